#!/usr/bin/env bash
# vllm-single-gpu.sh — issue 26's single-GPU part, on the device (nvidia-h200), no network:
# real vLLM 0.24.0 behind a one-node Ray head with token auth, started by the program's own
# launch-vllm.sh (build/gpu-bundle, from tests/gpu/render-single-gpu.py), on the tiny model with
# dummy weights. Records raw into $OUT (8 files at most):
#   memory.txt  nvidia-smi before start / while serving (at /health 200, after the requests) /
#               after a clean stop / while serving again / after the worker is killed / after ray stop
#   api.txt     /health, /v1/models, /v1/responses, a streamed chat completion with tools (auto),
#               then tool calls through the real parser, the text forced by structured outputs
#               (tool-call-requests.py): auto streamed with usage, auto not streamed, named streamed
#   metrics.txt /metrics raw, then each name the dashboards and alerts query: present or absent
#   guard.log   the guard's own tool-call check against this server, as sent and forced
#               (guard-tool-call.py); then, unless CANARY=0, launch/serving-guard.py as its unit
#               runs it (guard-argv.json; paths under /tmp, docker a recording stand-in), its status file
#   vllm.log    the engine's log, both starts; kill.txt the worker kill: exit code, log tail
# BUNDLE: the rendered files (default build/gpu-bundle); GUARD: the guard script (default
# launch/serving-guard.py); the helper scripts are read beside this one.
# Before it: every .whl/partN copied into /tmp/wheels by earlier calls (docs: the run sequence).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.." || exit 1
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
bundle=${BUNDLE:-$PWD/build/gpu-bundle} guard=${GUARD:-$PWD/launch/serving-guard.py}
sock=$(sed -n 's/.*--uds \([^ ]*\) .*/\1/p' "$bundle/launch-vllm.sh")
model=$(sed -n 's/^exec vllm serve \([^ ]*\) .*/\1/p' "$bundle/launch-vllm.sh")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the device's rule
export HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 RAY_memory_monitor_refresh_ms=0 RAY_DISABLE_MEMORY_MONITOR=1
# memory.used and the processes using the GPU; while serving also nvidia-smi's own table and
# CUDA's count (torch.cuda.mem_get_info, from a process of its own), to see whether the query sees usage
mem() { echo "== $1 ($(date +%T))"; nvidia-smi --query-gpu=memory.used,memory.total,mig.mode.current --format=csv,noheader
        echo "compute apps (pid, process_name, used_memory):"
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
        if [ "${2:-}" = serving ]; then nvidia-smi
          python3 -c 'import torch; free, total = torch.cuda.mem_get_info(); print(f"torch.cuda.mem_get_info: {(total - free) >> 20} MiB used of {total >> 20} MiB")'
        fi; } >> "$OUT/memory.txt" 2>&1

