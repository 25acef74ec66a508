"""What launch/lane-router.py adds (issue 41, part 2): the real API gateway (api-gateway.sh, nginx,
the rendered conf) in front of an OpenAI stand-in engine, alone (A) and with the router between
them (B), one after the other on this machine; printed as a report.

    .venv/bin/python dev/router_overhead.py > docs/measurements/router-overhead-<date>.txt

Root (nginx's workers run as nobody:twinspark-api, vLLM's socket path is /run/twinspark-vllm, as
tests/test_node_security.py's gateway); the machine otherwise idle; never beside the simulator.
Figures: per-request latency (non-streamed, 1 token, prefill and decode instant: the hops alone)
at a 1 KiB and a 1 MiB body; streams paced as a Spark decodes (60 tok/s each, one SSE event a
token) at 1, 16 and 64 at once: the gap between a stream's events (p50, p99) and the CPU seconds
the router spent per 1,000 events; and the relay's ceiling (16 streams, the engine emitting as fast
as it can; the Python client reading them is the bound there, alike in both arms).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from core import contract  # noqa: E402
from test_node_security import API_KEY, free_port, gateway_bundle  # noqa: E402
from toolbox import wait_for  # noqa: E402

MODEL = "lane-model"
STANDIN = f"""
import sys
from openai_standin import Behaviour, UnixServer, make_server
UnixServer.request_queue_size = 256  # the gateway opens one connection a request: 64 at once
make_server(Behaviour(api_key=None, model={MODEL!r}, base_latency_s=0.0, prefill_tok_s=float("inf"),
                      decode_tok_s=float(sys.argv[2])), uds=sys.argv[1]).serve_forever()
