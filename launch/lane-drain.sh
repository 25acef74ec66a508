#!/usr/bin/env bash
# lane-drain.sh — a lane's engine swapped while the other lanes serve (issue 41): before `pulumi up`
# replaces the lane's containers, `drain` turns new requests away at the lane's gateway (the drain
# file: 503 with Retry-After, /health too, so the guard leaves it be) and waits until the engine runs
# no request, or until the deadline; `open` takes the drain file away once the new engine is in place.
#
#   lane-drain.sh drain --node sim2 --drain-file /run/twinspark-drain/draining \
#       --metrics-url http://127.0.0.1:8103/metrics --deadline-s 30
#   lane-drain.sh open --node sim2 --drain-file /run/twinspark-drain/draining
#
# An engine that does not answer (the first `up`, or one already down) has nothing to drain.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" drain_file="" metrics_url="" deadline_s=""

# the drain folder is root's (the guard writes it too); a step runs as the SSH user, with sudo
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }

running() {  # the engine's running requests (vLLM's gauge, summed); fails where nothing answers
  local metrics
  metrics=$(curl -fsS --max-time 5 "$metrics_url") || return 1
  awk '/^vllm:num_requests_running[{ ]/ {n += $NF} END {printf "%d\n", n}' <<<"$metrics"
}

drain() {
  require_flags --node --drain-file --metrics-url --deadline-s
  [[ $deadline_s =~ ^[0-9]+$ ]] || usage_error "--deadline-s must be whole seconds, not '$deadline_s'"
  local count
  if ! count=$(running); then
    log "the engine does not answer at $metrics_url: nothing to drain"
    return
  fi
  as_root mkdir -p "$(dirname "$drain_file")"
  printf 'swap: the lane'"'"'s engine is being replaced by pulumi up\n' | as_root tee "$drain_file" >/dev/null
  log "draining: new requests get 503; $count running, up to ${deadline_s} s to finish"
  local deadline=$((SECONDS + deadline_s))
  while [ "$count" -gt 0 ] && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 1
    count=$(running) || { log "the engine stopped answering: nothing left to wait for"; return; }
  done
  if [ "$count" -gt 0 ]; then
    log "deadline: $count still running after ${deadline_s} s; the swap goes on"
  else
    log "drained: no request running"
  fi
}

open_lane() {
  require_flags --node --drain-file
  as_root rm -f "$drain_file"
  log "open: the lane's gateway takes requests again"
}

main() {
  local verb=${1:-}
  [ $# -gt 0 ] && shift
  parse_flags --node=node --drain-file=drain_file --metrics-url=metrics_url --deadline-s=deadline_s -- "$@"
  log_node=$node
  case $verb in
    drain) drain ;;
    open) open_lane ;;
    *) usage_error "expected drain or open, got '$verb'" ;;
  esac
}

main "$@"
