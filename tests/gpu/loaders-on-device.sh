#!/usr/bin/env bash
# loaders-on-device.sh — issue 42 item 2 on the device (one GPU, no network): vLLM 0.24.0's weight
# loaders timed on a real-size checkpoint (big-checkpoint.py: Qwen2.5-14B's shapes, 29.5 GB bf16 in
# 6 shards) written on the device's disk, each with a cold page cache and a warm one.
#
#   loaders-on-device.sh probe        the machine's facts (GPU, disk, memory, drop_caches, libraries)
#                                     into $OUT/probe.txt, then the checkpoint written in the
#                                     background (setsid: it outlives the call while the machine is
#                                     warm), so the wheels' carry calls overlap it
#   loaders-on-device.sh run DEADLINE_S RUN...
#                                     wheels installed (once), the checkpoint awaited, a read-back
#                                     timing of one shard cold and warm (once), then each RUN not
#                                     done yet, as LOADER-cold or LOADER-warm (LOADER: vLLM's
#                                     --load-format; dummy-asis: no weights read, the floor); no
#                                     run starts after DEADLINE_S seconds less RESERVE_S (180);
#                                     a run done (by an earlier call on this machine) is skipped
#
# A run: the cache made cold (sync; echo 3 > /proc/sys/vm/drop_caches; if refused,
# posix_fadvise DONTNEED on each shard) or warm (each shard read through the cache), its state
# checked with mincore (page-cache.py); `vllm serve` (the default executor, TP 1, --enforce-eager:
# no torch.compile nor CUDA graphs, --max-model-len 4096, the default 0.9 of GPU memory); /health
# polled every 0.2 s (RUN_LIMIT_S, 240, at most); nvidia-smi at /health 200; one streamed completion (first-token.py); SIGTERM
# to the server's process group, then the GPU awaited empty. Writes into $OUT (8 files at most):
#   results.tsv  one line a run (all runs of this machine so far): seconds to /health 200, to the
#                first token of the request, start to first token, vLLM's own lines' figures
#   vllm.log     each run's server log, headed by its name (this call's runs)
#   runs.log     cache state, nvidia-smi, the request's answer, the stop (this call's runs)
# Before `run`: every .whl/partN copied into /tmp/wheels by earlier calls (fetch-vllm-wheels.sh).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/loaders-out}; mkdir -p "$OUT"
state=/tmp/loaders model=${MODEL_DIR:-/tmp/big-model} port=${PORT:-8000}
mkdir -p "$state/bin" "$state/done"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the device's rule
export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
cp "$here"/{big-checkpoint.py,tiny-model.py,page-cache.py,first-token.py} "$state/bin/" 2>/dev/null

