#!/usr/bin/env bash
# model-shape-check.sh — can the fetched model run over these nodes at the stack's TP x PP?
#
#   model-shape-check.sh memory --node spark2        (on each worker: prints "memory-kb spark2=KB")
#   model-shape-check.sh check --node spark1 --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 \
#       --manifest .twinspark-manifest --tensor-parallel-size 2 [--pipeline-parallel-size 3] \
#       --gpu-memory-utilization 0.85 --memory-kb spark2=123456789   < model-shape.py
#
# `check` runs on the head once the weights are complete there: before they are copied, and long
# before vLLM would fail loading them. It judges every node's MemTotal (Spark's memory is unified:
# it is what the GPU can use): this node's from /proc/meminfo, each worker's as its own `memory` step
# read it (the program hands it on). No key reaches a worker for it: the weight copy's key stays
# open only for the steps that move bytes (a check that ran on a key would run without its
# authorization whenever a failed `up` left the two apart). model-shape.py `check` (stdin, after
# this script) then judges config.json, the manifest's safetensors sizes and those figures, one
# ok/FAIL line per check. fetch-weights.sh runs the same checks before the download, on this node's
# MemTotal alone.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

node="" dir="" manifest="" tp="" pp=1 utilization="" program=""
kv_dtype="" max_len="" kv_bytes="" overhead=""  # the memory fit's: passed on, empty where not set
workers_memory=()  # NODE=KB: each worker's MemTotal, as its memory step read it

memtotal_kb() { awk '$1 == "MemTotal:" {print $2; exit}' /proc/meminfo; }

memory() {
  parse_flags --node=node -- "$@"
  require_flags --node
  log_node=$node
  local kb
  kb=$(memtotal_kb)
  [[ $kb =~ ^[0-9]+$ ]] || die "/proc/meminfo has no MemTotal"
  echo "memory-kb $node=$kb"
}

check() {
  parse_flags --node=node --dir=dir --manifest=manifest --tensor-parallel-size=tp \
    --pipeline-parallel-size=pp --gpu-memory-utilization=utilization --memory-kb=workers_memory[] \
    --kv-cache-dtype=kv_dtype --max-model-len=max_len --kv-bytes-per-token=kv_bytes \
    --overhead-gib=overhead -- "$@"
  require_flags --node --dir --manifest --tensor-parallel-size --gpu-memory-utilization
  log_node=$node
  read_payload program model-shape.py
  [ -s "$dir/$manifest" ] || die "$dir/$manifest missing: the weights here are not complete (run fetch-weights.sh)"
  local memory=(--memory-kb "$node=$(memtotal_kb)") peer
  for peer in "${workers_memory[@]}"; do
    [[ $peer =~ ^[^=]+=[0-9]+$ ]] || usage_error "--memory-kb must be NODE=KB, got '$peer'"
    memory+=(--memory-kb "$peer")
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

main() {
  local verb="${1:-}"
  [ $# -gt 0 ] && shift
  case "$verb" in
    memory | check) "$verb" "$@" ;;
    *) usage_error "expected 'memory' or 'check' first, got '$verb'" ;;
  esac
}

main "$@"
