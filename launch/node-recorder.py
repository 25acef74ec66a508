#!/usr/bin/env python3
"""node-recorder.py — what a node that froze or lost power leaves behind, kept (stdlib only, root).

    node-recorder.py boot    --dir /var/lib/twinspark/forensics [--hold FILE] [--journalctl journalctl]
                             [--pstore /sys/fs/pstore --pstore /var/lib/systemd/pstore]   (ExecStartPre)
    node-recorder.py record  --dir ... [--interval 15]                                    (ExecStart)
    node-recorder.py list    --dir ...          the reports, newest first, as JSON
    node-recorder.py show    --dir ... NAME     one report, as JSON
    node-recorder.py release --dir ... [--hold FILE]   the fabric and NCCL checks passed again

`boot`, before docker starts (the unit is ordered so): when the previous boot did not end by this
service's own stop (a clean shutdown stops it last and it writes the mark), that boot ended in a
freeze, a panic or a power cut. Then it keeps in reports/NAME.json the previous boot's kernel log
(journald's, `journalctl -k -b -1`), what pstore kept of a panic, the GPU's Xid lines and the OOM
kills in them, and the last memory picture `record` wrote before the end, with a one-line
summary, and marks the node pending re-qualification: with --hold it writes the hold file the
boot scripts wait on (contract.UNCLEAN_BOOT_HOLD), so the node joins serving only after the head's
guard ran the fabric and NCCL checks again and `release`d it.

`record` writes the memory picture (MemAvailable, swap, PSI, what each top-level slice holds)
every --interval seconds while the node runs — the one thing of a freeze that no log keeps — and
on SIGTERM (systemd's stop, at a clean shutdown) the clean mark of this boot.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

XID = re.compile(r"NVRM: Xid")
OOM = re.compile(r"Out of memory|oom-kill|invoked oom-killer")
PANIC = re.compile(r"Kernel panic|BUG: |Oops|hung_task|soft lockup|hard LOCKUP")
KERNEL_LOG_TAIL = 200
MEMINFO_FIELDS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree", "Shmem", "Mlocked")
SLICES = ("twinspark.slice", "system.slice", "user.slice")


def write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    """Root's records in a root-only folder; the hold (mode 0644) in /run/twinspark, which the login
    (`twinspark status`, the worker's `look`) reads too: made as docker would make it."""
    path.parent.mkdir(mode=0o700 if mode == 0o600 else 0o755, parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    part.chmod(mode)
    part.replace(path)


def read_json(path: Path) -> Optional[dict]:
    try:
        value = json.loads(path.read_text())
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"  # the kernel's, new at every boot (a test names its own)


def boot_id() -> str:
    return Path(os.environ.get("TWINSPARK_BOOT_ID_FILE", BOOT_ID_FILE)).read_text().strip()


# ---- the memory picture ----------------------------------------------------------------------
def memory_picture(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> dict:
    fields: dict[str, int] = {}
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in MEMINFO_FIELDS:
                fields[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    pressure = {}
    try:
        for line in (proc / "pressure" / "memory").read_text().splitlines():
            kind, *pairs = line.split()
            pressure[kind] = dict(p.split("=", 1) for p in pairs)
    except (OSError, ValueError):
        pass
    slices = {}
    for name in SLICES:
        try:
            slices[name] = int((cgroup / name / "memory.current").read_text())
        except (OSError, ValueError):
            continue
    return {"at": round(time.time(), 1), "boot_id": boot_id(), "meminfo_bytes": fields, "pressure": pressure,
            "slices_bytes": slices}


def record(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    this_boot = boot_id()
    (folder / "clean-shutdown").unlink(missing_ok=True)  # running again in this boot: no end yet

    def stop(*_):
        write_atomically(folder / "clean-shutdown", this_boot + "\n")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        write_atomically(folder / "memory-last.json", json.dumps(memory_picture()) + "\n")
        time.sleep(args.interval)


# ---- the boot: clean or not ------------------------------------------------------------------
def previous_kernel_log(journalctl: str) -> tuple[list[str], Optional[str]]:
    """The previous boot's kernel lines, or why there are none."""
    try:
        done = subprocess.run([journalctl, "-k", "-b", "-1", "--no-pager", "-o", "short-iso"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"{journalctl}: {err}"
    if done.returncode != 0:
        return [], ((done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}") + \
            " (journald keeps the previous boot only where /var/log/journal exists: Storage=persistent)"
    return done.stdout.splitlines(), None


def pstore_files(dirs: list[str], since: float) -> list[dict]:
    """What pstore (or systemd-pstore's copy of it) kept of the previous boot's end."""
    found = []
    for folder in dirs:
        for path in sorted(Path(folder).rglob("*")) if Path(folder).is_dir() else []:
            try:
                if not path.is_file() or path.stat().st_mtime < since:
                    continue
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            found.append({"path": str(path), "tail": lines[-100:]})
    return found


def judge(kernel: list[str], pstore: list[dict], memory: Optional[dict]) -> tuple[str, list[str], int]:
    """(the likely cause in words, the Xid lines, the OOM kills) from what the boot left."""
    lines = kernel + [line for f in pstore for line in f["tail"]]
    xids = [line for line in lines if XID.search(line)]
    ooms = sum(1 for line in lines if OOM.search(line))
    panics = [line for line in lines if PANIC.search(line)]
    mem = (memory or {}).get("meminfo_bytes", {})
    if xids:
        cause = f"the GPU driver reported {len(xids)} Xid event(s), the first: {xids[0].strip()[-200:]}"
    elif panics:
        cause = f"the kernel reported: {panics[0].strip()[-200:]}"
    elif mem.get("MemTotal") and mem.get("MemAvailable", 0) < mem["MemTotal"] * 0.03:
        cause = (f"memory nearly exhausted at the last picture ({mem['MemAvailable'] / 2**30:.1f} GiB available of "
                 f"{mem['MemTotal'] / 2**30:.1f}): unified memory ran out and the box stopped answering")
    elif ooms:
        cause = f"{ooms} OOM kill(s) before the end"
    else:
        cause = "no trace in the kernel log, pstore or the memory picture: a freeze below the kernel's reach or a power cut"
    return cause, xids[:50], ooms


def collect(previous: dict, args: argparse.Namespace) -> dict:
    folder = Path(args.dir)
    kernel, kernel_missing = previous_kernel_log(args.journalctl)
    pstore = pstore_files(args.pstore, previous.get("started_at", 0))
    memory = read_json(folder / "memory-last.json")
    if memory and memory.get("boot_id") != previous.get("boot_id"):
        memory = None  # an older boot's picture says nothing of this end
    cause, xids, ooms = judge(kernel, pstore, memory)
    last_sign = memory["at"] if memory else None
    return {
        "node": args.node, "found_at": round(time.time(), 1), "previous_boot": previous,
        "last_memory_picture_at": last_sign, "cause": cause,
        "summary": (f"the boot started {iso(previous.get('started_at'))} did not shut down cleanly"
                    + (f" (last sign of life {iso(last_sign)})" if last_sign else "") + f": {cause}"),
        "xid_lines": xids, "oom_kills": ooms,
        "kernel_log_tail": kernel[-KERNEL_LOG_TAIL:], "kernel_log_missing": kernel_missing,
        "pstore": pstore, "memory_picture": memory, "requalified_at": None,
    }


def iso(stamp: Optional[float]) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp)) if stamp else "at an unknown time"


def boot(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = boot_id()
    previous = read_json(folder / "boot.json")
    if previous and previous.get("boot_id") != now:
        clean = (folder / "clean-shutdown").read_text().strip() if (folder / "clean-shutdown").exists() else ""
        if clean != previous["boot_id"]:
            report = collect(previous, args)
            name = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + previous["boot_id"][:8]
            write_atomically(folder / "reports" / f"{name}.json", json.dumps(report, indent=1) + "\n")
            write_atomically(Path(args.pending), name + "\n")
            print(f"node-recorder: {report['summary']} (report {name})", flush=True)
        (folder / "clean-shutdown").unlink(missing_ok=True)
    if not previous or previous.get("boot_id") != now:
        write_atomically(folder / "boot.json", json.dumps({"boot_id": now, "started_at": round(time.time(), 1)}) + "\n")
    pending = Path(args.pending)
    if args.hold and pending.exists():  # /run is new at each boot: put the hold back while re-qualification is owed
        name = pending.read_text().strip()
        write_atomically(Path(args.hold), f"unclean boot ({name}): held out of serving until the fabric and NCCL "
                                          "checks pass again\n", mode=0o644)
    return 0


def reports(folder: Path) -> list[tuple[str, dict]]:
    found = []
    for path in sorted((folder / "reports").glob("*.json"), reverse=True):
        report = read_json(path)
        if report is not None:
            found.append((path.stem, report))
    return found


def list_reports(args: argparse.Namespace) -> int:
    pending = Path(args.pending).read_text().strip() if Path(args.pending).exists() else None
    print(json.dumps({"pending_requalification": pending, "reports": [
        {"name": name, "found_at": r.get("found_at"), "summary": r.get("summary"), "xid": len(r.get("xid_lines", [])),
         "oom_kills": r.get("oom_kills"), "requalified_at": r.get("requalified_at")}
        for name, r in reports(Path(args.dir))]}))
    return 0


def show(args: argparse.Namespace) -> int:
    names = dict(reports(Path(args.dir)))
    if args.name not in names:
        print(f"node-recorder: no report {args.name!r}; the reports: {', '.join(names) or 'none'}", file=sys.stderr)
        return 2
    print(json.dumps(names[args.name], indent=1))
    return 0


def release(args: argparse.Namespace) -> int:
    pending = Path(args.pending)
    if pending.exists():
        name = pending.read_text().strip()
        path = Path(args.dir) / "reports" / f"{name}.json"
        report = read_json(path)
        if report is not None:
            report["requalified_at"] = round(time.time(), 1)
            write_atomically(path, json.dumps(report, indent=1) + "\n")
        pending.unlink(missing_ok=True)
        print(f"node-recorder: released after {name}: the fabric and NCCL checks passed")
    if args.hold:
        Path(args.hold).unlink(missing_ok=True)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("boot", "record", "list", "show", "release"))
    parser.add_argument("name", nargs="?", help="show: the report")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--node", default=os.uname().nodename)
    parser.add_argument("--pending", help="the record that re-qualification is owed (default: DIR/pending-requalification)")
    parser.add_argument("--hold", help="the file the boot scripts wait on while re-qualification is owed")
    parser.add_argument("--journalctl", default="journalctl")
    parser.add_argument("--pstore", action="append", default=[])
    parser.add_argument("--interval", type=float, default=15.0)
    args = parser.parse_args(argv)
    args.pending = args.pending or f"{args.dir}/pending-requalification"
    args.pstore = args.pstore or ["/sys/fs/pstore", "/var/lib/systemd/pstore"]
    if args.mode == "show" and not args.name:
        parser.error("show needs the report's NAME (`list` names them)")
    return {"boot": boot, "record": record, "list": list_reports, "show": show, "release": release}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
