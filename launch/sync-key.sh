#!/usr/bin/env bash
# sync-key.sh — the head's dedicated key for copying weights to the workers over the rails.
#
#   sync-key.sh create --key ~/.ssh/twinspark_weights --comment twinspark-weights   # prints the public key
#   sync-key.sh remove --key ~/.ssh/twinspark_weights --comment twinspark-weights
#
# create keeps an existing key (running it twice changes nothing) and prints its public half,
# which the authorize step installs on each worker. remove deletes the pair only when it is
# the one create made (its comment), never a key of the user's.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

key="" comment=""

main() {
  local verb="${1:-}"
  [ $# -gt 0 ] && shift
  parse_flags --key=key --comment=comment -- "$@"
  require_flags --key --comment
  key=${key/#\~/$HOME}
  case "$verb" in
    create)
      install -d -m 700 "$(dirname "$key")"
      [ -f "$key" ] || ssh-keygen -q -t ed25519 -N '' -C "$comment@$(hostname)" -f "$key"
      cat "$key.pub"
      ;;
    remove)
      if [ -f "$key.pub" ] && grep -q " $comment@" "$key.pub"; then
        rm -f "$key" "$key.pub"
        echo "removed: $key"
      fi
      ;;
    *) usage_error "expected 'create' or 'remove' first, got '$verb'" ;;
  esac
}

main "$@"
