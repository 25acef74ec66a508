#!/usr/bin/env python3
"""big-checkpoint.py DIR [--layers N] [--shard-gb 5] — write, offline, a real-size safetensors checkpoint.

Qwen2.5-14B's shapes (Qwen2ForCausalLM: hidden 5120, intermediate 13824, 48 layers, 40 heads over
8 KV heads, vocab 152064, untied lm_head, q/k/v biases): 14.77e9 bf16 parameters, 29.5 GB, in
shards of at most --shard-gb GB (HF's default 5 GB) named model-0000i-of-0000n.safetensors, with
model.safetensors.index.json. The tokenizer and chat template are tiny-model.py's (beside this
file; vocab 4096 < the config's 152064, as Qwen's own tokenizer is smaller than its vocab_size).
The values are random (normal, std 0.02; norms 1), drawn on the GPU when there is one: the loaders
read every byte, and nothing is compressible or sparse. For issue 42's loader measurements
(loaders-on-device.sh); needs torch, safetensors and tokenizers (the device has them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 48,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
    "bos_token_id": None,
    "eos_token_id": 2,  # tiny-model.py's tokenizer: <|im_end|>
    "pad_token_id": 0,
}


def tensor_plan(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    plan: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (v, h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        plan += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
    plan += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return plan


def nbytes(shape: tuple[int, ...]) -> int:
    n = 2
    for d in shape:
        n *= d
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    ap.add_argument("--shard-gb", type=float, default=5.0)
    args = ap.parse_args()
    cfg = dict(CONFIG, num_hidden_layers=args.layers)
    out: Path = args.dir
    # tokenizer, tokenizer_config (chat template), generation_config: tiny-model.py's
    subprocess.run([sys.executable, str(Path(__file__).with_name("tiny-model.py")), str(out)], check=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    plan = tensor_plan(cfg)
    limit = int(args.shard_gb * 1e9)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in plan:
        if shards[-1] and size + nbytes(shape) > limit:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes(shape)
    total = sum(nbytes(s) for _, s in plan)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(42)
    weight_map = {}
    started = time.monotonic()
    for k, shard in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            if name.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.bfloat16)
            else:
                t = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0, 0.02, generator=gen).cpu()
            tensors[name] = t
            weight_map[name] = fname
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        del tensors
        print(f"{fname}: {sum(nbytes(s) for _, s in shard) / 1e9:.2f} GB, {len(shard)} tensors, "
              f"{time.monotonic() - started:.1f} s", flush=True)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    params = total // 2
    print(f"wrote {out}: Qwen2ForCausalLM, {args.layers} layers, {params / 1e9:.2f}e9 params, "
          f"{total / 1e9:.2f} GB in {len(shards)} shards, {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
