"""needle — the recipe's long-context reliability probe (§5 Addendum 2).

Non-guessable access codes are planted at several depths of a synthetic service log; the
model must return all of them, exactly, at temperature 0. Per context size and trial:
- pass:  every code right, nothing else;
- junk:  every code right, plus trailing garbage;
- fail:  a code wrong or missing, or a refusal (a "real failure" in the recipe's table).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from .stream import client, stream_chat

VAULTS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CHARS_PER_TOKEN = 4  # log text; the endpoint's usage gives the real prompt size
ANSWER_LINE = re.compile(r"^\s*[`*]*(\w+)[`*]*\s*:\s*[`*]*([A-Z0-9-]+)[`*]*\s*$")


@dataclass(frozen=True)
class Haystack:
    prompt: str
    codes: dict[str, str]  # vault -> code


def parse_size(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1000, "m": 1000000}.get(text[-1], 1)
    return int(float(text.rstrip("km")) * scale)


def build_haystack(tokens: int, needles: int = 3, seed: int = 0) -> Haystack:
    """A log of about `tokens` tokens with `needles` codes at evenly spaced depths."""
    rng = random.Random(seed)
    services = ["ingest", "billing", "auth", "search", "render", "queue"]
    lines = []
    while sum(len(line) for line in lines) < tokens * CHARS_PER_TOKEN:
        n = len(lines)
        lines.append(
            f"2026-08-11T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:{n % 60:02d}Z svc={rng.choice(services)} "
            f"level=INFO request_id={rng.getrandbits(48):012x} latency_ms={rng.randint(1, 900)} "
            f"bytes={rng.randint(100, 99999)}\n"
        )
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
                max_tokens: int, on_trial_done: Callable[[], None] = lambda: None) -> list[dict]:
    rows = []
    async with client(api_key, timeout=3600) as http:
        for size in sizes:
            outcome = {"pass": 0, "junk": 0, "fail": 0}
            prompt_tokens, examples = [], []
            for trial in range(trials):
                stack = build_haystack(size, needles, seed=size * 1000 + trial)
                result = await stream_chat(http, endpoint, model, [{"role": "user", "content": stack.prompt}],
                                           max_tokens, 0.0)
                verdict = "fail" if result.error else score(result.text, stack.codes)
                outcome[verdict] += 1
                prompt_tokens.append(result.prompt_tokens)
                if verdict != "pass" and len(examples) < 2:
                    examples.append((result.error or result.text)[:200])
                on_trial_done()
            known = [t for t in prompt_tokens if t]
            rows.append({"size": size, "prompt_tokens": round(sum(known) / len(known)) if known else None,
                         "trials": trials, "real_failures": outcome["fail"], "junk": outcome["junk"],
                         "passes": outcome["pass"], "examples": examples})
    return rows


def render(rows: list[dict], console: Console) -> None:
    table = Table(title="needle retrieval (real failures = wrong, missing or refused)")
    for col in ("context", "prompt tokens", "real failures", "junk", "passes"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(f"{row['size'] // 1000}k", str(row["prompt_tokens"] or "?"),
                      f"{row['real_failures']}/{row['trials']}", str(row["junk"]), str(row["passes"]))
    total_fail = sum(r["real_failures"] for r in rows)
    total = sum(r["trials"] for r in rows)
    table.add_row("total", "", f"{total_fail}/{total}", str(sum(r["junk"] for r in rows)), "")
    console.print(table)


def run_needle(target, sizes: Sequence[int], trials: int, needles: int, max_tokens: int, console: Console,
               output: Optional[str] = None) -> int:
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("needle trials", total=len(sizes) * trials)
        rows = asyncio.run(probe(target.endpoint, target.api_key, target.model, sizes, trials, needles, max_tokens,
                                 lambda: progress.advance(task)))
    render(rows, console)
    if output:
        with open(output, "w") as f:
            json.dump(rows, f, indent=2)
    return 0
