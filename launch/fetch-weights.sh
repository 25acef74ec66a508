#!/usr/bin/env bash
# fetch-weights.sh — one revision of a Hugging Face model, downloaded once and checked against
# the hashes the hub publishes for it.
#
#   HF_TOKEN=... fetch-weights.sh resolve --repo deepseek-ai/DeepSeek-V4-Flash-0731 [--revision SHA] \
#       --image ghcr.io/anemll/dspark-vllm-gx10:0.1.1 --owner spark1-weights-revision   < weights.py
#   fetch-weights.sh forget --owner spark1-weights-revision   < weights.py
#   (resolve and download take --hub-endpoint URL: a mirror or proxy, the container's HF_ENDPOINT)
#   HF_TOKEN=... fetch-weights.sh download --repo deepseek-ai/DeepSeek-V4-Flash-0731 --revision SHA \
#       --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 --image ghcr.io/anemll/dspark-vllm-gx10:0.1.1 \
#       --manifest .twinspark-manifest --record .twinspark-verified --node spark1 \
#       --tensor-parallel-size 2 [--pipeline-parallel-size 3] --gpu-memory-utilization 0.85 \
#       [--kv-cache-dtype fp8_ds_mla \
#       --max-model-len 1048576 --kv-bytes-per-token 8206 --overhead-gib 4.5]   < (model-shape.py, weights.py)
#
# resolve prints the commit the hub serves for --revision (empty: the default branch's head)
# as its last line, and keeps it on this node: run again for the same repo and --revision
# (an update of the step: a new image, script or token) it prints the kept commit, asking the
# hub nothing. Only forget (the step's delete: a replace, a new repo or --revision) lets the
# next resolve ask again. The step's output is the stack's record of the revision.
# download first runs the shape check (model-shape.py hub-check) on what the hub lists for
# the commit, its config.json and this node's MemTotal, and stops before any weight is
# downloaded when the model cannot run over the nodes at TP x PP or one sequence of
# --max-model-len does not fit. Then it resumes a partial download of exactly that commit,
# and weights.py `pin` checks every file (sha256 of the LFS files, git blob id of the others)
# and writes DIR/MANIFEST (revision, size and sha256 per file) and this node's record of what
# it verified. A file that does not match is removed and fetched once more; still wrong, the
# step fails naming it. While the manifest holds this revision and the files equal the
# record, nothing is downloaded, nothing is read and the hub is not asked (nor the shape
# check run): a new --max-model-len then costs one stat of each file, and the shape check
# after the download (model-shape-check.sh) judges it.
# The host needs no Python packages: huggingface_hub runs inside the serving base image,
# weights.py (stdin, after this script) on the host's python3 alone. download reads two programs
# after the script, each behind its size in bytes on a line (remote.payloads): model-shape.py, weights.py.
# HF_TOKEN (optional, for gated models) comes from the environment, never from argv.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=prelude.sh
[ -n "${TWINSPARK_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
# shellcheck source-path=SCRIPTDIR source=step-prelude.sh
[ -n "${TWINSPARK_STEP_PRELUDE:-}" ] || . "$(dirname "${BASH_SOURCE[0]}")/step-prelude.sh"

repo="" revision="" dir="" image="" manifest="" record="" node="" owner="" timeout_h=8
program="" shape_program="" cgroup_parent="" hub_endpoint=""
tp="" pp=1 utilization="" kv_dtype="" max_len="" kv_bytes="" overhead=""  # the shape check's (model-shape-check.sh)
HUB_LISTING=.twinspark-hub.json  # what the hub published for the revision (weights.py hub-download; its HUB_LISTING)

# read_payloads VAR WHAT...: the programs after the script (remote.payloads: each its size in
# bytes on a line, then its bytes; head -c reads no further), each into a private temporary file
read_payloads() {
  local size
  while [ $# -gt 0 ]; do
    make_temp "$1"
    if ! IFS= read -r size || ! [[ $size =~ ^[0-9]+$ ]]; then
      usage_error "$2 must follow the script on stdin, behind its size"
    fi
    head -c "$size" >"${!1}"
    [ "$(wc -c <"${!1}")" -eq "$size" ] || usage_error "$2 ended early on stdin"
    shift 2
  done
}

# in_image PROGRAM ARGS...: the launch/ program (a file here) with ARGS inside the serving base
# image, DIR mounted at /weights
in_image() {
  local token_env=() placement=() hub_env=() mounts=(-v "$1:/twinspark/program.py:ro")
  shift
  [ -n "${HF_TOKEN:-}" ] && token_env=(-e HF_TOKEN)
  # not a secret (model.hubEndpoint refuses user:password@): in argv, unlike the token
  [ -n "$hub_endpoint" ] && hub_env=(-e "HF_ENDPOINT=$hub_endpoint")
  [ -n "$dir" ] && mounts+=(-v "$dir:/weights")
  # the download's page cache counts where the container runs: beside serving, not in the capped system.slice
  [ -n "$cgroup_parent" ] && placement=(--cgroup-parent "$cgroup_parent")
  timeout "${timeout_h}h" docker run --rm --network host "${placement[@]}" "${token_env[@]}" "${hub_env[@]}" \
    -e HOME=/tmp -e HF_HUB_DISABLE_TELEMETRY=1 -e HF_HUB_DISABLE_PROGRESS_BARS=1 \
    -u "$(id -u):$(id -g)" "${mounts[@]}" --entrypoint python3 "$image" /twinspark/program.py "$@"
}

checked() { python3 "$program" "$@" --dir "$dir" --manifest "$dir/$manifest" --record "$dir/$record" --node "$node"; }

manifest_revision() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["revision"])' "$dir/$manifest" 2>/dev/null || true; }

is_complete() {
  [ "$(manifest_revision)" = "$revision" ] || return 1
  local need
  need=$(checked verify) && [ -z "$need" ]
}

download_and_pin() {
  mkdir -p "$dir"
  log "downloading $repo@$revision into $dir (resumes a partial download)"
  in_image "$program" hub-download --repo "$repo" --revision "$revision" --dir /weights --hub-listing "/weights/$HUB_LISTING" \
    || return 1
  python3 "$program" pin --hub-listing "$dir/$HUB_LISTING" --dir "$dir" --manifest "$dir/$manifest" \
    --record "$dir/$record" --node "$node"
}

# The shape check before a byte of the weights, with this node's MemTotal only: the workers'
# are read over the rail with the sync key, which is not there yet. Its refusal is always
# right: the full check after the download (model-shape-check.sh) judges the same config.json
# and sizes (pin checks each file's against this listing) against the smallest node's
# MemTotal, at most this one's, so this estimate can only be more generous than that one.
fits_before_download() {
  # dir empty here: in_image mounts nothing (the check reads no file of it, and docker would
  # create a missing DIR as root, which the download running as this user could not write)
  local dir="" memtotal_kb report status=0
  memtotal_kb=$(awk '$1 == "MemTotal:" {print $2; exit}' /proc/meminfo)
  report=$(in_image "$shape_program" hub-check --repo "$repo" --revision "$revision" --memory-kb "$node=$memtotal_kb" \
    --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" --gpu-memory-utilization "$utilization" \
    --kv-cache-dtype "$kv_dtype" --max-model-len "$max_len" --kv-bytes-per-token "$kv_bytes" \
    --overhead-gib "$overhead") || status=$?
  [ -n "$report" ] || die "the hub did not answer the shape check of $repo@$revision (see the client's error above): nothing downloaded"
  while IFS= read -r line; do [ -z "$line" ] || log "$line"; done <<<"$report"
  return "$status"
}

check_hub_endpoint() {
  [ -z "$hub_endpoint" ] || [[ $hub_endpoint =~ ^https?://[^/@]+(/[^/]+)*$ ]] \
    || usage_error "--hub-endpoint must be an http(s) URL without user or trailing '/', got '$hub_endpoint'"
}

kept_revision() { printf '%s/.local/state/twinspark/model-revision' "$HOME"; }

resolve() {
  parse_flags --repo=repo --revision=revision --image=image --owner=owner --hub-endpoint=hub_endpoint -- "$@"
  require_flags --repo --image --owner
  check_hub_endpoint
  read_payload program weights.py
  local asked="$repo@$revision" kept resolved
  kept=$(cat "$(kept_revision)" 2>/dev/null || true)
  if [ "${kept% *}" = "$asked" ]; then
    log "kept: $repo at ${kept##* } (resolved when the stack first asked for $asked)"
    echo "${kept##* }"
    return 0
  fi
  resolved=$(in_image "$program" hub-resolve --repo "$repo" --revision "$revision" | tail -n 1)
  [[ $resolved =~ ^[0-9a-f]{40}$ ]] || die "the hub answered no commit for $asked: '$resolved'"
  claim_owner model-revision "$owner"
  printf '%s %s\n' "$asked" "$resolved" >"$(kept_revision)"
  log "resolved: $asked is commit $resolved"
  echo "$resolved"
}

forget() {
  parse_flags --owner=owner -- "$@"
  require_flags --owner
  if owned_by model-revision "$owner"; then
    rm -f "$(kept_revision)"
    release_owner model-revision
  fi
}

download() {
  parse_flags --repo=repo --revision=revision --dir=dir --image=image --manifest=manifest --record=record \
    --cgroup-parent=cgroup_parent --hub-endpoint=hub_endpoint \
    --node=node --timeout-hours=timeout_h --tensor-parallel-size=tp --pipeline-parallel-size=pp \
    --gpu-memory-utilization=utilization --kv-cache-dtype=kv_dtype --max-model-len=max_len \
    --kv-bytes-per-token=kv_bytes --overhead-gib=overhead -- "$@"
  require_flags --repo --revision --dir --image --manifest --record --node --tensor-parallel-size \
    --gpu-memory-utilization
  check_hub_endpoint
  read_payloads shape_program model-shape.py program weights.py
  log_node=$node
  [[ $revision =~ ^[0-9a-f]{40}$ ]] || usage_error "--revision must be a full commit sha (40 hex), got '$revision'"
  local held
  held=$(manifest_revision)
  if is_complete; then
    log "complete: $dir holds $repo@$revision ($(grep -c '"sha256"' "$dir/$manifest") files, verified), nothing to download"
    return 0
  fi
  fits_before_download || die "$repo@$revision cannot run over these $((tp * pp)) nodes at TP $tp × PP $pp (see the FAIL lines): nothing downloaded"
  [ -z "$held" ] || [ "$held" = "$revision" ] || log "$dir holds revision $held; this stack pins $revision: updating"
  rm -f "${dir:?}/$manifest"  # complete again only once the new download is pinned
  download_and_pin || { log "some files did not match the hub and were removed: downloading them again"; download_and_pin; } \
    || die "the download of $repo@$revision does not match the hub (see the FAIL lines)"
  log "complete: $dir holds $repo@$revision ($(du -sh --exclude=.cache "$dir" | cut -f1))"
}

main() {
  local verb="${1:-}"
  [ $# -gt 0 ] && shift
  case "$verb" in
    resolve) resolve "$@" ;;
    forget) forget "$@" ;;
    download) download "$@" ;;
    *) usage_error "expected resolve, forget or download, got '$verb'" ;;
  esac
}

main "$@"
