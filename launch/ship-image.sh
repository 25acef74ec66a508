#!/usr/bin/env bash
# ship-image.sh — on the head, hand the serving image it built to a worker over the rail, so
# that every node runs the same image ID (the `{worker}-image-ship` step).
#
#   ship-image.sh --node spark1 --peer spark2 --image twinspark-vllm:ray-0123456789ab \
#       --id sha256:... --to nvidia@10.0.0.2 --key ~/.ssh/twinspark_weights \
#       --known-hosts ~/.ssh/twinspark_known_hosts
#
# `docker save IMAGE | ssh PEER image-load` over the weight copy's control connection: the sync
# key, which the worker admits only from this node's rail address and only to run its forced
# command (authorize-key.sh, sync-key-command.py: `image-id`, `image-load`), and the
# worker's pinned host key (peer-host-key.sh). The image keeps its tag, so the worker's copy is
# not dangling (a rollback finds it), and its ID, which is the digest of its config: the same
# on both sides or the step fails. A worker that already holds the ID is left alone. Prints
# the ID as the last line.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

node="" peer="" image="" id="" to="" key="" known_hosts=""
peer_options=()

image_id_here() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
# shellcheck disable=SC2029  # the peer runs its forced command's verb (image-id, image-load), no shell
peer_ssh() { ssh "${peer_options[@]}" "$to" "$@"; }

main() {
  parse_flags --node=node --peer=peer --image=image --id=id --to=to --key=key --known-hosts=known_hosts -- "$@"
  require_flags --node --peer --image --id --to --key --known-hosts
  log_node=$node
  [[ $id =~ ^sha256:[0-9a-f]{64}$ ]] || usage_error "--id must be an image ID sha256:<64 hex>, not '$id'"
  key=${key/#\~/$HOME} known_hosts=${known_hosts/#\~/$HOME}
  local here there
  here=$(image_id_here "$image")
  [ "$here" = "$id" ] ||
    die "$node holds ${here:-no image} as $image, the stack built $id: refused (pulumi up builds it again)"
  sync_key_ssh_options peer_options "$key" "$known_hosts"
  local status=0
  there=$(peer_ssh image-id "$image" </dev/null) || status=$?
  [ "$status" -ne 255 ] || die "$(sync_key_refused "$peer")"
  [ "$status" -eq 0 ] || die "$peer refused to say which image it holds as $image (see above)"
  if [ "$there" = "$id" ]; then
    log "$peer already holds $image ($id)"
  else
    log "shipping $image ($id) to $peer over $to"
    local started
    started=$(date +%s)
    docker save "$image" | peer_ssh image-load >&2
    there=$(peer_ssh image-id "$image" </dev/null)
    [ "$there" = "$id" ] || die "$peer loaded $image as ${there:-nothing}, not $id"
    log "$peer holds $image ($id) after $(( $(date +%s) - started )) s"
  fi
  printf '%s\n' "$id"
}

main "$@"
