#!/usr/bin/env bash
# sync-weights.sh — copy the verified model directory from this node to a peer over every
# rail at once, then verify the peer's copy file by file against the manifest's sha256.
#
#   sync-weights.sh --node spark1 --peer spark2 --dir /home/nvidia/models/M \
#       --manifest .twinspark-manifest --record .twinspark-verified --to nvidia@10.0.0.2 \
#       --rail 10.0.0.2=10.0.0.1 --rail 10.0.1.2=10.0.1.1 --port 8873 --max-streams-per-rail 4 \
#       --key ~/.ssh/twinspark_weights --known-hosts ~/.ssh/twinspark_known_hosts \
#       --firewall-set "inet twinspark weight_copy_flows"   < weights.py
#
# Run on the node that holds the weights (fetch-weights.sh pinned them). The bulk copy is
# rsync's own protocol, unencrypted on the private point-to-point cable: for the copy only,
# the peer runs one rsync daemon per rail, bound to its address on that rail, answering
# only this node's address on it, with one module (the model directory) behind a secret made
# for this copy alone (challenge-response; it reaches the daemon over ssh stdin and the clients
# in RSYNC_PASSWORD, never argv; no node keeps it after). The module hides and refuses
# twinspark's own files (a client cannot replace the manifest or the record), and the
# verification after flags any file the revision does not have, wherever it is. The peer's
# firewall opens the port to this node's rail addresses only, for the copy only
# (--firewall-set: an nftables set of (source, destination) pairs, each timing out by itself
# after DAEMON_HOURS). The daemons stop and the port shuts when the copy ends, whatever the
# end; a leftover of a killed run is stopped by the next and by its own time limit.
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
firewall_set=""
rails=()
program=""
DAEMON_HOURS=8  # a daemon left by a killed run stops by itself after this long, its firewall pairs too
MODULE=model RSYNC_USER=twinspark
# shellcheck disable=SC2016  # expanded on the peer
STATE='$HOME/.local/state/twinspark/weights-sync'  # on the peer: daemon config, pid files, weights.py

ssh_transport=()
set_ssh_transport() {
  local peer_options
  sync_key_ssh_options peer_options "$key" "$known_hosts"
  ssh_transport=(ssh "${peer_options[@]}" -o ControlMaster=auto -o "ControlPath=$HOME/.ssh/twinspark-sync-%C"
    -o ControlPersist=60)
}
close_connection() { "${ssh_transport[@]}" -O exit "$to" >/dev/null 2>&1 || true; }
on_peer() { "${ssh_transport[@]}" "$to" "$1"; }
q() { printf %q "$1"; }

