#!/usr/bin/env bash
# fetch-weights.sh — download a Hugging Face model into a directory on this node, once.
#
#   HF_TOKEN=... fetch-weights.sh --repo deepseek-ai/DeepSeek-V4-Flash-0731 \
#       --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 --image ghcr.io/anemll/dspark-vllm-gx10:0.1.1
#
# The host needs no Python tooling: huggingface_hub runs inside the serving base image.
# The download resumes where it stopped. When it completes, the file list and sizes are
# written to DIR/.twinspark-manifest; while that still matches, nothing is downloaded.
# HF_TOKEN (optional, for gated models) comes from the environment, never from argv.
set -euo pipefail

MANIFEST=.twinspark-manifest
repo="" dir="" image="" timeout_h=8

log() { printf '%s fetch-weights: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

parse_args() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --repo) repo="$2"; shift 2 ;;
      --dir) dir="$2"; shift 2 ;;
      --image) image="$2"; shift 2 ;;
      --timeout-hours) timeout_h="$2"; shift 2 ;;
      *) die "unknown argument $1 (expected --repo R --dir D --image I [--timeout-hours H])" ;;
    esac
  done
  if [ -z "$repo" ] || [ -z "$dir" ] || [ -z "$image" ]; then die "--repo, --dir and --image are required"; fi
}

# "relative/path size" per file, sorted; what a complete copy must match.
list_files() {
  (cd "$1" && find . -type f ! -path './.cache/*' ! -name "$MANIFEST*" -printf '%P %s\n' | LC_ALL=C sort)
}

is_complete() {
  [ -s "$dir/$MANIFEST" ] && [ "$(list_files "$dir")" = "$(cat "$dir/$MANIFEST")" ]
}

download() {
  local token_env=()
  [ -n "${HF_TOKEN:-}" ] && token_env=(-e HF_TOKEN)
  mkdir -p "$dir"
  log "downloading $repo into $dir (resumes a partial download)"
  timeout "${timeout_h}h" docker run --rm --network host "${token_env[@]}" \
    -e HOME=/tmp -e HF_HUB_DISABLE_TELEMETRY=1 \
    -u "$(id -u):$(id -g)" -v "$dir:/weights" --entrypoint python3 "$image" -c '
import sys
from huggingface_hub import snapshot_download
snapshot_download(repo_id=sys.argv[1], local_dir="/weights")
' "$repo"
}

main() {
  parse_args "$@"
  if is_complete; then
    log "complete: $dir ($(wc -l <"$dir/$MANIFEST") files), nothing to download"
    return 0
  fi
  download
  [ -n "$(list_files "$dir")" ] || die "download finished but $dir holds no files"
  list_files "$dir" >"$dir/$MANIFEST.tmp"
  mv "$dir/$MANIFEST.tmp" "$dir/$MANIFEST"
  log "complete: $dir ($(wc -l <"$dir/$MANIFEST") files, $(du -sh --exclude=.cache "$dir" | cut -f1))"
}

main "$@"
