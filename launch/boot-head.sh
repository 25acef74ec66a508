#!/usr/bin/env bash
# boot-head.sh — entrypoint of the head container (restart policy: unless-stopped).
#
# Start the Ray head, wait until every node of the stack is alive with its GPU, then exec
# launch-vllm.sh so vLLM is PID 1: when the engine dies (exit code 0 in some releases),
# the container ends and docker re-runs this whole sequence.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=boot-common.sh
. "$(dirname "$0")/boot-common.sh"
log_to "$TWINSPARK_BOOT_LOG"

main() {
  memory_check
  log "starting Ray head on $TWINSPARK_NODE_IP:$RAY_PORT"
  stop_ray
  interruptible ray_start --head --port="$RAY_PORT" --dashboard-host="$TWINSPARK_NODE_IP" \
    --dashboard-port="$RAY_DASHBOARD_PORT"
  log "waiting for ${TWINSPARK_NODE_COUNT} nodes with a GPU: $TWINSPARK_NODE_IPS"
  interruptible membership wait-cluster --head "$TWINSPARK_NODE_IP" --expect-ips "$TWINSPARK_NODE_IPS"
  prepare_vllm_socket
  log "cluster complete; exec $TWINSPARK_LAUNCH_VLLM (log: $TWINSPARK_LOG_DIR/$TWINSPARK_VLLM_LOG)"
  log_to "$TWINSPARK_VLLM_LOG"
  exec "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_LAUNCH_VLLM"
}

main "$@"
