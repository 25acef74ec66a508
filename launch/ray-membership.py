#!/usr/bin/env python3
"""ray-membership.py — what the boot scripts ask the Ray cluster, through the head's GCS itself.

  wait-cluster --head IP --expect-ips IP[,IP...]   (head) block until every node is alive with a GPU
  node-id --head IP --ip IP                         (worker) print this node's own alive Ray NodeID
  join --head IP -- ray start ...                   (worker) run `ray start`, stopped if the head restarts meanwhile
  watch --head IP --node-id ID                      (worker) return when this node must rejoin
  alive --head IP                                   (status) alive nodes with their GPUs, as JSON

Every question goes to the GCS's node table (Ray's own GcsClient, as `ray status` uses it, with
the cluster's token from RAY_AUTH_MODE/RAY_AUTH_TOKEN_PATH), never to the dashboard: a dashboard
that is slow, frozen or dead says nothing about membership, and is no reason to leave.

`node-id` prints the NodeID of the raylet running here, read from that raylet's own command line
(`--node_id`, the flag Ray's own find_node_ids reads), once the GCS lists it alive. The GCS may list
two nodes at this IP — a crashed raylet stays ALIVE until its health checks run out, ~15 s —
and only the raylet's own identity tells which is this one.

`join` runs the worker's `ray start` and kills it (exit JOINED_A_RESTARTED_HEAD) the moment the
head's GCS answers with another cluster ID than the one it had when the join began: the head
restarted meanwhile (a crash loop: vLLM fails right after the cluster forms). `ray start` itself
would wait 30 s for its raylet's entry in the GCS that died (Ray's node.py, fixed) and fail; the
worker then joins the new head at once instead of half a minute later.

`watch` leaves (prints the reason, exits 0) only on evidence: this NodeID is missing from a node
table the GCS returned (the head restarted: a new GCS session never knows the old raylet —
recipe gotcha 11, where `ray status` keeps succeeding), the raylet with this NodeID is gone, or
the GCS has answered nothing for --grace seconds, counted from its last answer. The GCS is asked
in the background, so a call that hangs (a frozen head) cannot stretch the grace.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

# Seconds one node-table request may take: the GCS answers in milliseconds, and the watch's
# grace is counted from the last answer, not from this.
REQUEST_TIMEOUT_S = 2.0
# How long the head's GCS may answer nothing before a worker rejoins (TWINSPARK_HEAD_GRACE_S
# overrides it): longer than a GC pause or a busy second, far shorter than Ray's own 60 s
# reconnect limit, after which the raylet gives up anyway.
HEAD_GRACE_S = 6.0
# `join`'s exit status when it stopped a `ray start` whose head restarted: join again at once
# (boot-worker.sh); EX_TEMPFAIL, which neither `ray start` nor `timeout` exits with
JOINED_A_RESTARTED_HEAD = 75


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} ray-membership: {message}", file=sys.stderr, flush=True)


def gcs_client(args: argparse.Namespace):
    """A client of the head's GCS; the token comes from the environment, as for `ray start`.
    Making one waits (tens of seconds) for a GCS that does not answer: callers that must keep
    time make it in the background."""
    from ray._raylet import GcsClient

    return GcsClient(address=f"{args.head}:{args.gcs_port}")


def alive_nodes(client) -> list[dict]:
    """The GCS's alive nodes; raises when it does not answer within REQUEST_TIMEOUT_S."""
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    # filtered here, not by the call's state_filter, which older Rays' client does not take
    infos = client.get_all_node_info(timeout=REQUEST_TIMEOUT_S)
    return [{"node_id": node_id.hex(), "node_ip": info.node_manager_address,
             "gpus": float(info.resources_total.get("GPU", 0))}
            for node_id, info in infos.items() if info.state == GcsNodeInfo.GcsNodeState.ALIVE]


def local_raylets() -> dict[str, str]:
    """NodeID -> IP of each raylet process this machine (the container) runs, from its own
    command line: the identity Ray gave it when it started. A zombie has no command line."""
    raylets = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) != "raylet":
            continue
        flags = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
        if "node_id" in flags:
            raylets[flags["node_id"]] = flags.get("node_ip_address", "")
    return raylets


