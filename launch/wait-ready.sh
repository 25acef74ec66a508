#!/usr/bin/env bash
# wait-ready.sh — wait until the endpoint really serves: /health, then one 1-token completion.
#
#   VLLM_API_KEY=... wait-ready.sh --url http://127.0.0.1:8000 --model ds-0731 \
#       --timeout-s 1200 --container twinspark-serving --container twinspark-api-gateway \
#       --log /var/log/twinspark/vllm.log --log /var/log/twinspark/boot-head.log \
#       --hold /run/twinspark/serving-hold --memory-status /run/twinspark/memory-check.json
#
# /health can stay 200 while a Ray worker is dead, so a real completion (with the API key,
# read from the environment and handed to curl through a private config file, never argv)
# is the liveness proof. Logs progress every 30 s; on timeout prints the tail of the head
# container's docker log and of each --log file, and exits 1. Serving held by the guard (a
# restart loop: --hold exists) fails at once with the hold's reason; a memory check still
# waiting (--memory-status) is shown with its numbers.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

url="" model="" timeout_s="" hold="" memory_status=""
# a poll a second: serving is seen the second it answers (every `up` that restarts it waits on
# this), and a local /health call a second costs the head nothing
poll_s=1
containers=() log_files=()

curl_config=""
write_curl_config() {
  make_temp curl_config
  chmod 600 "$curl_config"
  printf 'header = "Authorization: Bearer %s"\n' "${VLLM_API_KEY:-}" >"$curl_config"
}

healthy() { curl -fsS -o /dev/null --max-time 5 "$url/health"; }

completes() {
  local body
  body=$(printf '{"model":"%s","prompt":"Hello","max_tokens":1,"temperature":0}' "$model")
  curl -fsS --max-time 120 -K "$curl_config" -H 'Content-Type: application/json' \
    -d "$body" "$url/v1/completions" | grep -q '"choices"'
}

show_failure() {
  local file container
  log "not serving after ${timeout_s} s; last lines of the head's logs:"
  for container in "${containers[@]}"; do
    docker logs --tail 20 "$container" 2>&1 | sed "s/^/  docker logs $container | /" || true
  done
  for file in "${log_files[@]}"; do
    tail -n 40 "$file" 2>/dev/null | sed "s#^#  $(basename "$file") | #" || true
  done
}

# a JSON file's "reason" or "message" string (python3 is on every node; jq is not)
json_text() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2" 2>/dev/null; }

fail_if_held() {
  [ -n "$hold" ] && [ -e "$hold" ] || return 0
  die "serving is held: $(json_text "$hold" reason)"
}

memory_waiting() {
  [ -n "$memory_status" ] && grep -q '"ok": false' "$memory_status" 2>/dev/null || return 1
  log "memory check before load is waiting: $(json_text "$memory_status" message)"
}

main() {
  parse_flags --url=url --model=model --timeout-s=timeout_s --container=containers[] --log=log_files[] \
    --hold=hold --memory-status=memory_status -- "$@"
  require_flags --url --model --timeout-s --container
  write_curl_config
  local started=$SECONDS stage="health" last_report=-30
  while [ $((SECONDS - started)) -lt "$timeout_s" ]; do
    fail_if_held
    if [ "$stage" = "health" ] && healthy; then
      log "/health answers after $((SECONDS - started)) s; trying a real completion"
      stage="completion"
    fi
    if [ "$stage" = "completion" ] && completes; then
      log "serving: a 1-token completion succeeded after $((SECONDS - started)) s"
      return 0
    fi
    if [ $((SECONDS - last_report)) -ge 30 ]; then
      log "waiting for $stage ($((SECONDS - started)) s of ${timeout_s} s)"
      memory_waiting || true
      last_report=$SECONDS
    fi
    sleep "$poll_s"
  done
  show_failure
  exit 1
}

main "$@"
