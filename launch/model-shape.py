"""model-shape.py — can the model run over these nodes at TP × PP, and how much context fits
(stdlib only; the node's python3 or the serving image's):

    python3 model-shape.py hub-check --repo R --revision SHA SHAPE-FLAGS   (in the serving image)
    python3 model-shape.py check --config D/config.json --manifest D/M SHAPE-FLAGS

SHAPE-FLAGS: --tensor-parallel-size N [--pipeline-parallel-size P] --gpu-memory-utilization U
--memory-kb NODE=KB (one per node) and, for the memory fit, --kv-cache-dtype --max-model-len
--kv-bytes-per-token --overhead-gib (an empty value: not given).

It runs twice: before the download (hub-check, on what the hub publishes for the revision:
fetch-weights.sh) and after it (check, on the pinned config.json and manifest, against every
node's MemTotal: model-shape-check.sh). The stack's config check loads the same rules by path
(components/config/schema.py), so vLLM's rules are written once. The weights' integrity is
weights.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

# One `ok`, `skip` or `FAIL` line per check; the rules are vLLM's own:
# - attention heads divisible by TP, and by TP only: PP splits layers, not heads
#   (vllm/config: ModelConfig.verify_with_parallel_config);
# - KV heads divisible by TP, or TP a multiple of them, each then replicated
#   (vllm/model_executor/layers/linear.py: QKVParallelLinear.__init__); a model with latent
#   attention (MLA, kv_lora_rank) keeps one latent KV on every rank;
# - with PP, the hidden layers split over the stages: vLLM does not need PP to divide them.
#   vllm/distributed/utils.py get_pp_indices (vllm-project/vllm @ 5a6541db) gives each stage
#   num_hidden_layers // PP and the remainder one each to the stages before the last (the last
#   holds the final norm and lm_head), unless VLLM_PP_LAYER_PARTITION lists them (no recipe
#   sets it: this check and the estimate assume vLLM's own split). A stage needs a layer:
#   fewer layers than PP stages is refused. Whether
#   the architecture supports PP at all (vLLM's SupportsPP) config.json cannot say: vLLM's own
#   check says it at load;
# - each rank holds about 1/(TP x PP) of the weights: the safetensors' bytes over TP x PP must
#   fit in gpu_memory_utilization x MemTotal of the smallest node (Spark's memory is unified);
# - memory fit: what is left of gpu_memory_utilization x MemTotal after the weights and the
#   recipe's overhead holds the KV cache; at the KV bytes per token (the recipe's figure, or from
#   config.json: MLA's compressed latent, else every full-attention layer's K and V heads on this
#   rank; with PP the layers of the largest stage only) that is the longest context and how
#   many sequences of it fit (a profile's maxNumSeqs
#   share the pool: running fewer tokens each is fine, as vLLM does). vLLM refuses to start
#   when one sequence of max_model_len does not fit (its "KV cache is needed" check): so does this.

GIB = 1 << 30


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def text_config(config: dict) -> dict:
    """Multimodal models keep the language model's shape under text_config."""
    return config if "num_attention_heads" in config else config.get("text_config") or config


def layout_words(tp: int, pp: int) -> str:
    """'TP 2' as before PP existed; 'TP 1 × PP 3' with it."""
    return f"TP {tp}" if pp == 1 else f"TP {tp} × PP {pp}"


def pp_partition(layers: int, pp: int) -> list[int]:
    """Layers per stage as vLLM's get_pp_indices splits them (VLLM_PP_LAYER_PARTITION unset):
    layers // pp each, the remainder one each to the stages before the last, from the last back."""
    partitions = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        partitions[-i] += 1
    return partitions


def head_lines(config: dict, tp: int, pp: int = 1) -> list[str]:
    shape = text_config(config)
    heads = shape.get("num_attention_heads")
    if not isinstance(heads, int):
        return ["skip attention heads: config.json names no num_attention_heads"] + layer_lines(shape, pp)
    where = "the node count" if pp == 1 else f"the node count {tp * pp} ÷ PP {pp}"
    lines = [f"ok   attention heads: {heads} over TP {tp}, {heads // tp} per node" if heads % tp == 0
             else f"FAIL attention heads: {heads} not divisible by TP {tp} ({where})"]
    if shape.get("kv_lora_rank"):
        lines.append(f"ok   KV heads: latent (MLA, kv_lora_rank {shape['kv_lora_rank']}), the same on every node")
        return lines + layer_lines(shape, pp)
    kv = shape.get("num_key_value_heads") or heads  # absent: one per attention head (HF's default)
    if kv % tp == 0:
        lines.append(f"ok   KV heads: {kv} over TP {tp}, {kv // tp} per node")
    elif tp % kv == 0:
        lines.append(f"ok   KV heads: {kv}, each replicated on {tp // kv} nodes")
    else:
        lines.append(f"FAIL KV heads: {kv} neither divisible by TP {tp} nor a divisor of it")
    return lines + layer_lines(shape, pp)


