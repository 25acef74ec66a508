#!/usr/bin/env python3
"""nccl-allreduce-check.py — cross-node NCCL all-reduce bandwidth, before any model loads (recipe §1).

One process per node, inside the serving image with the serving containers' docker flags
and environment (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...):

  python3 nccl-allreduce-check.py --node spark1 --rank 0 --world-size 2 --master 10.0.0.1:29555

First a roll call on the rendezvous port, before torch loads: rank 0 listens, every other
rank says who it is, and all go on only when all are there. A rank left alone (the others
not started, or started for another run) fails within --join-timeout-s, naming --rerun-all:
the command that starts every rank together.

Then times all_reduce of a --size-mib buffer (nccl-tests' all_reduce_perf peaks at 1 GiB) and
reports bus bandwidth, busbw = algbw * 2(n-1)/n, and the network NCCL chose. Fails when
busbw is under --min-busbw-gbps or, with --require-network IB, when NCCL fell back to
sockets: ~2 GB/s across the cable means TCP, ~20 GB/s means both RoCE rails work.
"""

import argparse
import glob
import json
import os
import re
import socket
import sys
import time
from datetime import timedelta

DEBUG_FILE_PREFIX = "/tmp/twinspark-nccl-check"
# The ranks start at once (one `pulumi up` starts them after the same steps): a rank still
# alone after this long is alone for good — far sooner than NCCL's own --timeout-s.
JOIN_TIMEOUT_S = 180
ANSWER_GRACE_S = 15  # how much longer a rank waits for rank 0's verdict than for the roll call


def log(node, message):
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} nccl-check {node}: {message}", flush=True)


def bus_bandwidth_gbps(size_bytes, seconds, world_size):
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def chosen_network(debug_text):
    """'IB', 'Socket', or None, from NCCL's INFO lines ('NCCL INFO Using network IB')."""
    found = re.findall(r"Using network (\w+)", debug_text)
    return found[-1] if found else None


class NotTogether(Exception):
    """The ranks are not all there: this rank cannot measure anything."""


def read_line(conn, deadline):
    """One line from the peer, or None when it closed or the deadline passed."""
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        conn.settimeout(remaining)
        try:
            chunk = conn.recv(4096)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.decode(errors="replace").strip()


def missing_ranks(nodes, present):
    return ", ".join(f"{nodes[r]} (rank {r})" for r in range(len(nodes)) if r not in present)


def host_roll_call(host, port, nodes, timeout_s):
    """Rank 0: wait for every other rank; all go on together, or none does."""
    deadline = time.monotonic() + timeout_s
    joined = {}
    with socket.create_server((host, port)) as server:  # SO_REUSEADDR, as torch's store after it
        try:
            while len(joined) < len(nodes) - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NotTogether(f"{missing_ranks(nodes, {0, *joined})} did not join within {timeout_s} s")
                server.settimeout(remaining)
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                try:  # a peer that says nothing is not waited for beyond the grace
                    hello = json.loads(read_line(conn, min(deadline, time.monotonic() + ANSWER_GRACE_S)) or "null")
                    rank = hello["rank"] if isinstance(hello, dict) else None
                except (ValueError, KeyError):
                    rank = None
                if not isinstance(rank, int) or not 0 < rank < len(nodes) or rank in joined \
                        or hello.get("nodes") != nodes:
                    try:
                        conn.sendall(f"refused: rank 0 runs {','.join(nodes)}, not {hello}\n".encode())
                    except OSError:
                        pass
                    conn.close()
                    continue
                joined[rank] = conn
            # no more listening before the go: a rank quick to its store connect is refused (and
            # retries) rather than queued in this backlog, which closes under it
            server.close()
            for conn in joined.values():
                conn.sendall(b"go\n")
            for conn in joined.values():  # each peer closes first: the port is free for torch's store
                read_line(conn, time.monotonic() + ANSWER_GRACE_S)
        except NotTogether as alone:
            for conn in joined.values():
                try:
                    conn.sendall(f"missing: {alone}\n".encode())
                except OSError:
                    pass
            raise
        finally:
            for conn in joined.values():
                conn.close()


