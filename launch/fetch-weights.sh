#!/usr/bin/env bash
# fetch-weights.sh — download a Hugging Face model into a directory on this node, once.
#
#   HF_TOKEN=... fetch-weights.sh --repo deepseek-ai/DeepSeek-V4-Flash-0731 \
#       --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 --image ghcr.io/anemll/dspark-vllm-gx10:0.1.1 \
#       --manifest .twinspark-manifest
#
# The host needs no Python tooling: huggingface_hub runs inside the serving base image.
# The download resumes where it stopped. When it completes, the file list and sizes are
# written to DIR/MANIFEST; while that still matches, nothing is downloaded.
# HF_TOKEN (optional, for gated models) comes from the environment, never from argv.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"

repo="" dir="" image="" manifest="" timeout_h=8

is_complete() {
  [ -s "$dir/$manifest" ] && [ "$(manifest_listing "$dir" "$manifest")" = "$(cat "$dir/$manifest")" ]
}

download() {
  local token_env=()
  [ -n "${HF_TOKEN:-}" ] && token_env=(-e HF_TOKEN)
  mkdir -p "$dir"
  log "downloading $repo into $dir (resumes a partial download)"
  timeout "${timeout_h}h" docker run --rm --network host "${token_env[@]}" \
    -e HOME=/tmp -e HF_HUB_DISABLE_TELEMETRY=1 -e HF_HUB_DISABLE_PROGRESS_BARS=1 \
    -u "$(id -u):$(id -g)" -v "$dir:/weights" --entrypoint python3 "$image" -c '
import sys
from huggingface_hub import snapshot_download
snapshot_download(repo_id=sys.argv[1], local_dir="/weights")
' "$repo"
}

main() {
  parse_flags --repo=repo --dir=dir --image=image --manifest=manifest --timeout-hours=timeout_h -- "$@"
  require_flags --repo --dir --image --manifest
  if is_complete; then
    log "complete: $dir ($(wc -l <"$dir/$manifest") files), nothing to download"
    return 0
  fi
  download
  [ -n "$(manifest_listing "$dir" "$manifest")" ] || die "download finished but $dir holds no files"
  manifest_listing "$dir" "$manifest" >"$dir/$manifest.tmp"
  mv "$dir/$manifest.tmp" "$dir/$manifest"
  log "complete: $dir ($(wc -l <"$dir/$manifest") files, $(du -sh --exclude=.cache "$dir" | cut -f1))"
}

main "$@"
