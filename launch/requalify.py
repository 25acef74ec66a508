#!/usr/bin/env python3
"""requalify.py — the fabric re-qualified while serving is drained (stdlib only).

    requalify.py run --plan /usr/local/lib/twinspark/requalify/plan.json         (the head's guard)
    requalify.py peers-look --plan /usr/local/lib/twinspark/requalify/plan.json  (the head's guard)
    requalify.py forced --plan /usr/local/lib/twinspark/requalify/plan.json      (a worker, by sshd)

`run` (the serving guard, on the head, after it drained and stopped serving) runs every node's
fabric check (launch/fabric-check.sh, with the flags `pulumi up` ran it with), then, when all
pass, every node's rank of the NCCL check (launch/nccl-check.sh and nccl-allreduce-check.py, the
same run as `up`'s: the serving image, the bundle's environment, the bus-bandwidth floor and
"IB, not Socket"): this node's here, each worker's over SSH with the head's re-qualification key.
It prints each node's lines with the node's name in front and exits 0 only when every check passed.

`peers-look` (the guard, every 5 min while serving) asks each worker for a `look` at its own
rails — link, speed, MTU, RoCE port, error counters, the HCA's PCIe link and AER (fabric_watch.py,
beside the checks) — and prints {worker: {"rails": [...]}} or {worker: {"error": ...}} as JSON: the
head sees a worker's rail go down even where its own end stays up (a switch), and a worker's
throttled HCA.

When every check passed, `run` ends with `release` on every node: the node recorder's (launch/
node-recorder.py) hold on a node that booted uncleanly is lifted, and that node joins serving again.
A worker's `look` says whether it is so held ("unclean_boot"), and the guard re-qualifies at once.

`forced` is that key's forced command on a worker (components/fabric_requalify.py renders the
authorization): the client's request (SSH_ORIGINAL_COMMAND) may name `fabric`, `nccl-rank`, `look` or
`release` and nothing else; the flags are this node's plan's, fixed when the plan was installed.

A plan: {"node": NAME, "fabric": [fabric-check.sh flags], "nccl": [nccl-check.sh flags],
"release": [the node recorder's release argv], "unclean_boot_hold": FILE,
"peers": [{"node": NAME, "address": RAIL IP}], "user": SSH USER, "key": KEY, "known_hosts": FILE}
(peers, user, key and known_hosts on the head only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKS_DIR = HERE / "requalify"  # fabric-check.sh, nccl-check.sh, prelude.sh, nccl-allreduce-check.py, fabric_watch.py
VERBS = ("fabric", "nccl-rank", "look", "release")
# a look holds up the guard's loop (its canary) for as long as it takes: a worker that is down (a
# reboot) costs it a few seconds, not the re-qualification's patience
LOOK_CONNECT_TIMEOUT_S, LOOK_TIMEOUT_S = 3, 8
TIMEOUT_S = 1500  # nccl-check.sh's own timeout (1200 s) and the roll call's


def local_command(plan: dict, verb: str) -> tuple[list[str], bytes]:
    """argv and stdin of this node's half of `verb`."""
    if verb == "release":  # the node recorder's, as root: the unclean boot's hold and its pending record
        return ["sudo", "-n", *plan["release"]], b""
    if verb == "fabric":
        return ["bash", str(CHECKS_DIR / "fabric-check.sh"), *plan["fabric"]], b""
    return (["bash", str(CHECKS_DIR / "nccl-check.sh"), *plan["nccl"]],
            (CHECKS_DIR / "nccl-allreduce-check.py").read_bytes())


def peer_command(plan: dict, peer: dict, verb: str, connect_timeout_s: int = 10) -> tuple[list[str], bytes]:
    """A worker's half: ssh with the re-qualification key; its forced command picks the flags."""
    return ["ssh", "-i", os.path.expanduser(plan["key"]), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={os.path.expanduser(plan['known_hosts'])}", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={connect_timeout_s}", f"{plan['user']}@{peer['address']}", verb], b""


