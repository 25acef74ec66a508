#!/usr/bin/env bash
# model-shape-check.sh — can the fetched model run over these nodes at the stack's TP x PP?
#
#   model-shape-check.sh --node spark1 --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 \
#       --manifest .twinspark-manifest --tensor-parallel-size 2 [--pipeline-parallel-size 3] \
#       --gpu-memory-utilization 0.85 \
#       --key ~/.ssh/twinspark_weights --known-hosts ~/.ssh/twinspark_known_hosts \
#       --peer spark2=nvidia@10.0.0.2   < model-shape.py
#
# Runs on the head once the weights are complete there: before they are copied, and long
# before vLLM would fail loading them. Reads every node's MemTotal (Spark's memory is unified:
# it is what the GPU can use): this node's from /proc/meminfo, each peer's over its rail with
# the weight sync's key (its forced command's `meminfo`). model-shape.py `check` (stdin, after this script) then judges
# config.json, the manifest's safetensors sizes and those figures, one ok/FAIL line per check.
# fetch-weights.sh runs the same checks before the download, on this node's MemTotal alone.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

node="" dir="" manifest="" tp="" pp=1 utilization="" key="" known_hosts="" program=""
kv_dtype="" max_len="" kv_bytes="" overhead=""  # the memory fit's: passed on, empty where not set
peers=()

memtotal_kb() { awk '$1 == "MemTotal:" {print $2; exit}'; }

peer_memtotal_kb() {
  local address="$1" peer_options
  sync_key_ssh_options peer_options "$key" "$known_hosts"
  # -n: ssh reads no stdin of this script's
  # meminfo: the peer's forced command for the sync key (sync-key-command.py) prints /proc/meminfo
  ssh -n "${peer_options[@]}" -o ConnectTimeout=20 "$address" meminfo | memtotal_kb
}

main() {
  parse_flags --node=node --dir=dir --manifest=manifest --tensor-parallel-size=tp \
    --pipeline-parallel-size=pp --gpu-memory-utilization=utilization --key=key --known-hosts=known_hosts --peer=peers[] \
    --kv-cache-dtype=kv_dtype --max-model-len=max_len --kv-bytes-per-token=kv_bytes \
    --overhead-gib=overhead -- "$@"
  require_flags --node --dir --manifest --tensor-parallel-size --gpu-memory-utilization --key --known-hosts
  log_node=$node
  key=${key/#\~/$HOME} known_hosts=${known_hosts/#\~/$HOME}
  read_payload program model-shape.py
  [ -s "$dir/$manifest" ] || die "$dir/$manifest missing: the weights here are not complete (run fetch-weights.sh)"
  local memory=(--memory-kb "$node=$(memtotal_kb </proc/meminfo)") peer kb
  for peer in "${peers[@]}"; do
    kb=$(peer_memtotal_kb "${peer#*=}") || die "cannot read MemTotal of ${peer%%=*} at ${peer#*=}: $(sync_key_refused "${peer%%=*}")"
    [[ $kb =~ ^[0-9]+$ ]] || die "${peer%%=*} at ${peer#*=} reported no MemTotal"
    memory+=(--memory-kb "${peer%%=*}=$kb")
  done
  local report status=0
  report=$(python3 "$program" check --config "$dir/config.json" --manifest "$dir/$manifest" \
    --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" --gpu-memory-utilization "$utilization" \
    "${memory[@]}" --kv-cache-dtype "$kv_dtype" \
    --max-model-len "$max_len" --kv-bytes-per-token "$kv_bytes" --overhead-gib "$overhead") || status=$?
  [ -n "$report" ] || die "the check program (model-shape.py check, on stdin) did not run"
  while IFS= read -r line; do [ -z "$line" ] || log "$line"; done <<<"$report"
  [ "$status" -eq 0 ] || die "$dir cannot run over these $((tp * pp)) nodes at TP $tp × PP $pp (see the FAIL lines)"
}

main "$@"
