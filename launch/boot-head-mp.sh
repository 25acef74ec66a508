#!/usr/bin/env bash
# boot-head-mp.sh — entrypoint of the head container with serving.executor mp (no Ray; restart
# policy: unless-stopped).
#
# vLLM's API server is node rank 0: its rank-0 worker opens torch.distributed's TCPStore on the
# master port and blocks until every node rank has joined (torch's 600 s init timeout; past it
# the engine exits and docker re-runs this), so the API answers only with every rank in. Beside
# it runs the rank watch (mp-membership.py head): once a worker rank that had joined is gone,
# it stops vLLM (PID 1 after the exec below), the container ends, docker re-runs this sequence
# and the head waits for every rank again — a process group cannot take a rank back.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=boot-common.sh
. "$(dirname "$0")/boot-common.sh"
log_to "$TWINSPARK_BOOT_LOG"
# no Ray to leave: stop at once
trap 'log "stop requested (SIGTERM)" >&2; exit 0' TERM

# every node's rail address but the head's: the worker ranks
worker_ips() {
  local ip all workers=()
  IFS=, read -ra all <<<"$TWINSPARK_NODE_IPS"
  for ip in "${all[@]}"; do [ "$ip" = "$TWINSPARK_HEAD_IP" ] || workers+=("$ip"); done
  (IFS=,; echo "${workers[*]}")
}

main() {
  wait_while_held
  memory_check
  export_gid_index
  prepare_vllm_socket
  prepare_kv_tier
  log "node rank 0 on $TWINSPARK_NODE_IP:$TWINSPARK_MP_MASTER_PORT; vLLM waits for all ${TWINSPARK_NODE_COUNT} node ranks"
  # its lines go to this log (stdout and stderr are the boot log here); $$ is vLLM after the exec
  python3 "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_MP_MEMBERSHIP_SCRIPT" head --port "$TWINSPARK_MP_MASTER_PORT" \
    --workers "$(worker_ips)" --target-pid $$ ${TWINSPARK_RANK_GRACE_S:+--grace "$TWINSPARK_RANK_GRACE_S"} &
  log "exec $TWINSPARK_LAUNCH_VLLM (log: $TWINSPARK_LOG_DIR/$TWINSPARK_VLLM_LOG)"
  log_to "$TWINSPARK_VLLM_LOG"
  exec "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_LAUNCH_VLLM"
}

main "$@"
