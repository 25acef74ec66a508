#!/usr/bin/env bash
# nccl-pair-check.sh — one rank of a pair's NCCL check (three nodes or more: every pair on a
# switch, each cable of a ring), run before the all-node check: nccl-check.sh's run over this
# pair's rails only, and when it measured a failure, one line naming both nodes, the rails and
# the fix.
#
#   nccl-pair-check.sh --node spark1 --pair spark1-spark3 \
#       --rail 'spark1 rocep1s0f1 192.168.2.1 <-> spark3 rocep1s0f0 192.168.2.2' ... --fix '...' \
#       --rerun-all "pulumi up --replace '...nccl-run'" --rank-arg --node --rank-arg spark1 ... \
#       < nccl-check.sh (behind the prelude, as the runner sends a script), nccl-allreduce-check.py
#
# The rank's run is nccl-check.sh itself, the same for every NCCL rank: it arrives on stdin as
# a { ... } block, which a nested bash reads whole (bash reads a pipe a byte at a time, so no
# further), and its container then reads the check program behind it.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" pair="" fix="" rerun_all=""
rails=()
rank_args=()

main() {
  parse_flags --node=node --pair=pair --rail=rails[] --fix=fix --rerun-all=rerun_all --rank-arg=rank_args[] \
    -- "$@"
  require_flags --node --pair --rail --fix --rerun-all
  log_node=$node
  local said status=0
  make_temp said
  TWINSPARK_SCRIPT=nccl-check.sh bash -s -- "${rank_args[@]}" | tee "$said" || status=$?
  [ "$status" -eq 0 ] && return 0
  # "FAIL rank R of W:" is the check program's roll-call failure (a rank alone, which it names
  # the cure of); any other failure measured the link, or NCCL could not use it
  if ! grep -q ' FAIL rank [0-9]* of [0-9]*:' "$said"; then
    local joined
    joined=$(printf '%s, ' "${rails[@]}")
    log "FAIL pair $pair over ${joined%, }: fix $fix; then $rerun_all (every NCCL check runs again, the pairs before the all-node run)"
  fi
  return "$status"
}

main "$@"
