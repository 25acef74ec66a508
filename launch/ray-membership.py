#!/usr/bin/env python3
"""ray-membership.py — what the boot scripts ask the Ray cluster, through the head's state API.

  wait-cluster --head IP --expect-ips IP[,IP...]   (head) block until every node is alive with a GPU
  node-id --head IP --ip IP                         (worker) print this node's alive Ray NodeID
  watch --head IP --node-id ID                      (worker) return when this node must rejoin
  alive --head IP                                   (status) alive nodes with their GPUs, as JSON

`watch` exits 0 with the reason on stdout only on evidence: the NodeID is no longer alive in a
node table the head returned (the head restarted: a new GCS session never knows the old
raylet — recipe gotcha 11, where `ray status` keeps succeeding), the local raylet process is
gone, or the head is silent — its state API and its GCS port both — past the grace period.
A slow or frozen dashboard whose GCS still accepts connections (a busy head loading the
model) is not silence: the worker stays, for up to --dashboard-limit seconds.
"""

from __future__ import annotations

import argparse
import os
import socket
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


def gcs_accepts(args: argparse.Namespace) -> bool:
    """The head's GCS port takes a connection: the head is alive, whatever its dashboard does."""
    try:
        with socket.create_connection((args.head, args.gcs_port), timeout=2):
            return True
    except OSError:
        return False


def watch(args: argparse.Namespace) -> int:
    silent_since = unanswered_since = None  # head silent (both doors) / state API unanswered
    while True:
        if not raylet_running():
            print("local raylet is gone")
            return 0
        try:
            alive_ids = {n["node_id"] for n in alive_nodes(args)}
        except Exception as err:
            now = time.monotonic()
            unanswered_since = unanswered_since or now
            if gcs_accepts(args):
                silent_since = None
                if now - unanswered_since > args.dashboard_limit:
                    print(f"head {args.head}'s state API unanswered for {args.dashboard_limit:.0f} s while its GCS "
                          f"accepts ({type(err).__name__}): cannot check this node's membership")
                    return 0
            else:
                silent_since = silent_since or now
                if now - silent_since > args.grace:
                    print(f"head {args.head} unreachable for {args.grace:.0f} s: state API ({type(err).__name__}) "
                          f"and GCS port {args.gcs_port} both silent")
                    return 0
        else:
            silent_since = unanswered_since = None
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
    p.add_argument("--grace", type=float, default=6.0,
                   help="seconds the head may be silent (state API and GCS port) before this node rejoins")
    # The recipe's cold start loads 167 GB for ~8 min on a busy head; a dashboard that stays
    # unanswered longer, while the GCS accepts, leaves the membership unknowable.
    p.add_argument("--dashboard-limit", type=float, default=900.0,
                   help="seconds the state API may stay unanswered while the GCS accepts")
    gcs_port = os.environ.get("RAY_PORT")
    p.add_argument("--gcs-port", type=int, default=gcs_port, required=gcs_port is None)
    p.set_defaults(run=watch)
    p = sub.add_parser("alive", parents=[head])
    p.set_defaults(run=alive)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
