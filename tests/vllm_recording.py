"""Real vLLM 0.24.0's answers as recorded on an H200 (docs/measurements/vllm-0.24-h200-2026-12-02/
and its -run2, made by tests/gpu/vllm-single-gpu.sh), parsed for the tests that hold the stand-in,
the guard and the dashboards to them."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

RECORDING = Path(__file__).resolve().parents[1] / "docs/measurements/vllm-0.24-h200-2026-12-02"
# the second run: GPU memory while serving, and tool calls through the hermes parser (the model's
# text forced by structured outputs, tests/gpu/tool-call-requests.py)
RECORDING_RUN2 = RECORDING.with_name(RECORDING.name + "-run2")
# the first run's api.txt keeps each call's curl arguments, not its URL: the script's order names them
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


def recorded_calls(recording: Path = RECORDING_RUN2) -> list[tuple[str, Exchange]]:
    """api.txt's calls in order, with their paths: `== PATH <curl arguments>` (the first run's
    headers name no path: API_PATHS gives them), then the raw HTTP answer."""
    sections = re.split(r"^== ", (recording / "api.txt").read_text(), flags=re.M)[1:]
    out = []
    for i, section in enumerate(sections):
        args, answer = section.split("\nHTTP/1.1 ", 1)
        path = args.split(" ", 1)[0] if args.startswith("/") else API_PATHS[i]
        head, _, body = answer.partition("\n\n")
        status, *header_lines = head.splitlines()
        headers = dict(line.split(": ", 1) for line in header_lines)
        request = json.loads(args.split("-d ", 1)[1]) if "-d " in args else {}
        out.append((path, Exchange(request, int(status.split()[0]), {k.lower(): v for k, v in headers.items()},
                                   body.strip())))
    return out


def recorded_exchanges() -> dict[str, Exchange]:
    """The first run's four calls by path."""
    calls = recorded_calls(RECORDING)
    assert len(calls) == len(API_PATHS), f"api.txt: {len(calls)} calls, expected {len(API_PATHS)}"
    return dict(calls)


def recorded_tool_calls() -> dict[str, Exchange]:
    """The second run's tool calls (the chat requests with a tool call forced or named), by kind:
    "auto-stream", "auto", "named-stream"."""
    forced = [e for path, e in recorded_calls() if path == "/v1/chat/completions"
              and ("structured_outputs" in e.request or isinstance(e.request.get("tool_choice"), dict))]
    kinds = [("named" if isinstance(e.request["tool_choice"], dict) else "auto") + ("-stream" if e.request.get("stream") else "")
             for e in forced]
    assert sorted(kinds) == ["auto", "auto-stream", "named-stream"], kinds
    return dict(zip(kinds, forced))


def chunk_kind(event) -> str:
    """What a chat stream's event carries: role, content, tool_name, tool_arguments, finish, usage, [DONE]."""
    if event == "[DONE]":
        return "[DONE]"
    if not event["choices"]:
        return "usage" if "usage" in event else "empty"
    choice = event["choices"][0]
    if choice.get("finish_reason"):
        return "finish"
    delta = choice["delta"]
    if delta.get("tool_calls"):
        return "tool_name" if any((c.get("function") or {}).get("name") for c in delta["tool_calls"]) else "tool_arguments"
    return "role" if "role" in delta else "content"


def chunk_sequence(events: list) -> list[str]:
    """The kinds in order, a run of one kind counted once (values and piece sizes may differ)."""
    kinds = [chunk_kind(e) for e in events]
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


def streamed_call(events: list) -> tuple[str, str]:
    """A streamed tool call's name and arguments, put together as a client does."""
    name = arguments = ""
    for event in events[:-1]:
        for choice in event["choices"]:
            for call in choice["delta"].get("tool_calls") or []:
                name += (call.get("function") or {}).get("name") or ""
                arguments += (call.get("function") or {}).get("arguments") or ""
    return name, arguments


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
