"""bench — the recipe's benchmark methodology against the live endpoint.

- single stream: decode tok/s on real coding prompts, mean of 3, temperature 0.2
- N-way concurrent: aggregate output tok/s of N simultaneous streams
- long prompt: TTFT of a ~7k-token prompt, and the prefill tok/s it implies
- sweep: for each concurrency, output tok/s and TTFT / TPOT p50 and p99, each level repeated
  (--sweep-repeats) so that the run measures its own run-to-run spread

Results are JSON (plus a table); `--compare baseline.json` flags regressions, which is how
a silent NCCL fallback to TCP after a restart shows up (decode collapses). A regression is a
gated figure's median worse by more than the larger of --tolerance and the spread of its repeats
in either run; figures the sample cannot support (a p99 of fewer than MIN_P99_SAMPLES requests, a
single long-prompt or concurrent measurement) are shown beside them but never gate (see compare).
`--compare recipe` holds the run to the serving recipe's published baseline instead, which has
no spread: a fixed band, shortfalls only (see compare_with_recipe).

Comparable across days: every prompt starts with a salt unique to the run and the request,
so the server's prefix cache cannot serve any of it (optionally also vLLM's `cache_salt`);
the results keep the plan, and --compare refuses a baseline made with a different plan.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from pydantic import Field, ValidationError

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from components import recipes

from .api import Lenient, first_problem
from .inputs import (DeadlineError, InputError, check_output_path, fraction, positive_float, positive_int,
                     positive_int_list, read_json_file, run_with_deadline)
from .stream import USAGE_FROM_CHUNKS, USAGE_FROM_SERVER, StreamResult, client, stream_chat
from .target import add_recipe_argument, add_target_arguments, check_endpoint, resolve_target, target_recipe

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

# Higher is better for tok/s; lower is better for latencies.
HIGHER_IS_BETTER = ("tok_s",)

# A p99 needs about this many requests before it is more than the largest sample: below it, p99 is
# one request's luck, reported but not compared.
MIN_P99_SAMPLES = 20
# A gated figure's medians must differ by this many times the wider range of its repeats (compare).
NOISE_FACTOR = 2.0


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
    text, i = [], 0
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
        return WARMUP_REQUESTS + p.single_runs + p.concurrency + 1 + sum(c * p.sweep_requests_per_level for c in p.sweep) * p.sweep_repeats

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
            sweep = []
            for level in p.sweep:
                repeats = [await self._level(http, level) for _ in range(p.sweep_repeats)]
                sweep.append(sweep_row(level, repeats))
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


SWEEP_FIGURES = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_ms", "tpot_p99_ms")


@dataclass
class Figure:
    value: float
    samples: list[float]  # the independent measurements behind value (repeats, runs); [] when unknown
    gated: bool  # False: reported only, the sample cannot support a comparison
    why_not: str = ""


def figures(result: dict) -> dict[str, Figure]:
    """The comparable figures of a result, by a stable name, with what they rest on."""
    out: dict[str, Figure] = {}

    def put(name, value, samples=(), gated=True, why_not=""):
        if value is not None:
            out[name] = Figure(value, [v for v in samples if v is not None], gated, why_not)

    single = result["single_stream"]
    runs = [v for v in single.get("runs_tok_s") or [] if v is not None]
    # the median of the runs: one slow run (a stray compile, a busy host) moves it less than the mean
    put("single_stream.decode_tok_s", median(runs) if runs else single["decode_tok_s"], runs)
    put("concurrent.aggregate_tok_s", result["concurrent"]["aggregate_tok_s"], gated=False,
        why_not="one measurement; the sweep's output tok/s is the gated aggregate")
    put("long_prompt.ttft_s", result["long_prompt"]["ttft_s"], gated=False, why_not="one request")
    put("long_prompt.prefill_tok_s", result["long_prompt"]["prefill_tok_s"], gated=False, why_not="one request")
    for row in result["sweep"]:
        repeats = row.get("per_repeat") or []
        per_repeat_requests = row.get("requests", 0) / max(row.get("repeats") or 1, 1)
        for key in SWEEP_FIGURES:
            name = f"sweep[c={row['concurrency']}].{key}"
            if key.endswith("p99_s") or key.endswith("p99_ms"):
                few = per_repeat_requests < MIN_P99_SAMPLES
                put(name, row[key], [f[key] for f in repeats] if not few else (), gated=not few,
                    why_not=f"p99 of {per_repeat_requests:g} requests" if few else "")
            else:
                put(name, row[key], [f[key] for f in repeats])
    return out


def flat_metrics(result: dict) -> dict[str, float]:
    """The comparable figures of a result, by a stable name."""
    return {name: f.value for name, f in figures(result).items()}


def relative_spread(figure: Figure, reference: float) -> float:
    return (max(figure.samples) - min(figure.samples)) / abs(reference) if len(figure.samples) > 1 else 0.0


def compare(current: dict, baseline: dict, tolerance: float = 0.10) -> list[dict]:
    """Each shared figure with its change; `regression` when a gated figure is worse by more than
    `allowed`: the larger of tolerance and the run-to-run spread measured in either run.

    Why the spread and not a fixed tolerance alone: two identical runs of a few requests each
    differ by more than 10% in their tails and short latencies, so a fixed bound fires on noise.
    Each gated figure is a median over repeats measured in the same sweep (single-stream runs, sweep
    repeats), and the range (max - min) of those repeats is the noise that run itself saw. A
    regression needs the medians NOISE_FACTOR (2) times the wider range apart: then no value lies in
    both runs' ranges (the gap exceeds their sum), so no common level explains both runs. With three
    repeats a side drawn from one distribution (a simulation with up to 50% uniform per-request TTFT
    jitter), one range fires on about 2.7% of figures, twice the range on about 0.3%, and the 10%
    floor brings that lower when the noise is small; a real regression (a TCP fallback's 3-4x slower
    decode) clears it by far, since decode's repeats barely spread. It is a deliberately conservative
    rank-free test rather than a t-test: three samples a side give a t-test little power and no check
    of its normality assumption, and a range needs neither."""
    rows = []
    now, before = figures(current), figures(baseline)
    for name in [n for n in now if n in before]:
        a, b = now[name], before[name]
        higher_better = name.endswith(HIGHER_IS_BETTER)
        change = (a.value - b.value) / b.value if b.value else 0.0
        worse = -change if higher_better else change
        gated = a.gated and b.gated
        allowed = max(tolerance, NOISE_FACTOR * relative_spread(a, b.value),
                      NOISE_FACTOR * relative_spread(b, b.value)) if b.value else tolerance
        rows.append({"metric": name, "baseline": b.value, "current": a.value, "change": change,
                     "allowed": allowed, "gated": gated, "why_not": a.why_not or b.why_not,
                     "regression": gated and worse > allowed})
    return rows


class SingleStreamFigures(Lenient):
    decode_tok_s: Optional[float] = None
    runs_tok_s: Optional[list[Optional[float]]] = None


class ConcurrentFigures(Lenient):
    aggregate_tok_s: Optional[float] = None


class LongPromptFigures(Lenient):
    ttft_s: Optional[float] = None
    prefill_tok_s: Optional[float] = None


class SweepFigures(Lenient):
    concurrency: int
    requests: Optional[int] = None
    repeats: Optional[int] = None
    per_repeat: Optional[list[dict[str, Optional[float]]]] = None
    output_tok_s: Optional[float] = None
    ttft_p50_s: Optional[float] = None
    ttft_p99_s: Optional[float] = None
    tpot_p50_ms: Optional[float] = None
    tpot_p99_ms: Optional[float] = None


class Results(Lenient):
    """What --compare reads of a results file (ops bench -o); schema 1 files have only the figures."""
    schema_version: Optional[int] = Field(None, alias="schema")
    plan: Optional[dict[str, Any]] = None
    prompt_uniqueness: Optional[str] = None
    usage: Optional[dict[str, int]] = None
    single_stream: SingleStreamFigures
    concurrent: ConcurrentFigures
    long_prompt: LongPromptFigures
    sweep: list[SweepFigures]


def load_baseline(path: str) -> dict:
    data = read_json_file(path, "--compare")
    try:
        figures = Results.model_validate(data)
    except ValidationError as err:
        raise InputError(f"--compare {path}: not the results of ops bench -o ({first_problem(err)})") from None
    # every figure present (None where the file has none), the rest as the file has it
    return {**data, **figures.model_dump(include={"single_stream", "concurrent", "long_prompt", "sweep"})}


# ---- against the recipe's published baseline (--compare recipe) ------------------------------------
# The recipe's three figures, the bench figure that measures each (figures()), and what it is called.
RECIPE_FIGURES = (("single_stream_tokens_per_second", "single_stream.decode_tok_s", "single-stream decode"),
                  ("four_way_tokens_per_second", "concurrent.aggregate_tok_s", "4-way aggregate"),
                  ("ttft_7k_seconds", "long_prompt.ttft_s", "TTFT at 7k"))
# What the recipe's figures are of: 4 concurrent streams, a ~7k-token prompt (Baseline's names)
RECIPE_CONCURRENCY = 4
RECIPE_LONG_PROMPT_TOKENS = 7000
# The band a run may fall short of a recipe's figure by. A recipe's figure is one number measured
# elsewhere (another harness, prompt mix and image build), so there is no spread to allow, only a
# systematic offset between methods, which the band must hold: the seed's own single stream spread
# 74.4-75.2 over its runs (1%), GLM's source gives 34.1-47.7 by prompt kind (its lowest is the
# figure). What the gate is for lies far beyond 20%: NCCL over TCP or spec decode lost puts decode
# at the no-spec floor, 27.3 of 74.8 tok/s (-64%).
RECIPE_TOLERANCE = 0.20


def published_figures(recipe: recipes.Recipe) -> list[tuple[str, str, recipes.Figure]]:
    """(bench figure, what it is called, the recipe's figure) for each of the three, published or not."""
    return [(metric, label, getattr(recipe.baseline, field)) for field, metric, label in RECIPE_FIGURES]


def recipe_plan_differences(plan: BenchPlan, profile: Optional[str], recipe: recipes.Recipe) -> list[str]:
    """Where this run would measure something else than the recipe's figures are of."""
    differences = []
    if plan.concurrency != RECIPE_CONCURRENCY:
        differences.append(f"concurrency {plan.concurrency} (its 4-way figure is of {RECIPE_CONCURRENCY} streams)")
    if plan.long_prompt_tokens != RECIPE_LONG_PROMPT_TOKENS:
        differences.append(f"long_prompt_tokens {plan.long_prompt_tokens} (its TTFT is of a "
                           f"{RECIPE_LONG_PROMPT_TOKENS}-token prompt)")
    if profile is not None and profile != recipe.baseline.profile:
        differences.append(f"profile {profile} (its figures are of profile {recipe.baseline.profile})")
    return differences


def check_recipe_reference(recipe: recipes.Recipe, plan: BenchPlan, profile: Optional[str],
                           allow_plan_mismatch: bool, what: str = "--compare recipe",
                           way_out: str = "rerun without them, or pass --allow-plan-mismatch") -> list[str]:
    """Before any request: the recipe publishes a figure to compare with, and the plan measures
    what it is of (unless allow_plan_mismatch). InputError otherwise; returns the warnings."""
    published = [f for _, _, f in published_figures(recipe) if f.value is not None]
    if not published:
        sources = "; ".join(f"{label}: {figure.source}" for _, label, figure in published_figures(recipe))
        raise InputError(f"{what}: recipe {recipe.name} publishes no baseline figure ({sources}); measure the "
                         "deployment once with `ops bench -o FILE` and compare with that file")
    differences = recipe_plan_differences(plan, profile, recipe)
    if differences and not allow_plan_mismatch:
        raise InputError(f"{what}: the bench would not measure what recipe {recipe.name}'s baseline is of: "
                         f"{'; '.join(differences)}; {way_out}")
    warnings = [f"the plan differs from the recipe's ({'; '.join(differences)}): a shortfall below may come "
                "from the plan"] if differences else []
    if profile is None:
        warnings.append(f"no --profile given: recipe {recipe.name}'s figures are of profile "
                        f"{recipe.baseline.profile}; another profile trades single-stream for 4-way rates")
    unpublished = [f"{label} ({figure.source})" for _, label, figure in published_figures(recipe)
                   if figure.value is None]
    if unpublished:
        warnings.append(f"recipe {recipe.name} publishes no figure for {'; '.join(unpublished)}: not compared")
    return warnings


def compare_with_recipe(current: dict, recipe: recipes.Recipe, tolerance: float = RECIPE_TOLERANCE) -> list[dict]:
    """Each figure the recipe publishes beside this run's; `regression` when the run falls short of
    it by more than `allowed`: the band (tolerance), or twice the spread of the run's own repeats
    where that is wider (single stream has three runs; the 4-way and TTFT are one measurement each).

    A recipe's figure is one number with its source and no repeats, so compare's rule (the medians
    apart by twice either run's spread) has nothing to stand on for the baseline: the band stands in
    for the offset between the recipe's harness and this one. Only a shortfall is flagged: a run
    faster than the published figure is no regression, whatever the distance. Rows carry the same
    keys as compare's, and `source`."""
    now = figures(current)
    rows = []
    for metric, label, published in published_figures(recipe):
        if published.value is None or metric not in now:
            continue
        figure, reference = now[metric], published.value
        change = (figure.value - reference) / reference
        worse = -change if metric.endswith(HIGHER_IS_BETTER) else change
        allowed = max(tolerance, NOISE_FACTOR * relative_spread(figure, reference))
        rows.append({"metric": metric, "baseline": reference, "current": figure.value, "change": change,
                     "allowed": allowed, "gated": True, "why_not": "", "regression": worse > allowed,
                     "source": published.source, "label": label})
    return rows


def plan_differences(plan: dict, baseline: dict) -> list[str]:
    """'key baseline→now' for every plan key that differs; empty when like is compared with like."""
    if baseline.get("schema") != SCHEMA or not isinstance(baseline.get("plan"), dict):
        return [f"schema {baseline.get('schema', 1)}→{SCHEMA} (the baseline keeps no plan and its prompts "
                "could hit the prefix cache)"]
    before = {"sweep_repeats": 1, **baseline["plan"]}  # results from before the repeats ran each level once
    return [f"{key} {json.dumps(before.get(key))}→{json.dumps(plan.get(key))}"
            for key in dict.fromkeys([*before, *plan]) if before.get(key) != plan.get(key)]


def comparison_warnings(current: dict, baseline: dict) -> list[str]:
    """What makes a comparison shaky even when it is allowed."""
    warnings = []
    diffs = plan_differences(current["plan"], baseline)
    if diffs:
        warnings.append("the plans differ (" + "; ".join(diffs) + "): a change below may come from the plan, "
                        "not from the cluster")
    fallback = (baseline.get("usage") or {}).get("chunk_count_fallback")
    if fallback:  # this run's own fallback has its warning already
        warnings.append(f"the baseline counted stream chunks instead of server usage for {fallback} requests: "
                        "its token rates read low under speculative decoding")
    if baseline.get("prompt_uniqueness") not in (None, current.get("prompt_uniqueness")):
        warnings.append(f"prompt uniqueness differs: baseline {baseline['prompt_uniqueness']}, "
                        f"this run {current['prompt_uniqueness']}")
    return warnings


def render(result: dict, console: Console, comparison: Optional[list[dict]] = None,
           warnings: Sequence[str] = (), against: str = "baseline") -> None:
    """Every text that comes from outside (model, endpoint, server messages, metric names) is escaped."""
    summary = Table(title=escape(f"bench {result['model']} @ {result['endpoint']}"))
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    summary.add_column("min / median / max", justify="right")
    fmt = lambda v, unit: "—" if v is None else f"{v:.1f} {unit}"  # noqa: E731
    single = result["single_stream"]
    runs = "" if single.get("min_tok_s") is None else \
        f"{single['min_tok_s']:.1f} / {single['median_tok_s']:.1f} / {single['max_tok_s']:.1f}"
    summary.add_row("single-stream decode (mean of runs)", fmt(single["decode_tok_s"], "tok/s"), runs)
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
    if result.get("plan"):
        console.print(Text("plan: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in result["plan"].items()
                                                 if k not in ("model", "endpoint")), style="dim"))
    uniqueness = {"salt": "a per-run, per-request salt opens every prompt",
                  "salt+cache_salt": "a per-run, per-request salt opens every prompt, and each request sends "
                                     "vLLM's cache_salt"}
    if result.get("prompt_uniqueness") in uniqueness:
        console.print(Text(f"prompts: {uniqueness[result['prompt_uniqueness']]} (run {result['run_id']})",
                           style="dim"))
    cached = result.get("server_cached_prompt_tokens") or {}
    if cached.get("requests_reporting"):
        # only a chat template's shared opening, if it fills a whole cache block, can still hit
        console.print(Text(f"server-reported prefix-cache hits: {cached['total']} prompt tokens over "
                           f"{cached['requests_reporting']} requests", style="dim"))
    usage = result.get("usage") or {}
    if usage.get("chunk_count_fallback"):
        answered = usage["chunk_count_fallback"] + usage.get("server", 0)
        console.print(Text(f"WARNING: {usage['chunk_count_fallback']} of {answered} requests came without usage "
                           "from the server although the stream asked for it; their output tokens are counted as "
                           "stream chunks, an undercount when a chunk carries several tokens (speculative "
                           "decoding): decode tok/s and aggregates read low, TPOT high", style="bold red"))
    for warning in warnings:
        console.print(Text(f"WARNING: {warning}", style="bold yellow"))
    if comparison is not None:
        diff = Table(title=escape(f"against {against}"))
        diff.add_column("metric", no_wrap=True)
        for col in ("baseline", "current", "change", "allowed", ""):
            diff.add_column(col)
        for row in comparison:
            verdict = Text("REGRESSION", style="red") if row["regression"] else \
                Text(f"not gated: {row['why_not']}", style="dim") if not row.get("gated", True) else ""
            diff.add_row(Text(row["metric"]), f"{row['baseline']:.2f}", f"{row['current']:.2f}",
                         f"{row['change']:+.0%}", f"{row['allowed']:.0%} short" if row.get("source") else
                         f"±{row.get('allowed', 0):.0%}", verdict)
        console.print(diff)
        for row in comparison:
            if row.get("source"):
                console.print(Text(f"{row['label']} {row['baseline']:g}: {row['source']}", style="dim"))
    for error in result["errors"][:5]:
        console.print(Text("request failed: ", style="red") + Text(error))
    if len(result["errors"]) > 5:
        console.print(Text(f"... and {len(result['errors']) - 5} more failed requests", style="red"))


