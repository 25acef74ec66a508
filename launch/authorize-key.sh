#!/usr/bin/env bash
# authorize-key.sh — let the head's sync key in to this node, and nothing more.
#
#   authorize-key.sh add --comment twinspark-weights < 'from="10.0.0.1",restrict ssh-ed25519 AAAA... twinspark-weights@spark1'
#   authorize-key.sh remove --comment twinspark-weights
#
# add appends the line from stdin to ~/.ssh/authorized_keys unless it is there already;
# remove deletes every line carrying the sync key's comment and no other line.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

comment="" owner=""
keys_file="$HOME/.ssh/authorized_keys"

main() {
  local verb="${1:-}" line kept
  [ $# -gt 0 ] && shift
  parse_flags --comment=comment --owner=owner -- "$@"
  require_flags --comment --owner
  case "$verb" in
    add)
      IFS= read -r line || true
      [[ $line == *" $comment@"* ]] || usage_error "stdin must be one authorized_keys line with comment $comment@HOST"
      install -d -m 700 "$(dirname "$keys_file")"
      touch "$keys_file" && chmod 600 "$keys_file"
      claim_owner sync-key-authorization "$owner"
      if grep -qxF "$line" "$keys_file"; then echo "unchanged: sync key authorized"; return 0; fi
      echo "$line" >>"$keys_file"
      echo "authorized: sync key"
      ;;
    remove)
      if ! owned_by sync-key-authorization "$owner"; then
        echo "kept: sync key authorization (now managed by $(owner_of sync-key-authorization))"
        return 0
      fi
      release_owner sync-key-authorization
      [ -f "$keys_file" ] || return 0
      make_temp kept
      grep -v " $comment@" "$keys_file" >"$kept" || true
      cat "$kept" >"$keys_file"
      ;;
    *) usage_error "expected 'add' or 'remove' first, got '$verb'" ;;
  esac
}

main "$@"
