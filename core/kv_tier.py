"""The KV tier (`serving.kvTier`, a lane's too): the prompt's KV blocks kept on the node's NVMe, so a
long context survives an engine restart and is read back instead of prefilled again.

vLLM 0.24.0's own KV offload, nothing added to the image: its OffloadingConnector with the
TieringOffloadingSpec (vllm/v1/kv_offload/tiering/spec.py) — a CPU tier of `memoryGiB` (a
/dev/shm region, part of the node's memory budget) in front of its file tier
(tiering/fs/manager.py: one file per block, written with O_DIRECT and renamed in place, looked up
by the file's existence, so what an engine stored is found by the next one).

What bites, read from vLLM 0.24.0's code (docs/measurements/kv-tier-2026-12-07.md):
- A block's file is named by its hash, and the hash chain starts from NONE_HASH, which vLLM draws
  from os.urandom in every process unless PYTHONHASHSEED is set (v1/core/kv_cache_utils.py,
  init_none_hash): without a fixed seed a restarted engine finds nothing. The stack's seed
  (four random bytes as an integer, a secret in its state) is a 0600 bundle file the head's boot script exports.
- The CPU tier is one /dev/shm file shared by the ranks of one host, each rank at the offset of its
  *local* device index (cpu/shared_offload_region.py, TieringOffloadingSpec.create_handlers), and
  the file tier copies the scheduler's (the head's) view: a lane whose ranks are on several nodes
  (one GPU each, every rank index 0) would store and reload the head's part only. A tier is for a
  lane on one node.
- The file tier evicts nothing: launch/kv-tier-bound.py holds it under `diskGiB`.
- LMCache 0.5.6, the other tier vLLM can drive, cannot go into vLLM 0.24.0's image as it is: it
  pins numpy<=2.2.6, protobuf<7, grpcio 1.78, opentelemetry<=1.40 and prometheus_client<=0.24.1,
  each below what vLLM 0.24.0 resolves to (uv pip compile, same measurement).

A leaf module: data and pure functions.
"""

from __future__ import annotations

import json
import math

from . import contract

# the DGX Spark's usable memory (the recipe: "128 GB unified LPDDR5x (121 GiB usable)"): the config's
# budget arithmetic turns memoryGiB into a share of it; the memory check on the node uses the bytes
CONFIG_MEMTOTAL_GIB = 121
GIB = 1024**3
# vLLM's file tier writes and reads this many blocks at once (16 each: its default)
IO_THREADS = 16


def tier_dir(lane: str) -> str:
    """Host and container (contract.CACHE_DIR is mounted): one folder a lane, root-only (KV blocks are the
    prompts' content in another form)."""
    return f"{contract.KV_TIER_DIR}/{lane}"


def transfer_config(memory_gib: int, lane: str) -> str:
    """`--kv-transfer-config`: the CPU tier of memory_gib, then the file tier under tier_dir(lane)."""
    return json.dumps({
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": memory_gib * GIB,
            "secondary_tiers": [{"type": "fs", "root_dir": tier_dir(lane),
                                 "n_read_threads": IO_THREADS, "n_write_threads": IO_THREADS}]}},
        separators=(",", ":"))


def memory_share(memory_gib: int) -> float:
    """The CPU tier's share of a Spark's memory, rounded up to the budget's basis points."""
    return math.ceil(memory_gib / CONFIG_MEMTOTAL_GIB * 10_000) / 10_000
