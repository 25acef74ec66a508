#!/usr/bin/env python3
"""memory-check.py — is the memory vLLM will ask for free on this node? Run before Ray starts.

  memory-check.py --model-dir /models/M --utilization 0.85 --status /run/twinspark/memory-check.json \
      --node spark2 [--cotenant-slices user.slice,system.slice --cotenant-percent 5 --headroom-percent 5 \
      --container-slice twinspark.slice --cgroup-root /host/sys/fs/cgroup] [--kv-tier-bytes N] \
      [--meminfo /proc/meminfo] [--retry-seconds 2] [--say-seconds 30]

First it releases the page cache that the model's files fill (posix_fadvise DONTNEED on each:
the copy and any earlier load left them cached, and on the Spark's unified memory cached pages
compete with the model; unlike `drop_caches` this needs no privilege and leaves other files'
cache alone). Then it compares what vLLM will take, utilization x MemTotal (and its KV tier's CPU
part, --kv-tier-bytes, with serving.kvTier), with MemAvailable.

The numbers are the node's memory budget (components/memory_budget.py, through twinspark.env):
model + each co-tenant slice's cap + headroom <= MemTotal, so co-tenants inside their caps and
the rest inside the headroom leave the model's share available. When it is not, the check
says who holds more than the budget gives it, from the host's cgroup tree: a co-tenant slice
(what its processes hold that the kernel cannot reclaim, cgroup v2 or v1), the serving slice
(a previous engine's processes), or nothing in those slices — memory that a crashed engine may
have leaked, which only a reboot frees. It says so with the numbers (stdout and --status,
which `ops status` shows) and checks again every --retry-seconds (a few seconds: reading meminfo
and the cgroups costs nothing, and memory a co-tenant frees is then seen at once, not up to half a
minute later), saying so again when the cause changes or every --say-seconds; it returns once the
memory is there. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

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


def cgroup_held(root: str, name: str) -> Optional[int]:
    """Bytes the processes of cgroup `name` hold that the kernel cannot reclaim: its usage less
    its page cache and reclaimable slab, which MemAvailable already counts as available. None
    when the cgroup tree does not show it."""
    def stat(path: Path) -> dict[str, int]:
        fields = (line.split() for line in path.read_text().splitlines())
        return {f[0]: int(f[1]) for f in fields if len(f) == 2}

    try:
        v2 = Path(root, name)
        if (v2 / "memory.current").exists():
            usage, counts = int((v2 / "memory.current").read_text()), stat(v2 / "memory.stat")
            reclaimable = sum(counts.get(k, 0) for k in ("active_file", "inactive_file", "slab_reclaimable"))
        else:  # cgroup v1: the memory controller's own hierarchy
            v1 = Path(root, "memory", name)
            usage, counts = int((v1 / "memory.usage_in_bytes").read_text()), stat(v1 / "memory.stat")
            reclaimable = sum(counts.get(k, 0) for k in ("total_active_file", "total_inactive_file"))
    except (OSError, ValueError):
        return None
    return max(0, usage - reclaimable)


def verdict(mem: dict[str, int], utilization: float, held: Optional[dict[str, Optional[int]]] = None,
            allowed: Optional[dict[str, Optional[float]]] = None, headroom_share: float = 0.0,
            kv_tier_bytes: int = 0) -> dict:
    """`held`: bytes each slice holds (None: unreadable); `allowed`: each slice's share of
    MemTotal in the budget (a co-tenant's cap, 0 for the serving slice before load; None:
    uncapped, so nothing of the budget is its own); `kv_tier_bytes`: the KV tier's CPU part."""
    total, available, free = mem["MemTotal"], mem["MemAvailable"], mem["MemFree"]
    need = utilization * total + kv_tier_bytes
    ok = available >= need
    tier = f" + {kv_tier_bytes / GIB:.1f} GiB for its KV tier" if kv_tier_bytes else ""
    numbers = (f"vLLM needs {need / GIB:.1f} GiB ({utilization} x {total / GIB:.1f} GiB{tier}), "
               f"{available / GIB:.1f} GiB available ({free / GIB:.1f} GiB free)")
    result = {"ok": ok, "need_gib": round(need / GIB, 2), "total_gib": round(total / GIB, 2),
              "available_gib": round(available / GIB, 2), "free_gib": round(free / GIB, 2)}
    if held:
        result["held_gib"] = {name: None if b is None else round(b / GIB, 2) for name, b in held.items()}
    if ok:
        return {**result, "message": numbers}
    message = f"not enough memory to load: {numbers}; {(need - available) / GIB:.1f} GiB that should be free is not. "
    known = {name: b for name, b in (held or {}).items() if b is not None}
    if not known:
        message += ("What holds it is unknown (the slices' cgroups could not be read): see `ps aux --sort=-rss | head`; "
                    "if no process holds it, an engine that crashed leaked it, which only a reboot frees")
        return {**result, "cause": None, "message": message}
    allowed = allowed or {}
    # held beyond its share of the budget: a co-tenant past its cap (or uncapped), a serving
    # process left over, or memory outside these slices beyond the headroom (the kernel, a leak)
    outside = max(0, total - available - sum(known.values()))
    excess = {name: b - (allowed.get(name) or 0) * total for name, b in known.items()}
    excess["outside"] = outside - headroom_share * total
    cause = max(excess, key=excess.get)

    def shown(name: str) -> str:
        share = allowed.get(name, 0)
        cap = "uncapped" if share is None else f"cap {share * total / GIB:.1f} GiB" if share else ""
        return f"{name} {known[name] / GIB:.1f} GiB" + (f" ({cap})" if cap else "")

    message += f"Held: {', '.join(shown(n) for n in known)}, outside these slices {outside / GIB:.1f} GiB. "
    if cause == "outside":
        message += ("No slice's processes hold it: an engine that crashed may have leaked it, which only a reboot frees "
                    "(see `ps aux --sort=-rss | head` first)")
    elif allowed.get(cause, 0) == 0 and cause in allowed:
        message += f"{cause} holds it: processes of an earlier serving container (see `systemd-cgls /{cause}`)"
    else:
        message += (f"{cause} holds it: a co-tenant there (see `systemd-cgls /{cause}`); stopping it frees the memory, "
                    "no reboot needed")
    return {**result, "cause": cause, "message": message}


