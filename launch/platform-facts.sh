#!/usr/bin/env bash
# platform-facts.sh — the platform gate's facts of this node, and, where the serving image was
# built (the head, --base), the check that it was built from the pinned base (the
# `{node}-platform-facts` step).
#
#   platform-facts.sh --node spark1 --image sha256:... [--base ghcr.io/owner/image@sha256:...]
#       < platform-facts.py
#
# The facts program arrives on stdin (after this script, from the runner) and goes on to
# `python3 -`. Its last stdout line is the JSON report `pulumi up` judges
# (platform_gate.py); it exits 1, naming the node, the image and the base, when the image does
# not start with the base's layers. Reads only; pulls the base by digest if it is absent.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

node="" image="" base=""

main() {
  parse_flags --node=node --image=image --base=base -- "$@"
  require_flags --node --image
  log_node=$node
  if [ -z "$base" ]; then
    python3 - --node "$node" --image "$image"
    return
  fi
  [[ $base == *@sha256:* ]] || usage_error "--base must name a digest (REPO@sha256:...), not '$base'"
  python3 - --node "$node" --image "$image" --base "$base"
}

main "$@"