def wait_cluster(args: argparse.Namespace) -> int:
    expected = [ip for ip in args.expect_ips.split(",") if ip]
    last_report, client = 0.0, None
    while True:
        try:
            client = client or gcs_client(args)
            ready = {n["node_ip"] for n in alive_nodes(client) if n["gpus"] >= 1}
        except Exception as err:  # the GCS still starting
            ready, problem, client = set(), f"GCS not answering yet ({type(err).__name__})", None
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
    """Called once `ray start` has returned, which it does only after the GCS it joined listed
    the new raylet: a GCS that answers without it for --unlisted-s is another head (the one it
    joined died meanwhile, as in a crash loop), and waiting out --timeout cannot bring it back."""
    deadline = time.monotonic() + args.timeout
    client, mine, alive_here, unlisted_since = None, [], [], None
    while time.monotonic() < deadline:
        mine = [nid for nid, ip in local_raylets().items() if ip == args.ip]
        try:
            client = client or gcs_client(args)
            alive_here = [n["node_id"] for n in alive_nodes(client) if n["node_ip"] == args.ip]
        except Exception:
            client, alive_here = None, []
        else:
            listed = any(nid in alive_here for nid in mine)
            unlisted_since = None if listed else (unlisted_since or time.monotonic())
            if unlisted_since is not None and time.monotonic() - unlisted_since >= args.unlisted_s:
                log(f"the head's GCS has not listed a raylet here for {args.unlisted_s:.0f} s (raylets here with "
                    f"IP {args.ip}: {mine or 'none'}; alive at that IP: {alive_here or 'none'}): the head it "
                    "joined is gone")
                return 1
        # one raylet here (an old one is still exiting when there are two), and the GCS knows it
        if len(mine) == 1 and mine[0] in alive_here:
            print(mine[0])
            return 0
        time.sleep(1)
    log(f"after {args.timeout:.0f} s: raylets here with IP {args.ip}: {mine or 'none'}; "
        f"alive at that IP in the head's GCS: {alive_here or 'none'}")
    return 1


def cluster_id(args: argparse.Namespace) -> str:
    """The cluster ID of the GCS answering at the head now (a new one each time a head starts)."""
    return gcs_client(args).cluster_id.hex()


def join(args: argparse.Namespace) -> int:
    """Runs the command after `--` (the worker's `ray start`) in a session of its own; kills that
    session when the head's GCS answers with another cluster ID than at the start."""
    if not args.command or args.command[0] != "--" or len(args.command) < 2:
        log("join: give the command to run after --")
        return 2
    deadline, joining = time.monotonic() + args.timeout, None
    while joining is None:
        try:
            joining = cluster_id(args)
        except Exception as err:  # the GCS still starting
            if time.monotonic() > deadline:
                log(f"the head's GCS at {args.head}:{args.gcs_port} answered nothing in {args.timeout:.0f} s "
                    f"({type(err).__name__})")
                return 1
            time.sleep(args.interval)
    start = subprocess.Popen(args.command[1:], start_new_session=True)
    changed: list[str] = []

    def ask() -> None:  # in the background: a client of a GCS that does not answer waits long
        while start.poll() is None and not changed:
            try:
                now = cluster_id(args)
            except Exception:
                now = joining  # no answer is not another head; `ray start` keeps its own time
            if now != joining:
                changed.append(now)
            time.sleep(args.interval)

    threading.Thread(target=ask, daemon=True).start()
    while start.poll() is None:
        if changed:
            log(f"the head restarted while this node joined (cluster {joining[:12]} is now {changed[0][:12]}): "
                "stopping this `ray start` to join the new head")
            os.killpg(start.pid, signal.SIGKILL)  # ray start and the daemons it spawned
            start.wait()
            return JOINED_A_RESTARTED_HEAD
        time.sleep(0.1)
    return start.returncode


