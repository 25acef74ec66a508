"""The sim's model as a hub publishes it: safetensors-like shards, their index, a drafter's file and a config
(the vLLM stand-in and the model-shape check read only the config's head counts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

# divisible by TP 2; layers and a head size, so the memory fit can size a token of KV from it
DRAFTER_FILE = "mtp-drafter.pt"
SIM_MODEL_CONFIG = {"num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 4, "head_dim": 64}


def shard_names(count: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def publish(repo_dir: Path, shard_count: int = 4, shard_mb: int = 16) -> None:
    """Write the repo once (random shards: a hub's files are what they are); kept when present."""
    if (repo_dir / "config.json").exists():
        return
    repo_dir.mkdir(parents=True, exist_ok=True)
    shards = shard_names(shard_count)
    for shard in shards:
        (repo_dir / shard).write_bytes(os.urandom(shard_mb << 20))
    index = {"metadata": {"total_size": shard_count * (shard_mb << 20)},
             "weight_map": {f"layers.{i}.weight": s for i, s in enumerate(shards)}}
    (repo_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    # a drafter's file, as a recipe's speculative model ships beside the weights (the doctor reads its bytes)
    (repo_dir / DRAFTER_FILE).write_bytes(os.urandom(1 << 20))
    (repo_dir / "config.json").write_text(json.dumps(SIM_MODEL_CONFIG))


if __name__ == "__main__":  # scripts/sim.sh: python tests/sim/sim_model.py HUB_ROOT REPO
    import sys
    publish(Path(sys.argv[1]) / sys.argv[2])
