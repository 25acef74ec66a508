#!/usr/bin/env bash
# loaders-bare-on-device.sh DEADLINE_S [RUN,...] — issue 42 item 2 cut down, in ONE device call:
# vLLM 0.24.0's safetensors loaders timed WITHOUT vLLM (loaders-bare.py), reading a real-size
# checkpoint (big-checkpoint.py: Qwen2.5-14B's shapes, 29.5 GB bf16, 6 shards) from the device's
# disk into GPU memory, each with a cold page cache, then each warm.
#
#   1. the machine's facts (loaders-on-device.sh's probe: GPU, disk, memory, drop_caches, libraries)
#   2. the carried loader wheels installed into /tmp/site (pip --no-index --no-deps --target;
#      WHEELS, default .whl/bare beside .gpu: fastsafetensors 0.5.0, instanttensor 0.2.2,
#      runai-model-streamer 0.17.1, humanize), libcudart.so named where ldconfig has none
#   3. the checkpoint written (all 48 layers where the disk holds them), then sync, both timed
#   4. the disk's raw read rate: the page cache dropped, shard 1 read through it (page-cache.py),
#      shard 2's first 2 GiB read with O_DIRECT (dd iflag=direct)
#   5. the runs (default: safetensors, instanttensor, fastsafetensors, runai_streamer, each -cold,
#      then the same four -warm), in one python process that frees the GPU between runs; if it
#      dies, the run it had started is recorded FAIL and a new process takes the rest
# No run starts with less than RESERVE_S (60) of DEADLINE_S left (seconds from this script's start);
# no process outlives DEADLINE_S - 5. Into $OUT (3 files): probe.txt, run.log (all of the above),
# results.tsv (loaders-bare.py's columns, one row a run). Reuses loaders-on-device.sh's functions
# (sourced) and settings: the checkpoint in MODEL_DIR (/tmp/big-model), state in /tmp/loaders.
# A dry run off the device: DRY_RUN=1 (no drop_caches: posix_fadvise), LAYERS=N (a smaller
# checkpoint), LOADERS_BARE_DEVICE=cpu (loaders-bare.py on the CPU).
set -uo pipefail
deadline_s=${1:?usage: loaders-bare-on-device.sh DEADLINE_S [RUN,...]}
runs=${2:-safetensors-cold,instanttensor-cold,fastsafetensors-cold,runai_streamer-cold,safetensors-warm,instanttensor-warm,fastsafetensors-warm,runai_streamer-warm}
end=$(( $(date +%s) + deadline_s ))
bare=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-/tmp/loaders-bare-out}; mkdir -p "$OUT"
WHEELS=${WHEELS:-$bare/../.whl/bare}
# shellcheck source-path=SCRIPTDIR source=loaders-on-device.sh
source "$bare/loaders-on-device.sh"   # probe, libraries, layers_that_fit, cold; $state, $model; the device's env rules
left() { echo $(( end - $(date +%s) )); }
if [ -n "${DRY_RUN:-}" ]; then  # a dry run off the device: the page cache of a shared machine left alone
  cold() { echo "cache: (dry run) posix_fadvise DONTNEED"; shards evict | tail -1; }
  probe() { echo "(dry run: no probe, whose drop_caches test writes the file)"; }
  export LOADERS_BARE_NO_DROP=1
fi

{
  echo "== probe ($(date -u +%T) UTC; deadline ${deadline_s} s)"
  probe > "$OUT/probe.txt" 2>&1
  { echo "model dir's mount:"; findmnt -T "$(dirname "$model")" -o TARGET,SOURCE,FSTYPE,OPTIONS
    echo "block devices:"; lsblk -o NAME,SIZE,ROTA,MODEL 2>&1 | head -20; } >> "$OUT/probe.txt" 2>&1
  cat "$OUT/probe.txt"

  echo "== install ($(date -u +%T)) from $WHEELS: $(find "$WHEELS" -maxdepth 1 -name '*.whl' -printf '%f ')"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || echo "install failed (rc $?)"
  # shellcheck disable=SC2031  # set here for this script's runs; loaders-on-device.sh sets its own in a subshell
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  libraries
  python3 -c 'from importlib.metadata import version
print("versions:", *(f"{n} {version(n)}" for n in ("torch", "safetensors", "fastsafetensors", "instanttensor", "runai-model-streamer", "humanize", "numpy")))' 2>&1 | tail -2

  echo "== checkpoint ($(date -u +%T))"
  layers=${LAYERS:-$(layers_that_fit)}
  rm -rf "$model"; mkdir -p "$model"
  t=$(date +%s.%N)
  python3 "$state/bin/big-checkpoint.py" "$model" --layers "$layers" || echo "checkpoint failed (rc $?)"
  echo "written in $(since "$t") s"; t=$(date +%s.%N); sync; echo "sync took $(since "$t") s"
  du -sb "$model"

  echo "== raw read ($(date -u +%T)): $(left) s left"
  cold
  first=$(find "$model" -name 'model-00001-*.safetensors'); second=$(find "$model" -name 'model-00002-*.safetensors')
  python3 "$state/bin/page-cache.py" read "$first"
  [ -n "$second" ] && dd if="$second" of=/dev/null bs=16M count=128 iflag=direct 2>&1 | tail -1 | sed 's/^/O_DIRECT dd, shard 2, 2 GiB: /'

  echo "== runs ($(date -u +%T)): $(left) s left"
  rm -rf "$state/bare"; mkdir -p "$state/bare"
  for _ in 1 2 3 4 5 6 7 8; do
    [ "$(left)" -lt "${RESERVE_S:-60}" ] && break
    timeout -s KILL "$(( $(left) - 5 ))" python3 "$bare/loaders-bare.py" "$model" --runs "$runs" \
      --results "$OUT/results.tsv" --deadline "$end" --reserve "${RESERVE_S:-60}" --state "$state/bare"
    rc=$?; [ $rc = 0 ] && break
    echo "loaders-bare.py exited with rc $rc"
    for f in "$state/bare"/*.started; do
      [ -e "$f" ] || continue; r=$(basename "$f" .started)
      [ -e "$state/bare/$r.done" ] && continue
      printf '%s\t%s\t%s\t\tFAIL\t\t\t\t\t\t\t\t\t\tprocess ended, rc %s\n' "$r" "${r%-*}" "${r##*-}" "$rc" >> "$OUT/results.tsv"
      touch "$state/bare/$r.done"
    done
  done
  echo "== done ($(date -u +%T)): $(left) s left"
} 2>&1 | tee "$OUT/run.log"
column -t -s $'\t' "$OUT/results.tsv" 2>/dev/null || cat "$OUT/results.tsv"
