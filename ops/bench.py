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

Here: the tool (its flags, the run, the table); the requests and their figures in bench_requests.py, the
comparisons in bench_compare.py.
"""

from __future__ import annotations

import argparse
import json
from typing import Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from core import recipes

from .output import add_json_argument, human_console, print_json
from .bench_compare import (RECIPE_TOLERANCE, check_recipe_reference, compare, compare_with_recipe,
                            comparison_warnings, load_baseline, plan_differences)
from .bench_requests import Bench, BenchPlan, plan_record
from .inputs import (DeadlineError, InputError, check_output_path, fraction, positive_float, positive_int,
                     positive_int_list, run_with_deadline)
from .target import add_recipe_argument, add_target_arguments, check_endpoint, resolve_target, target_recipe


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
              recipe: Optional[recipes.Recipe] = None, recipe_tolerance: float = RECIPE_TOLERANCE,
              outcome: Optional[dict] = None) -> int:
    """Compared with the baseline file at baseline_path, or with `recipe`'s published baseline;
    `outcome` (for --json) gets the results, the comparison and its warnings.
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
    if outcome is not None:
        outcome.update(result=result, compared_with=against if comparison is not None else None,
                       comparison=comparison, warnings=warnings, passed=not failed)
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
    p.add_argument("--tolerance", type=positive_float, default=0.10, help="allowed worsening before a regression (0.10 = 10%%); "
                   "a figure noisier than that in its own repeats is allowed its spread")
    p.add_argument("--deadline-min", type=positive_float, default=DEADLINE_MIN,
                   help=f"stop the whole run after this many minutes (default {DEADLINE_MIN})")
    add_json_argument(p)


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
    outcome: dict = {}
    code = run_bench(target, plan, args.output, None if recipe else args.compare, args.tolerance, human_console(args),
                     profile=args.profile, send_cache_salt=args.cache_salt,
                     allow_plan_mismatch=args.allow_plan_mismatch, deadline_s=args.deadline_min * 60, recipe=recipe,
                     recipe_tolerance=args.recipe_tolerance, outcome=outcome)
    print_json(args, outcome)
    return code
