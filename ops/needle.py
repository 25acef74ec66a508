"""needle — the recipe's long-context reliability probe (§5 Addendum 2).

Non-guessable access codes are planted at several depths of a synthetic service log; the
model must return all of them, exactly, at temperature 0. Per context size and trial:
- pass:  every code right, nothing else;
- junk:  every code right, plus trailing garbage;
- fail:  a code wrong or missing, or a refusal (a "real failure" in the recipe's table);
- truncated: the reply hit max_tokens (finish_reason "length") before a complete answer,
  usually because reasoning used the budget: inconclusive, not a failure of the model;
- error: no answer at all (key refused, endpoint gone, HTTP error, a stream that is not the
  API's): not the model's failure either, and the run exits 1.
The run exits 1 too when the real failures are more than --max-failures (0 by default): a gate
for a script or CI; the recipe's own table allows a few at its longest sizes.

Only the answer (`content`) is scored; reasoning counts against max_tokens, which is why the
default budget is large.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from core.recipes import DEFAULT_RECIPE

from .output import add_json_argument, human_console, print_json
from .inputs import (DeadlineError, InputError, check_output_path, non_negative_int, positive_float, positive_int,
                     run_with_deadline)
from .stream import client, stream_chat
from .target import add_recipe_argument, add_target_arguments, check_endpoint, resolve_target, target_recipe

VAULTS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CHARS_PER_TOKEN = 4  # log text; the endpoint's usage gives the real prompt size
# Reasoning and the answer share max_tokens; a few lines of answer need ~60 tokens, the rest is
# room to think (reasoning models spend thousands of tokens on a long haystack).
DEFAULT_MAX_TOKENS = 8192
SCHEMA = 2  # 2: an object with the plan and per-size rows (1 was the bare list of rows)
ANSWER_LINE = re.compile(r"^\s*[`*]*(\w+)[`*]*\s*:\s*[`*]*([A-Z0-9-]+)[`*]*\s*$")


@dataclass(frozen=True)
class Haystack:
    prompt: str
    codes: dict[str, str]  # vault -> code


SIZE = re.compile(r"^(\d+(?:\.\d+)?)([km]?)$")


def parse_size(text: str) -> int:
    """'74k' -> 74000; ValueError for anything that is not a positive size."""
    match = SIZE.match(text.strip().lower())
    if not match:
        raise ValueError(f"size {text.strip()!r} is not a number of tokens such as 2000, 74k or 1.5m")
    size = int(float(match.group(1)) * {"": 1, "k": 1000, "m": 1000000}[match.group(2)])
    if size <= 0:
        raise ValueError(f"size {text.strip()!r} is not above zero")
    return size


def parse_sizes(text: str) -> list[int]:
    """argparse type: '74k,110k' -> [74000, 110000]."""
    try:
        sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    if not sizes:
        raise argparse.ArgumentTypeError(f"{text!r} lists no sizes")
    return sizes


def build_haystack(tokens: int, needles: int = 3, seed: int = 0) -> Haystack:
    """A log of about `tokens` tokens with `needles` codes at evenly spaced depths."""
    rng = random.Random(seed)
    services = ["ingest", "billing", "auth", "search", "render", "queue"]
    lines: list[str] = []
    chars = 0  # a running count: summing every line again per line was quadratic (5m: minutes of CPU)
    while chars < tokens * CHARS_PER_TOKEN:
        n = len(lines)
        lines.append(
            f"2026-08-11T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z svc={rng.choice(services)} "
            f"level=INFO request_id={rng.getrandbits(48):012x} latency_ms={rng.randint(1, 900)} "
            f"bytes={rng.randint(100, 99999)}\n"
        )
        chars += len(lines[-1])
    codes = {}
    for k in range(needles):
        vault = VAULTS[k]
        code = "-".join("".join(rng.choice(CODE_ALPHABET) for _ in range(4)) for _ in range(3))
        codes[vault] = code
        depth = int(len(lines) * (k + 1) / (needles + 1))
        lines.insert(depth, f"2026-08-11T12:00:00Z svc=vault level=NOTICE vault={vault} access_code={code}\n")
    names = ", ".join(codes)
    question = (
        f"\nThe log above contains the access codes of the vaults {names}. Reply with exactly one line per "
        "vault, in the form `vault: CODE`, and nothing else."
    )
    return Haystack("".join(lines) + question, codes)


def verdict(result, codes: dict[str, str]) -> str:
    """pass / junk / fail; truncated when max_tokens cut the reply before a complete answer; error
    when there was no answer to score."""
    if result.error:
        return "error"
    scored = score(result.text, codes)
    if scored == "fail" and result.finish_reason == "length":
        return "truncated"
    return scored


def score(answer: str, codes: dict[str, str]) -> str:
    found, other = {}, []
    for line in answer.strip().splitlines():
        match = ANSWER_LINE.match(line)
        if match and match.group(1).lower() in codes and match.group(1).lower() not in found:
            found[match.group(1).lower()] = match.group(2)
        elif line.strip():
            other.append(line)
    if found != codes:
        return "fail"
    return "junk" if other else "pass"


async def probe(endpoint: str, api_key: str, model: str, sizes: Sequence[int], trials: int, needles: int,
                max_tokens: int, on_trial_done: Callable[[], None] = lambda: None,
                rows: Optional[list] = None) -> list[dict]:
    """One row per size, appended to `rows` as each size completes (a deadline keeps them)."""
    rows = [] if rows is None else rows
    async with client(api_key, timeout=3600) as http:  # a 1M-token prefill is minutes before a first byte
        for size in sizes:
            outcome = {"pass": 0, "junk": 0, "fail": 0, "truncated": 0, "error": 0}
            prompt_tokens, completion_tokens = [], []
            examples: list[dict] = []
            for trial in range(trials):
                stack = build_haystack(size, needles, seed=size * 1000 + trial)
                result = await stream_chat(http, endpoint, model, [{"role": "user", "content": stack.prompt}],
                                           max_tokens, 0.0)
                found = verdict(result, stack.codes)
                outcome[found] += 1
                prompt_tokens.append(result.prompt_tokens)
                if not result.error:
                    completion_tokens.append(result.output_tokens)
                if found != "pass" and len(examples) < 2:
                    examples.append({"verdict": found, "finish_reason": result.finish_reason,
                                     "answer": (result.error or result.text)[:200],
                                     "reasoning_tail": result.reasoning_text[-200:]})
                on_trial_done()
            known = [t for t in prompt_tokens if t]
            rows.append({"size": size, "prompt_tokens": round(sum(known) / len(known)) if known else None,
                         "trials": trials, "real_failures": outcome["fail"], "junk": outcome["junk"],
                         "passes": outcome["pass"], "truncated": outcome["truncated"], "errors": outcome["error"],
                         "max_completion_tokens": max(completion_tokens) if completion_tokens else None,
                         "examples": examples})
    return rows


def render(rows: list[dict], console: Console, max_tokens: Optional[int] = None) -> None:
    table = Table(title="needle retrieval (real failures = wrong, missing or refused)")
    for col in ("context", "prompt tokens", "real failures", "junk", "passes", "truncated", "errors",
                "most tokens used"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(f"{row['size'] // 1000}k", str(row["prompt_tokens"] or "?"),
                      f"{row['real_failures']}/{row['trials']}", str(row["junk"]), str(row["passes"]),
                      str(row["truncated"]), str(row["errors"]), str(row["max_completion_tokens"] or "?"))
    total_fail = sum(r["real_failures"] for r in rows)
    total = sum(r["trials"] for r in rows)
    total_truncated = sum(r["truncated"] for r in rows)
    total_errors = sum(r["errors"] for r in rows)
    table.add_row("total", "", f"{total_fail}/{total}", str(sum(r["junk"] for r in rows)), "", str(total_truncated),
                  str(total_errors), "")
    console.print(table)
    if total_errors:
        example = next(e["answer"] for r in rows for e in r["examples"] if e["verdict"] == "error")
        console.print(Text(f"ERROR: {total_errors} of {total} trials got no answer to score, e.g. {example}",
                           style="bold red"))
    if total_truncated:
        console.print(Text(f"WARNING: {total_truncated} of {total} trials hit max_tokens ({max_tokens or '?'}) before "
                           "a complete answer, usually while reasoning; they are not counted as failures. "
                           "Raise --max-tokens to score them.", style="bold yellow"))


def run_needle(target, sizes: Sequence[int], trials: int, needles: int, max_tokens: int, console: Console,
               output: Optional[str] = None, profile: Optional[str] = None, deadline_s: Optional[float] = None,
               max_failures: int = 0, outcome: Optional[dict] = None) -> int:
    """0, or 1 when a trial got no answer or the real failures are more than max_failures; `outcome`
    (for --json) gets what the output file holds and the verdict; raises
    InputError, before any request, for an output file that cannot be written, and DeadlineError
    (after writing the sizes done) at the deadline."""
    check_output_path(output)
    plan = {"sizes": list(sizes), "trials": trials, "needles": needles, "max_tokens": max_tokens,
            "temperature": 0.0, "model": target.model, "endpoint": target.endpoint, "profile": profile}
    rows: list[dict] = []
    missed: Optional[DeadlineError] = None
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("needle trials", total=len(sizes) * trials)
        try:
            run_with_deadline(probe(target.endpoint, target.api_key, target.model, sizes, trials, needles, max_tokens,
                                    lambda: progress.advance(task), rows), deadline_s)
        except DeadlineError as err:
            missed = err
    document = {"schema": SCHEMA, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "plan": plan,
                "complete": missed is None, "sizes": rows}
    if output:  # before rendering: nothing that follows may lose the run
        with open(output, "w") as f:
            json.dump(document, f, indent=2)
    if missed:
        if rows:
            render(rows, console, max_tokens)
        raise DeadlineError(f"{missed}; {len(rows)} of {len(sizes)} sizes were done"
                            + (f" and are written to {output}" if output and rows else ""))
    render(rows, console, max_tokens)
    failures = sum(row["real_failures"] for row in rows)
    passed = not any(row["errors"] for row in rows) and failures <= max_failures
    if outcome is not None:
        outcome.update(document, real_failures=failures, max_failures=max_failures, passed=passed)
    if failures > max_failures:
        console.print(Text(f"FAIL: {failures} real failure{'' if failures == 1 else 's'}, more than --max-failures "
                           f"{max_failures}", style="bold red"))
    return 0 if passed else 1


DEADLINE_MIN = 180  # the whole run's: a default run takes up to ~2 h when the model thinks long


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("--sizes", type=parse_sizes,
                   help="context sizes in tokens, comma separated (default: the recipe's needleSizes)")
    add_recipe_argument(p, "its needle sizes")
    p.add_argument("--trials", type=positive_int, default=5)
    p.add_argument("--needles", type=positive_int, default=3)
    p.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                   help="per reply, reasoning included; a reply cut off here counts as truncated, not failed")
    p.add_argument("--profile", help="serving profile in use (default, multiagent), kept in the plan")
    p.add_argument("--output", "-o")
    p.add_argument("--max-failures", type=non_negative_int, default=0,
                   help="exit 1 when the real failures (every size's together) are more than this")
    p.add_argument("--deadline-min", type=positive_float, default=DEADLINE_MIN,
                   help=f"stop the whole run after this many minutes, keeping the sizes done (default {DEADLINE_MIN})")
    add_json_argument(p)


def run(args: argparse.Namespace) -> int:
    """The recipe (for the default sizes), the endpoint and the key are checked before any request."""
    target = resolve_target(args)
    # a stack that names no recipe serves the default one
    recipe = target_recipe(target, default=DEFAULT_RECIPE) if args.sizes is None else None
    target.model = check_endpoint(target)
    console = human_console(args)
    sizes = args.sizes
    if recipe is not None:
        sizes = recipe.needle_sizes
        console.print(Text(f"sizes: recipe {recipe.name}'s needleSizes" + ("" if target.recipe else
                           " (no recipe named: the default recipe's; pass --recipe)"), style="dim"))
    too_long = [size for size in sizes if target.max_model_len and size > target.max_model_len]
    if too_long:
        raise InputError(f"sizes {', '.join(f'{s:,}' for s in too_long)} tokens: beyond the context {target.model!r} "
                         f"is served with ({target.max_model_len:,} tokens, /v1/models): pass --sizes up to that")
    # the stack does not export its serving profile: unknown stays null in the plan
    outcome: dict = {}
    code = run_needle(target, sizes, args.trials, args.needles, args.max_tokens, console, args.output, args.profile,
                      deadline_s=args.deadline_min * 60, max_failures=args.max_failures, outcome=outcome)
    print_json(args, outcome)
    return code
