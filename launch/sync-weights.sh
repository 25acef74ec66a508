#!/usr/bin/env bash
# sync-weights.sh — copy a complete model directory from this node to a peer over a rail.
#
#   sync-weights.sh --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 --manifest .twinspark-manifest \
#       --to nvidia@10.0.0.2 --key ~/.ssh/twinspark_weights --known-hosts ~/.ssh/twinspark_known_hosts
#
# Run on the node that holds the weights (fetch-weights.sh wrote DIR/MANIFEST).
# --to names the peer by its rail address, so the bytes cross the QSFP cable, never the LAN.
# Resumable (partial files are kept and appended); files the source no longer has are
# removed from the peer (vLLM globs *.safetensors). Afterwards the peer's file list and
# sizes must equal the manifest, or it fails naming what differs. A peer already complete
# is left untouched.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

dir="" manifest="" to="" key="" known_hosts=""

# The cable is point to point and trusted, but rsync's transport is ssh: pick the cheapest
# AEAD cipher, no compression (safetensors do not compress), and one multiplexed connection
# for every call to the peer (a handshake costs more than a small shard).
ssh_transport=()
set_ssh_transport() {
  local peer_options
  sync_key_ssh_options peer_options "$key" "$known_hosts"
  ssh_transport=(ssh "${peer_options[@]}" -o Compression=no -c aes128-gcm@openssh.com
    -o ControlMaster=auto -o "ControlPath=$HOME/.ssh/twinspark-sync-%C" -o ControlPersist=60)
}

close_connection() { "${ssh_transport[@]}" -O exit "$to" >/dev/null 2>&1 || true; }

on_peer() { "${ssh_transport[@]}" "$to" "$1"; }

# The peer runs the same listing function as this side: one definition of the format.
peer_listing() {
  on_peer "$(declare -f manifest_listing); manifest_listing $(printf %q "$dir") $(printf %q "$manifest") 2>/dev/null"
}

report_difference() {
  local expected="$1" actual="$2"
  log "peer copy differs from $dir/$manifest:"
  comm -23 <(echo "$expected") <(echo "$actual") | head -n 20 | sed 's/^/  missing or wrong size on peer: /'
  comm -13 <(echo "$expected") <(echo "$actual") | head -n 20 | sed 's/^/  unexpected on peer:            /'
}

main() {
  parse_flags --dir=dir --manifest=manifest --to=to --key=key --known-hosts=known_hosts -- "$@"
  require_flags --dir --manifest --to --key --known-hosts
  key=${key/#\~/$HOME} known_hosts=${known_hosts/#\~/$HOME}
  set_ssh_transport
  on_exit close_connection
  [ -s "$dir/$manifest" ] || die "$dir/$manifest missing: the weights here are not complete (run fetch-weights.sh)"
  local expected actual
  expected=$(cat "$dir/$manifest")
  if [ "$(peer_listing || true)" = "$expected" ] && [ "$(on_peer "cat $(printf %q "$dir/$manifest") 2>/dev/null" || true)" = "$expected" ]; then
    log "complete on $to: $(wc -l <<<"$expected") files, nothing to copy"
    return 0
  fi
  on_peer "mkdir -p $(printf %q "$dir")"
  log "copying $dir to $to over the rail"
  local started=$SECONDS
  rsync -a --delete --partial --append-verify --exclude=/.cache/ --exclude="/$manifest*" \
    -e "${ssh_transport[*]}" "$dir/" "$to:$dir/"
  actual=$(peer_listing)
  if [ "$actual" != "$expected" ]; then
    report_difference "$expected" "$actual"
    die "verification failed for $to:$dir"
  fi
  on_peer "cat > $(printf %q "$dir/$manifest")" <<<"$expected"
  log "complete on $to: $(wc -l <<<"$expected") files verified in $((SECONDS - started)) s"
}

main "$@"
