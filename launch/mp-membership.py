#!/usr/bin/env python3
"""mp-membership.py — serving.executor mp's rank watch, in place of Ray's membership (ray-membership.py).

  head --port P --workers IP[,IP...] --target-pid PID [--grace S]
      (head) wait until every worker rank holds a connection to rank 0's TCPStore on port P,
      then, once one has none for --grace seconds, SIGTERM PID (vLLM, PID 1 after the boot
      script's exec) and print why: its process group lost a rank and cannot take it back.
  alive --head IP --port P --workers IP[,IP...]
      (head, for ops status) the node ranks joined to rank 0, as JSON.
  worker --head IP --port P --pid PID [--grace S]
      (worker) return (print the reason, exit 0) when this node's headless vLLM must be restarted:
      PID has exited, its connection to the head's TCPStore is no longer established (rank 0
      ended: the head restarted), or the head's port has accepted nothing for --grace seconds
      (the head is down; a connection of a host that vanished stays ESTABLISHED).

Why a watch at all: vLLM's headless worker does not leave when the head goes away — its
busy loop reads the head's message queue with no timeout (vllm/v1/executor/multiproc_executor.py,
WorkerProc.worker_busy_loop: dequeue(indefinite=True); vllm-project/vllm#32136) — and the head's
engine learns of a dead worker only when its next collective fails or times out.

The evidence is the kernel's own table of TCP connections (/proc/net/tcp, tcp6): every rank's
torch.distributed TCPStore client keeps one connection to rank 0's store (the master port) for
the process group's life. Standard library only: it runs in the serving image as it is.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import sys
import time

POLL_S = 1.0
# How long evidence must hold before a rank leaves: longer than a busy second, far shorter than
# torch's own 600 s init timeout (vllm/config/parallel.py distributed_timeout_seconds).
GRACE_S = 6.0
PROBE_TIMEOUT_S = 2.0
ESTABLISHED, CLOSE_WAIT, LISTEN = "01", "08", "0A"  # include/net/tcp_states.h
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} mp-membership: {message}", file=sys.stderr, flush=True)


def _address(hex_address: str) -> tuple[str, int]:
    """'0100007F:1F90' (little-endian words, as the kernel prints them) -> ('127.0.0.1', 8080)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:  # a dual-stack listener's IPv4 peer
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def tcp_rows(tables=TCP_TABLES):
    """Each socket row of the kernel's TCP tables, split: [sl, local, remote, state, ...]."""
    for table in tables:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        yield from (row.split() for row in rows if len(row.split()) > 3)


def established(tables=TCP_TABLES) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """Every established TCP connection of this network namespace: (local, remote) address pairs."""
    return [(_address(f[1]), _address(f[2])) for f in tcp_rows(tables) if f[3] == ESTABLISHED]


def workers_connected(port: int, workers: list[str], tables=TCP_TABLES) -> set[str]:
    """The workers with a connection to this node's `port` (rank 0's TCPStore)."""
    return {remote[0] for local, remote in established(tables) if local[1] == port and remote[0] in workers}


def head_connection_states(head: str, port: int, tables=TCP_TABLES) -> set[str]:
    """The states of this node's connections to the head's TCPStore: ESTABLISHED while joined,
    CLOSE_WAIT once the head closed one that this node's vLLM still holds."""
    return {f[3] for f in tcp_rows(tables) if _address(f[2]) == (head, port)}


def joined_head(head: str, port: int, tables=TCP_TABLES) -> bool:
    """Whether this node holds a connection to the head's TCPStore."""
    return ESTABLISHED in head_connection_states(head, port, tables)


def listening(port: int, tables=TCP_TABLES) -> bool:
    """Whether something on this node listens on `port` (rank 0's store: the head's vLLM is up)."""
    return any(f[3] == LISTEN and _address(f[1])[1] == port for f in tcp_rows(tables))


