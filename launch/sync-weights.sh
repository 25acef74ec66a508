#!/usr/bin/env bash
# sync-weights.sh — copy a complete model directory from this node to a peer over a rail.
#
#   sync-weights.sh --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 \
#       --to nvidia@10.0.0.2 --key ~/.ssh/twinspark_weights
#
# Run on the node that holds the weights (fetch-weights.sh wrote DIR/.twinspark-manifest).
# --to names the peer by its rail address, so the bytes cross the QSFP cable, never the LAN.
# Resumable (partial files are kept and appended); files the source no longer has are
# removed from the peer (vLLM globs *.safetensors). Afterwards the peer's file list and
# sizes must equal the manifest, or it fails naming what differs. A peer already complete
# is left untouched.
set -euo pipefail

MANIFEST=.twinspark-manifest
dir="" to="" key=""

log() { printf '%s sync-weights: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --dir) dir="$2"; shift 2 ;;
      --to) to="$2"; shift 2 ;;
      --key) key="$2"; shift 2 ;;
      *) die "unknown argument $1 (expected --dir D --to USER@RAIL_IP --key FILE)" ;;
    esac
  done
  if [ -z "$dir" ] || [ -z "$to" ] || [ -z "$key" ]; then die "--dir, --to and --key are required"; fi
}

# The cable is point to point and trusted, but rsync's transport is ssh: pick the cheapest
# AEAD cipher, no compression (safetensors do not compress), and one multiplexed connection
# for every call to the peer (a handshake costs more than a small shard).
ssh_transport=()
set_ssh_transport() {
  ssh_transport=(ssh -i "$key" -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=accept-new
    -o "UserKnownHostsFile=$HOME/.ssh/twinspark_known_hosts" -o Compression=no -c aes128-gcm@openssh.com
    -o ControlMaster=auto -o "ControlPath=$HOME/.ssh/twinspark-sync-%C" -o ControlPersist=60)
}

close_connection() { "${ssh_transport[@]}" -O exit "$to" >/dev/null 2>&1 || true; }

on_peer() { "${ssh_transport[@]}" "$to" "$1"; }

peer_listing() {
  on_peer "cd $(printf %q "$dir") 2>/dev/null && find . -type f ! -path './.cache/*' ! -name '$MANIFEST*' -printf '%P %s\n' | LC_ALL=C sort"
}

report_difference() {
  local expected="$1" actual="$2"
  log "peer copy differs from $dir/$MANIFEST:"
  comm -23 <(echo "$expected") <(echo "$actual") | head -n 20 | sed 's/^/  missing or wrong size on peer: /'
  comm -13 <(echo "$expected") <(echo "$actual") | head -n 20 | sed 's/^/  unexpected on peer:            /'
}

main() {
  parse_args "$@"
  set_ssh_transport
  trap close_connection EXIT
  [ -s "$dir/$MANIFEST" ] || die "$dir/$MANIFEST missing: the weights here are not complete (run fetch-weights.sh)"
  local expected actual
  expected=$(cat "$dir/$MANIFEST")
  if [ "$(peer_listing || true)" = "$expected" ] && [ "$(on_peer "cat $(printf %q "$dir/$MANIFEST") 2>/dev/null" || true)" = "$expected" ]; then
    log "complete on $to: $(wc -l <<<"$expected") files, nothing to copy"
    return 0
  fi
  on_peer "mkdir -p $(printf %q "$dir")"
  log "copying $dir to $to over the rail"
  local started=$SECONDS
  rsync -a --delete --partial --append-verify --exclude=/.cache/ --exclude="/$MANIFEST*" \
    -e "${ssh_transport[*]}" "$dir/" "$to:$dir/"
  actual=$(peer_listing)
  if [ "$actual" != "$expected" ]; then
    report_difference "$expected" "$actual"
    die "verification failed for $to:$dir"
  fi
  on_peer "cat > $(printf %q "$dir/$MANIFEST")" <<<"$expected"
  log "complete on $to: $(wc -l <<<"$expected") files verified in $((SECONDS - started)) s"
}

main "$@"
