#!/usr/bin/env bash
# sync-weights.sh — copy the verified model directory from this node to a peer over every
# rail at once, then verify the peer's copy file by file against the manifest's sha256.
#
#   sync-weights.sh --node spark1 --peer spark2 --dir /home/nvidia/models/M \
#       --manifest .twinspark-manifest --record .twinspark-verified --to nvidia@10.0.0.2 \
#       --rail 10.0.0.2=10.0.0.1 --rail 10.0.1.2=10.0.1.1 --port 8873 --max-streams-per-rail 4 \
#       --key ~/.ssh/twinspark_weights --known-hosts ~/.ssh/twinspark_known_hosts   < weights.py
#
# Run on the node that holds the weights (fetch-weights.sh pinned them). The bulk copy is
# rsync's own protocol, unencrypted on the private point-to-point cable: for the copy only,
# the peer runs one rsync daemon per rail, bound to its address on that rail, answering
# only this node's address on it, with one module (the model directory) behind a secret made
# for this copy alone (challenge-response; it reaches the daemon over ssh stdin and the clients
# in RSYNC_PASSWORD, never argv; no node keeps it after). The module hides and refuses
# twinspark's own files (a client cannot replace the manifest or the record), and the
# verification after flags any file the revision does not have, wherever it is. The peer's
# firewall opens the port to this node's rail addresses only, for the copy only (an nftables
# set of (source, destination) pairs, each timing out by itself with the daemons). The daemons
# stop and the port shuts when the copy ends, whatever the end; a leftover of a killed run is
# stopped by the next and by its own time limit. On the peer the sync key runs only its forced
# command (sync-key-command.py, root-owned there): the verbs below, bound by the peer's
# authorization to the model directory, this revision, these rails, port and firewall set.
# The files still needed are split over streams (largest first, into the least loaded),
# the streams over the rails, as many as the cores of both sides keep busy. ssh (the sync key, first rail) carries only the control.
# Before: this node's copy must still match its record (a changed file is hashed again, and
# a damaged one refused here, before it spreads); the peer's copy is checked the same way
# (--repair): a damaged file is removed and sent again, a short one (an interrupted copy)
# appended to (rsync --append-verify checks it whole). During: the peer hashes each file as
# soon as rsync has finished it, beside the rest of the copy. After: every file must match,
# or the step fails naming each file and the node. The page cache the copy filled is released
# on both sides (weights.py release_cache). A peer already complete is left untouched.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

node="" peer="" dir="" manifest="" record="" revision="" to="" port="" max_streams_per_rail="" key="" known_hosts=""
rails=()
program=""
MODULE=model RSYNC_USER=twinspark  # the peer's daemons serve these (sync-key-command.py names the same)

ssh_transport=()
set_ssh_transport() {
  local peer_options
  sync_key_ssh_options peer_options "$key" "$known_hosts"
  ssh_transport=(ssh "${peer_options[@]}" -o ControlMaster=auto -o "ControlPath=$HOME/.ssh/twinspark-sync-%C"
    -o ControlPersist=60)
}
close_connection() { "${ssh_transport[@]}" -O exit "$to" >/dev/null 2>&1 || true; }
# on_peer VERB [ARG]: one of the verbs the peer's forced command for the sync key runs
# (sync-key-command.py); its flags (the directory, the rails, the port, the firewall set) are
# the authorization's, not ours
on_peer() { "${ssh_transport[@]}" "$to" "$@"; }

# ---- here ----------------------------------------------------------------------------------------
daemons_up=0
start_daemons() {
  daemons_up=1
  printf '%s\n' "$copy_secret" | on_peer daemons-start
}
# (the exit hook's, after a failure; a finished copy stops them beside the peer's verification)
stop_daemons() {
  [ "$daemons_up" -eq 1 ] || return 0
  on_peer daemons-stop </dev/null || true
  daemons_up=0
}

# start_follower ARRIVALS: the peer hashes each file as soon as rsync has finished it, beside the rest
# of the copy (weights.py verify --follow), until this side closes the follower's stdin: the copy's end.
# Then the peer's page cache of the copy goes as its disk takes it, detached: the step does not wait
# on the disk.
follower_pid="" follower_stdin=""
start_follower() {
  coproc follower { on_peer follow; }
  # shellcheck disable=SC2154  # follower_PID: set by coproc
  follower_pid=$follower_PID follower_stdin=${follower[1]}
  cat "$1" >&"$follower_stdin"
}
# verify_and_stop_daemons: the copy ended: the follower hashes what is left and verifies every file
# while the peer's daemons are stopped; the page cache the copy filled here is released meanwhile
verify_and_stop_daemons() {
  local need=$1 release stop status=0 stdin=$follower_stdin
  python3 "$program" release-cache --dir "$dir" --files "$need" &
  release=$!
  on_peer daemons-stop </dev/null &
  stop=$!
  exec {stdin}>&-
  wait "$follower_pid" || status=$?
  wait "$stop" && daemons_up=0
  wait "$release"
  return "$status"
}

