#!/usr/bin/env python3
"""render-single-gpu.py OUTDIR — the files vllm-single-gpu.sh runs, rendered by the program itself.

- launch-vllm.sh: components.launch_bundle.render_launch_vllm for the stack file's config with
  recipe gpt-oss-120b (a model vLLM 0.24 knows), the tiny model (tests/gpu/tiny-model.py) at
  TINY_MODEL_DIR, TP 1, and `--load-format dummy` through serving.extraArgs. The recipe's
  model-specific lines are then swapped for the tiny Qwen2's, each checked present first
  (LEFT_OUT below: a recipe change stops this script instead of rendering a wrong command).
- metric-names.txt: every vllm:* and process_* series components/observability_files/ queries.
- guard-argv.json: components.serving_guard.guard_argv with the default serving guard config.
Run with the project's .venv (pulumi, pydantic) from the checkout, the repository and tests/ on
PYTHONPATH (`PYTHONPATH=.:tests .venv/bin/python tests/gpu/render-single-gpu.py OUTDIR`); nothing
here needs the device.
"""

import json
import re
import sys
from pathlib import Path

from program_harness import config_blocks

from components import launch_bundle, serving_guard
from components.config import ServingGuard, parse_stack_config

ROOT = Path(__file__).resolve().parents[2]

TINY_MODEL_DIR = "/tmp/tiny-model"  # model.dir; vLLM reads it as model.container_dir (/models/tiny-model)
# gpt-oss-120b's lines that name its weights or its own parsers -> what the tiny Qwen2 needs
LEFT_OUT = {
    "  --tool-call-parser openai \\\n": "  --tool-call-parser hermes \\\n",  # Qwen2-style <tool_call> blocks
    "  --reasoning-parser openai_gptoss \\\n": "",  # harmony channels: the tiny model has none
    "  --quantization mxfp4 \\\n": "",  # dummy bf16 weights
    "  --attention-backend FLASHINFER \\\n": "",  # FlashInfer is not carried: vLLM picks FLASH_ATTN on Hopper
    "  --mxfp4-backend CUTLASS \\\n": "",
    "  --mxfp4-layers moe,qkv,o,lm_head \\\n": "",
}


def main(out: Path) -> None:
    raw = config_blocks()
    raw["serving"] = {**raw["serving"], "recipe": "gpt-oss-120b", "profile": "default", "maxModelLen": 4096,
                      "gpuMemoryUtilization": 0.5, "kvCacheDtype": "auto", "extraArgs": ["--load-format", "dummy"]}
    raw["model"] = {**raw["model"], "dir": TINY_MODEL_DIR, "servedName": "tiny", "repo": "openai/gpt-oss-120b"}
    cfg = parse_stack_config(raw)
    script = launch_bundle.render_launch_vllm(launch_bundle.VllmServe(cfg.serving, cfg.model, 1))
    for line, replacement in LEFT_OUT.items():
        if line not in script:
            raise SystemExit(f"the rendered launch-vllm.sh no longer has {line.strip()!r}: update LEFT_OUT\n{script}")
        script = script.replace(line, replacement)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch-vllm.sh").write_text(script)
    (out / "launch-vllm.sh").chmod(0o755)
    args = serving_guard.ServingGuardArgs("gpu0", None, cfg.serving.port, ["gpu0"], ServingGuard(), "hermes")
    (out / "guard-argv.json").write_text(json.dumps(serving_guard.guard_argv(args)) + "\n")
    rendering = "".join(p.read_text() for p in sorted((ROOT / "components" / "observability_files").glob("*.py")))
    queried = sorted(set(re.findall(r"\b(vllm:[A-Za-z0-9_:]+|process_[a-z_]+)", rendering)))
    (out / "metric-names.txt").write_text("\n".join(queried) + "\n")
    print(script)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "build" / "gpu-bundle"))