def run_one(node: str, argv: list[str], stdin: bytes) -> tuple[str, int, str]:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, timeout=TIMEOUT_S)
        said = (done.stdout + done.stderr).decode("utf-8", "replace")
        return node, done.returncode, said
    except subprocess.TimeoutExpired:
        return node, 124, f"no answer within {TIMEOUT_S} s"
    except OSError as err:
        return node, 127, f"{argv[0]}: {err}"


def everywhere(plan: dict, verb: str) -> bool:
    """`verb` on this node and every peer at once (the NCCL ranks must run together); each
    node's lines printed with its name, the failures' last lines again at the end."""
    jobs = [(plan["node"], *local_command(plan, verb))]
    jobs += [(peer["node"], *peer_command(plan, peer, verb)) for peer in plan.get("peers", [])]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: run_one(*job), jobs))
    for node, _, said in results:
        for line in said.strip().splitlines():
            print(f"{node} {verb}: {line}", flush=True)
    failed = [(node, status, said) for node, status, said in results if status != 0]
    for node, status, said in failed:
        # the first failures: a rail down fails its speed, RoCE and pings after its link, which says why
        first = [line for line in said.strip().splitlines() if "FAIL" in line][:4] or said.strip().splitlines()[-2:]
        print(f"FAIL {node} {verb} (exit {status}): " + " | ".join(first), flush=True)
    return not failed


def run(plan: dict) -> int:
    if not everywhere(plan, "fabric"):
        return 1
    if plan["nccl"] and not everywhere(plan, "nccl-rank"):  # no flags: fabric.minBusBandwidthGBps 0, no NCCL check
        return 1
    # every node passed: a node held out of serving since an unclean boot may serve again
    return 0 if "release" not in plan or everywhere(plan, "release") else 1


def look(plan: dict) -> dict:
    """This node's rails as the guard's fabric watch reads them (fabric_watch.py beside the checks)."""
    sys.path.insert(0, str(CHECKS_DIR))
    import fabric_watch
    rails = fabric_watch.rails_of_fabric_check(plan["fabric"])
    # "sys_root": a test's staged sysfs; the program's plans name none
    root = Path(plan.get("sys_root", "/sys"))
    return {"node": plan["node"], "rails": [fabric_watch.reading_record(fabric_watch.read_rail(r, root)) for r in rails],
            "unclean_boot": fabric_watch.unclean_boot(plan.get("unclean_boot_hold"))}


def peers_look(plan: dict) -> dict:
    """Every worker's `look`, at once: {node: its look, or {"error": why}}."""
    def one(peer: dict) -> tuple[str, dict]:
        argv, _ = peer_command(plan, peer, "look", LOOK_CONNECT_TIMEOUT_S)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=LOOK_TIMEOUT_S)
            if done.returncode == 0:
                return peer["node"], json.loads(done.stdout)
            return peer["node"], {"error": (done.stderr or done.stdout).strip()[-300:] or f"exit {done.returncode}"}
        except (OSError, subprocess.TimeoutExpired, ValueError) as err:
            return peer["node"], {"error": f"{type(err).__name__}: {err}"}

    peers = plan.get("peers", [])
    with ThreadPoolExecutor(max_workers=max(1, len(peers))) as pool:
        return dict(pool.map(one, peers))


def forced(plan: dict) -> int:
    verb = os.environ.get("SSH_ORIGINAL_COMMAND", "").strip()
    if verb not in VERBS:
        print(f"requalify: refused {verb[:80]!r}: this key may run only {', '.join(VERBS)}", file=sys.stderr)
        return 2
    if verb == "look":
        print(json.dumps(look(plan)))
        return 0
    argv, stdin = local_command(plan, verb)
    done = subprocess.run(argv, input=stdin, timeout=TIMEOUT_S)
    return done.returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("run", "peers-look", "forced"))
    parser.add_argument("--plan", required=True)
    args = parser.parse_args(argv)
    try:
        plan = json.loads(Path(args.plan).read_text())
    except (OSError, ValueError) as err:
        print(f"requalify: cannot read the plan {args.plan}: {err}", file=sys.stderr)
        return 2
    if args.mode == "peers-look":
        print(json.dumps(peers_look(plan)))
        return 0
    return run(plan) if args.mode == "run" else forced(plan)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
