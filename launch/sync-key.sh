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
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

key="" comment="" owner=""

main() {
  local verb="${1:-}"
  [ $# -gt 0 ] && shift
  parse_flags --key=key --comment=comment --owner=owner -- "$@"
  require_flags --key --comment --owner
  key=${key/#\~/$HOME}
  case "$verb" in
    create)
      install -d -m 700 "$(dirname "$key")"
      [ -f "$key" ] || ssh-keygen -q -t ed25519 -N '' -C "$comment@$(hostname)" -f "$key"
      claim_owner sync-key "$owner"
      cat "$key.pub"
      ;;
    remove)
      if ! owned_by sync-key "$owner"; then
        echo "kept: $key (now managed by $(owner_of sync-key))"
        return 0
      fi
      if [ -f "$key.pub" ] && grep -q " $comment@" "$key.pub"; then
        rm -f "$key" "$key.pub"
        echo "removed: $key"
      fi
      release_owner sync-key
      ;;
    *) usage_error "expected 'create' or 'remove' first, got '$verb'" ;;
  esac
}

main "$@"
