#!/usr/bin/env python3
"""kv-tier-bound.py — holds the KV tier's files (serving.kvTier) under its diskGiB.

  kv-tier-bound.py --dir /var/cache/twinspark/kv-tier/LANE --max-bytes N [--interval 30] [--low-water 0.9] [--once]

vLLM 0.24.0's file tier writes a file per KV block and removes none (vllm/v1/kv_offload/tiering/fs):
left alone it fills the disk. Every --interval seconds this sums the files under --dir; above
--max-bytes it removes the least recently used ones (the later of a file's access and modification
times: the tier reads a block to use it, which relatime records once a day at least) until
--low-water x --max-bytes is left, and says how many and how much. A block removed while vLLM
looks it up is a block the engine computes again: the tier checks a file's existence, then reads it
into its CPU part, and a read that fails leaves the block unavailable (vLLM 0.24.0's
TieringOffloadingManager, complete_write with success False). Only block files (NAME.bin) are
removed. Runs beside vLLM in the serving container (boot-common.sh prepare_kv_tier); standard
library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def block_files(root: str) -> list[tuple[float, int, str]]:
    """(last use, bytes, path) of every block file (NAME.bin) under root: not the tier's config.json, not a
    block being written (NAME.bin.tmp...), not one gone meanwhile."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if not name.endswith(".bin"):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found.append((max(st.st_atime, st.st_mtime), st.st_size, path))
    return found


def bound(root: str, max_bytes: int, low_water: float) -> tuple[int, int, int]:
    """Removes the least recently used files beyond the bound: (files removed, bytes removed, bytes left)."""
    files = block_files(root)
    held = sum(size for _, size, _ in files)
    if held <= max_bytes:
        return 0, 0, held
    removed = freed = 0
    for _, size, path in sorted(files):
        if held - freed <= low_water * max_bytes:
            break
        try:
            os.remove(path)
        except FileNotFoundError:
            pass  # vLLM removed it (a failed read) meanwhile
        removed, freed = removed + 1, freed + size
    return removed, freed, held - freed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--low-water", type=float, default=0.9)
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    args = parser.parse_args(argv)
    if args.max_bytes <= 0 or not 0 < args.low_water <= 1:
        parser.error(f"--max-bytes must be above 0 and --low-water in (0, 1]; got {args.max_bytes}, {args.low_water}")
    while True:
        removed, freed, left = bound(args.dir, args.max_bytes, args.low_water)
        if removed:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            print(f"{stamp} kv-tier-bound: {args.dir} over {args.max_bytes} bytes: removed {removed} least recently "
                  f"used blocks ({freed} bytes), {left} bytes left", flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
