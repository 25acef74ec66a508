#!/usr/bin/env bash
# nccl-check-on-device.sh — run launch/nccl-allreduce-check.py for real on a 2-GPU machine
# (the `device` tool's nvidia-h200-x2), one process per GPU as one process per Spark:
#   1. NCCL's own choice of transport (NVLink P2P here): must pass with a high busbw;
#   2. P2P, SHM and IB disabled so NCCL must use sockets — the Sparks' silent TCP fallback:
#      must fail, naming the fallback;
#   3. rank 0 alone (a rank replaced by itself): must fail at the roll call within its join
#      timeout, naming the command that runs every rank together.
# Writes both runs' output under $OUT (default build/gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-build/gpu}"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the device's rule

pair() {  # NAME PORT EXTRA_ARGS...
  local name="$1" port="$2"; shift 2
  local pids=() rc=0 rank
  for rank in 0 1; do
    python3 launch/nccl-allreduce-check.py --node "gpu$rank" --rank "$rank" --world-size 2 \
      --master "127.0.0.1:$port" --local-device "$rank" --timeout-s 120 "$@" > "$out/$name.rank$rank.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  echo "$name exit=$rc"
  cat "$out/$name.rank0.log"
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
pair native 29555 --require-network any --min-busbw-gbps 10
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
  pair tcp-fallback 29556 --require-network IB --min-busbw-gbps 10 --size-mib 256 --iters 5
started=$SECONDS
rc=0
python3 launch/nccl-allreduce-check.py --node gpu0 --rank 0 --world-size 2 --nodes gpu0,gpu1 --master 127.0.0.1:29557 \
  --join-timeout-s 10 --rerun-all "pulumi up --replace 'urn:...:nccl-run'" > "$out/alone.rank0.log" 2>&1 || rc=$?
echo "alone exit=$rc after $((SECONDS - started)) s"
cat "$out/alone.rank0.log"
