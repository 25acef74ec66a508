"""Real vLLM 0.24.0's answers as recorded on an H200 (docs/measurements/vllm-0.24-h200-2026-12-02/,
made by tests/gpu/vllm-single-gpu.sh), parsed for the tests that hold the stand-in and the
dashboards to them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

RECORDING = Path(__file__).resolve().parents[1] / "docs/measurements/vllm-0.24-h200-2026-12-02"
# api.txt keeps each call's curl arguments, not its URL: the script's order names them
API_PATHS = ("/health", "/v1/models", "/v1/responses", "/v1/chat/completions")


@dataclass(frozen=True)
class Family:
    type: str
    help: str
    labels: frozenset  # label names over every sample, `le` and `quantile` left out
    buckets: tuple  # a histogram's `le` values, in order


@dataclass(frozen=True)
class Exchange:
    request: dict  # the JSON body sent, {} for a GET
    status: int
    headers: dict  # lower-case names
    body: str


def families(exposition: str) -> dict[str, Family]:
    """Family name -> what it is, as prometheus_client's own parser reads the text."""
    out = {}
    for family in text_string_to_metric_families(exposition):
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        buckets = []
        for sample in family.samples:
            if "le" in sample.labels and sample.labels["le"] not in buckets:
                buckets.append(sample.labels["le"])
        out[family.name] = Family(family.type, family.documentation, frozenset(labels), tuple(buckets))
    return out


def sample_names(exposition: str) -> set[str]:
    """Every series name the text exports (a counter's `_total`, a histogram's `_bucket`, ...)."""
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}


def recorded_metrics() -> str:
    """metrics.txt's raw /metrics (the script appends its present/absent list after `== `)."""
    return (RECORDING / "metrics.txt").read_text().split("\n== ", 1)[0] + "\n"


def recorded_exchanges() -> dict[str, Exchange]:
    """api.txt's calls by path: `== <curl arguments>`, then the raw HTTP answer."""
    sections = re.split(r"^== ", (RECORDING / "api.txt").read_text(), flags=re.M)[1:]
    assert len(sections) == len(API_PATHS), f"api.txt: {len(sections)} calls, expected {len(API_PATHS)}"
    out = {}
    for path, section in zip(API_PATHS, sections):
        args, answer = section.split("\nHTTP/1.1 ", 1)
        head, _, body = answer.partition("\n\n")
        status, *header_lines = head.splitlines()
        headers = dict(line.split(": ", 1) for line in header_lines)
        request = json.loads(args.split("-d ", 1)[1]) if "-d " in args else {}
        out[path] = Exchange(request, int(status.split()[0]), {k.lower(): v for k, v in headers.items()}, body.strip())
    return out


def stream_events(body: str) -> list:
    """A server-sent event stream's `data:` payloads, JSON decoded, `[DONE]` as the string."""
    payloads = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def shape(value):
    """A JSON value's shape: keys (nested) and value types; null stands for "any type" (an
    optional field, set or not by what the answer happens to be)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return None if value is None else type(value).__name__


def shape_differences(recorded, served, where="") -> list[str]:
    """Where the served JSON's shape departs from the recorded one's."""
    if recorded is None or served is None:
        return []
    if isinstance(recorded, dict) and isinstance(served, dict):
        out = [f"{where}.{k}: recorded, not served" for k in recorded if k not in served]
        out += [f"{where}.{k}: served, not recorded" for k in served if k not in recorded]
        for k in recorded.keys() & served.keys():
            out += shape_differences(recorded[k], served[k], f"{where}.{k}")
        return out
    if isinstance(recorded, list) and isinstance(served, list):
        if recorded and served:
            return shape_differences(recorded[0], served[0], f"{where}[0]")
        return []
    return [] if recorded == served else [f"{where}: recorded {recorded}, served {served}"]
