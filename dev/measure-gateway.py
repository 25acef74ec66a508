#!/usr/bin/env python3
# dev/measure-gateway.py — the API gateway against every key length and bypass request
# (docs/measurements/doors-2026-12-01.md): run as root from the repository root, after
# scripts/test.sh has installed nginx and the serving image's group.
# As the tests run it: real nginx, api-gateway.sh, a recording upstream on vLLM's socket.
import pathlib
import sys
import tempfile

sys.path[:0] = ["tests", "."]  # run as a program: the tests' gateway fixture and the repository
import test_node_security as t  # noqa: E402
rows = []
for length in (39, 40, 48, 128, 256):
    key = t.generated_key(length)
    with tempfile.TemporaryDirectory() as d, t.serving_gateway(pathlib.Path(d), key) as gw:
        misses = t.near_misses(key)
        refused = sum(t.call(gw.port, "/v1/models", k) == 401 for k in misses)
        rows.append(f"| {length} | starts | {t.call(gw.port, '/v1/models', key)} | {refused}/{len(misses)} refused | {gw.seen} |")
print("| key length | nginx | exact key on /v1/models | near misses (none, wrong, +x, -1, x+, lower, upper, one case flip, "
      "doubled, +tab) | reached upstream |")
print("|---|---|---|---|---|")
print("\n".join(rows))
with tempfile.TemporaryDirectory() as d, t.serving_gateway(pathlib.Path(d)) as gw:
    print("\n| raw request target (no key) | status |\n|---|---|")
    for target in t.BYPASS_REQUESTS + [f"http://127.0.0.1:{gw.port}/metrics/../health"]:
        print(f"| `{target}` | {t.raw_status(gw.port, target)} |")
    print(f"\nreached upstream: {gw.seen}")
