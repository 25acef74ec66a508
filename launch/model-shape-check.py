#!/usr/bin/env python3
"""model-shape-check.py — does a model's shape allow tensor parallelism over these nodes?

    python3 model-shape-check.py --config DIR/config.json --manifest DIR/.twinspark-manifest \
        --tensor-parallel-size 2 --gpu-memory-utilization 0.85 \
        --memory-kb spark1=127535148 --memory-kb spark2=127535148

Prints one `ok`, `skip` or `FAIL` line per check and exits 1 if any failed. The rules are
vLLM's own:
- attention heads divisible by TP (vllm/config: ModelConfig.verify_with_parallel_config);
- KV heads divisible by TP, or TP a multiple of them, each then replicated
  (vllm/model_executor/layers/linear.py: QKVParallelLinear.__init__); a model with latent
  attention (MLA, kv_lora_rank) keeps one latent KV on every rank;
- each rank holds about 1/TP of the weights: the safetensors' bytes over TP must fit in
  gpu_memory_utilization x MemTotal of the smallest node (Spark's memory is unified).
- memory fit: what is left of gpu_memory_utilization x MemTotal after the weights and the
  recipe's overhead holds the KV cache; at the KV bytes per token (the recipe's figure, or from
  config.json: MLA's compressed latent, else every full-attention layer's K and V heads on this
  rank) that is the longest context and how many sequences of it fit (a profile's maxNumSeqs
  share the pool: running fewer tokens each is fine, as vLLM does). vLLM refuses to start
  when one sequence of max_model_len does not fit (its "KV cache is needed" check): so does this.
Standard library only: it runs with the host's python3, which netplan needs anyway.
"""

import argparse
import json
import sys

GIB = 1 << 30


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def text_config(config: dict) -> dict:
    """Multimodal models keep the language model's shape under text_config."""
    return config if "num_attention_heads" in config else config.get("text_config") or config


def head_lines(config: dict, tp: int) -> list[str]:
    shape = text_config(config)
    heads = shape.get("num_attention_heads")
    if not isinstance(heads, int):
        return ["skip attention heads: config.json names no num_attention_heads"]
    lines = [f"ok   attention heads: {heads} over TP {tp}, {heads // tp} per node" if heads % tp == 0
             else f"FAIL attention heads: {heads} not divisible by TP {tp} (the node count)"]
    if shape.get("kv_lora_rank"):
        return lines + [f"ok   KV heads: latent (MLA, kv_lora_rank {shape['kv_lora_rank']}), the same on every node"]
    kv = shape.get("num_key_value_heads") or heads  # absent: one per attention head (HF's default)
    if kv % tp == 0:
        lines.append(f"ok   KV heads: {kv} over TP {tp}, {kv // tp} per node")
    elif tp % kv == 0:
        lines.append(f"ok   KV heads: {kv}, each replicated on {tp // kv} nodes")
    else:
        lines.append(f"FAIL KV heads: {kv} neither divisible by TP {tp} nor a divisor of it")
    return lines


def safetensors_bytes(manifest: str) -> int:
    """The manifest (launch/weights.py `pin`): {"files": {relative path: {"size": ..}}}."""
    files = json.loads(manifest)["files"]
    return sum(entry["size"] for path, entry in files.items() if path.endswith(".safetensors"))


def memory_line(weights: int, tp: int, utilization: float, memory_kb: dict[str, int]) -> str:
    if not weights:
        return "skip weights: no safetensors in the manifest"
    per_node = weights / tp
    name, kb = min(memory_kb.items(), key=lambda item: item[1])
    usable = utilization * kb * 1024
    if per_node > usable:
        return (f"FAIL weights: {gib(weights)} of safetensors need {gib(per_node)} per node over TP {tp}, but "
                f"{utilization:g} × {name}'s MemTotal {gib(kb * 1024)} leaves {gib(usable)}")
    every = ", ".join(f"{node} {gib(total * 1024)}" for node, total in memory_kb.items())
    return (f"ok   weights: {gib(weights)} of safetensors, {gib(per_node)} per node over TP {tp}, within "
            f"{utilization:g} × MemTotal on every node ({every})")


# bytes of one cached value per KV dtype (vLLM's CacheDType names); fp8_ds_mla is vLLM's
# DeepSeek layout, per layer per token: 512 fp8 latent + 4 float32 scales + 64 bf16 rope = 656
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "nvfp4": 0.5625, "nvfp4_ds_mla": 0.5625}
FP8_DS_MLA_BYTES_PER_LAYER = 656


