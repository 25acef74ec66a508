#!/usr/bin/env bash
# authorize-key.sh — let one node's dedicated key in to this node, from its rail address, to run
# its forced command and nothing more: the weight copy's sync key (sync-key-command.py), the
# head's re-qualification key (requalify.py forced). The comment tells the keys apart.
#
#   authorize-key.sh add --comment twinspark-weights --owner O \
#       < 'from="10.0.0.1",command="python3 ...",restrict ssh-ed25519 AAAA... twinspark-weights@spark1'
#   authorize-key.sh revoke --comment twinspark-weights --owner O < (the same line)
#   authorize-key.sh remove --comment twinspark-weights --owner O < (the same line)
#
# A worker admits the head's key and, where its copy leaves from another worker (a switch of
# four), that worker's too: one authorization per source address, each its own step. add
# appends the line from stdin unless it is there already, dropping the line it replaces (the
# same source's earlier key: a rotated or reinstalled source); remove deletes that source's
# lines carrying the sync key's comment and no other line. revoke does as remove once the
# steps that use the key are done, keeping the ownership (the authorization's step still
# stands, and opens it again when those steps run again). All read the line (a delete runs
# with its create's stdin).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

comment="" owner=""
keys_file="$HOME/.ssh/authorized_keys"

main() {
  local verb="${1:-}" line address thing what
  [ $# -gt 0 ] && shift
  parse_flags --comment=comment --owner=owner -- "$@"
  require_flags --comment --owner
  [[ $verb == add || $verb == revoke || $verb == remove ]] ||
    usage_error "expected 'add', 'revoke' or 'remove' first, got '$verb'"
  IFS= read -r line || true
  [[ $line =~ ^from=\"([^\"]+)\",command=\"[^\"]+\",restrict\ .*\ $comment@ ]] ||
    usage_error "stdin must be one authorized_keys line from=\"ADDRESS\",command=\"...\",restrict ... with comment $comment@HOST"
  address=${BASH_REMATCH[1]}
  # the weights' key keeps the record name it had before the re-qualification key came
  case "$comment" in
    twinspark-weights) thing="sync-key-authorization@$address" ;;
    *) thing="$comment-authorization@$address" ;;
  esac
  what="${comment#twinspark-} key"
  # one edit of the file at a time: two keys' steps run at once on a node (the weight copy's and the
  # re-qualification's), and a read-modify-rename beside another loses that one's line
  install -d -m 700 "$(dirname "$keys_file")"
  exec {keys_lock}>"$keys_file.lock"
  flock "$keys_lock"
  case "$verb" in
    add)
      install -d -m 700 "$(dirname "$keys_file")"
      touch "$keys_file" && chmod 600 "$keys_file"
      claim_owner "$thing" "$owner"
      # stamped: each opening prints anew, and the revoke (its triggers hold this output) runs after it even
      # where its steps' fingerprints went back to what they were (a failed step, then a revert)
      if grep -qxF "$line" "$keys_file"; then
        echo "unchanged: $what from $address authorized (checked $(date -u +%FT%T.%NZ))"
        return 0
      fi
      replace_keys_file "$address" "$line"
      echo "authorized: $what from $address (opened $(date -u +%FT%T.%NZ))"
      ;;
    revoke)
      if ! owned_by "$thing" "$owner"; then
        echo "kept: $what authorization from $address (now managed by $(owner_of "$thing"))"
        return 0
      fi
      if [ ! -f "$keys_file" ] || ! admitted "$address" <"$keys_file"; then
        echo "unchanged: no $what from $address authorized"
        return 0
      fi
      replace_keys_file "$address" ""
      echo "revoked: $what from $address (its steps are done)"
      ;;
    remove)
      if ! owned_by "$thing" "$owner"; then
        echo "kept: $what authorization from $address (now managed by $(owner_of "$thing"))"
        return 0
      fi
      release_owner "$thing"
      [ -f "$keys_file" ] || return 0
      replace_keys_file "$address" ""
      ;;
  esac
}

# replace_keys_file ADDRESS [LINE]: the file without ADDRESS's sync key, plus LINE, put in place
# by a rename: sshd reads the file at every login (the operator's, the docker provider's), and a
# file rewritten in place is empty for a moment (a login then fails: Permission denied).
replace_keys_file() {
  local next
  next=$(mktemp "$keys_file.XXXXXX")
  cleanup_paths+=("$next")
  chmod 600 "$next"
  others_than "$1" <"$keys_file" >"$next"
  if [ -n "$2" ]; then printf '%s\n' "$2" >>"$next"; fi
  mv -f "$next" "$keys_file"
}

# admitted ADDRESS: does stdin hold the sync key's line from ADDRESS?
admitted() {
  awk -v prefix="from=\"$1\"," -v comment=" $comment@" \
    'index($0, prefix) == 1 && index($0, comment) > 0 { found = 1 } END { exit !found }'
}

# others_than ADDRESS: the lines of stdin but the sync key's from ADDRESS
others_than() {
  local prefix="from=\"$1\","
  awk -v prefix="$prefix" -v comment=" $comment@" 'index($0, prefix) != 1 || index($0, comment) == 0'
}

main "$@"