class NodeTable(threading.Thread):
    """Asks the head's GCS for its alive nodes every `interval`, keeping the last answer and
    when it came. A client is made again after any failure: after a head restart the old one
    is refused for good (the new GCS has another cluster ID), a new one reads the new table."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(daemon=True)
        self.args, self.lock = args, threading.Lock()
        self.answered_at = time.monotonic()  # node-id read this node alive just before
        self.alive_ids: set[str] | None = None
        self.error = "no answer yet"

    def run(self) -> None:
        client = None
        while True:
            asked = time.monotonic()
            try:
                client = client or gcs_client(self.args)
                ids = {n["node_id"] for n in alive_nodes(client)}
            except Exception as err:
                client = None
                with self.lock:
                    self.error = f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
            else:
                with self.lock:
                    self.answered_at, self.alive_ids = time.monotonic(), ids
            time.sleep(max(0.0, self.args.interval - (time.monotonic() - asked)))

    def last(self) -> tuple[float, set[str] | None, str]:
        with self.lock:
            return self.answered_at, self.alive_ids, self.error


def leave(reason: str) -> int:
    print(reason, flush=True)
    # the table's thread may sit in a call to an unanswering GCS: exit without waiting for it
    os._exit(0)


def watch(args: argparse.Namespace) -> int:
    table = NodeTable(args)
    table.start()
    next_raylet_check = 0.0
    while True:
        now = time.monotonic()
        if now >= next_raylet_check:
            if args.node_id not in local_raylets():
                return leave(f"local raylet {args.node_id[:12]} is gone")
            next_raylet_check = now + args.interval
        answered_at, alive_ids, error = table.last()
        if alive_ids is not None and args.node_id not in alive_ids:
            return leave(f"node {args.node_id[:12]} is not alive in the head's GCS (head restarted?)")
        silent = now - answered_at
        if silent >= args.grace:
            return leave(f"head {args.head} unreachable: its GCS answered nothing for {silent:.1f} s "
                         f"(grace {args.grace:g} s; last error {error})")
        # wake at the grace's end, not up to a whole interval after it
        time.sleep(max(0.02, min(next_raylet_check - now, args.grace - silent)))


def gcs_accepts(args: argparse.Namespace) -> bool:
    """Whether anything takes a connection at the GCS's port: a GcsClient waits tens of seconds
    for one that does not, which `ops status` must not (the head waiting for memory, or down)."""
    try:
        socket.create_connection((args.head, args.gcs_port), timeout=REQUEST_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def alive(args: argparse.Namespace) -> int:
    import json

    if not gcs_accepts(args):
        log(f"nothing takes a connection at the head's GCS, {args.head}:{args.gcs_port}: Ray is not running there")
        return 1
    print(json.dumps(alive_nodes(gcs_client(args))))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    head = argparse.ArgumentParser(add_help=False)
    head.add_argument("--head", required=True, help="the head's Ray IP")
    # twinspark.env sets RAY_PORT for the boot scripts; `ops status` passes the flag
    port = os.environ.get("RAY_PORT")
    head.add_argument("--gcs-port", type=int, default=port, required=port is None, help="the head's GCS port")
    p = sub.add_parser("wait-cluster", parents=[head])
    p.add_argument("--expect-ips", required=True)
    # vLLM starts the moment the last node is seen: a GCS node-table read every half second on
    # the head, for the few seconds the workers take to join, is nothing
    p.add_argument("--interval", type=float, default=0.5, help="seconds between two node-table requests")
    p.add_argument("--report-every", type=float, default=30.0)
    p.set_defaults(run=wait_cluster)
    p = sub.add_parser("node-id", parents=[head])
    p.add_argument("--ip", required=True)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a GCS that answers nothing")
    p.add_argument("--unlisted-s", type=float, default=5.0,
                   help="seconds an answering GCS may leave this node's raylet out before it is another head's")
    p.set_defaults(run=node_id)
    p = sub.add_parser("join", parents=[head])
    p.add_argument("--interval", type=float, default=0.5, help="seconds between two cluster ID requests")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the head's GCS to answer")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- ray start ...")
    p.set_defaults(run=join)
    p = sub.add_parser("watch", parents=[head])
    p.add_argument("--node-id", required=True)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between two node-table requests")
    p.add_argument("--grace", type=float, default=HEAD_GRACE_S,
                   help="seconds the head's GCS may answer nothing, from its last answer, before this node rejoins")
    p.set_defaults(run=watch)
    p = sub.add_parser("alive", parents=[head])
    p.set_defaults(run=alive)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
