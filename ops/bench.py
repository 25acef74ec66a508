"""bench — the recipe's benchmark methodology against the live endpoint.

- single stream: decode tok/s on real coding prompts, mean of 3, temperature 0.2
- N-way concurrent: aggregate output tok/s of N simultaneous streams
- long prompt: TTFT of a ~7k-token prompt, and the prefill tok/s it implies
- sweep: for each concurrency, output tok/s and TTFT / TPOT p50 and p99

Results are JSON (plus a table); `--compare baseline.json` flags regressions, which is how
a silent NCCL fallback to TCP after a restart shows up (decode collapses).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .stream import StreamResult, client, stream_chat

CODING_PROMPTS = [
    "Write a Python function that parses an ISO 8601 duration such as 'P3DT4H5M' into seconds, with tests.",
    "Implement a thread-safe LRU cache in Python with a max size and per-entry TTL. Explain the locking.",
    "Write a Bash script that rotates log files older than 7 days into gzip archives, with a dry-run flag.",
    "Refactor this into idiomatic Rust: a function that reads a CSV of (name, score) and returns the top 3.",
    "Write a SQL query and the matching index for: the 10 customers with the highest 30-day order totals.",
    "Explain and fix the race condition in a Go worker pool that closes its results channel too early.",
]

# Higher is better for tok/s; lower is better for latencies.
HIGHER_IS_BETTER = ("tok_s",)


@dataclass
class BenchPlan:
    single_runs: int = 3
    single_max_tokens: int = 256
    concurrency: int = 4
    long_prompt_tokens: int = 7000
    sweep: Sequence[int] = (1, 2, 4, 6)
    sweep_requests_per_level: int = 2  # x concurrency
    sweep_input_tokens: int = 1000
    sweep_output_tokens: int = 128
    temperature: float = 0.2


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear interpolation between closest ranks (numpy's default)."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    position = (len(data) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return data[low] + (data[high] - data[low]) * (position - low)


def mean(values: Sequence[float]) -> Optional[float]:
    data = [v for v in values if v is not None]
    return sum(data) / len(data) if data else None


def aggregate_tok_s(results: Sequence[StreamResult]) -> Optional[float]:
    ok = [r for r in results if r.error is None and r.output_tokens]
    if not ok:
        return None
    wall = max(r.done for r in ok) - min(r.sent for r in ok)
    return sum(r.output_tokens for r in ok) / wall if wall > 0 else None


def filler_text(tokens: int) -> str:
    """Code-like text of roughly `tokens` tokens (~4 characters each), deterministic."""
    line = "def handler_{i}(request):\n    return {{'status': 200, 'id': {i}, 'items': [x for x in range({i} % 17)]}}\n"
    text, i = [], 0
    while sum(len(t) for t in text) < tokens * 4:
        text.append(line.format(i=i))
        i += 1
    return "".join(text)


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


class Bench:
    def __init__(self, endpoint: str, api_key: str, model: str, plan: BenchPlan,
                 on_request_done: Callable[[], None] = lambda: None):
        self.endpoint, self.api_key, self.model, self.plan = endpoint, api_key, model, plan
        self.on_request_done = on_request_done
        self.errors: list[str] = []

    def total_requests(self) -> int:
        p = self.plan
        return p.single_runs + p.concurrency + 1 + sum(c * p.sweep_requests_per_level for c in p.sweep)

    async def _one(self, http, messages, max_tokens, extra=None) -> StreamResult:
        result = await stream_chat(http, self.endpoint, self.model, messages, max_tokens, self.plan.temperature, extra=extra)
        if result.error:
            self.errors.append(result.error)
        self.on_request_done()
        return result

    async def run(self) -> dict:
        p = self.plan
        async with client(self.api_key) as http:
            single = [await self._one(http, user(CODING_PROMPTS[i % len(CODING_PROMPTS)]), p.single_max_tokens)
                      for i in range(p.single_runs)]
            concurrent = await asyncio.gather(*(
                self._one(http, user(CODING_PROMPTS[i % len(CODING_PROMPTS)]), p.single_max_tokens)
                for i in range(p.concurrency)))
            long = await self._one(http, user(filler_text(p.long_prompt_tokens) + "\nSummarize the code above."), 1)
            sweep = []
            for level in p.sweep:
                results = await self._level(http, level)
                sweep.append(sweep_row(level, results))
        return {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "endpoint": self.endpoint,
            "model": self.model,
            "single_stream": {
                "decode_tok_s": mean([r.decode_tok_s for r in single]),
                "runs_tok_s": [r.decode_tok_s for r in single],
            },
            "concurrent": {"streams": p.concurrency, "aggregate_tok_s": aggregate_tok_s(concurrent)},
            "long_prompt": {
                "prompt_tokens": long.prompt_tokens,
                "ttft_s": long.ttft_s,
                "prefill_tok_s": (long.prompt_tokens / long.ttft_s) if long.prompt_tokens and long.ttft_s else None,
            },
            "sweep": sweep,
            "errors": self.errors,
        }

    async def _level(self, http, level: int) -> list[StreamResult]:
        """`level` streams in flight at all times until the level's requests are done."""
        p = self.plan
        queue = list(range(level * p.sweep_requests_per_level))
        prompt = filler_text(p.sweep_input_tokens)
        results: list[StreamResult] = []

        async def worker():
            while queue:
                i = queue.pop()
                # ignore_eos: every request produces exactly the requested tokens (vLLM extension)
                results.append(await self._one(http, user(f"[{i}] {prompt}"), p.sweep_output_tokens,
                                               extra={"ignore_eos": True}))

        await asyncio.gather(*(worker() for _ in range(level)))
        return results