# send_stream LIST ADDRESS: the files in LIST to the daemon on ADDRESS
send_stream() {
  RSYNC_PASSWORD=$copy_secret rsync -rlpt --inplace --append-verify --files-from="$1" \
    --contimeout=30 --timeout=600 "$dir/" "rsync://$RSYNC_USER@$2:$port/$MODULE/"
}

# streams_per_rail: a stream keeps about two cores busy (rsync's sender here, its receiver and
# the kernel's copies there): as many per rail as the smaller side's cores allow, at least one,
# at most --max-streams-per-rail.
streams_per_rail() {
  local cores peer_cores per_rail
  cores=$(nproc)
  peer_cores=$(on_peer nproc </dev/null)
  [ "$peer_cores" -ge "$cores" ] || cores=$peer_cores
  per_rail=$((cores / (2 * ${#rails[@]})))
  [ "$per_rail" -le "$max_streams_per_rail" ] || per_rail=$max_streams_per_rail
  echo $((per_rail > 0 ? per_rail : 1))
}

send() {  # send NEED_FILE: every file listed, over every rail, in parallel streams
  local need=$1 streams lists arrivals bytes started i pids=() failed=0
  streams=$(( ${#rails[@]} * $(streams_per_rail) ))
  make_temp lists
  make_temp arrivals
  bytes=$(python3 "$program" plan --manifest "$dir/$manifest" --need "$need" --buckets "$streams" --out-prefix "$lists." \
    --dir "$dir" --arrivals "$arrivals")
  for ((i = 0; i < streams; i++)); do cleanup_paths+=("$lists.$i"); done
  start_daemons
  start_follower "$arrivals"
  log "copying $(wc -l <"$need") files ($((bytes / 1000000)) MB) to $peer: $streams streams over ${#rails[@]} rails"
  started=$(date +%s.%N)
  for ((i = 0; i < streams; i++)); do
    [ -s "$lists.$i" ] || continue
    local rail=${rails[i % ${#rails[@]}]}
    send_stream "$lists.$i" "${rail%%=*}" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || failed=$((failed + 1)); done
  [ "$failed" -eq 0 ] || die "$failed of ${#pids[@]} copy streams to $peer failed (see rsync's errors above); run again to resume"
  log "copied $((bytes / 1000000)) MB to $peer in $(awk -v s="$started" -v b="$bytes" -v e="$(date +%s.%N)" \
    'BEGIN { t = e - s; printf "%.2f s (%.0f MB/s)", t, b / 1e6 / t }')"
}

main() {
  parse_flags --node=node --peer=peer --dir=dir --manifest=manifest --record=record --revision=revision --to=to \
    --rail=rails[] --port=port --max-streams-per-rail=max_streams_per_rail --key=key --known-hosts=known_hosts -- "$@"
  require_flags --node --peer --dir --manifest --record --revision --to --rail --port --max-streams-per-rail --key \
    --known-hosts
  log_node=$node
  key=${key/#\~/$HOME} known_hosts=${known_hosts/#\~/$HOME}
  # this copy's own secret: 48 letters and digits from the kernel's random source, never stored
  copy_secret=$(LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c 48 || true)
  [ "${#copy_secret}" -eq 48 ] || die "cannot draw the copy's secret from /dev/urandom"
  read_payload program weights.py
  [ -s "$dir/$manifest" ] || die "$dir/$manifest missing: the weights here are not complete (run fetch-weights.sh)"
  local held here_need
  held=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["revision"])' "$dir/$manifest")
  [ "$held" = "$revision" ] || die "$node holds revision $held of $dir, this stack pins $revision: refused (run fetch-weights.sh)"
  if ! here_need=$(python3 "$program" verify --dir "$dir" --manifest "$dir/$manifest" --record "$dir/$record" \
    --node "$node") || [ -n "$here_need" ]; then
    die "$node's copy of $dir no longer matches what was downloaded: nothing sent to $peer. Download it again and send it on: pulumi up with --replace of the ${node}-weights-fetch step and of ${peer}'s weights-authorize, weights-sync and weights-revoke steps (docs/operating.md, Recovering)"
  fi
  set_ssh_transport
  on_exit stop_daemons  # the hooks run in this order: the daemons stop over the connection before it closes
  on_exit close_connection
  local status=0
  on_peer manifest <"$dir/$manifest" || status=$?
  [ "$status" -ne 255 ] || die "$(sync_key_refused "$peer")"
  [ "$status" -eq 0 ] || die "$peer refused the manifest of $dir (see above)"
  local need
  make_temp need
  on_peer verify --repair </dev/null >"$need" || die "cannot check $peer's copy of $dir"
  if [ ! -s "$need" ]; then
    log "complete on $peer: $(grep -c '"sha256"' "$dir/$manifest") files verified, nothing to copy"
    return 0
  fi
  send "$need"
  verify_and_stop_daemons "$need" || die "verification failed for $peer ($to:$dir): see the FAIL lines"
  log "complete on $peer: $(grep -c '"sha256"' "$dir/$manifest") files verified"
}

main "$@"