def join_roll_call(host, port, rank, nodes, timeout_s):
    """Every other rank: say who it is to rank 0, then wait for its go. Until the deadline, a
    refusal or a closed connection is tried again: what answered may be a rank 0 not yet
    replaced by this run's (the ranks start at once, each on its own node)."""
    deadline = time.monotonic() + timeout_s
    hello = (json.dumps({"rank": rank, "nodes": nodes}) + "\n").encode()
    last = "no answer"
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            conn = socket.create_connection((host, port), timeout=min(remaining, 5))
        except OSError as err:
            last = err.strerror or str(err)
        else:
            with conn:
                conn.sendall(hello)
                answer = read_line(conn, deadline + ANSWER_GRACE_S)
            if answer == "go":
                return
            if answer and answer.startswith("missing: "):  # rank 0 gave up: so does every rank
                raise NotTogether(answer.removeprefix("missing: "))
            last = answer or "closed without an answer"
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))
    raise NotTogether(f"{nodes[0]} (rank 0) did not answer at {host}:{port} within {timeout_s} s ({last})")


def roll_call(rank, nodes, master, timeout_s):
    host, port = master.rsplit(":", 1)
    if rank == 0:
        host_roll_call(host, int(port), nodes, timeout_s)
    else:
        join_roll_call(host, int(port), rank, nodes, timeout_s)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous")
    p.add_argument("--nodes", help="every rank's node, comma-separated, in rank order (default rank0,rank1,...)")
    p.add_argument("--join-timeout-s", type=int, default=JOIN_TIMEOUT_S,
                   help="how long to wait for the other ranks at the roll call")
    p.add_argument("--rerun-all", help="the command that starts every rank together (named when one is alone)")
    p.add_argument("--local-device", type=int, default=0)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-busbw-gbps", type=float, default=10.0)
    p.add_argument("--require-network", default="IB", help="IB (the Sparks' RoCE), or 'any'")
    p.add_argument("--timeout-s", type=int, default=900, help="how long NCCL waits for the other ranks once all are there")
    args = p.parse_args()
    nodes = args.nodes.split(",") if args.nodes else [f"rank{r}" for r in range(args.world_size)]
    if len(nodes) != args.world_size or not 0 <= args.rank < args.world_size:
        p.error(f"--rank {args.rank} of --world-size {args.world_size} with --nodes {','.join(nodes)}")

    log(args.node, f"rank {args.rank}/{args.world_size}: roll call at {args.master}")
    try:
        roll_call(args.rank, nodes, args.master, args.join_timeout_s)
    except NotTogether as missing:
        how = f": {args.rerun_all}" if args.rerun_all else ""
        log(args.node, f"FAIL rank {args.rank} of {args.world_size}: {missing} — the NCCL ranks run only together{how}")
        return 1
    except OSError as err:  # rank 0 cannot listen: another process holds the port
        log(args.node, f"FAIL rank {args.rank} of {args.world_size}: no roll call at {args.master}: {err}")
        return 1

    # NCCL reads these at init: keep its INFO lines in a file we can read back.
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    os.environ["NCCL_DEBUG_FILE"] = f"{DEBUG_FILE_PREFIX}.%h.%p.log"
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(args.local_device)
    log(args.node, f"rank {args.rank}/{args.world_size}: every rank is there; NCCL rendezvous at {args.master}")
    dist.init_process_group("nccl", init_method=f"tcp://{args.master}", rank=args.rank,
                            world_size=args.world_size, timeout=timedelta(seconds=args.timeout_s))
    size_bytes = args.size_mib << 20
    buf = torch.ones(size_bytes // 4, dtype=torch.float32, device="cuda")
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    correct = bool(buf[0].item() == args.world_size and buf[-1].item() == args.world_size)
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(buf)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.iters
    dist.destroy_process_group()

    algbw, busbw = bus_bandwidth_gbps(size_bytes, seconds, args.world_size)
    debug = "".join(open(f).read() for f in glob.glob(f"{DEBUG_FILE_PREFIX}.*.{os.getpid()}.log"))
    network = chosen_network(debug)
    log(args.node, f"all_reduce {args.size_mib} MiB x {args.iters}: busbw {busbw:.1f} GB/s "
                   f"(algbw {algbw:.1f} GB/s), network {network or 'unknown'}, sum {'correct' if correct else 'WRONG'}")
    failures = []
    if not correct:
        failures.append(f"all_reduce returned a wrong sum (expected {args.world_size})")
    if busbw < args.min_busbw_gbps:
        failures.append(f"busbw expected >= {args.min_busbw_gbps:g} GB/s, measured {busbw:.1f} GB/s")
    if args.require_network != "any" and network != args.require_network:
        failures.append(f"NCCL network expected {args.require_network}, measured {network or 'unknown'}"
                        + (": NCCL fell back to TCP — fix RDMA before loading any model" if network == "Socket" else ""))
    for failure in failures:
        log(args.node, f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