def sweep_row(level: int, results: Sequence[StreamResult]) -> dict:
    ttfts = [r.ttft_s for r in results if r.error is None]
    tpots = [r.tpot_s * 1000 for r in results if r.error is None and r.tpot_s is not None]
    return {
        "concurrency": level,
        "requests": len(results),
        "output_tok_s": aggregate_tok_s(results),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "tpot_p50_ms": percentile(tpots, 50),
        "tpot_p99_ms": percentile(tpots, 99),
    }


def flat_metrics(result: dict) -> dict[str, float]:
    """The comparable figures of a result, by a stable name."""
    metrics = {
        "single_stream.decode_tok_s": result["single_stream"]["decode_tok_s"],
        "concurrent.aggregate_tok_s": result["concurrent"]["aggregate_tok_s"],
        "long_prompt.ttft_s": result["long_prompt"]["ttft_s"],
        "long_prompt.prefill_tok_s": result["long_prompt"]["prefill_tok_s"],
    }
    for row in result["sweep"]:
        for key in ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "tpot_p99_ms"):
            metrics[f"sweep[c={row['concurrency']}].{key}"] = row[key]
    return {k: v for k, v in metrics.items() if v is not None}


def compare(current: dict, baseline: dict, tolerance: float = 0.10) -> list[dict]:
    """Each shared figure with its change; `regression` when worse by more than tolerance."""
    rows = []
    now, before = flat_metrics(current), flat_metrics(baseline)
    for name in sorted(set(now) & set(before)):
        higher_better = name.endswith(HIGHER_IS_BETTER)
        change = (now[name] - before[name]) / before[name] if before[name] else 0.0
        worse = -change if higher_better else change
        rows.append({"metric": name, "baseline": before[name], "current": now[name],
                     "change": change, "regression": worse > tolerance})
    return rows


def render(result: dict, console: Console, comparison: Optional[list[dict]] = None) -> None:
    summary = Table(title=f"bench {result['model']} @ {result['endpoint']}")
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    fmt = lambda v, unit: "—" if v is None else f"{v:.1f} {unit}"  # noqa: E731
    summary.add_row("single-stream decode (mean of runs)", fmt(result["single_stream"]["decode_tok_s"], "tok/s"))
    summary.add_row(f"{result['concurrent']['streams']}-way aggregate", fmt(result["concurrent"]["aggregate_tok_s"], "tok/s"))
    lp = result["long_prompt"]
    summary.add_row(f"TTFT, {lp['prompt_tokens'] or '?'}-token prompt", fmt(lp["ttft_s"], "s"))
    summary.add_row("prefill", fmt(lp["prefill_tok_s"], "tok/s"))
    console.print(summary)
    sweep = Table(title="concurrency sweep")
    for col in ("conc", "output tok/s", "TTFT p50 / p99 (s)", "TPOT p50 / p99 (ms)"):
        sweep.add_column(col, justify="right")
    for row in result["sweep"]:
        pair = lambda a, b: "—" if a is None else f"{a:.2f} / {b:.2f}"  # noqa: E731
        sweep.add_row(str(row["concurrency"]), fmt(row["output_tok_s"], ""), pair(row["ttft_p50_s"], row["ttft_p99_s"]),
                      pair(row["tpot_p50_ms"], row["tpot_p99_ms"]))
    console.print(sweep)
    if comparison:
        diff = Table(title="against baseline")
        for col in ("metric", "baseline", "current", "change", ""):
            diff.add_column(col)
        for row in comparison:
            diff.add_row(row["metric"], f"{row['baseline']:.2f}", f"{row['current']:.2f}", f"{row['change']:+.0%}",
                         "[red]REGRESSION[/red]" if row["regression"] else "")
        console.print(diff)
    for error in result["errors"][:5]:
        console.print(f"[red]request failed:[/red] {error}")


def run_bench(target, plan: BenchPlan, output: Optional[str], baseline: Optional[str], tolerance: float,
              console: Console) -> int:
    with Progress(console=console, transient=True) as progress:
        bench = Bench(target.endpoint, target.api_key, target.model, plan)
        task = progress.add_task("benchmarking", total=bench.total_requests())
        bench.on_request_done = lambda: progress.advance(task)
        result = asyncio.run(bench.run())
    comparison = None
    if baseline:
        with open(baseline) as f:
            comparison = compare(result, json.load(f), tolerance)
    render(result, console, comparison)
    if output:
        with open(output, "w") as f:
            json.dump(result, f, indent=2)
        console.print(f"results written to {output}")
    failed = bool(result["errors"]) or any(row["regression"] for row in comparison or [])
    return 1 if failed else 0