def layer_lines(shape: dict, pp: int) -> list[str]:
    """With PP, the hidden layers over the stages; without it, nothing to say."""
    if pp == 1:
        return []
    layers = shape.get("num_hidden_layers")
    if not isinstance(layers, int):
        return ["skip hidden layers: config.json names no num_hidden_layers"]
    if layers < pp:
        return [f"FAIL hidden layers: {layers} fewer than PP {pp} stages (vLLM's split would leave a stage "
                "without a layer)"]
    split = pp_partition(layers, pp)
    even = "" if layers % pp == 0 else " (uneven, as vLLM's get_pp_indices splits them)"
    return [f"ok   hidden layers: {layers} over PP {pp}, {'/'.join(map(str, split))} per stage{even}"]


def layouts_of(nodes: int) -> list[tuple[int, int]]:
    """Every (TP, PP) of `nodes` ranks, one per node's GPU, TP largest first."""
    return [(nodes // pp, pp) for pp in range(1, nodes + 1) if nodes % pp == 0]


def layout_option(tp: int, pp: int) -> str:
    """A layout as the stack config sets it (tensorParallel unset is the node count ÷ PP)."""
    return f"pipelineParallel: {pp} (TP={tp})"


def workable_layouts(config: dict, nodes: int) -> list[tuple[int, int]]:
    """Every (TP, PP) of `nodes` that config.json's shape passes, TP largest first."""
    return [(tp, pp) for tp, pp in layouts_of(nodes)
            if not any(line.startswith("FAIL") for line in head_lines(config, tp, pp))]


def layout_advice(config: dict, tp: int, pp: int) -> list[str]:
    """After a FAIL of the shape: the layouts of the same nodes that would pass, as config keys."""
    nodes = tp * pp
    options = [f"serving.{layout_option(t, p)}" for t, p in workable_layouts(config, nodes) if (t, p) != (tp, pp)]
    if not options:
        return [f"FAIL layout: {layout_words(tp, pp)} does not split this model, nor does any TP × PP of {nodes} "
                "nodes: serve it on another number of nodes"]
    return [f"FAIL layout: {layout_words(tp, pp)} does not split this model; with {nodes} nodes set "
            + " or ".join(options)]


def safetensors_bytes(files: dict) -> int:
    """files: {relative path: {"size": ..}}, as the manifest and the hub listing hold them."""
    return sum(entry["size"] for path, entry in files.items() if path.endswith(".safetensors"))


def memory_line(weights: int, tp: int, utilization: float, memory_kb: dict[str, int], pp: int = 1) -> str:
    if not weights:
        return "skip weights: no safetensors in the manifest"
    per_node = weights / (tp * pp)
    name, kb = min(memory_kb.items(), key=lambda item: item[1])
    usable = utilization * kb * 1024
    if per_node > usable:
        return (f"FAIL weights: {gib(weights)} of safetensors need {gib(per_node)} per node over "
                f"{layout_words(tp, pp)}, but {utilization:g} × {name}'s MemTotal {gib(kb * 1024)} leaves "
                f"{gib(usable)}")
    every = ", ".join(f"{node} {gib(total * 1024)}" for node, total in memory_kb.items())
    return (f"ok   weights: {gib(weights)} of safetensors, {gib(per_node)} per node over {layout_words(tp, pp)}, "
            f"within {utilization:g} × MemTotal on every node ({every})")


# bytes of one cached value per KV dtype (vLLM's CacheDType names); fp8_ds_mla is vLLM's
# DeepSeek layout, per layer per token: 512 fp8 latent + 4 float32 scales + 64 bf16 rope = 656
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
               "nvfp4": 0.5625, "nvfp4_ds_mla": 0.5625}
FP8_DS_MLA_BYTES_PER_LAYER = 656


def stage_layers(shape: dict, pp: int) -> list[range]:
    """The layer indices of each PP stage (one stage: every layer)."""
    layers = shape.get("num_hidden_layers") or 0
    bounds = [0]
    for count in pp_partition(layers, pp):
        bounds.append(bounds[-1] + count)
    return [range(start, end) for start, end in zip(bounds, bounds[1:])]


def kv_layers(shape: dict, pp: int) -> int:
    """The layers keeping a per-token KV on the rank with the most of them: each PP stage caches
    its own layers' KV only, and vLLM sizes every rank's cache in blocks the smallest pool holds."""
    types = shape.get("layer_types")
    if isinstance(types, list):  # hybrid models: only full-attention layers keep a per-token KV
        keeps = [t in ("full_attention", "attention") for t in types]
        if pp == 1:
            return sum(keeps)
        return max(sum(keeps[i] for i in stage if i < len(keeps)) for stage in stage_layers(shape, pp))
    return max(len(stage) for stage in stage_layers(shape, pp))


def stage_kv_share(config: dict, pp: int) -> float:
    """Of every layer's KV, the fraction on the fullest stage (1 without PP; 1/PP where config.json
    names no layers)."""
    if pp == 1:
        return 1.0
    shape = text_config(config)
    whole = kv_layers(shape, 1)
    return kv_layers(shape, pp) / whole if whole else 1 / pp


def kv_bytes_per_token(config: dict, tp: int, kv_dtype: str, pp: int = 1) -> int:
    """One token's KV on one rank, every layer of its stage, from config.json (0: the shape is not known)."""
    shape = text_config(config)
    layers = kv_layers(shape, pp)
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
               overhead_bytes: float, max_model_len: int, pp: int = 1) -> dict:
    """The estimate on the smallest node, in bytes and tokens; kv_per_token is one rank's."""
    weights_per_node = weights / (tp * pp)
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


