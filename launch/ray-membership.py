#!/usr/bin/env python3
"""ray-membership.py — what the boot scripts ask the Ray cluster, through the head's state API.

  wait-cluster --head IP --expect-ips IP[,IP...]   (head) block until every node is alive with a GPU
  node-id --head IP --ip IP                         (worker) print this node's alive Ray NodeID
  watch --head IP --node-id ID                      (worker) return when this node must rejoin
  alive --head IP                                   (status) alive nodes with their GPUs, as JSON

`watch` exits 0 with the reason on stdout when: the NodeID is no longer alive in the GCS node
table (the head restarted: a new GCS session never knows the old raylet — recipe gotcha 11,
where `ray status` keeps succeeding), the head stays unreachable past the grace period, or
the local raylet process is gone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} ray-membership: {message}", file=sys.stderr, flush=True)


def alive_nodes(args: argparse.Namespace) -> list[dict]:
    """Alive nodes as the head's GCS sees them; raises when the head cannot be asked."""
    from ray.util.state import list_nodes

    nodes = list_nodes(
        address=f"http://{args.head}:{args.dashboard_port}",
        filters=[("state", "=", "ALIVE")],
        limit=1000,
        timeout=5,
        raise_on_missing_output=False,
    )
    return [n if isinstance(n, dict) else n.__dict__ for n in nodes]


def gpus(node: dict) -> float:
    return float((node.get("resources_total") or {}).get("GPU", 0))


def wait_cluster(args: argparse.Namespace) -> int:
    expected = [ip for ip in args.expect_ips.split(",") if ip]
    last_report = 0.0
    while True:
        try:
            ready = {n["node_ip"] for n in alive_nodes(args) if gpus(n) >= 1}
        except Exception as err:  # dashboard still starting
            ready, problem = set(), f"state API not answering yet ({type(err).__name__})"
        else:
            problem = ""
        missing = [ip for ip in expected if ip not in ready]
        if not missing:
            log(f"all {len(expected)} nodes alive with a GPU: {', '.join(expected)}")
            return 0
        if time.monotonic() - last_report >= args.report_every:
            log(f"{len(expected) - len(missing)}/{len(expected)} nodes with a GPU; waiting for {', '.join(missing)} {problem}")
            last_report = time.monotonic()
        time.sleep(args.interval)


def node_id(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            mine = [n for n in alive_nodes(args) if n["node_ip"] == args.ip]
        except Exception:
            mine = []
        if mine:
            print(mine[-1]["node_id"])
            return 0
        time.sleep(1)
    log(f"no alive Ray node with IP {args.ip} after {args.timeout:.0f} s")
    return 1


def raylet_running() -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as comm:
                    if comm.read().strip() == "raylet":
                        return True
            except OSError:
                continue
    return False


def watch(args: argparse.Namespace) -> int:
    unreachable_since = None
    while True:
        if not raylet_running():
            print("local raylet is gone")
            return 0
        try:
            alive_ids = {n["node_id"] for n in alive_nodes(args)}
        except Exception as err:
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > args.grace:
                print(f"head {args.head} unreachable for {args.grace:.0f} s ({type(err).__name__})")
                return 0
        else:
            unreachable_since = None
            if args.node_id not in alive_ids:
                print(f"node {args.node_id[:12]} is not alive in the head's GCS (head restarted?)")
                return 0
        time.sleep(args.interval)


def alive(args: argparse.Namespace) -> int:
    import json

    nodes = alive_nodes(args)
    print(json.dumps([{"node_id": n["node_id"], "node_ip": n["node_ip"], "gpus": gpus(n)} for n in nodes]))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    head = argparse.ArgumentParser(add_help=False)
    head.add_argument("--head", required=True, help="the head's Ray IP")
    # twinspark.env sets RAY_DASHBOARD_PORT for the boot scripts; `ops status` passes the flag
    port = os.environ.get("RAY_DASHBOARD_PORT")
    head.add_argument("--dashboard-port", type=int, default=port, required=port is None)
    p = sub.add_parser("wait-cluster", parents=[head])
    p.add_argument("--expect-ips", required=True)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--report-every", type=float, default=30.0)
    p.set_defaults(run=wait_cluster)
    p = sub.add_parser("node-id", parents=[head])
    p.add_argument("--ip", required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(run=node_id)
    p = sub.add_parser("watch", parents=[head])
    p.add_argument("--node-id", required=True)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--grace", type=float, default=6.0)
    p.set_defaults(run=watch)
    p = sub.add_parser("alive", parents=[head])
    p.set_defaults(run=alive)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
