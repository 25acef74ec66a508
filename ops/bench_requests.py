"""The load `ops bench` puts on the endpoint and the figures each run yields: the plan, the salted
prompts, the requests (warm-up, single stream, N-way, long prompt, sweep) and their statistics
(percentiles, spread, aggregate tok/s). What the figures are compared with: bench_compare.py."""

from __future__ import annotations

import asyncio
import math
import secrets
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .stream import USAGE_FROM_CHUNKS, USAGE_FROM_SERVER, StreamResult, client, stream_chat

# 2: plan, salted prompts, usage sources. A results file without `schema` is version 1: no
# plan, and prompts fixed in the code, so its TTFT and prefill may be prefix-cache hits.
SCHEMA = 2

WARMUP_REQUESTS = 1
WARMUP_MAX_TOKENS = 16

CODING_PROMPTS = [
    "Write a Python function that parses an ISO 8601 duration such as 'P3DT4H5M' into seconds, with tests.",
    "Implement a thread-safe LRU cache in Python with a max size and per-entry TTL. Explain the locking.",
    "Write a Bash script that rotates log files older than 7 days into gzip archives, with a dry-run flag.",
    "Refactor this into idiomatic Rust: a function that reads a CSV of (name, score) and returns the top 3.",
    "Write a SQL query and the matching index for: the 10 customers with the highest 30-day order totals.",
    "Explain and fix the race condition in a Go worker pool that closes its results channel too early.",
]


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
    sweep_repeats: int = 3  # each level measured this many times: the spread the gate allows
    temperature: float = 0.2