def read_config(path: Path) -> tuple[dict | None, list[str]]:
    """config.json, or None and the FAIL line saying why not."""
    try:
        return json.loads(path.read_text()), []
    except FileNotFoundError:
        return None, [f"FAIL config.json: missing in the model directory ({path})"]
    except ValueError as err:
        return None, [f"FAIL config.json: not JSON ({err})"]


def shape_lines(config: dict | None, files: dict, args) -> tuple[list[str], dict]:
    """Every check's line on config.json (None: its FAIL line is the caller's) and the files'
    sizes, against args' TP, utilization and --memory-kb; and the memory fit ({}: not estimated)."""
    tp, pp, utilization = args.tensor_parallel_size, args.pipeline_parallel_size, args.gpu_memory_utilization
    memory_kb = {name: int(kb) for name, kb in (item.split("=", 1) for item in args.memory_kb)}
    lines = head_lines(config, tp, pp) if config is not None else []
    if any(line.startswith("FAIL") for line in lines):
        lines += layout_advice(config, tp, pp)  # type: ignore[arg-type]  # a FAIL line: config was read
    weights = safetensors_bytes(files)
    lines.append(memory_line(weights, tp, utilization, memory_kb, pp))
    fit: dict = {}
    if args.max_model_len and weights and config is not None:
        # the recipe's figure is every layer's, on one node: a stage keeps its own layers' share
        per_token = (math.ceil(args.kv_bytes_per_token * stage_kv_share(config, pp)) if args.kv_bytes_per_token
                     else kv_bytes_per_token(config, tp, args.kv_cache_dtype, pp))
        if not per_token:  # no estimate is no reason to refuse: vLLM's own check still runs at load
            lines.append("skip memory fit: config.json gives no KV size per token (num_hidden_layers with "
                         "num_attention_heads and head_dim or hidden_size, or kv_lora_rank) and the recipe names none")
            return lines, fit
        fit = memory_fit(weights, tp, utilization, min(memory_kb.values()) * 1024, per_token,
                         (args.overhead_gib or 0) * GIB, args.max_model_len, pp)
        lines.append(fit_line(fit, utilization))
    return lines, fit


def report(lines: list[str]) -> int:
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


def shape_check(args) -> int:
    """After the download, on the host: the pinned config.json and manifest, every node's MemTotal.
    Its last line, `memory-fit {json}`, is the stack's memoryFit output."""
    config, lines = read_config(Path(args.config))
    checks, fit = shape_lines(config, json.loads(Path(args.manifest).read_text())["files"], args)
    return report(lines + checks + (["memory-fit " + json.dumps(fit, sort_keys=True)] if fit else []))


def hub_shape_check(args) -> int:
    """Before the download, in the serving image: the same checks on what the hub publishes for
    the revision (every file's size) and its config.json, fetched alone into a directory that
    goes with this process, so the model directory is untouched by a refusal. The caller gives
    only its own node's MemTotal (see fetch-weights.sh: why its refusal is always right)."""
    import tempfile

    from huggingface_hub import HfApi, hf_hub_download

    info = HfApi().model_info(args.repo, revision=args.revision, files_metadata=True)
    # the hub always lists a model's files (siblings)
    files = {sibling.rfilename: {"size": sibling.size} for sibling in info.siblings}  # type: ignore[union-attr]
    if "config.json" not in files:
        config, lines = None, [f"FAIL config.json: {args.repo}@{args.revision} publishes none"]
    else:
        with tempfile.TemporaryDirectory() as cache:
            config, lines = read_config(Path(hf_hub_download(args.repo, "config.json", revision=args.revision,
                                                             cache_dir=cache)))
    return report(lines + shape_lines(config, files, args)[0])


def optional(kind):
    """A flag's value, or None where the script passed it empty (not set in the stack)."""
    return lambda text: kind(text) if text else None


def add_shape_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensor-parallel-size", type=int, required=True)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, required=True)
    p.add_argument("--memory-kb", action="append", required=True, help="NODE=KB, one per node")
    p.add_argument("--kv-cache-dtype", help="with --max-model-len: estimate the memory fit")
    p.add_argument("--max-model-len", type=optional(int))
    p.add_argument("--kv-bytes-per-token", type=optional(int), help="the recipe's; none or 0: from config.json")
    p.add_argument("--overhead-gib", type=optional(float))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="model-shape.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("hub-check")
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", required=True)
    add_shape_flags(p)
    p.set_defaults(run=hub_shape_check)
    p = sub.add_parser("check")
    p.add_argument("--config", required=True)
    p.add_argument("--manifest", required=True)
    add_shape_flags(p)
    p.set_defaults(run=shape_check)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
