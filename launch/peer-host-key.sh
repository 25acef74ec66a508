#!/usr/bin/env bash
# peer-host-key.sh — on the head, pin a worker's SSH host key (the one the stack pins for it) for
# its rail addresses, in the known_hosts file the weight copy and the shape check read.
#
#   peer-host-key.sh --node spark1 --peer spark2 --known-hosts ~/.ssh/twinspark_known_hosts \
#       --address 10.0.0.2 --address 10.0.1.2 --host-key 'ssh-ed25519 AAAA...'
#
# Those scripts would otherwise learn the key at first use, and refuse the worker for good once
# it is reinstalled. Every other entry of the file stays; so does an entry already pinned.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" peer="" known_hosts="" host_key=""
addresses=()

# pinned: each address has exactly one entry in the file, holding the key
pinned() {
  local address entries
  for address in "${addresses[@]}"; do
    entries=$(ssh-keygen -F "$address" -f "$known_hosts" | grep -v '^#' || true)
    [ "$(awk '{print $2 " " $3}' <<<"$entries")" = "$host_key" ] || return 1
  done
}

main() {
  local address
  parse_flags --node=node --peer=peer --known-hosts=known_hosts --address=addresses[] --host-key=host_key -- "$@"
  require_flags --node --peer --known-hosts --address --host-key
  log_node=$node
  [[ $host_key =~ ^[a-z0-9-]+\ [A-Za-z0-9+/]+=*$ ]] || usage_error "--host-key must be 'TYPE BASE64', got '$host_key'"
  known_hosts=${known_hosts/#\~/$HOME}
  install -d -m 700 "$(dirname "$known_hosts")"
  touch "$known_hosts" && chmod 600 "$known_hosts"
  if pinned; then
    log "unchanged: $peer's host key for ${addresses[*]}"
    return 0
  fi
  for address in "${addresses[@]}"; do
    # every entry for the address, hashed ones too; ssh-keygen keeps a copy in .old
    ssh-keygen -R "$address" -f "$known_hosts" >/dev/null 2>&1
    rm -f "$known_hosts.old"
    printf '%s %s\n' "$address" "$host_key" >>"$known_hosts"
  done
  log "pinned: $peer's host key $(ssh-keygen -lf - <<<"${addresses[0]} $host_key" | awk '{print $2}') for ${addresses[*]}"
}

main "$@"