def write_status(path: str, status: dict) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_suffix(".tmp")
    staged.write_text(json.dumps(status, indent=1) + "\n")
    staged.replace(target)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--utilization", type=float, required=True, help="the model's share of MemTotal")
    parser.add_argument("--status", required=True)
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument("--meminfo", default="/proc/meminfo")
    parser.add_argument("--retry-seconds", type=float, default=2.0)
    parser.add_argument("--say-seconds", type=float, default=30.0, help="a WAIT line again, the cause unchanged")
    parser.add_argument("--cotenant-slices", default="", help="the co-tenants' slices, comma-separated")
    parser.add_argument("--cotenant-percent", default="", help="each co-tenant slice's cap; empty: uncapped")
    parser.add_argument("--headroom-percent", type=float, default=0.0)
    parser.add_argument("--container-slice", default="", help="the serving containers' slice")
    parser.add_argument("--cgroup-root", default="/sys/fs/cgroup", help="the host's cgroup tree")
    parser.add_argument("--kv-tier-bytes", type=int, default=0, help="serving.kvTier's CPU part (its /dev/shm region)")
    args = parser.parse_args(argv)
    cap = float(args.cotenant_percent) / 100 if args.cotenant_percent else None
    allowed: dict[str, Optional[float]] = {name: cap for name in args.cotenant_slices.split(",") if name}
    if args.container_slice:
        allowed[args.container_slice] = 0.0  # before load, nothing of the budget is the serving slice's yet
    files = release_page_cache(args.model_dir)
    said: tuple = ()  # (the cause, when) of the last WAIT line
    while True:
        held = {name: cgroup_held(args.cgroup_root, name) for name in allowed}
        result = verdict(meminfo(args.meminfo), args.utilization, held, allowed, args.headroom_percent / 100,
                         args.kv_tier_bytes)
        write_status(args.status, {"node": args.node, "checked_at": time.time(), "model_files_released": files,
                                   **result})
        if result["ok"] or not said or said[0] != result.get("cause") or time.monotonic() - said[1] >= args.say_seconds:
            print(f"{'ok  ' if result['ok'] else 'WAIT'} {args.node}: {result['message']}", flush=True)
            said = (result.get("cause"), time.monotonic())
        if result["ok"]:
            return 0
        time.sleep(args.retry_seconds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
