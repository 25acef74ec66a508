# boot-common.sh — sourced by boot-head.sh and boot-worker.sh: environment, logging, Ray.
# shellcheck shell=bash

# The bundle is this script's directory (mounted read-only in the container).
TWINSPARK_BUNDLE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=prelude.sh
. "$TWINSPARK_BUNDLE_DIR/prelude.sh"
set -a
# shellcheck source=/dev/null
. "$TWINSPARK_BUNDLE_DIR/twinspark.env"
set +a
log_node=$TWINSPARK_NODE_NAME
mkdir -p "$TWINSPARK_LOG_DIR"
# NCCL writes its debug file only into a folder that exists (else to stderr, where nobody reads it);
# each start leaves one a process: the newest 64 are kept
if [ -n "${NCCL_DEBUG_FILE:-}" ]; then
  mkdir -p "$(dirname "$NCCL_DEBUG_FILE")"
  find "$(dirname "$NCCL_DEBUG_FILE")" -maxdepth 1 -type f -printf '%T@ %p\n' | sort -rn | tail -n +65 |
    cut -d' ' -f2- | xargs -r rm -f --
fi

# One log file per stream, on the host (it outlives the container), rotated by logrotate.
log_to() { exec >>"$TWINSPARK_LOG_DIR/$1" 2>&1; }

membership() { python3 "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_MEMBERSHIP_SCRIPT" "$@"; }

# Before Ray (and so vLLM) starts: NCCL's GID, RoCE v2 over each rail's IPv4 address, read from the
# HCAs' GID tables now (roce-gid.py; its reasons go to this log): an address change or a driver
# reload moves the index, so it is resolved at every start and never pinned. A recipe's own
# NCCL_IB_GID_INDEX wins.
export_gid_index() {
  local index
  [ -n "${NCCL_IB_HCA:-}" ] || return 0
  if [ -n "${NCCL_IB_GID_INDEX:-}" ]; then
    log "NCCL_IB_GID_INDEX=$NCCL_IB_GID_INDEX (the environment's)"
    return 0
  fi
  index=$(python3 "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_ROCE_GID_SCRIPT" --hca "$NCCL_IB_HCA") || index=""
  if [ -n "$index" ]; then
    export NCCL_IB_GID_INDEX=$index
    log "NCCL_IB_GID_INDEX=$index (RoCE v2 over IPv4 on $NCCL_IB_HCA)"
  fi
}

# Before anything loads: after an unclean boot (a freeze, a panic, a power cut) this node stays out
# of serving until the head's guard has run the fabric and NCCL checks again and released it
# (launch/node-recorder.py writes the hold at boot, its `release` removes it).
wait_while_held() {
  [ -e "$TWINSPARK_UNCLEAN_BOOT_HOLD" ] || return 0
  log "held: $(cat "$TWINSPARK_UNCLEAN_BOOT_HOLD" 2>/dev/null || true); waiting for the head's guard to release it"
  while [ -e "$TWINSPARK_UNCLEAN_BOOT_HOLD" ]; do interruptible sleep 3; done
  log "released: the fabric and NCCL checks passed again"
}

# Before Ray (and so vLLM) starts: release the model files' page cache, then wait until the
# memory vLLM will take is available, saying how much is missing and which slice holds it
# (memory-check.py; the budget's numbers come from twinspark.env).
memory_check() {
  log "checking memory before load (model page cache released first)"
  interruptible python3 "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_MEMORY_CHECK_SCRIPT" --node "$TWINSPARK_NODE_NAME" \
    --model-dir "$TWINSPARK_MODEL_DIR" --utilization "$TWINSPARK_GPU_MEMORY_UTILIZATION" \
    --cotenant-slices "$TWINSPARK_COTENANT_SLICES" --cotenant-percent "$TWINSPARK_COTENANT_MEMORY_PERCENT" \
    --headroom-percent "$TWINSPARK_MEMORY_HEADROOM_PERCENT" --container-slice "$TWINSPARK_CONTAINER_SLICE" \
    --cgroup-root "$TWINSPARK_HOST_CGROUP_DIR" --status "$TWINSPARK_MEMORY_CHECK_STATUS" \
    --kv-tier-bytes "${TWINSPARK_KV_TIER_MEMORY_BYTES:-0}"
}

