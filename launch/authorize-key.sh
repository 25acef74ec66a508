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

comment=""
keys_file="$HOME/.ssh/authorized_keys"

main() {
  local verb="${1:-}" line kept
  [ $# -gt 0 ] && shift
  parse_flags --comment=comment -- "$@"
  require_flags --comment
  case "$verb" in
    add)
      IFS= read -r line || true
      [[ $line == *" $comment@"* ]] || usage_error "stdin must be one authorized_keys line with comment $comment@HOST"
      install -d -m 700 "$(dirname "$keys_file")"
      touch "$keys_file" && chmod 600 "$keys_file"
      if grep -qxF "$line" "$keys_file"; then echo "unchanged: sync key authorized"; return 0; fi
      echo "$line" >>"$keys_file"
      echo "authorized: sync key"
      ;;
    remove)
      [ -f "$keys_file" ] || return 0
      make_temp kept
      grep -v " $comment@" "$keys_file" >"$kept" || true
      cat "$kept" >"$keys_file"
      ;;
    *) usage_error "expected 'add' or 'remove' first, got '$verb'" ;;
  esac
}

main "$@"