def kv_bytes_per_token(config: dict, tp: int, kv_dtype: str) -> int:
    """One token's KV on one rank, every layer, from config.json (0: the shape is not known)."""
    shape = text_config(config)
    layers = shape.get("num_hidden_layers") or 0
    types = shape.get("layer_types")
    if isinstance(types, list):  # hybrid models: only full-attention layers keep a per-token KV
        layers = sum(1 for t in types if t in ("full_attention", "attention"))
    if shape.get("kv_lora_rank"):  # MLA: one compressed latent, the same on every rank
        if kv_dtype == "fp8_ds_mla":
            return layers * FP8_DS_MLA_BYTES_PER_LAYER
        width = shape["kv_lora_rank"] + (shape.get("qk_rope_head_dim") or 0)
        return int(layers * width * DTYPE_BYTES.get(kv_dtype, 2))
    heads = shape.get("num_attention_heads") or 0
    kv_heads = shape.get("num_key_value_heads") or heads
    head_dim = shape.get("head_dim") or (shape.get("hidden_size", 0) // heads if heads else 0)
    per_rank = -(-kv_heads // tp)  # a replicated KV head still costs its full size on each rank
    return int(layers * 2 * per_rank * head_dim * DTYPE_BYTES.get(kv_dtype, 2))


def memory_fit(weights: int, tp: int, utilization: float, memtotal_bytes: int, kv_per_token: int,
               overhead_bytes: float, max_model_len: int) -> dict:
    """The estimate on the smallest node, in bytes and tokens."""
    weights_per_node = weights / tp
    kv_bytes = utilization * memtotal_bytes - weights_per_node - overhead_bytes
    tokens = int(kv_bytes // kv_per_token) if kv_per_token and kv_bytes > 0 else 0
    return {"weightsPerNodeGiB": round(weights_per_node / GIB, 1), "kvGiB": round(max(kv_bytes, 0) / GIB, 1),
            "kvBytesPerToken": kv_per_token, "kvTokens": tokens, "maxModelLen": max_model_len,
            "sequencesAtMaxModelLen": round(tokens / max_model_len, 2),
            "longestContext": tokens}


def fit_line(fit: dict, utilization: float) -> str:
    figures = (f"{fit['weightsPerNodeGiB']} GiB weights per node, {fit['kvGiB']} GiB KV at "
               f"{fit['kvBytesPerToken']} B/token = {fit['kvTokens']:,} tokens; {fit['sequencesAtMaxModelLen']} "
               f"sequences of maxModelLen {fit['maxModelLen']:,} fit")
    if fit["kvTokens"] < fit["maxModelLen"]:
        return (f"FAIL memory fit: {figures} — one sequence of maxModelLen needs {fit['maxModelLen']:,} tokens of "
                f"KV: lower serving.maxModelLen to at most {fit['kvTokens']:,} or raise gpuMemoryUtilization "
                f"({utilization:g})")
    return f"ok   memory fit: {figures}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--tensor-parallel-size", type=int, required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    parser.add_argument("--memory-kb", action="append", required=True, help="NODE=KB, one per node")
    parser.add_argument("--kv-cache-dtype", help="with --max-model-len: estimate the memory fit")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--kv-bytes-per-token", type=int, default=0, help="the recipe's; 0: from config.json")
    parser.add_argument("--overhead-gib", type=float, default=0.0)
    args = parser.parse_args()
    tp = args.tensor_parallel_size
    memory_kb = {name: int(kb) for name, kb in (item.split("=", 1) for item in args.memory_kb)}
    config = None
    try:
        with open(args.config) as f:
            config = json.load(f)
    except FileNotFoundError:
        lines = [f"FAIL config.json: missing in the model directory ({args.config})"]
    except ValueError as err:
        lines = [f"FAIL config.json: not JSON ({err})"]
    else:
        lines = head_lines(config, tp)
    with open(args.manifest) as f:
        weights = safetensors_bytes(f.read())
    lines.append(memory_line(weights, tp, args.gpu_memory_utilization, memory_kb))
    if args.max_model_len and weights and config is not None:
        per_token = args.kv_bytes_per_token or kv_bytes_per_token(config, tp, args.kv_cache_dtype)
        if not per_token:  # no estimate is no reason to refuse: vLLM's own check still runs at load
            lines.append("skip memory fit: config.json gives no KV size per token (num_hidden_layers with "
                         "num_attention_heads and head_dim or hidden_size, or kv_lora_rank) and the recipe names none")
        else:
            fit = memory_fit(weights, tp, args.gpu_memory_utilization, min(memory_kb.values()) * 1024, per_token,
                             args.overhead_gib * GIB, args.max_model_len)
            lines.append(fit_line(fit, args.gpu_memory_utilization))
            lines.append("memory-fit " + json.dumps(fit, sort_keys=True))
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