def ranks_joined(head: str, port: int, workers: list[str], tables=TCP_TABLES) -> list[dict]:
    """(head, for ops status) node rank 0 while it listens, then each worker rank joined to it,
    in the shape of ray-membership.py's `alive` (one GPU per rank: one GB10 per Spark)."""
    joined = workers_connected(port, workers, tables)
    ranks = [head] if listening(port, tables) else []
    return [{"node_ip": ip, "gpus": 1} for ip in ranks + [w for w in workers if w in joined]]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child that exited stays a zombie until reaped: gone all the same
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def accepts(head: str, port: int) -> bool:
    try:
        with socket.create_connection((head, port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def watch_head_side(port: int, workers: list[str], grace: float, tables=TCP_TABLES) -> str:
    """(head) Block until a worker that had joined has been gone for `grace` s; say which."""
    expected = set(workers)
    while workers_connected(port, workers, tables) != expected:
        time.sleep(POLL_S)
    log(f"every worker rank joined rank 0's store on port {port}: {', '.join(sorted(expected))}")
    missing_since: dict[str, float] = {}
    while True:
        now = time.monotonic()
        present = workers_connected(port, workers, tables)
        for worker in expected - present:
            missing_since.setdefault(worker, now)
        for worker in present:
            missing_since.pop(worker, None)
        gone = sorted(w for w, since in missing_since.items() if now - since >= grace)
        if gone:
            return (f"worker rank(s) {', '.join(gone)} left rank 0's store for {grace:g} s: the process group "
                    f"cannot take a rank back, so the head's engine restarts and waits for every rank")
        time.sleep(POLL_S)


def watch_worker_side(head: str, port: int, pid: int, grace: float, tables=TCP_TABLES) -> str:
    """(worker) Block until this node's headless vLLM must be restarted; say why."""
    closed = f"the head's store at {head}:{port} closed this rank's connection (the head restarted)"
    while ESTABLISHED not in (states := head_connection_states(head, port, tables)):
        if not alive(pid):
            return f"vLLM (pid {pid}) exited before it joined the head's store at {head}:{port}"
        # joined and dropped between two polls (a head that died within a second of the join, or
        # a store that was already winding down): the headless worker would wait on it forever
        if CLOSE_WAIT in states:
            return closed
        time.sleep(POLL_S)
    log(f"joined the head's store at {head}:{port}; watching it")
    last_answer = time.monotonic()
    while True:
        if not alive(pid):
            return f"vLLM (pid {pid}) exited"
        if not joined_head(head, port, tables):
            return closed
        if accepts(head, port):
            last_answer = time.monotonic()
        elif time.monotonic() - last_answer >= grace:
            return f"the head's store at {head}:{port} has accepted nothing for {grace:g} s (the head is down)"
        time.sleep(POLL_S)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    head = sub.add_parser("head")
    head.add_argument("--port", type=int, required=True)
    head.add_argument("--workers", required=True, help="the worker ranks' addresses, comma-separated")
    head.add_argument("--target-pid", type=int, required=True)
    head.add_argument("--grace", type=float, default=GRACE_S)
    worker = sub.add_parser("worker")
    worker.add_argument("--head", required=True)
    worker.add_argument("--port", type=int, required=True)
    worker.add_argument("--pid", type=int, required=True)
    worker.add_argument("--grace", type=float, default=GRACE_S)
    ranks = sub.add_parser("alive", help="the node ranks joined to rank 0, as JSON (ops status)")
    ranks.add_argument("--head", required=True)
    ranks.add_argument("--port", type=int, required=True)
    ranks.add_argument("--workers", default="")
    args = parser.parse_args(argv)
    if args.command == "alive":
        print(json.dumps(ranks_joined(args.head, args.port, [w for w in args.workers.split(",") if w])))
        return 0
    if args.command == "head":
        workers = [w for w in args.workers.split(",") if w]
        if not workers:  # one node: no rank to lose
            signal.pause()
        reason = watch_head_side(args.port, workers, args.grace)
        log(reason)
        print(reason, flush=True)
        os.kill(args.target_pid, signal.SIGTERM)
        return 0
    reason = watch_worker_side(args.head, args.port, args.pid, args.grace)
    print(reason, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