# A restarted container must not inherit a stale raylet. `ray stop` is asked only when one of
# Ray's processes runs here (its daemons and workers run from its package, .../ray/..., or are
# named ray::...; the bracket keeps grep from matching its own command line): it costs a CPU
# second of imports with nothing to stop, which is every container start (its own PID namespace).
ray_running() { grep -qsa -e '/ra[y]/' -e '^ra[y]::' /proc/[0-9]*/cmdline; }
stop_ray() { ray_running || return 0; ray stop --force >/dev/null 2>&1 || true; }

# `docker stop` sends SIGTERM to PID 1 — this bash — which ignores it unless trapped and
# runs a trap only between commands: the long waits run in the background (`interruptible`)
# so a stop leaves Ray at once instead of after the 60 s grace.
# Leaving is this bash's exit: as the container's PID 1, its exit ends every other process of
# the container's PID namespace (the kernel SIGKILLs them, as `ray stop --force` does), so no
# `ray stop` first (~1.8 CPU-s of imports, each time a worker leaves).
# (stderr: the trap may run inside `interruptible ... >file`, where stdout is that file)
on_stop() { log "stop requested (SIGTERM): leaving Ray" >&2; exit 0; }
trap on_stop TERM
interruptible() { "$@" & wait $!; }

# Every node declares one GPU: a GB10 Spark has exactly one, and TP spans the nodes.
# Bounded: `ray start` can hang on an unreachable GCS.
RAY_START=(timeout 90 ray start --node-ip-address="$TWINSPARK_NODE_IP" --num-gpus=1 --disable-usage-stats)
ray_start() { "${RAY_START[@]}" "$@"; }

# Before vLLM starts on the head: its API socket's directory is root's and the API gateway's
# group's (setgid, so the socket takes that group) and holds no socket of a previous engine
# (vLLM's bind would fail on it); the umask makes the socket read-write for that group and
# nothing for others (what vLLM writes elsewhere loses only world read).
prepare_vllm_socket() {
  mkdir -p "$TWINSPARK_VLLM_SOCKET_DIR"
  chown "root:$TWINSPARK_API_SOCKET_GROUP" "$TWINSPARK_VLLM_SOCKET_DIR"
  chmod 2750 "$TWINSPARK_VLLM_SOCKET_DIR"
  rm -f "$TWINSPARK_VLLM_SOCKET"
  umask 0007
}

# Before vLLM starts, with serving.kvTier (core/kv_tier.py): the tier's folders root-only (its blocks
# are the prompts' content in another form), the stack's hash seed, without which a restarted
# engine names its blocks anew and finds none of the last one's, and the bound on the tier's size
# beside vLLM (its file tier removes nothing itself).
prepare_kv_tier() {
  [ -n "${TWINSPARK_KV_TIER_DIR:-}" ] || return 0
  install -d -m 0700 "$(dirname "$TWINSPARK_KV_TIER_DIR")" "$TWINSPARK_KV_TIER_DIR"
  PYTHONHASHSEED=$(cat "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_KV_TIER_SEED_FILE")
  export PYTHONHASHSEED
  python3 "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_KV_TIER_BOUND_SCRIPT" --dir "$TWINSPARK_KV_TIER_DIR" \
    --max-bytes "$TWINSPARK_KV_TIER_DISK_BYTES" >>"$TWINSPARK_LOG_DIR/$TWINSPARK_KV_TIER_BOUND_LOG" 2>&1 &
  log "KV tier: $TWINSPARK_KV_TIER_DIR, at most $TWINSPARK_KV_TIER_DISK_BYTES bytes ($TWINSPARK_KV_TIER_BOUND_LOG names what the bound removes)"
}
