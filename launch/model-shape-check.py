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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--tensor-parallel-size", type=int, required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    parser.add_argument("--memory-kb", action="append", required=True, help="NODE=KB, one per node")
    args = parser.parse_args()
    tp = args.tensor_parallel_size
    memory_kb = {name: int(kb) for name, kb in (item.split("=", 1) for item in args.memory_kb)}
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
        lines.append(memory_line(safetensors_bytes(f.read()), tp, args.gpu_memory_utilization, memory_kb))
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