def measure(target, plan: BenchPlan, console: Console, profile: Optional[str] = None, send_cache_salt: bool = False,
            deadline_s: Optional[float] = None) -> dict:
    """One run of the plan against target, with a progress bar: the results (what -o writes)."""
    with Progress(console=console, transient=True) as progress:
        bench = Bench(target.endpoint, target.api_key, target.model, plan, send_cache_salt=send_cache_salt,
                      profile=profile)
        task = progress.add_task("benchmarking", total=bench.total_requests())
        bench.on_request_done = lambda: progress.advance(task)
        try:
            return run_with_deadline(bench.run(), deadline_s)
        except DeadlineError as err:
            done = sum(r is not None for r in bench.results)
            raise DeadlineError(f"{err}; {done} of {bench.total_requests()} requests had finished, nothing written "
                                "(a hanging server? see `ops status`)") from None


def run_bench(target, plan: BenchPlan, output: Optional[str], baseline_path: Optional[str], tolerance: float,
              console: Console, profile: Optional[str] = None, send_cache_salt: bool = False,
              allow_plan_mismatch: bool = False, deadline_s: Optional[float] = None,
              recipe: Optional[recipes.Recipe] = None, recipe_tolerance: float = RECIPE_TOLERANCE) -> int:
    """Compared with the baseline file at baseline_path, or with `recipe`'s published baseline.
    Raises InputError, before any request, for an output or baseline that cannot be used, and
    DeadlineError when the run outlasts deadline_s."""
    check_output_path(output)
    baseline, recipe_warnings = None, []
    if recipe is not None:
        recipe_warnings = check_recipe_reference(recipe, plan, profile, allow_plan_mismatch)
    elif baseline_path:
        baseline = load_baseline(baseline_path)
        diffs = plan_differences(plan_record(plan, target.model, target.endpoint, profile), baseline)
        if diffs and not allow_plan_mismatch:
            raise InputError(f"--compare {baseline_path} was made with another plan: {'; '.join(diffs)}. "
                             "Rerun with the baseline's parameters, or pass --allow-plan-mismatch")
    result = measure(target, plan, console, profile, send_cache_salt, deadline_s)
    if output:  # first: nothing that follows may lose the run
        with open(output, "w") as f:
            json.dump(result, f, indent=2)
    comparison, warnings, against = None, [], "baseline"
    if recipe is not None:
        comparison, warnings = compare_with_recipe(result, recipe, recipe_tolerance), recipe_warnings
        against = f"recipe {recipe.name}'s baseline (a shortfall beyond {recipe_tolerance:.0%} gates)"
    elif baseline is not None:
        comparison = compare(result, baseline, tolerance)
        warnings = comparison_warnings(result, baseline)
    render(result, console, comparison, warnings, against)
    if output:
        console.print(Text(f"results written to {output}"))
    failed = bool(result["errors"]) or any(row["regression"] for row in comparison or [])
    return 1 if failed else 0


