#!/usr/bin/env bash
# boot-worker-mp.sh — entrypoint of a worker container with serving.executor mp (no Ray; restart
# policy: unless-stopped).
#
# Run vLLM headless (launch-vllm.sh: this node's --node-rank, the head's --master-addr), which
# joins rank 0's TCPStore on the head, and watch it (mp-membership.py worker): when vLLM exits,
# when the head's store closes this rank's connection (the head restarted) or when the head's
# port accepts nothing past the grace (the head is down), stop vLLM and leave so docker restarts
# the container and it joins the head's next engine. vLLM's headless worker would not leave by
# itself: it waits on the head's message queue with no timeout (docs/architecture.md, The mp
# executor).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=boot-common.sh
. "$(dirname "$0")/boot-common.sh"
log_to "$TWINSPARK_BOOT_LOG"

vllm_pid=""
# SIGTERM first (vLLM's workers shut down on it), SIGKILL after 30 s
stop_vllm() {
  [ -n "$vllm_pid" ] || return 0
  kill -TERM "$vllm_pid" 2>/dev/null || return 0
  local waited=0
  while kill -0 "$vllm_pid" 2>/dev/null && [ "$waited" -lt 30 ]; do sleep 1; waited=$((waited + 1)); done
  kill -KILL "$vllm_pid" 2>/dev/null || true
}
trap 'log "stop requested (SIGTERM): stopping vLLM" >&2; stop_vllm; exit 0' TERM

main() {
  wait_while_held
  memory_check
  export_gid_index
  log "vLLM headless: joining the head's store at $TWINSPARK_HEAD_IP:$TWINSPARK_MP_MASTER_PORT as $TWINSPARK_NODE_IP"
  "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_LAUNCH_VLLM" >>"$TWINSPARK_LOG_DIR/$TWINSPARK_VLLM_LOG" 2>&1 &
  vllm_pid=$!
  local answer reason
  make_temp answer
  # TWINSPARK_HEAD_GRACE_S, as for Ray's watch: how long the head's port may accept nothing
  interruptible python3 "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_MP_MEMBERSHIP_SCRIPT" worker --head "$TWINSPARK_HEAD_IP" \
    --port "$TWINSPARK_MP_MASTER_PORT" --pid "$vllm_pid" ${TWINSPARK_HEAD_GRACE_S:+--grace "$TWINSPARK_HEAD_GRACE_S"} \
    >"$answer"
  reason=$(cat "$answer")
  log "leaving: $reason; docker restarts this container and it joins the head's next engine"
  stop_vllm
  exit 1
}

main "$@"