# ---- on the peer (sent with declare -f) ---------------------------------------------------------
# rsyncd_start STATE DIR PORT HOURS MODULE USER FIREWALL_SET ADDRESS=ALLOWED...; the secret on stdin
rsyncd_start() {
  local state=$1 dir=$2 port=$3 hours=$4 module=$5 user=$6 firewall_set=$7 i=0 rail as_root="" pairs=() timed=()
  shift 7
  # rsyncd drops a root daemon to nobody; any other user keeps its own (and may not set one)
  [ "$(id -u)" -ne 0 ] || as_root=$'uid = 0\ngid = 0'

  rsyncd_stop "$state"
  install -d -m 700 "$state"
  # each rail's (source . destination) pair, open as long as the daemons may live
  for rail; do
    pairs+=("${rail#*=} . ${rail%%=*}")
    timed+=("${rail#*=} . ${rail%%=*} timeout ${hours}h")
  done
  printf '%s\n' "$firewall_set" "$(IFS=,; echo "${pairs[*]}")" >"$state/firewall"
  # shellcheck disable=SC2086  # the set's family, table and name: three words
  sudo -n nft add element $firewall_set "{ $(IFS=,; echo "${timed[*]}") }" </dev/null ||
    { echo "cannot open the copy's port in this node's firewall (nftables set $firewall_set: is HostPrep's table loaded?)" >&2; return 1; }
  (umask 077 && sed "s/^/$user:/" >"$state/rsyncd.secrets")
  for rail; do
    cat >"$state/rsyncd-$i.conf" <<EOF
pid file = $state/rsyncd-$i.pid
address = ${rail%%=*}
port = $port
use chroot = no
reverse lookup = no
max connections = 64
$as_root
[$module]
path = $dir
read only = no
list = no
auth users = $user
secrets file = $state/rsyncd.secrets
hosts allow = ${rail#*=}
hosts deny = *
refuse options = delete remove-source-files
# twinspark's own files (the manifest, the record) are neither read nor written through the module
filter = - /.twinspark-*
EOF
    setsid -f timeout "${hours}h" rsync --daemon --no-detach --config="$state/rsyncd-$i.conf" \
      --log-file="$state/rsyncd-$i.log" </dev/null >/dev/null 2>&1
    i=$((i + 1))
  done
  for rail; do  # listening?
    for _ in $(seq 100); do
      (exec 3<>"/dev/tcp/${rail%%=*}/$port") 2>/dev/null && continue 2
      sleep 0.1
    done
    echo "the rsync daemon on ${rail%%=*}:$port did not start: $(tail -n 3 "$state"/rsyncd-*.log)" >&2
    return 1
  done
}
# SIGKILL: a daemon whose copy ended holds nothing to flush, and a TERM costs it 0.4 s to exit
rsyncd_stop() {
  local state=$1 pid_file pid pids=()
  for pid_file in "$state"/rsyncd-*.pid; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    # only the daemon that wrote it: the pid in a file a killed run left may have been reused since
    grep -qaF -- "--config=$state/rsyncd-" "/proc/$pid/cmdline" 2>/dev/null || continue
    kill -KILL "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.01; done
  done
  rm -f "$state"/rsyncd-*.pid "$state"/rsyncd-*.conf "$state/rsyncd.secrets"
  # the port shuts: the pairs rsyncd_start opened (gone already where their timeout passed)
  if [ -s "$state/firewall" ]; then
    local set elements
    { read -r set && read -r elements; } <"$state/firewall"
    # shellcheck disable=SC2086  # the set's family, table and name: three words
    sudo -n nft delete element $set "{ $elements }" 2>/dev/null || true
    rm -f "$state/firewall"
  fi
}

# ---- here ----------------------------------------------------------------------------------------
weights_command() {  # weights_command SUBCOMMAND ARGS...: the line that runs weights.py on the peer
  echo "python3 $STATE/weights.py $* --dir $(q "$dir") --manifest $(q "$dir/$manifest") --record $(q "$dir/$record") --node $(q "$peer")"
}
peer_weights() { on_peer "$(weights_command "$@")"; }

daemons_up=0
start_daemons() {
  daemons_up=1
  printf '%s\n' "$copy_secret" | on_peer "$(declare -f rsyncd_start rsyncd_stop); rsyncd_start $STATE $(q "$dir") $port $DAEMON_HOURS $MODULE $RSYNC_USER $(q "$firewall_set") ${rails[*]}"
}
# (the exit hook's, after a failure; a finished copy stops them beside the peer's verification)
stop_daemons() {
  [ "$daemons_up" -eq 1 ] || return 0
  on_peer "$(declare -f rsyncd_stop); rsyncd_stop $STATE" || true
  daemons_up=0
}

# start_follower ARRIVALS: the peer hashes each file as soon as rsync has finished it, beside the rest
# of the copy (weights.py verify --follow), until this side closes the follower's stdin: the copy's end.
# Then the peer's page cache of the copy goes as its disk takes it, detached: the step does not wait
# on the disk.
follower_pid="" follower_stdin=""
start_follower() {
  local release
  release="python3 $STATE/weights.py release-cache --dir $(q "$dir") --manifest $(q "$dir/$manifest") --wait-for-disk"
  coproc follower { on_peer "$(weights_command verify --follow) >/dev/null; status=\$?; setsid -f $release </dev/null >/dev/null 2>&1; exit \$status"; }
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
  on_peer "$(declare -f rsyncd_stop); rsyncd_stop $STATE" &
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
  peer_cores=$(on_peer nproc)
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
    --rail=rails[] --port=port --max-streams-per-rail=max_streams_per_rail --key=key --known-hosts=known_hosts \
    --firewall-set=firewall_set -- "$@"
  require_flags --node --peer --dir --manifest --record --revision --to --rail --port --max-streams-per-rail --key \
    --known-hosts --firewall-set
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
    die "$node's copy of $dir no longer matches what was downloaded: nothing sent to $peer. Download it again and send it on: pulumi up with --replace of both the ${node}-weights-fetch and the ${peer}-weights-sync step"
  fi
  set_ssh_transport
  on_exit stop_daemons  # the hooks run in this order: the daemons stop over the connection before it closes
  on_exit close_connection
  on_peer "mkdir -p $STATE $(q "$dir") && cat > $STATE/weights.py" <"$program"
  # shellcheck disable=SC2094  # read here, written on the peer
  on_peer "cat > $(q "$dir/$manifest")" <"$dir/$manifest"
  local need
  make_temp need
  peer_weights verify --repair >"$need" || die "cannot check $peer's copy of $dir"
  if [ ! -s "$need" ]; then
    log "complete on $peer: $(grep -c '"sha256"' "$dir/$manifest") files verified, nothing to copy"
    return 0
  fi
  send "$need"
  verify_and_stop_daemons "$need" || die "verification failed for $peer ($to:$dir): see the FAIL lines"
  log "complete on $peer: $(grep -c '"sha256"' "$dir/$manifest") files verified"
}

main "$@"
