#!/usr/bin/env bash
# wait-ready.sh — wait until the endpoint really serves: /health, then one 1-token completion.
#
#   VLLM_API_KEY=... wait-ready.sh --url http://127.0.0.1:8000 --model ds-0731 \
#       --timeout-s 1200 --container twinspark-head --log /var/log/twinspark/vllm.log
#
# /health can stay 200 while a Ray worker is dead, so a real completion (with the API key,
# read from the environment and handed to curl through a private config file, never argv)
# is the liveness proof. Logs progress every 30 s; on timeout prints the tail of the head
# container's log and exits 1.
set -euo pipefail

url="" model="" timeout_s=1200 container="twinspark-head" log_file=""

log() { printf '%s wait-ready: %s\n' "$(date -u +%H:%M:%S)" "$*"; }

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --url) url="$2"; shift 2 ;;
      --model) model="$2"; shift 2 ;;
      --timeout-s) timeout_s="$2"; shift 2 ;;
      --container) container="$2"; shift 2 ;;
      --log) log_file="$2"; shift 2 ;;
      *) echo "usage: $0 --url URL --model NAME [--timeout-s S] [--container NAME] [--log FILE]" >&2; exit 2 ;;
    esac
  done
  if [ -z "$url" ] || [ -z "$model" ]; then echo "--url and --model are required" >&2; exit 2; fi
}

curl_config=""
write_curl_config() {
  curl_config=$(mktemp)
  trap 'rm -f "$curl_config"' EXIT
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
  log "not serving after ${timeout_s} s; last lines of the head's logs:"
  docker logs --tail 60 "$container" 2>&1 | sed 's/^/  container | /' || true
  if [ -n "$log_file" ]; then tail -n 40 "$log_file" 2>/dev/null | sed 's/^/  vllm.log  | /' || true; fi
}

main() {
  parse_args "$@"
  write_curl_config
  local started=$SECONDS stage="health" last_report=-30
  while [ $((SECONDS - started)) -lt "$timeout_s" ]; do
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
      last_report=$SECONDS
    fi
    sleep 5
  done
  show_failure
  exit 1
}

main "$@"