# The whole run's deadline: a hanging server must not hold it for hours (the default plan takes
# ~2 min at the recipe's rates).
DEADLINE_MIN = 30
COMPARE_RECIPE = "recipe"  # --compare recipe: the recipe's published baseline, not a file


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("--runs", type=positive_int, default=3, help="single-stream runs to average")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="output tokens per single/concurrent request")
    p.add_argument("--concurrency", type=positive_int, default=4, help="streams in the N-way aggregate test")
    p.add_argument("--long-prompt-tokens", type=positive_int, default=7000)
    p.add_argument("--sweep", type=positive_int_list, default=[1, 2, 4, 6], help="concurrency levels, comma separated")
    p.add_argument("--sweep-requests", type=positive_int, default=2, help="requests per level, times the level")
    p.add_argument("--sweep-input-tokens", type=positive_int, default=1000)
    p.add_argument("--sweep-output-tokens", type=positive_int, default=128)
    p.add_argument("--sweep-repeats", type=positive_int, default=3,
                   help="times each sweep level is measured: the run-to-run spread --compare allows")
    p.add_argument("--profile", help="serving profile in use (default, multiagent), kept in the plan; "
                                     "--compare refuses a baseline with another one")
    p.add_argument("--cache-salt", action="store_true",
                   help="also send vLLM's per-request cache_salt (vLLM >= 0.9 with the V1 engine; the prompt "
                        "salt alone already defeats the prefix cache)")
    p.add_argument("--output", "-o", help="write the results JSON here")
    p.add_argument("--compare", help="a previous results JSON made with the same plan: flag regressions; or "
                                     "`recipe`: the serving recipe's published baseline (a file named recipe: ./recipe)")
    p.add_argument("--recipe-tolerance", type=fraction, default=RECIPE_TOLERANCE,
                   help="with --compare recipe: the shortfall below a recipe's figure allowed (default %(default)s); "
                        "a recipe's figure has no spread, so a fixed band stands in for it")
    add_recipe_argument(p, "--compare recipe")
    p.add_argument("--allow-plan-mismatch", action="store_true",
                   help="compare with a baseline made with another plan anyway (with a warning)")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed worsening before a regression (0.10 = 10%%); a "
                   "figure noisier than that in its own repeats is allowed its spread")
    p.add_argument("--deadline-min", type=positive_float, default=DEADLINE_MIN,
                   help=f"stop the whole run after this many minutes (default {DEADLINE_MIN})")


def run(args: argparse.Namespace) -> int:
    """Bad input (the recipe --compare recipe needs, a dead endpoint, a refused key) ends it in
    one line before any request."""
    target = resolve_target(args)
    recipe = target_recipe(target) if args.compare == COMPARE_RECIPE else None
    target.model = check_endpoint(target)
    plan = BenchPlan(single_runs=args.runs, single_max_tokens=args.max_tokens, concurrency=args.concurrency,
                     long_prompt_tokens=args.long_prompt_tokens, sweep=args.sweep,
                     sweep_requests_per_level=args.sweep_requests, sweep_input_tokens=args.sweep_input_tokens,
                     sweep_output_tokens=args.sweep_output_tokens, sweep_repeats=args.sweep_repeats)
    # the stack does not export its serving profile: unknown stays null in the plan
    return run_bench(target, plan, args.output, None if recipe else args.compare, args.tolerance, Console(),
                     profile=args.profile, send_cache_salt=args.cache_salt,
                     allow_plan_mismatch=args.allow_plan_mismatch, deadline_s=args.deadline_min * 60, recipe=recipe,
                     recipe_tolerance=args.recipe_tolerance)
