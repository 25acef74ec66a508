#!/usr/bin/env python3
"""pace.py — this machine's pace now, one line, so that runs on other days compare like with like.

  python3 dev/pace.py [DIR]   # pace: python 1.42 s, sha256 0.38 s, disk 0.91 s (one core each; lower is faster)
  python3 dev/pace.py --cpu-mark FILE    # the cores' counters now (/proc/stat), kept in FILE
  python3 dev/pace.py --cpu-since FILE   # cores since the mark: 91 % busy, 4 % stolen by the host, 5 % idle

Three fixed pieces of work, each on one core, like the simulator's own: a pure-Python loop (the
tests', the program's and Ray's interpreter), sha256 over 1 GiB (the weights' verification, in
C) and 256 MiB written to DIR (default build/) and fsynced (docker's layers, the engine's state).
The same 2-core box has run the same CI 1.5x apart in one day (docs/testing.md, "CI"): a stage's
minutes mean something only beside the pace of the run that gave them. scripts/test.sh prints it
at a run's start and end, and under them how busy the cores were over the run and how much of
their time the host gave to others (steal: this box is a VM). Only the standard library: it runs
before the .venv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

MIB = 1 << 20
HASHED_MIB = 1024
WRITTEN_MIB = 256
LOOP_ROUNDS = 10_000_000


def python_loop() -> int:
    total = 0
    for i in range(LOOP_ROUNDS):
        total += i * i % 7
    return total


def sha256_pass() -> None:
    block = os.urandom(MIB)
    digest = hashlib.sha256()
    for _ in range(HASHED_MIB):
        digest.update(block)


def disk_write(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".pace-{os.getpid()}"
    block = os.urandom(MIB)
    try:
        with open(path, "wb") as out:
            for _ in range(WRITTEN_MIB):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
    finally:
        path.unlink(missing_ok=True)


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


# /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal (guest time is inside user)
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_counters(stat_text: str) -> dict[str, int]:
    """The whole machine's jiffies by kind, from /proc/stat's text."""
    first = stat_text.splitlines()[0].split()
    if first[0] != "cpu":
        raise ValueError(f"not /proc/stat's text: its first line is {stat_text.splitlines()[0]!r}")
    return dict(zip(CPU_FIELDS, (int(v) for v in first[1:len(CPU_FIELDS) + 1]), strict=True))


def cpu_shares(before: dict[str, int], after: dict[str, int]) -> str:
    """Where the cores' time went between two readings: busy (this machine's work), stolen by the
    host, idle (iowait counted idle: nothing ran)."""
    spent = {kind: after[kind] - before[kind] for kind in CPU_FIELDS}
    total = sum(spent.values())
    if total <= 0:
        raise ValueError("the two readings are the same moment")
    idle = spent["idle"] + spent["iowait"]
    busy = total - idle - spent["steal"]
    return (f"cores since the mark: {100 * busy / total:.0f} % busy, {100 * spent['steal'] / total:.0f} % "
            f"stolen by the host, {100 * idle / total:.0f} % idle")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, default=Path("build"), help="where the disk figure writes")
    marks = parser.add_mutually_exclusive_group()
    marks.add_argument("--cpu-mark", type=Path, metavar="FILE", help="keep the cores' counters now in FILE")
    marks.add_argument("--cpu-since", type=Path, metavar="FILE", help="the cores' shares since FILE's counters")
    args = parser.parse_args(argv[1:])
    if args.cpu_mark:
        args.cpu_mark.parent.mkdir(parents=True, exist_ok=True)
        args.cpu_mark.write_text(Path("/proc/stat").read_text())
        return 0
    if args.cpu_since:
        print(cpu_shares(cpu_counters(args.cpu_since.read_text()), cpu_counters(Path("/proc/stat").read_text())))
        return 0
    folder = args.folder
    figures = {"python": timed(python_loop), "sha256": timed(sha256_pass), "disk": timed(lambda: disk_write(folder))}
    print("pace: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in figures.items())
          + " (one core each; lower is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
