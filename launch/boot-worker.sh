#!/usr/bin/env bash
# boot-worker.sh — entrypoint of a worker container (restart policy: unless-stopped).
#
# Join the head's Ray cluster (retrying until it answers), remember this node's Ray NodeID (its
# own raylet's), then watch the head's GCS: when that NodeID is no longer alive there (the head
# restarted), the GCS answers nothing past the grace, or the local raylet dies, leave so docker
# restarts the container and it rejoins fresh. `ray status` succeeding proves nothing (recipe
# gotcha 11); the dashboard is never asked.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=boot-common.sh
. "$(dirname "$0")/boot-common.sh"
log_to "$TWINSPARK_BOOT_LOG"

# `membership join` stops a `ray start` whose head restarted meanwhile (exit 75, as it says): the
# new head is joined at once; any other failure (no head yet) is retried after 5 s.
join_head() {
  local attempt=1 status
  while true; do
    interruptible membership join --head "$TWINSPARK_HEAD_IP" -- "${RAY_START[@]}" \
      --address="$TWINSPARK_HEAD_IP:$RAY_PORT" && return 0
    status=$?
    stop_ray
    if [ "$status" -ne 75 ]; then
      log "head $TWINSPARK_HEAD_IP:$RAY_PORT not joinable yet (attempt $attempt); retrying in 5 s"
      interruptible sleep 5
    fi
    attempt=$((attempt + 1))
  done
}

main() {
  stop_ray
  wait_while_held
  memory_check
  export_gid_index
  log "joining Ray head $TWINSPARK_HEAD_IP:$RAY_PORT as $TWINSPARK_NODE_IP"
  join_head
  local node_id reason answer
  make_temp answer
  if ! interruptible membership node-id --head "$TWINSPARK_HEAD_IP" --ip "$TWINSPARK_NODE_IP" >"$answer"; then
    log "joined, but the head does not list this node; restarting to rejoin"
    exit 1  # Ray goes with the container (boot-common.sh, on_stop)
  fi
  node_id=$(cat "$answer")
  log "joined as Ray node $node_id; watching membership"
  # How long the head's GCS may answer nothing before this node rejoins (ray-membership.py's
  # default unless TWINSPARK_HEAD_GRACE_S says otherwise); a head that comes back sooner is
  # still caught, by this node's NodeID missing from its new GCS.
  interruptible membership watch --head "$TWINSPARK_HEAD_IP" --node-id "$node_id" \
    ${TWINSPARK_HEAD_GRACE_S:+--grace "$TWINSPARK_HEAD_GRACE_S"} >"$answer"
  reason=$(cat "$answer")
  log "leaving: $reason; docker restarts this container and it rejoins fresh"
  exit 1
}

main "$@"
