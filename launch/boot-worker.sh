#!/usr/bin/env bash
# boot-worker.sh — entrypoint of a worker container (restart policy: unless-stopped).
#
# Join the head's Ray cluster (retrying until it answers), remember this node's Ray NodeID,
# then watch: when that NodeID is no longer alive in the head's GCS (the head restarted), the
# head stays unreachable, or the local raylet dies, leave so docker restarts the container
# and it rejoins fresh. `ray status` succeeding proves nothing (recipe gotcha 11).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=boot-common.sh
. "$(dirname "$0")/boot-common.sh"
log_to "$TWINSPARK_BOOT_LOG"

join_head() {
  local attempt=1
  until interruptible ray_start --address="$TWINSPARK_HEAD_IP:$RAY_PORT"; do
    log "head $TWINSPARK_HEAD_IP:$RAY_PORT not joinable yet (attempt $attempt); retrying in 5 s"
    stop_ray
    attempt=$((attempt + 1))
    interruptible sleep 5
  done
}

main() {
  stop_ray
  memory_check
  log "joining Ray head $TWINSPARK_HEAD_IP:$RAY_PORT as $TWINSPARK_NODE_IP"
  join_head
  local node_id reason answer
  make_temp answer
  if ! interruptible membership node-id --head "$TWINSPARK_HEAD_IP" --ip "$TWINSPARK_NODE_IP" >"$answer"; then
    log "joined, but the head does not list this node; restarting to rejoin"
    stop_ray
    exit 1
  fi
  node_id=$(cat "$answer")
  log "joined as Ray node $node_id; watching membership"
  # How long the head may be unreachable before this node rejoins; a head that comes back
  # sooner is still caught, by this node's NodeID missing from its new GCS.
  interruptible membership watch --head "$TWINSPARK_HEAD_IP" --node-id "$node_id" \
    --grace "${TWINSPARK_HEAD_GRACE_S:-6}" >"$answer"
  reason=$(cat "$answer")
  log "leaving: $reason; docker restarts this container and it rejoins fresh"
  stop_ray
  exit 1
}

main "$@"
