#!/usr/bin/env python3
"""nccl-allreduce-check.py — cross-node NCCL all-reduce bandwidth, before any model loads (recipe §1).

One process per node, inside the serving image with the serving containers' docker flags
and environment (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...):

  python3 nccl-allreduce-check.py --node spark1 --rank 0 --world-size 2 --master 10.0.0.1:29555

Times all_reduce of a --size-mib buffer (nccl-tests' all_reduce_perf peaks at 1 GiB) and
reports bus bandwidth, busbw = algbw * 2(n-1)/n, and the network NCCL chose. Fails when
busbw is under --min-busbw-gbps or, with --require-network IB, when NCCL fell back to
sockets: ~2 GB/s across the cable means TCP, ~20 GB/s means both RoCE rails work.
"""

import argparse
import glob
import os
import re
import sys
import time
from datetime import timedelta

DEBUG_FILE_PREFIX = "/tmp/twinspark-nccl-check"


def log(node, message):
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} nccl-check {node}: {message}", flush=True)


def bus_bandwidth_gbps(size_bytes, seconds, world_size):
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def chosen_network(debug_text):
    """'IB', 'Socket', or None, from NCCL's INFO lines ('NCCL INFO Using network IB')."""
    found = re.findall(r"Using network (\w+)", debug_text)
    return found[-1] if found else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous")
    p.add_argument("--local-device", type=int, default=0)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--min-busbw-gbps", type=float, default=10.0)
    p.add_argument("--require-network", default="IB", help="IB (the Sparks' RoCE), or 'any'")
    p.add_argument("--timeout-s", type=int, default=900, help="how long to wait for the other nodes")
    args = p.parse_args()

    # NCCL reads these at init: keep its INFO lines in a file we can read back.
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    os.environ["NCCL_DEBUG_FILE"] = f"{DEBUG_FILE_PREFIX}.%h.%p.log"
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(args.local_device)
    log(args.node, f"rank {args.rank}/{args.world_size}: waiting for the other nodes at {args.master}")
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
