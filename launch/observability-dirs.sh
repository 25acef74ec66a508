#!/usr/bin/env bash
# observability-dirs.sh — the host directories the observability containers keep data in.
#
#   observability-dirs.sh --node spark1 --dir /var/lib/twinspark/observability:0:0:0755 \
#       --dir /var/lib/twinspark/observability/prometheus:65534:65534:0750 ...
#
# Each --dir is PATH:UID:GID:MODE (the container's user owns its data: Prometheus runs as
# nobody, Grafana as 472). Creates what is missing and corrects owner and mode of what is
# there; never deletes anything (pulumi destroy keeps the metrics and Grafana's database).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node=""
dirs=()

ensure_dir() {
  local spec=$1 path uid gid mode
  IFS=: read -r path uid gid mode <<<"$spec"
  [[ $path == /* && $uid =~ ^[0-9]+$ && $gid =~ ^[0-9]+$ && $mode =~ ^0?[0-7]{3}$ ]] \
    || usage_error "--dir '$spec': expected /PATH:UID:GID:MODE"
  if sudo -n test -d "$path" \
     && [ "$(sudo -n stat -c '%u:%g:%a' "$path")" = "$uid:$gid:$(printf '%o' "$((8#$mode))")" ]; then
    log "unchanged: $path"
    return 0
  fi
  sudo -n install -d -o "$uid" -g "$gid" -m "$mode" "$path"
  log "ready: $path ($uid:$gid $mode)"
}

main() {
  parse_flags --node=node --dir=dirs[] -- "$@"
  require_flags --node --dir
  log_node=$node
  local spec
  for spec in "${dirs[@]}"; do ensure_dir "$spec"; done
}

main "$@"
