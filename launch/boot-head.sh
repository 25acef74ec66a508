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
  wait_while_held
  memory_check
  export_gid_index
  log "starting Ray head on $TWINSPARK_NODE_IP:$RAY_PORT"
  stop_ray
  # No dashboard: nothing here asks it (membership goes to the GCS), its nine module processes
  # hold ~1 GB of the unified memory vLLM's KV cache could have, its HTTP job API runs code for
  # whoever reaches it, and ray start waits for all of them before the raylet (3-4 s a start)
  interruptible ray_start --head --port="$RAY_PORT" --include-dashboard=false
  log "waiting for ${TWINSPARK_NODE_COUNT} nodes with a GPU: $TWINSPARK_NODE_IPS"
  interruptible membership wait-cluster --head "$TWINSPARK_NODE_IP" --expect-ips "$TWINSPARK_NODE_IPS"
  prepare_vllm_socket
  prepare_kv_tier
  log "cluster complete; exec $TWINSPARK_LAUNCH_VLLM (log: $TWINSPARK_LOG_DIR/$TWINSPARK_VLLM_LOG)"
  log_to "$TWINSPARK_VLLM_LOG"
  exec "$TWINSPARK_BUNDLE_DIR/$TWINSPARK_LAUNCH_VLLM"
}

main "$@"