def percentile(values: Sequence[Optional[float]], q: float) -> Optional[float]:
    """Linear interpolation between closest ranks (numpy's default)."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    position = (len(data) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return data[low] + (data[high] - data[low]) * (position - low)


def mean(values: Sequence[Optional[float]]) -> Optional[float]:
    data = [v for v in values if v is not None]
    return sum(data) / len(data) if data else None


def spread(values: Sequence[Optional[float]], unit: str) -> dict:
    """min / median / max of the runs, beside their mean: noise and a regression look different."""
    data = [v for v in values if v is not None]
    return {f"min_{unit}": min(data, default=None), f"median_{unit}": statistics.median(data) if data else None,
            f"max_{unit}": max(data, default=None)}


def aggregate_tok_s(results: Sequence[StreamResult]) -> Optional[float]:
    ok = [r for r in results if r.error is None and r.output_tokens]
    if not ok:
        return None
    wall = max(r.done for r in ok) - min(r.sent for r in ok)
    return sum(r.output_tokens for r in ok) / wall if wall > 0 else None


def filler_text(tokens: int) -> str:
    """Code-like text of roughly `tokens` tokens (~4 characters each), deterministic."""
    line = "def handler_{i}(request):\n    return {{'status': 200, 'id': {i}, 'items': [x for x in range({i} % 17)]}}\n"
    text: list[str] = []
    i = 0
    while sum(len(t) for t in text) < tokens * 4:
        text.append(line.format(i=i))
        i += 1
    return "".join(text)


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def plan_record(plan: BenchPlan, model: str, endpoint: str, profile: Optional[str]) -> dict:
    """Everything that changes the figures, keyed like the command-line flags that set it."""
    return {
        "runs": plan.single_runs,
        "max_tokens": plan.single_max_tokens,
        "concurrency": plan.concurrency,
        "long_prompt_tokens": plan.long_prompt_tokens,
        "sweep": list(plan.sweep),
        "sweep_requests": plan.sweep_requests_per_level,
        "sweep_input_tokens": plan.sweep_input_tokens,
        "sweep_output_tokens": plan.sweep_output_tokens,
        "sweep_repeats": plan.sweep_repeats,
        "temperature": plan.temperature,
        "model": model,
        "endpoint": endpoint,
        "profile": profile,
    }


def plan_from_record(record: dict) -> BenchPlan:
    """The plan a results file was made with (plan_record's inverse), to measure like with like."""
    return BenchPlan(single_runs=record["runs"], single_max_tokens=record["max_tokens"],
                     concurrency=record["concurrency"], long_prompt_tokens=record["long_prompt_tokens"],
                     sweep=tuple(record["sweep"]), sweep_requests_per_level=record["sweep_requests"],
                     sweep_input_tokens=record["sweep_input_tokens"],
                     sweep_output_tokens=record["sweep_output_tokens"], temperature=record["temperature"],
                     sweep_repeats=record.get("sweep_repeats", 1))  # older results: each level once


class Bench:
    def __init__(self, endpoint: str, api_key: str, model: str, plan: BenchPlan,
                 on_request_done: Callable[[], None] = lambda: None, send_cache_salt: bool = False,
                 profile: Optional[str] = None):
        self.endpoint, self.api_key, self.model, self.plan = endpoint, api_key, model, plan
        self.on_request_done = on_request_done
        self.send_cache_salt, self.profile = send_cache_salt, profile
        self.run_id = secrets.token_hex(4)
        self.errors: list[str] = []
        self.results: list[Optional[StreamResult]] = []

    def total_requests(self) -> int:
        p = self.plan
        return (WARMUP_REQUESTS + p.single_runs + p.concurrency + 1
                + sum(c * p.sweep_requests_per_level for c in p.sweep) * p.sweep_repeats)

    async def _one(self, http, prompt: str, max_tokens, extra=None, warmup: bool = False) -> StreamResult:
        # The salt opens the prompt, so even the first cache block differs from every other
        # request's, in this run and any other: the figures are prefill and decode, never cache hits.
        if warmup:  # kept out of self.results: no figure or count includes it
            slot, tag = None, f"{self.run_id}.warmup"
        else:
            slot = len(self.results)
            self.results.append(None)  # taken before the first await, so concurrent requests get distinct numbers
            tag = f"{self.run_id}.{slot}"
        extra = {**(extra or {}), **({"cache_salt": f"twinspark-bench-{tag}"} if self.send_cache_salt else {})}
        result = await stream_chat(http, self.endpoint, self.model, user(f"[{tag}] {prompt}"), max_tokens,
                                   self.plan.temperature, extra=extra)
        if slot is not None:
            self.results[slot] = result
        if result.error:
            self.errors.append(("warm-up: " if warmup else "") + result.error)
        self.on_request_done()
        return result

    def usage_counts(self) -> dict:
        answered = [r for r in self.results if r is not None and r.error is None]
        return {"server": sum(r.usage_source == USAGE_FROM_SERVER for r in answered),
                "chunk_count_fallback": sum(r.usage_source == USAGE_FROM_CHUNKS for r in answered)}

    def cached_prompt_tokens(self) -> dict:
        reported = [r.cached_prompt_tokens for r in self.results
                    if r is not None and r.error is None and r.cached_prompt_tokens is not None]
        return {"requests_reporting": len(reported), "total": sum(reported)}

    async def run(self) -> dict:
        p = self.plan
        async with client(self.api_key) as http:
            # the first request after a restart or an idle spell can pay one-off costs (graph capture,
            # allocator growth): a warm-up takes them, outside every figure
            warmup = await self._one(http, CODING_PROMPTS[0], WARMUP_MAX_TOKENS, warmup=True)
            single = [await self._one(http, CODING_PROMPTS[i % len(CODING_PROMPTS)], p.single_max_tokens)
                      for i in range(p.single_runs)]
            concurrent = await asyncio.gather(*(
                self._one(http, CODING_PROMPTS[i % len(CODING_PROMPTS)], p.single_max_tokens)
                for i in range(p.concurrency)))
            long = await self._one(http, filler_text(p.long_prompt_tokens) + "\nSummarize the code above.", 1)
            # the repeats interleaved (each pass measures every level once): a burst of load (a
            # co-tenant, a busy host) lands in one repeat of a level and widens its spread, which
            # the gate allows, instead of moving all of them and with them the median
            repeats: list[list] = [[] for _ in p.sweep]
            for _ in range(p.sweep_repeats):
                for i, level in enumerate(p.sweep):
                    repeats[i].append(await self._level(http, level))
            sweep = [sweep_row(level, runs) for level, runs in zip(p.sweep, repeats)]
        return {
            "schema": SCHEMA,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "endpoint": self.endpoint,
            "model": self.model,
            "plan": plan_record(p, self.model, self.endpoint, self.profile),
            "prompt_uniqueness": "salt+cache_salt" if self.send_cache_salt else "salt",
            "run_id": self.run_id,
            "usage": self.usage_counts(),
            "server_cached_prompt_tokens": self.cached_prompt_tokens(),
            "warmup": {"requests": WARMUP_REQUESTS, "ttft_s": warmup.ttft_s, "error": warmup.error},
            "single_stream": {
                "decode_tok_s": mean([r.decode_tok_s for r in single]),
                **spread([r.decode_tok_s for r in single], "tok_s"),
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
                queue.pop()
                # ignore_eos: every request produces exactly the requested tokens (vLLM extension)
                results.append(await self._one(http, prompt, p.sweep_output_tokens, extra={"ignore_eos": True}))

        await asyncio.gather(*(worker() for _ in range(level)))
        return results


def repeat_figures(results: Sequence[StreamResult]) -> dict:
    """One repeat of a level: its aggregate and its TTFT / TPOT percentiles."""
    ttfts = [r.ttft_s for r in results if r.error is None]
    tpots = [r.tpot_s * 1000 for r in results if r.error is None and r.tpot_s is not None]
    return {"output_tok_s": aggregate_tok_s(results), "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p99_s": percentile(ttfts, 99), "tpot_p50_ms": percentile(tpots, 50),
            "tpot_p99_ms": percentile(tpots, 99)}


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    data = [v for v in values if v is not None]
    return statistics.median(data) if data else None


def sweep_row(level: int, repeats: Sequence[Sequence[StreamResult]]) -> dict:
    """A level's figures: the median over its repeats (a p99 over every request of the level), and
    each repeat's figures, the spread that compare allows."""
    every = [r for repeat in repeats for r in repeat]
    per_repeat = [repeat_figures(repeat) for repeat in repeats]
    pooled = repeat_figures(every)
    return {
        "concurrency": level,
        "requests": len(every),
        "repeats": len(repeats),
        "output_tok_s": median([f["output_tok_s"] for f in per_repeat]),
        "ttft_p50_s": median([f["ttft_p50_s"] for f in per_repeat]),
        "ttft_p99_s": pooled["ttft_p99_s"],
        "tpot_p50_ms": median([f["tpot_p50_ms"] for f in per_repeat]),
        "tpot_p99_ms": pooled["tpot_p99_ms"],
        "per_repeat": per_repeat,
    }