"""
LANE_SOCKET = "/run/twinspark-vllm/lane-a.sock"
LATENCY_REQUESTS = {1024: 400, 1024 * 1024: 60}
PACED_TOK_S, PACED_TOKENS = 60.0, 300  # a Spark's single-stream decode, 5 s a stream
CONCURRENCY = (1, 16, 64)
CEILING_STREAMS, CEILING_TOKENS = 16, 2000


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def body_of(size: int, stream: bool, max_tokens: int) -> bytes:
    base = {"model": MODEL, "max_tokens": max_tokens, "stream": stream, "messages": [{"role": "user", "content": ""}]}
    pad = size - len(json.dumps(base))
    base["messages"][0]["content"] = "tell me a story " * (max(pad, 0) // 16)
    return json.dumps(base).encode()


def post(port: int, body: bytes) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    return conn.getresponse()


def latencies(port: int, size: int, count: int) -> list[float]:
    body = body_of(size, False, 1)
    seen = []
    for _ in range(count):
        started = time.perf_counter()
        reply = post(port, body)
        reply.read()
        assert reply.status == 200, reply.status
        seen.append(time.perf_counter() - started)
    return seen


def streams(port: int, concurrency: int, tokens: int) -> tuple[int, list[float], int]:
    """(events delivered, the gaps between a stream's events in s, streams that failed) of
    `concurrency` clients at once, each a `tokens`-token stream."""
    body = body_of(512, True, tokens)
    counts, gaps, failed = [0] * concurrency, [], [0]

    def one(i: int) -> None:
        try:
            reply = post(port, body)
            if reply.status != 200:
                failed[0] += 1
                return
            last = None
            while line := reply.readline():
                if line.startswith(b"data: {"):
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    counts[i] += 1
        except (OSError, http.client.HTTPException):
            failed[0] += 1

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), sorted(gaps), failed[0]


@contextlib.contextmanager
def arm(tmp: Path, routed: bool, tok_s: float):
    """The gateway on a free port; behind it the stand-in on vLLM's socket (A) or the router there
    and the stand-in on a lane's socket (B)."""
    port = free_port()
    bundle = gateway_bundle(tmp, API_KEY, port, str(tmp / "no-drain"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    prepare = f". {bundle}/{contract.BOOT_COMMON} && prepare_vllm_socket && exec "
    engine_socket = LANE_SOCKET if routed else contract.VLLM_SOCKET
    (tmp / "standin.py").write_text(STANDIN)
    procs = [subprocess.Popen(["bash", "-c", prepare + f"python3 {tmp / 'standin.py'} {engine_socket} {tok_s}"], env=env)]
    router = None
    if routed:
        wait_for(lambda: os.path.exists(LANE_SOCKET), "the stand-in listening")
        router = subprocess.Popen(["bash", "-c", prepare + f"python3 {ROOT}/launch/{contract.LANE_ROUTER_SCRIPT} --listen "
                                   f"{contract.VLLM_SOCKET} --lane a={LANE_SOCKET}"], stderr=subprocess.DEVNULL)
        procs.append(router)
    gateway = subprocess.Popen(["bash", str(bundle / contract.API_GATEWAY_SCRIPT)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.STDOUT)
    procs.append(gateway)
    try:
        wait_for(lambda: os.path.exists(contract.VLLM_SOCKET), "the engine's socket")
        wait_for(lambda: post(port, body_of(256, False, 1)).status == 200, "the gateway answering", 20,
                 ignoring=(OSError, http.client.HTTPException))
        yield port, (router.pid if router else None)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=10)
        for path in (contract.VLLM_SOCKET, LANE_SOCKET):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def percentile(values: list[float], share: float) -> float:
    return values[int(share * (len(values) - 1))] if values else float("nan")


def measure(routed: bool) -> dict:
    figures: dict = {}
    with tempfile.TemporaryDirectory() as tmp, arm(Path(tmp), routed, float("inf")) as (port, router_pid):
        latencies(port, 1024, 50)  # warm: nginx's and python's first requests
        for size, count in LATENCY_REQUESTS.items():
            seen = sorted(latencies(port, size, count))
            figures[f"latency_{size // 1024}KiB_p50_ms"] = round(statistics.median(seen) * 1000, 2)
            figures[f"latency_{size // 1024}KiB_p99_ms"] = round(percentile(seen, 0.99) * 1000, 2)
        started = time.perf_counter()
        events, _, failed = streams(port, CEILING_STREAMS, CEILING_TOKENS)
        figures[f"ceiling_{CEILING_STREAMS}_streams_events_per_s"] = round(events / (time.perf_counter() - started))
        figures[f"ceiling_{CEILING_STREAMS}_streams_failed"] = failed
    with tempfile.TemporaryDirectory() as tmp, arm(Path(tmp), routed, PACED_TOK_S) as (port, router_pid):
        for concurrency in CONCURRENCY:
            cpu_before = cpu_seconds([router_pid]) if router_pid else 0.0
            events, gaps, failed = streams(port, concurrency, PACED_TOKENS)
            cpu = (cpu_seconds([router_pid]) if router_pid else 0.0) - cpu_before
            figures[f"paced_{concurrency}_streams_events"] = events
            figures[f"paced_{concurrency}_streams_failed"] = failed
            figures[f"paced_{concurrency}_gap_p50_ms"] = round(percentile(gaps, 0.5) * 1000, 2)
            figures[f"paced_{concurrency}_gap_p99_ms"] = round(percentile(gaps, 0.99) * 1000, 2)
            figures[f"paced_{concurrency}_router_cpu_s_per_1000_events"] = round(cpu / max(events, 1) * 1000, 4)
    return figures


def main() -> int:
    if os.geteuid() != 0:
        print("router_overhead.py: run as root (nginx's workers and vLLM's socket path, as the gateway's tests)",
              file=sys.stderr)
        return 2
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{subprocess.run(['nginx', '-v'], capture_output=True, text=True).stderr.strip()}, Python {sys.version.split()[0]}")
    results = {"A: gateway alone": measure(False), "B: gateway + lane-router": measure(True)}
    keys = list(results["A: gateway alone"])
    print(f"{'figure':<46}{'A: gateway alone':>20}{'B: + lane-router':>20}{'B - A':>12}")
    for key in keys:
        a, b = results["A: gateway alone"][key], results["B: gateway + lane-router"][key]
        print(f"{key:<46}{a:>20}{b:>20}{round(b - a, 4):>12}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