# 1. the wheels: pieces rebuilt with cat, installed beside the device's packages
mkdir -p /tmp/wheels && cp .whl/*/* /tmp/wheels/ 2>/dev/null  # part8 and extra, carried with this call
(cd /tmp/wheels && for first in *.whl.split-aa; do [ -e "$first" ] || continue
   w=${first%.split-aa}; cat "$w".split-* > "$w" && rm -f "$w".split-*; done)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  /tmp/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
python3 - <<'EOF' 2>&1 | tee "$OUT/kill.txt"   # vllm's requirements the device's own packages miss
from importlib.metadata import requires, version, PackageNotFoundError
from packaging.requirements import Requirement
for r in map(Requirement, requires("vllm")):
    if r.marker and not r.marker.evaluate({"extra": ""}): continue
    try: v = version(r.name)
    except PackageNotFoundError: print("ABSENT", r); continue
    if not r.specifier.contains(v, prereleases=True): print("MISMATCH", r, "have", v)
EOF

# 2. the tiny model where launch-vllm.sh reads it; Ray's token; the socket's group
python3 "$here/tiny-model.py" "$model"
getent group twinspark-api >/dev/null || groupadd -g 64180 twinspark-api
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/tmp/ray-token VLLM_HOST_IP=127.0.0.1
(umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH")
mem "before start"
timeout 90 ray start --head --port=6379 --node-ip-address=127.0.0.1 --num-gpus=1 --disable-usage-stats >> "$OUT/vllm.log" 2>&1

start_engine() {  # as boot-head.sh's prepare_vllm_socket, then exec launch-vllm.sh
  mkdir -p "$(dirname "$sock")"; chown root:twinspark-api "$(dirname "$sock")"; chmod 2750 "$(dirname "$sock")"
  rm -f "$sock"; (umask 0007; exec "$bundle/launch-vllm.sh") >> "$OUT/vllm.log" 2>&1 &
  engine=$!
  for _ in $(seq 240); do curl -sf --unix-socket "$sock" http://x/health >/dev/null && return 0
    kill -0 $engine 2>/dev/null || return 1; sleep 1; done; return 1
}
started=$SECONDS; start_engine || { echo "engine did not come up"; tail -50 "$OUT/vllm.log"; exit 1; }
echo "health after $((SECONDS - started)) s" >> "$OUT/api.txt"
mem "while serving: /health 200" serving
# the API gateway's stand-in: TCP 8000 (API) and 8100 (metrics) to vLLM's socket, no key check
python3 -c '
import asyncio, sys
async def pipe(r, w):
    while data := await r.read(65536): w.write(data); await w.drain()
    w.close()
async def handle(r, w):
    ur, uw = await asyncio.open_unix_connection(sys.argv[1]); await asyncio.gather(pipe(r, uw), pipe(ur, w))
async def main():
    servers = [await asyncio.start_server(handle, "127.0.0.1", p) for p in (8000, 8100)]
    await asyncio.gather(*(s.serve_forever() for s in servers))
asyncio.run(main())' "$sock" & forwarder=$!
sleep 1
api() { echo "== ${URL} $*"; curl -sS -i -N --max-time 60 "$@" http://127.0.0.1:8000"${URL}"; echo; } >> "$OUT/api.txt" 2>&1
URL=/health api; URL=/v1/models api
URL=/v1/responses api -H 'Content-Type: application/json' -d '{"model":"tiny","input":"What is 2 + 3?","max_output_tokens":16}'
URL=/v1/chat/completions api -H 'Content-Type: application/json' -d '{"model":"tiny","stream":true,"max_tokens":32,
 "messages":[{"role":"user","content":"What is the weather in Paris? Use the tool."}],"tool_choice":"auto",
 "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
 "properties":{"city":{"type":"string"}},"required":["city"]}}}]}'
mapfile -t tool_bodies < <(python3 "$here/tool-call-requests.py")
for body in "${tool_bodies[@]}"; do URL=/v1/chat/completions api -H 'Content-Type: application/json' -d "$body"; done
python3 "$here/guard-tool-call.py" "$guard" http://127.0.0.1:8000 > "$OUT/guard.log" 2>&1
mem "while serving: after the requests" serving
curl -sS http://127.0.0.1:8100/metrics > "$OUT/metrics.txt"
queried=$(while read -r name; do
    if grep -q "^${name}[{ ]" "$OUT/metrics.txt"; then echo "present $name"; else echo "ABSENT $name"; fi
  done < "$bundle/metric-names.txt")
printf '== queried by the dashboards and alerts\n%s\n' "$queried" >> "$OUT/metrics.txt"

# 3. the guard's canary, its unit's argv with host paths moved under /tmp and docker recorded
if [ "${CANARY:-1}" != 0 ]; then
mkdir -p /tmp/guard/bin && echo "VLLM_API_KEY=$(python3 -c 'import secrets; print(secrets.token_hex(16))')" > /tmp/guard/secrets.env
cat > /tmp/guard/bin/docker <<'EOF'
#!/usr/bin/env bash
echo "docker $*" >> /tmp/guard/docker-calls
[ "$1" = inspect ] && echo '[{"Id":"standin","RestartCount":0,"State":{"Running":true,"StartedAt":"","ExitCode":0},"HostConfig":{"RestartPolicy":{"Name":"unless-stopped"}}}]'
exit 0
EOF
chmod +x /tmp/guard/bin/docker
mapfile -t argv < <(python3 -c 'import json,sys; [print(a) for a in json.load(open(sys.argv[1]))]' "$bundle/guard-argv.json")
for i in "${!argv[@]}"; do a=${argv[$i]}
  case $a in /usr/local/lib/twinspark/serving-guard.py) argv[i]=$guard ;;
    /opt/twinspark/secrets.env) argv[i]=/tmp/guard/secrets.env ;; /usr/bin/python3) argv[i]=python3 ;;
    /*) argv[i]=/tmp/guard${a} ;; esac; done
mkdir -p /tmp/guard/run/twinspark/serving-guard /tmp/guard/var/lib/twinspark/serving-guard \
  /tmp/guard/var/lib/twinspark/observability/textfile /tmp/guard/var/log/twinspark
{ echo "argv: ${argv[*]}"; PATH=/tmp/guard/bin:$PATH timeout 100 "${argv[@]}" 2>&1; } >> "$OUT/guard.log"
{ echo "== status"; cat /tmp/guard/run/twinspark/serving-guard/status.json; echo "== docker calls"
  cat /tmp/guard/docker-calls 2>/dev/null; } >> "$OUT/guard.log"
fi

# 4. a clean stop (SIGTERM to the engine), then a start and its Ray worker killed
kill $forwarder; kill -TERM $engine; wait $engine; echo "clean stop: exit $?" >> "$OUT/kill.txt"; sleep 5
mem "after clean stop"
start_engine || { echo "second start failed" >> "$OUT/kill.txt"; }
mem "while serving again (second start)"
# the process that holds the GPU: vLLM 0.24's Ray worker is ray::RayWorkerProc (runs 1 and 2 looked
# for ray::RayWorkerWrapper, found none and killed the EngineCore); KILL=engine kills the EngineCore
case ${KILL:-worker} in
  worker) worker=$(pgrep -f 'ray::RayWorkerProc' | head -1); worker=${worker:-$(pgrep -f 'ray::RayWorkerWrapper' | head -1)} ;;
  engine) worker=$(pgrep -f 'VLLM::EngineCore' | head -1) ;;
esac
echo "killing pid ${worker:-none} ($(ps -o args= -p "${worker:-1}"))" >> "$OUT/kill.txt"
killed=$SECONDS; kill -9 "$worker"
for _ in $(seq 120); do kill -0 $engine 2>/dev/null || break; echo "$((SECONDS - killed)) s health $(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$sock" http://x/health)" >> "$OUT/kill.txt"; sleep 1; done
wait $engine; echo "engine exit $? after $((SECONDS - killed)) s" >> "$OUT/kill.txt"
tail -60 "$OUT/vllm.log" >> "$OUT/kill.txt"; sleep 5
mem "after worker kill"
ray stop --force >/dev/null 2>&1; sleep 3; mem "after ray stop"
