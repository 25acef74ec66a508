#!/usr/bin/env python3
"""memory-check.py — is the memory vLLM will ask for free on this node? Run before Ray starts.

  memory-check.py --model-dir /models/M --utilization 0.85 --status /run/twinspark/memory-check.json \
      --node spark2 [--meminfo /proc/meminfo] [--retry-seconds 30]

First it releases the page cache that the model's files fill (posix_fadvise DONTNEED on each:
the copy and any earlier load left them cached, and on the Spark's unified memory cached pages
compete with the model; unlike `drop_caches` this needs no privilege and leaves other files'
cache alone). Then it compares what vLLM will take, utilization x MemTotal, with MemAvailable.
Short: the memory that should be free is not — a co-tenant holds it, or a crashed engine leaked
it (freed only by a reboot) — and vLLM would fail or push the box into swap and the OOM killer.
It says so with the numbers (stdout and --status, which `ops status` shows) and checks again
every --retry-seconds; it returns once the memory is there. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

GIB = 1024**3


def meminfo(path: str) -> dict[str, int]:
    """Bytes, by field name."""
    fields = {}
    for line in Path(path).read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields


def release_page_cache(model_dir: str) -> int:
    """Drop the cached pages of every file under model_dir; returns how many files."""
    count = 0
    for root, _dirs, files in os.walk(model_dir):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                try:  # dirty pages are not dropped: written back first, as `sync` would
                    os.fdatasync(fd)
                except OSError:  # nothing to write back where the mount is read-only
                    pass
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                count += 1
            finally:
                os.close(fd)
    return count


def verdict(mem: dict[str, int], utilization: float) -> dict:
    total, available, free = mem["MemTotal"], mem["MemAvailable"], mem["MemFree"]
    need = utilization * total
    ok = available >= need
    numbers = (f"vLLM needs {need / GIB:.1f} GiB ({utilization} x {total / GIB:.1f} GiB), "
               f"{available / GIB:.1f} GiB available ({free / GIB:.1f} GiB free)")
    message = numbers if ok else (
        f"not enough memory to load: {numbers}; {(need - available) / GIB:.1f} GiB that should be free is not. "
        "Another process holds it (see `ps aux --sort=-rss | head`), or an engine that crashed leaked it: "
        "only a reboot frees that")
    return {"ok": ok, "need_gib": round(need / GIB, 2), "total_gib": round(total / GIB, 2),
            "available_gib": round(available / GIB, 2), "free_gib": round(free / GIB, 2), "message": message}


def write_status(path: str, status: dict) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_suffix(".tmp")
    staged.write_text(json.dumps(status, indent=1) + "\n")
    staged.replace(target)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--utilization", type=float, required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument("--meminfo", default="/proc/meminfo")
    parser.add_argument("--retry-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    files = release_page_cache(args.model_dir)
    while True:
        result = verdict(meminfo(args.meminfo), args.utilization)
        write_status(args.status, {"node": args.node, "checked_at": time.time(), "model_files_released": files,
                                   **result})
        print(f"{'ok  ' if result['ok'] else 'WAIT'} {args.node}: {result['message']}", flush=True)
        if result["ok"]:
            return 0
        time.sleep(args.retry_seconds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
