#!/usr/bin/env bash
# grafana-admin-password.sh — make Grafana's admin password the stack's (twinspark:grafanaAdminPassword).
#
#   GRAFANA_ADMIN_PASSWORD=... grafana-admin-password.sh --node spark1 --container twinspark-grafana \
#       --url http://127.0.0.1:3000 --timeout-s 180
#
# Grafana applies GF_SECURITY_ADMIN_PASSWORD__FILE only when it creates its database, and its
# database outlives a changed password and `pulumi destroy`. So once Grafana answers
# /api/health, this sets the password with `grafana cli admin reset-admin-password
# --password-from-stdin`: it travels on stdin only, never in argv.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" container="" url="" timeout_s=""

wait_healthy() {
  local deadline=$((SECONDS + timeout_s))
  until curl -fsS -o /dev/null --max-time 5 "$url/api/health"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "Grafana at $url not healthy after ${timeout_s}s; its last log lines:"
      docker logs --tail 30 "$container" 2>&1 | sed "s/^/  docker logs $container | /" || true
      die "Grafana did not answer $url/api/health"
    fi
    sleep 3
  done
}

main() {
  parse_flags --node=node --container=container --url=url --timeout-s=timeout_s -- "$@"
  require_flags --node --container --url --timeout-s
  log_node=$node
  [ -n "${GRAFANA_ADMIN_PASSWORD:-}" ] || usage_error "GRAFANA_ADMIN_PASSWORD is empty (it comes on stdin)"
  wait_healthy
  printf '%s' "$GRAFANA_ADMIN_PASSWORD" |
    docker exec -i "$container" grafana cli --homepath /usr/share/grafana \
      admin reset-admin-password --password-from-stdin >/dev/null
  log "admin password set in $container"
}

main "$@"