probe() {
  date -u; nvidia-smi; nvidia-smi --query-gpu=name,memory.total,driver_version,mig.mode.current --format=csv
  uname -r; nproc; grep -E 'MemTotal|MemAvailable' /proc/meminfo; df -B1 / /tmp; mount | grep -E ' on / | on /tmp '
  python3 -c 'import sys, torch, safetensors; print(sys.version.split()[0], torch.__version__, torch.version.cuda, safetensors.__version__)'
  python3 -m pip list 2>/dev/null | grep -i -E '^(typer|humanize|numpy|torch|safetensors|tokenizers|transformers) '
  echo "GDS device nodes: $(find /dev -maxdepth 1 -name 'nvidia-fs*' | head -2 | paste -sd' ')"
  echo "ldconfig:"; ldconfig -p | grep -E 'libcudart|libcufile|libnuma|liburing|libaio'
  local dirs; mapfile -t dirs < <(library_dirs)
  echo "cudart/cufile files:"; find "${dirs[@]}" -name 'libcudart.so*' -o -name 'libcufile.so*' 2>/dev/null
  if (sync; echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo "drop_caches: written"; else echo "drop_caches: refused"; fi
  grep -E 'MemTotal|MemAvailable|^Cached' /proc/meminfo
}

# fastsafetensors dlopens "libcudart.so" (unversioned) and "libcufile.so.0": name them where the
# device has them (torch's CUDA 13 runtime, nvidia-cufile), as an image with the toolkit would
library_dirs() { find /usr/local/cuda/lib64 -maxdepth 0 2>/dev/null; python3 -c 'import site; print(*site.getsitepackages(), sep="\n")'; }
libraries() {
  local lib=$state/lib dirs real
  mkdir -p "$lib"; mapfile -t dirs < <(library_dirs)
  if ! ldconfig -p | grep -q 'libcudart\.so '; then
    real=$(find "${dirs[@]}" -name 'libcudart.so.1[0-9]*' 2>/dev/null | sort | tail -1)
    [ -n "$real" ] && ln -sf "$real" "$lib/libcudart.so"
  fi
  real=$(find "${dirs[@]}" -name 'libcufile.so.0' 2>/dev/null | head -1)
  [ -n "$real" ] && ln -sf "$real" "$lib/libcufile.so.0"
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "libraries: $(find "$lib" -mindepth 1 -printf '%f -> %l ' )"
}

install_wheels() {
  [ -e /tmp/site/.installed ] && return 0
  (cd /tmp/wheels && for first in *.whl.split-aa; do [ -e "$first" ] || continue
     w=${first%.split-aa}; cat "$w".split-* > "$w" && rm -f "$w".split-*; done)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/wheels/*.whl || return 1
  # the bytecode now, on every core, so that the first server started does not pay it alone
  python3 -m compileall -q -j 0 /tmp/site > /dev/null 2>&1
  touch /tmp/site/.installed
}

layers_that_fit() {  # the checkpoint's layers that the disk holds (all 48 where it can), told on stderr
  local avail n; avail=$(df -B1 --output=avail "$(dirname "$model")" | tail -1)
  # 29.54 GB at 48 layers; each layer 0.5505 GB, the embeddings 3.11 GB; leave 4 GB for vLLM's install
  n=$(python3 -c "print(min(48, int(($avail - 4e9 - 3.12e9) / 0.5505e9)))")
  echo "disk free $avail B: $n layers" >&2; echo "$n"
}

shards() { python3 "$state/bin/page-cache.py" "$1" "$model"/model-*.safetensors; }

cold() {  # echo 3 > drop_caches; posix_fadvise where refused
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then echo "cache: drop_caches written"
    shards resident | tail -1
  else echo "cache: drop_caches refused, posix_fadvise DONTNEED"
    shards evict | tail -1; fi
}
warm() { echo "cache: each shard read"; shards read | tail -1; shards resident | tail -1; }

since() { awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $1}"; }
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

one_run() {  # NAME: LOADER-cold | LOADER-warm
  local name=$1 loader=${1%-*} cache=${1##*-} log=$state/$1.log started pid health="" ttft="" code gpu
  echo "== $name ($(date -u +%T))"
  case $cache in cold) cold ;; warm) warm ;; *) echo "cache: left as it is" ;; esac
  local resident; resident=$(shards resident | tail -1 | awk '{print $2}')
  echo "gpu before: $(gpu_used) MiB"
  started=$(date +%s.%N)
  setsid vllm serve "$model" --served-model-name big --load-format "$loader" --enforce-eager \
    --max-model-len 4096 --host 127.0.0.1 --port "$port" > "$log" 2>&1 < /dev/null &
  pid=$!
  local deadline=$((SECONDS + ${RUN_LIMIT_S:-240}))
  while [ $SECONDS -lt $deadline ]; do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$port/health")
    if [ "$code" = 200 ]; then health=$(since "$started"); break; fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
  local answer="" e2e=""
  if [ -n "$health" ]; then
    gpu=$(gpu_used)
    echo "health 200 after ${health} s; nvidia-smi at health: ${gpu} MiB"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
    local asked; asked=$(since "$started")
    answer=$(python3 "$state/bin/first-token.py" "http://127.0.0.1:$port" big 2>&1)
    echo "request (sent ${asked} s after the start): $answer"
    ttft=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ttft_s"])' "$answer" 2>/dev/null)
    [ -n "$ttft" ] && [ "$ttft" != None ] && e2e=$(awk "BEGIN{printf \"%.2f\", $asked + $ttft}")
  else
    echo "no /health 200 (server alive: $(kill -0 $pid 2>/dev/null && echo yes || echo no)); log tail:"; tail -25 "$log"
  fi
  kill -TERM -- -$pid 2>/dev/null
  for _ in $(seq 60); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  if kill -0 $pid 2>/dev/null; then echo "still up 30 s after SIGTERM: SIGKILL"; kill -KILL -- -$pid; fi
  wait $pid 2>/dev/null; echo "server exit: $?"
  for _ in $(seq 30); do [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break; sleep 1; done
  echo "gpu after stop: $(gpu_used) MiB"
  # vLLM's own lines: "Loading weights took X seconds", "Model loading took X GiB memory and Y seconds",
  # "init engine (profile, create kv cache, warmup model) took Z s"
  local lw ml_gib ml_s ie
  lw=$(grep -o 'Loading weights took [0-9.]* seconds' "$log" | head -1 | awk '{print $4}')
  ml_gib=$(grep -o 'Model loading took [0-9.]* GiB' "$log" | head -1 | awk '{print $4}')
  ml_s=$(grep -o 'Model loading took .* and [0-9.]* seconds' "$log" | head -1 | awk '{print $(NF-1)}')
  ie=$(grep -o 'warmup model) took [0-9.]*' "$log" | head -1 | awk '{print $NF}')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$loader" "$cache" "${resident:-}" \
    "${health:-FAIL}" "${ttft:-}" "${e2e:-}" "${lw:-}" "${ml_s:-}" "${ml_gib:-}" "${ie:-}" "${gpu:-}" >> "$state/results.tsv"
  { echo "===== $name"; cat "$log"; } >> "$OUT/vllm.log"
  touch "$state/done/$name"; results
}

results() {  # every run of this machine so far, into $OUT (after each run: a call cut short keeps them)
  { printf 'run\tloader\tcache\tresident_before\thealth_s\tttft_s\tstart_to_first_token_s\tloading_weights_s\tmodel_loading_s\tmodel_loading_GiB\tinit_engine_s\tgpu_used_MiB\n'
    cat "$state/results.tsv" 2>/dev/null; } > "$OUT/results.tsv"
}

# sourced (loaders-bare-on-device.sh): the functions and settings above, no verb
(return 0 2>/dev/null) && return 0

case ${1:-} in
  probe)
    probe > "$OUT/probe.txt" 2>&1; cat "$OUT/probe.txt"
    layers=$(layers_that_fit)
    rm -rf "$model" "$state/gen.rc"
    setsid nohup bash -c "python3 '$state/bin/big-checkpoint.py' '$model' --layers $layers > '$state/gen.log' 2>&1; echo \$? > '$state/gen.rc'" \
      < /dev/null > /dev/null 2>&1 &
    echo "checkpoint writing in the background (pid $!)"
    ;;
  run)
    limit=$2; shift 2
    t0=$SECONDS
    {
      echo "== install ($(date -u +%T))"; install_wheels || { echo "install failed"; exit 1; }
      export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
      echo "installed after $((SECONDS - t0)) s"
      libraries
      python3 -c 'import vllm, fastsafetensors, instanttensor, runai_model_streamer as r
from importlib.metadata import version
print("versions:", *(f"{n} {version(n)}" for n in ("vllm", "fastsafetensors", "instanttensor", "runai-model-streamer", "torch")))' 2>&1 | tail -3
      python3 -c 'from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER as loaders
parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
action = next(a for a in parser._actions if "--load-format" in a.option_strings)
print("parser --load-format: type", getattr(action.type, "__name__", action.type), "choices", action.choices, "default", action.default)
print("loaders:", {k: v.__name__ for k, v in loaders.items()})
print("parsed:", [parser.parse_args(["--load-format", f]).load_format for f in ("instanttensor", "FastSafetensors", "runai_streamer", "no-such-loader")])' 2>&1 | tail -4
      for _ in $(seq 300); do [ -e "$state/gen.rc" ] && break; sleep 1; done
      echo "checkpoint: rc $(cat "$state/gen.rc" 2>/dev/null || echo 'not done')"; cat "$state/gen.log"; du -sb "$model"
      if [ ! -e "$state/readback" ]; then
        cold; first=$(find "$model" -name 'model-00001-*.safetensors')
        python3 "$state/bin/page-cache.py" read "$first"; python3 "$state/bin/page-cache.py" read "$first"
        touch "$state/readback"
      fi
      for run in "$@"; do
        [ -e "$state/done/$run" ] && continue
        left=$((limit - (SECONDS - t0)))
        if [ "$left" -lt "${RESERVE_S:-180}" ]; then echo "== $run not started: $left s left"; continue; fi
        one_run "$run"
      done
      echo "== done after $((SECONDS - t0)) s"
    } 2>&1 | tee -a "$OUT/runs.log"
    results; cat "$OUT/results.tsv"
    ;;
  *) sed -n '2,30p' "$0"; exit 2 ;;
esac
