#!/usr/bin/env bash
# api-gateway.sh — entrypoint of the head's API gateway container (restart: unless-stopped).
#
# nginx on serving.port in front of vLLM (on a Unix socket): vLLM checks its key only on /v1,
# and paths such as /invocations run the model without one. The gateway checks the key on
# every path but /health. The key comes from secrets.env into a private file at start, on the
# container's own tmpfs; the rendered api-gateway.conf holds no secret.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
. "$(dirname "$0")/prelude.sh"
BUNDLE=$(cd "$(dirname "$0")" && pwd)
set -a
# shellcheck source=/dev/null
. "$BUNDLE/twinspark.env"
# shellcheck source=/dev/null
. "$BUNDLE/secrets.env"
set +a
log_node=$TWINSPARK_NODE_NAME log_step=api-gateway
RUN_DIR=$TWINSPARK_API_GATEWAY_RUN_DIR

write_key_map() {
  # The stack refuses other characters; checked again here because the key is spliced into
  # an nginx string and a regex, and must not be able to end either.
  [[ ${VLLM_API_KEY:-} =~ ^[A-Za-z0-9._~+/=-]{16,}$ ]] \
    || die "the API key in secrets.env is empty, shorter than 16 or has characters other than letters, digits and -._~+/="
  # A regex, matched case-sensitively: nginx compares a map's plain strings ignoring case,
  # and cannot build its hash for one of 40 characters or more. "Bearer" in any case (RFC
  # 7235); the key exactly, nothing before or after it. Of the key's characters only . and +
  # mean something in a regex: each goes in a bracket of its own.
  local key=${VLLM_API_KEY//./[.]}
  key=${key//+/[+]}
  mkdir -p "$RUN_DIR"
  chmod 700 "$RUN_DIR"
  # shellcheck disable=SC2016 # $http_authorization and $twinspark_key_ok are nginx variables
  (umask 077 && printf 'map $http_authorization $twinspark_key_ok {\n    default 0;\n    "~^(?i:bearer) +%s$" 1;\n}\n' \
    "$key" >"$RUN_DIR/$TWINSPARK_API_GATEWAY_KEY_MAP")
}

# nginx's workers (user nobody) spill request bodies and responses here: their own folders, as
# the run dir (the key) is root's alone
make_temp_dirs() {
  local dir
  for dir in "$TWINSPARK_API_GATEWAY_TEMP_DIR/body" "$TWINSPARK_API_GATEWAY_TEMP_DIR/proxy"; do
    mkdir -p "$dir"
    chown nobody "$dir"
    chmod 700 "$dir"
  done
}

main() {
  mkdir -p "$TWINSPARK_LOG_DIR"
  write_key_map
  make_temp_dirs
  # $1: another config of the bundle (several lanes: the head's front, api-front.conf)
  local conf=${1:-$TWINSPARK_API_GATEWAY_CONF}
  [[ $conf =~ ^[a-z-]+\.conf$ && -f $BUNDLE/$conf ]] || die "no gateway config $conf in $BUNDLE"
  log "API gateway: nginx with $conf (log: $TWINSPARK_LOG_DIR/${conf%.conf}.log)"
  exec nginx -e stderr -g 'daemon off;' -c "$BUNDLE/$conf"
}

main "$@"
