"""The one OpenAI-compatible stand-in for vLLM in the tests: known timing, known answers.

Used by the day-2 tool tests (tests/ops), the readiness tests (tests/test_node_artifacts.py)
and the simulator's `vllm` (tests/sim/bin/vllm), which runs it inside the simulated nodes
under their python3: so the standard library only, nothing else.

It serves what vLLM serves and the tests touch: /health, /metrics, /v1/models,
/v1/completions, /v1/chat/completions and /v1/responses, streamed in vLLM's
format (/v1/responses as its named events, `event:` and `data:` lines, from response.created to
response.completed; the rest as follows) (a chat stream opens with a role-only chunk, then content deltas — or a tool call: its
name alone with the call's id, then its arguments in pieces — a finish chunk, a `usage` chunk
when `stream_options.include_usage` asks for it, then `data: [DONE]`) or as one JSON body. The
answers' shapes, /metrics' families (names, types, HELP, labels, buckets) and the behaviour
while loading and after an engine death are real vLLM 0.24.0's, as recorded in
docs/measurements/vllm-0.24-h200-2026-12-02/ and, for tool calls through a real parser, its
-run2/ (tests/test_standin_matches_vllm.py holds the stand-in to both). The API key, when set,
is enforced on /v1 only, as vLLM does.
Every POST lands in `Behaviour.requests` with whether it was authorized.

Prompt tokens are len(text) // 4. A reply waits base_latency + uncached prompt / prefill_tok_s
before its first token, then emits tokens at decode_tok_s, on a schedule kept against the
clock (no drift). `engine(n)` produces the token pieces (the simulator's runs its Ray forward
pass there); needle prompts are answered from the codes really planted in them, bent by
`needle_behaviors` (correct, wrong, missing, junk, refuse), one per request.

Off by default, so the plain stand-in stays simple:
- `prefix_cache`: a block-hashed prefix cache like vLLM's (salted by `cache_salt`); cached
  prompt tokens skip prefill, and usage reports them as `prompt_tokens_details.cached_tokens`;
  with a `kv_tier` (a BlockStore), blocks outlive the engine there, as vLLM's KV offload keeps them;
- `tokens_per_chunk` > 1: several tokens per stream chunk, as under speculative decoding;
- `send_usage` False: no `usage` chunk even when asked, as some proxies and old servers do;
- `reasoning_tokens`: that many reasoning deltas (in `reasoning_field`) before the answer;
  reasoning and answer together stop at max_tokens with finish_reason "length";
- `chat_error`: (status, message) returned for every completion request;
- `accept_cache_salt` False: `cache_salt` is refused with 400, as vLLM's V0 engine does;
- `load_s`: the server refuses connections for that long after `serve()`, as vLLM, which opens
  its socket only once the engine is up (no 503 while loading: vllm.log logs no request before
  "Application startup complete");
- `raw_stream` / `raw_models`: bytes sent as they are (status 200) instead of a completion
  stream / the model list: garbage for the clients' error paths;
- `fault()`: asked per completion request, the engine gone wrong while /health stays 200:
  "garbage" (wrong answers, tool-call arguments that are not JSON), "hang" (a stream stops
  after its first chunk, a plain reply never comes) or "unparsed-tool-call" (with tool_choice
  "auto" the call comes back as text in the model's markup: a tool parser that fails);
- `max_running`: at most that many requests decode at once (vLLM's max_num_seqs); the rest
  wait, counted in `vllm:num_requests_waiting`.
`engine_died(server, behaviour, exit)` plays what the recording shows after the EngineCore is
killed (kill.txt): /health 503 for ~3 s, then the connection refused, then the server exits 0.
Known answers, as a healthy model gives them: "What is A + B?" is answered with the sum, and a
request naming a tool in `tool_choice`, or with tool_choice "auto" mentioning a tool's name,
gets a call of it (streamed as vLLM streams tool calls). /metrics counts what the stand-in
serves as vLLM counts it: tokens, requests by finished_reason, latency histograms, HTTP calls.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import os
import platform
import random
import re
import resource
import socketserver
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional, Protocol

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
# Anthropic's Messages API as vLLM serves it (vllm/entrypoints/anthropic: protocol.py, serving.py);
# Claude Code asks it with a query, /v1/messages?beta=true
MESSAGES_PATH = "/v1/messages"
# after the EngineCore dies, as kill.txt recorded it: /health 503, then refused, then exit 0
DEAD_SERVING_503_S = 3.0
DEAD_EXIT_S = 5.0


SYSTEM_FINGERPRINT = "vllm-0.24.0-standin"  # the recording's: vllm-0.24.0-0c9140c8


def random_id() -> str:
    return uuid.uuid4().hex[:16]  # vLLM's random_uuid(): chatcmpl-b3383d8208cfa1d4, resp_911c849d73fe34d2


# ---- /metrics: vLLM 0.24.0's exposition, family for family ----------------------------------
# As recorded in docs/measurements/vllm-0.24-h200-2026-12-02/metrics.txt: prometheus_client's
# text format (HELP and TYPE lines, a `_created` gauge after every counter and histogram), the
# engine's series labelled engine and model_name, the buckets vLLM's loggers.py declares.
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
HTTP_HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0,
                      7.5, 10.0, 30.0, 60.0)
HTTP_BUCKETS = (0.1, 0.5, 1.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
TOOL_PARSER_CASES = [(mode, outcome, kind) for mode in ("streaming", "non_streaming")
                     for outcome in ("tool_call", "no_tool_call") for kind in ("chat_completions", "responses", "other")]
HTTP_HANDLERS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses")  # /health, /metrics: not counted
CACHE_CONFIG = {  # vllm:cache_config_info's labels, the recorded run's values
    "_block_size_resolved": "True", "block_size": "16", "cache_dtype": "auto", "calculate_kv_scales": "False",
    "enable_prefix_caching": "True", "gpu_memory_utilization": "0.5", "hash_block_size": "None",
    "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_max_concurrency": "8895.3671875",
    "kv_cache_memory_bytes": "None", "kv_cache_size_tokens": "36435424", "kv_offloading_backend": "native",
    "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_cache_mode": "none", "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None", "num_gpu_blocks": "2277214",
    "num_gpu_blocks_override": "None", "prefix_caching_hash_algo": "sha256", "sliding_window": "None",
    "user_specified_block_size": "False", "user_specified_mamba_block_size": "False",
}
ENGINE_COUNTERS = {  # name: HELP, in the recorded order; the ones the stand-in never moves stay 0
    "vllm:estimated_flops_per_gpu_total": "Estimated number of floating point operations per GPU (for Model Flops "
                                          "Utilization calculations).",
    "vllm:estimated_read_bytes_per_gpu_total": "Estimated number of bytes read from memory per GPU (for Model Flops "
                                               "Utilization calculations).",
    "vllm:estimated_write_bytes_per_gpu_total": "Estimated number of bytes written to memory per GPU (for Model Flops "
                                                "Utilization calculations).",
    "vllm:prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:external_prefix_cache_queries_total": "External prefix cache queries from KV connector cross-instance cache "
                                                "sharing, in terms of number of queried tokens.",
    "vllm:external_prefix_cache_hits_total": "External prefix cache hits from KV connector cross-instance cache "
                                             "sharing, in terms of number of cached tokens.",
    "vllm:mm_cache_queries_total": "Multi-modal cache queries, in terms of number of queried items.",
    "vllm:mm_cache_hits_total": "Multi-modal cache hits, in terms of number of cached items.",
    "vllm:num_preemptions_total": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
}
ENGINE_HISTOGRAMS = {  # name: (HELP, buckets)
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", TOKEN_BUCKETS),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", TOKEN_BUCKETS),
    "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", ITERATION_BUCKETS),
    "vllm:request_max_num_generation_tokens": ("Histogram of maximum number of requested generation tokens.",
                                               TOKEN_BUCKETS),
    "vllm:request_params_n": ("Histogram of the n request parameter.", N_BUCKETS),
    "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", TOKEN_BUCKETS),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", TOKEN_LATENCY_BUCKETS),
    "vllm:request_time_per_output_token_seconds": ("Histogram of time_per_output_token_seconds per request.",
                                                   TOKEN_LATENCY_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", PHASE_BUCKETS),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.", PHASE_BUCKETS),
    "vllm:request_inference_time_seconds": ("Histogram of time spent in RUNNING phase for request.", PHASE_BUCKETS),
    "vllm:request_prefill_time_seconds": ("Histogram of time spent in PREFILL phase for request.", PHASE_BUCKETS),
    "vllm:request_decode_time_seconds": ("Histogram of time spent in DECODE phase for request.", PHASE_BUCKETS),
    "vllm:request_prefill_kv_computed_tokens": ("Histogram of new KV tokens computed during prefill (excluding cached "
                                                "tokens).", TOKEN_BUCKETS),
}
HTTP_SIZE_HELP = ("Content length of {} by handler. Only value of header is respected. Otherwise ignored. "
                  "No percentile calculated. ")


def number(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def label_text(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class Histogram:
    def __init__(self, bounds):
        self.bounds, self.buckets, self.count, self.sum = bounds, [0] * len(bounds), 0, 0.0

    def observe(self, value: float) -> None:
        self.count, self.sum = self.count + 1, self.sum + value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1

    def samples(self, name: str, labels: dict) -> list:
        out = [(f"{name}_bucket", {**labels, "le": number(b)}, n) for b, n in zip(self.bounds, self.buckets)]
        return out + [(f"{name}_bucket", {**labels, "le": "+Inf"}, self.count), (f"{name}_count", labels, self.count),
                      (f"{name}_sum", labels, self.sum)]


class Exposition:
    """prometheus_client's text format, as vLLM's /metrics writes it."""

    def __init__(self, created: float):
        self.lines, self.created = [], created

    def family(self, name, kind, help_text, samples, created=True):
        """samples: (sample name, labels, value); counters, histograms and summaries are followed
        by their `_created` gauge (one series per label set), as the recording has them — but for
        the python_gc and process collectors' (`created` False)."""
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        self.lines += [f"{sample}{label_text(labels)} {number(value)}" for sample, labels, value in samples]
        if created and kind in ("counter", "histogram", "summary"):
            created = (name[:-len("_total")] if kind == "counter" and name.endswith("_total") else name) + "_created"
            self.lines += [f"# HELP {created} {help_text}", f"# TYPE {created} gauge"]
            seen = []
            for _, labels, _ in samples:
                labels = {k: v for k, v in labels.items() if k not in ("le", "quantile")}
                if labels not in seen:
                    seen.append(labels)
            self.lines += [f"{created}{label_text(labels)} {number(self.created)}" for labels in seen]

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def process_samples(started: float) -> list:
    """prometheus_client's process collector, from /proc (the simulated nodes and CI run Linux)."""
    try:
        stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
        vmem, rss, cpu = float(stat[20]), float(stat[21]) * page, (float(stat[11]) + float(stat[12])) / ticks
        fds = len(os.listdir("/proc/self/fd"))
    except (OSError, IndexError, ValueError):
        vmem = rss = cpu = fds = 0
    return [("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vmem),
            ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss),
            ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", started),
            ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", cpu),
            ("process_open_fds", "gauge", "Number of open file descriptors.", fds),
            ("process_max_fds", "gauge", "Maximum number of open file descriptors.",
             resource.getrlimit(resource.RLIMIT_NOFILE)[0])]


@dataclass
class VllmStats:
    """What vLLM counts, counted for the stand-in's own traffic (under Behaviour's lock)."""

    started: float = field(default_factory=time.time)  # one Behaviour stands for one vLLM process
    counters: dict = field(default_factory=lambda: dict.fromkeys(ENGINE_COUNTERS, 0.0))
    generated: float = 0.0
    finished: dict = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0))
    prompt_by_source: dict = field(default_factory=lambda: dict.fromkeys(PROMPT_SOURCES, 0))
    histograms: dict = field(default_factory=lambda: {n: Histogram(b) for n, (_, b) in ENGINE_HISTOGRAMS.items()})
    tool_parser: dict = field(default_factory=lambda: dict.fromkeys(TOOL_PARSER_CASES, 0))
    http: dict = field(default_factory=dict)  # (handler, method, status class) -> count
    http_sizes: dict = field(default_factory=dict)  # handler -> [requests, request bytes, response bytes]
    http_durations: dict = field(default_factory=dict)  # (handler, method) -> Histogram
    http_all: Histogram = field(default_factory=lambda: Histogram(HTTP_HIGHR_BUCKETS))

    def request_done(self, reason, prompt, cached, generated, max_tokens, arrived, scheduled, first, done):
        c, h = self.counters, self.histograms
        c["vllm:prompt_tokens_total"] += prompt
        c["vllm:prefix_cache_queries_total"] += prompt
        c["vllm:prefix_cache_hits_total"] += cached
        self.prompt_by_source["local_compute"] += prompt - cached
        self.prompt_by_source["local_cache_hit"] += cached
        self.finished[reason] += 1
        for name, value in (("vllm:request_prompt_tokens", prompt), ("vllm:request_generation_tokens", generated),
                            ("vllm:request_max_num_generation_tokens", max_tokens), ("vllm:request_params_n", 1),
                            ("vllm:request_params_max_tokens", max_tokens),
                            ("vllm:time_to_first_token_seconds", first - arrived),
                            ("vllm:e2e_request_latency_seconds", done - arrived),
                            ("vllm:request_queue_time_seconds", scheduled - arrived),
                            ("vllm:request_inference_time_seconds", done - scheduled),
                            ("vllm:request_prefill_time_seconds", first - scheduled),
                            ("vllm:request_decode_time_seconds", done - first),
                            ("vllm:request_prefill_kv_computed_tokens", prompt - cached),
                            ("vllm:iteration_tokens_total", prompt - cached + 1)):
            h[name].observe(value)
        for _ in range(generated - 1):  # the tokens after the first, evenly spaced
            h["vllm:inter_token_latency_seconds"].observe((done - first) / (generated - 1))
            h["vllm:iteration_tokens_total"].observe(1)
        if generated > 1:
            h["vllm:request_time_per_output_token_seconds"].observe((done - first) / (generated - 1))

    def http_done(self, handler, method, status, request_bytes, response_bytes, seconds):
        key = (handler, method, f"{status // 100}xx")
        self.http[key] = self.http.get(key, 0) + 1
        sizes = self.http_sizes.setdefault(handler, [0, 0, 0])
        sizes[0], sizes[1], sizes[2] = sizes[0] + 1, sizes[1] + request_bytes, sizes[2] + response_bytes
        self.http_durations.setdefault((handler, method), Histogram(HTTP_BUCKETS)).observe(seconds)
        self.http_all.observe(seconds)

    def exposition(self, model: str, running: int, waiting: int) -> str:
        out, engine = Exposition(self.started), {"engine": "0", "model_name": model}
        gc_stats = gc.get_stats()
        for name, key, help_text in (
                ("python_gc_objects_collected_total", "collected", "Objects collected during gc"),
                ("python_gc_objects_uncollectable_total", "uncollectable", "Uncollectable objects found during GC"),
                ("python_gc_collections_total", "collections", "Number of times this generation was collected")):
            out.family(name, "counter", help_text,
                       [(name, {"generation": str(g)}, s[key]) for g, s in enumerate(gc_stats)], created=False)
        version = sys.version_info
        out.family("python_info", "gauge", "Python platform information", [("python_info", {
            "implementation": platform.python_implementation(), "major": str(version.major),
            "minor": str(version.minor), "patchlevel": str(version.micro),
            "version": platform.python_version()}, 1)])
        for name, kind, help_text, value in process_samples(self.started):
            out.family(name, kind, help_text, [(name, {}, value)], created=False)
        counters = list(ENGINE_COUNTERS.items())
        for name, help_text in counters[:3]:
            out.family(name, "counter", help_text, [(name, engine, self.counters[name])])
        out.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   [("vllm:num_requests_running", engine, running)])
        out.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                   [("vllm:num_requests_waiting", engine, waiting)])
        out.family("vllm:num_requests_waiting_by_reason", "gauge",
                   "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
                   "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
                   "status). Sum of all reasons equals vllm:num_requests_waiting.",
                   [("vllm:num_requests_waiting_by_reason", {**engine, "reason": "capacity"}, waiting),
                    ("vllm:num_requests_waiting_by_reason", {**engine, "reason": "deferred"}, 0)])
        out.family("vllm:engine_sleep_state", "gauge",
                   "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
                   "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
                   [("vllm:engine_sleep_state", {**engine, "sleep_state": state}, value)
                    for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0))])
        out.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   [("vllm:kv_cache_usage_perc", engine, min(1.0, running / 64))])
        for name, help_text in counters[3:]:
            out.family(name, "counter", help_text, [(name, engine, self.counters[name])])
        out.family("vllm:prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source.",
                   [("vllm:prompt_tokens_by_source_total", {**engine, "source": s}, n)
                    for s, n in self.prompt_by_source.items()])
        out.family("vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens (local + external).",
                   [("vllm:prompt_tokens_cached_total", engine, self.counters["vllm:prefix_cache_hits_total"])])
        out.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                   [("vllm:generation_tokens_total", engine, self.generated)])
        out.family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                   [("vllm:request_success_total", {"engine": "0", "finished_reason": r, "model_name": model}, n)
                    for r, n in self.finished.items()])
        for name, (help_text, _) in ENGINE_HISTOGRAMS.items():
            out.family(name, "histogram", help_text, self.histograms[name].samples(name, engine))
        out.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
                   [("vllm:cache_config_info", {**CACHE_CONFIG, "engine": "0"}, 1)])
        out.family("http_requests_total", "counter", "Total number of requests by method, status and handler.",
                   [("http_requests_total", {"handler": h, "method": m, "status": s}, n)
                    for (h, m, s), n in self.http.items()])
        for name, what, index in (("http_request_size_bytes", "incoming requests", 1),
                                  ("http_response_size_bytes", "outgoing responses", 2)):
            out.family(name, "summary", HTTP_SIZE_HELP.format(what), [
                sample for h, sizes in self.http_sizes.items()
                for sample in ((f"{name}_count", {"handler": h}, sizes[0]), (f"{name}_sum", {"handler": h}, sizes[index]))])
        out.family("http_request_duration_highr_seconds", "histogram",
                   "Latency with many buckets but no API specific labels. Made for more accurate percentile "
                   "calculations. ", self.http_all.samples("http_request_duration_highr_seconds", {}))
        out.family("http_request_duration_seconds", "histogram",
                   "Latency with only few buckets by handler. Made to be only used if aggregation by handler is "
                   "important. ", [sample for (h, m), hist in self.http_durations.items()
                                   for sample in hist.samples("http_request_duration_seconds",
                                                              {"handler": h, "method": m})])
        out.family("vllm:tool_call_parser_invocations_total", "counter",
                   "Total number of ToolParser invocations. Non-streaming increments once per choice; streaming "
                   "increments once per delta.",
                   [("vllm:tool_call_parser_invocations_total",
                     {"mode": mode, "model_name": model, "outcome": outcome, "request_type": kind}, n)
                    for (mode, outcome, kind), n in self.tool_parser.items()])
        return out.text()




def default_engine(tokens: int) -> list:
    return [f"t{i} " for i in range(tokens)]


@dataclass
class Request:
    path: str
    body: dict
    authorized: bool
    cached_prompt_tokens: int = 0


class BlockStore(Protocol):
    """A KV tier as the prefix cache sees it: blocks by their hash."""

    def has(self, digest: bytes) -> bool: ...

    def put(self, digest: bytes) -> None: ...


@dataclass
class Behaviour:
    api_key: Optional[str] = "sk-fake"  # empty or None: no key checked (vLLM started without one)
    model: str = "fake-model"
    base_latency_s: float = 0.02
    ttft_jitter_s: float = 0.0  # each request's first token up to this much later, at random: a real server's noise
    prefill_tok_s: float = 20000.0  # float("inf"): no prefill time
    decode_tok_s: float = 100.0  # float("inf"): every token at once
    engine: Callable[[int], list] = default_engine  # max_tokens -> token pieces
    on_engine_error: Optional[Callable[[BaseException], None]] = None  # after the 500 is sent
    load_s: float = 0.0
    max_model_len: int = 4096
    root: Optional[str] = None  # /v1/models' root: the model's path (None: the model's name)
    metrics_text: Optional[str] = None  # None: the stand-in's own counters, as vLLM 0.24 exposes them
    needle_behaviors: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # Request, one per POST, in arrival order
    prefix_cache: bool = False
    cache_block_chars: int = 16  # 4 tokens: finer than vLLM's 16-token blocks, so a stricter test
    hash_seed: bytes = b""  # where the blocks' hash chain starts (vLLM's NONE_HASH)
    kv_tier: Optional["BlockStore"] = None  # with prefix_cache: blocks kept beyond the engine (a KV tier)
    tier_hit_chars: int = 0
    tokens_per_chunk: int = 1
    send_usage: bool = True
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning_content"
    chat_error: Optional[tuple] = None
    accept_cache_salt: bool = True
    raw_stream: Optional[bytes] = None
    raw_models: Optional[bytes] = None
    fault: Callable[[], Optional[str]] = lambda: None
    max_running: Optional[int] = None
    health_calls: int = 0
    running: int = 0
    waiting: int = 0
    dead: bool = False  # the engine died: /health answers 503 until the server stops
    stats: VllmStats = field(default_factory=VllmStats)
    _cache: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    slots: threading.Semaphore = field(init=False, repr=False)  # one per request decoding at once

    def __post_init__(self):
        self.slots = threading.BoundedSemaphore(self.max_running or 1 << 20)

    def lookup_and_fill_cache(self, prompt: str, salt: str) -> int:
        """Prompt characters served from the cache: whole leading blocks seen before, chained like vLLM's
        (from `hash_seed`, its NONE_HASH); with a `kv_tier`, a block the engine does not hold is looked up
        there, and every block computed is stored there (counted in `tier_hit_chars`)."""
        block, digest, hit_chars, missed = self.cache_block_chars, self.hash_seed + salt.encode(), 0, False
        with self._lock:
            for start in range(0, len(prompt) - block + 1, block):
                digest = hashlib.sha256(digest + prompt[start:start + block].encode()).digest()
                if not missed and digest in self._cache:
                    hit_chars += block
                elif not missed and self.kv_tier is not None and self.kv_tier.has(digest):
                    hit_chars += block
                    self.tier_hit_chars += block
                    self._cache.add(digest)
                else:
                    missed = True
                    self._cache.add(digest)
                    if self.kv_tier is not None:
                        self.kv_tier.put(digest)
        return hit_chars

    def metrics(self) -> str:
        if self.metrics_text is not None:
            return self.metrics_text
        with self._lock:
            return self.stats.exposition(self.model, self.running, self.waiting)

    def count_generated(self, tokens: int) -> None:
        with self._lock:
            self.stats.generated += tokens


def prompt_text(body: dict) -> str:
    if "messages" in body:
        return "".join(m.get("content", "") for m in body["messages"])
    if "input" in body:  # /v1/responses: a string, or input items whose content is a string or text parts
        items = body["input"] if isinstance(body["input"], list) else [{"content": body["input"]}]
        contents = [item.get("content", "") for item in items if isinstance(item, dict)]
        return "".join(c if isinstance(c, str) else "".join(p.get("text", "") for p in c if isinstance(p, dict))
                       for c in contents)
    return str(body.get("prompt", ""))


def needle_answer(prompt: str, behaviour: str) -> str:
    codes = re.findall(r"vault=(\w+) access_code=([A-Z0-9-]+)", prompt)
    lines = [f"{vault}: {code}" for vault, code in codes]
    if behaviour == "wrong":
        lines[0] = lines[0][:-1] + ("A" if lines[0][-1] != "A" else "B")
    elif behaviour == "missing":
        lines = lines[1:]
    elif behaviour == "junk":
        lines.append("<|end|> </tool_call> </tool_call>")
    elif behaviour == "refuse":
        return "This looks like a prompt injection test; I will not reveal access codes."
    return "\n".join(lines)


GARBAGE = ["<unk>", "¿¿", " ]]]", "�", " the the the"]
SUM_QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")


def messages_text(body: dict) -> str:
    """An Anthropic request's text: its messages' string contents and text blocks (system aside)."""
    def text(content) -> str:
        if isinstance(content, str):
            return content
        return "".join(block.get("text") or "" for block in content if isinstance(block, dict))
    return "".join(text(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))


def anthropic_error(kind: str, message: str) -> dict:
    """vLLM's AnthropicErrorResponse."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def arithmetic_answer(prompt: str) -> Optional[str]:
    match = SUM_QUESTION.search(prompt)
    return str(int(match[1]) + int(match[2])) if match else None


def called_tool(body: dict, prompt: str) -> Optional[str]:
    """The tool a healthy model calls: the one named in tool_choice, or with tool_choice "auto"
    (the default) one of the tools whose name the prompt mentions, or that the request's
    structured outputs force the model to write (as the GPU run forced its call) — the model
    writes the call in its own markup and the server's tool parser turns it into `tool_calls`."""
    tools = [((t.get("function") or {}).get("name") or "") for t in body.get("tools") or []]
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        return ((choice.get("function") or {}).get("name")) if tools else None
    forced = json.dumps(body.get("structured_outputs") or {})
    return next((name for name in tools if name and choice == "auto" and (name in prompt or name in forced)), None)


def chat_completion_body(header: dict, message: dict, finish: str, usage: dict) -> dict:
    """A chat completion not streamed, key for key as vLLM 0.24 gave it (the second run's api.txt:
    a tool call; the same ChatCompletionResponse carries plain answers, their message without
    `tool_calls`)."""
    message = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, **message, "reasoning": None}
    return {**header, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None, "token_ids": None, "routed_experts": None}],
            "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {"prompt_tokens_details": None, **usage},
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None}


def hang_forever() -> None:
    threading.Event().wait()


def make_handler(behaviour: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        status, sent_bytes, outcome = 0, 0, None

        def log_message(self, *args):
            pass

        def reply(self, code, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
            self.status, self.sent_bytes = code, len(data)
            self.send_response(code)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            return not behaviour.api_key or self.headers.get("Authorization") == f"Bearer {behaviour.api_key}"

        def counted(self, handle, request_bytes: int = 0):
            """Runs handle(); a /v1 call lands in the http_* series, as vLLM's instrumentator counts them."""
            began = time.perf_counter()
            try:
                handle()
            finally:
                if self.path in HTTP_HANDLERS and self.status:
                    with behaviour._lock:
                        behaviour.stats.http_done(self.path, self.command, self.status, request_bytes,
                                                  self.sent_bytes, time.perf_counter() - began)

        def do_GET(self):
            self.counted(self.get)

        def get(self):
            if self.path == "/health":
                with behaviour._lock:
                    behaviour.health_calls += 1
                return self.reply(503 if behaviour.dead else 200, b"", None)  # vLLM: no body, no content type
            if self.path == "/metrics":
                return self.reply(200, behaviour.metrics(), "text/plain")
            if self.path == "/v1/models":
                if not self.authorized():
                    return self.reply(401, {"error": "Unauthorized"})
                if behaviour.raw_models is not None:
                    return self.reply(200, behaviour.raw_models)
                return self.reply(200, {"object": "list", "data": [self.model_card()]})
            self.reply(404, {"error": "not found"})

        def model_card(self) -> dict:
            created = int(behaviour.stats.started)
            return {"id": behaviour.model, "object": "model", "created": created, "owned_by": "vllm",
                    "root": behaviour.root or behaviour.model, "parent": None,
                    "max_model_len": behaviour.max_model_len,
                    "permission": [{"id": f"modelperm-{random_id()}", "object": "model_permission",
                                    "created": created, "allow_create_engine": False, "allow_sampling": True,
                                    "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                    "allow_fine_tuning": False, "organization": "*", "group": None,
                                    "is_blocking": False}]}

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.counted(lambda: self.post(raw), len(raw))

        def post(self, raw: bytes):
            arrived = time.perf_counter()
            if self.path.split("?", 1)[0] == MESSAGES_PATH:
                return self.messages(raw)
            if self.path not in COMPLETION_PATHS:
                return self.reply(404, {"error": "not found"})
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return self.reply(400, {"error": "request body is not JSON"})
            request = Request(self.path, body, self.authorized())
            with behaviour._lock:
                behaviour.requests.append(request)
            if not request.authorized:
                return self.reply(401, {"error": "Unauthorized"})
            if body.get("model") != behaviour.model:
                return self.reply(404, {"error": f"model {body.get('model')!r} not served"})
            if behaviour.chat_error:
                return self.reply(behaviour.chat_error[0], {"error": {"message": behaviour.chat_error[1]}})
            if "cache_salt" in body and not behaviour.accept_cache_salt:
                return self.reply(400, {"error": {"message": "Parameter 'cache_salt' is not supported"}})
            with behaviour._lock:
                behaviour.waiting += 1
            behaviour.slots.acquire()
            with behaviour._lock:
                behaviour.waiting -= 1
                behaviour.running += 1
            scheduled = time.perf_counter()
            try:
                self.complete(request)
            except (BrokenPipeError, ConnectionResetError):
                self.outcome = self.outcome and {**self.outcome, "reason": "abort"}
                raise
            finally:
                with behaviour._lock:
                    behaviour.running -= 1
                    if self.outcome:
                        behaviour.stats.request_done(arrived=arrived, scheduled=scheduled, done=time.perf_counter(),
                                                     **self.outcome)
                behaviour.slots.release()

        def complete(self, request: Request):
            start = time.perf_counter()
            body, chat, responses = request.body, request.path.endswith("chat/completions"), request.path.endswith("responses")
            prompt = prompt_text(body)
            n_prompt = len(prompt) // 4
            if behaviour.prefix_cache:
                cached = behaviour.lookup_and_fill_cache(prompt, body.get("cache_salt", "")) // 4
                request.cached_prompt_tokens = min(n_prompt, cached)
            max_tokens = max(1, int(body.get("max_output_tokens" if responses else "max_tokens") or 16))
            self.outcome = {"reason": "error", "prompt": n_prompt, "cached": request.cached_prompt_tokens,
                            "generated": 0, "max_tokens": max_tokens, "first": start}
            try:
                pieces = behaviour.engine(max_tokens)  # every request runs the engine, needle or not
            except Exception as err:  # the simulator's engine: a Ray worker died
                self.reply(500, {"error": "engine dead"})
                if behaviour.on_engine_error:
                    behaviour.on_engine_error(err)
                return
            if behaviour.raw_stream is not None:
                self.outcome = None
                return self.stream_raw(behaviour.raw_stream)
            fault = behaviour.fault()
            if fault == "hang" and not body.get("stream"):
                return hang_forever()
            header = {"id": f"{'resp_' if responses else 'chatcmpl-' if chat else 'cmpl-'}{random_id()}",
                      "created": int(time.time()), "model": behaviour.model}
            tool = called_tool(body, prompt) if chat else None
            parsing = chat and bool(body.get("tools")) and body.get("tool_choice", "auto") == "auto"  # the tool parser runs
            if tool and not (fault == "unparsed-tool-call" and body.get("tool_choice", "auto") == "auto"):
                arguments = '{"city": "Par\u00bf<unk>' if fault == "garbage" else '{"city": "Paris"}'
                generated = len(arguments) // 4 + 1
                self.outcome.update(reason="stop", generated=generated)
                usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + generated, "completion_tokens": generated}
                # vLLM ends a call it parsed with "tool_calls", one it made for a named tool_choice with "stop"
                finish = "stop" if isinstance(body.get("tool_choice"), dict) else "tool_calls"
                stream = bool(body.get("stream"))
                return self.tool_call(header, tool, arguments, finish, usage if wants_usage(body) or not stream else None,
                                      stream, fault == "hang", parsing)
            if tool:  # the tool parser missed the model's markup: the call arrives as text
                pieces = [f"<|tool_call|>{tool}", '{"city": "Paris"}', "<|end|>"]
            if arithmetic_answer(prompt):
                pieces = [arithmetic_answer(prompt)]
            if fault == "garbage":
                pieces = [GARBAGE[i % len(GARBAGE)] for i in range(len(pieces))]
            if "access codes of the vaults" in prompt:
                with behaviour._lock:
                    kind = behaviour.needle_behaviors.pop(0) if behaviour.needle_behaviors else "correct"
                pieces = [w + " " for w in needle_answer(prompt, kind).replace("\n", " \n").split(" ") if w]
            answer_field = "text" if not chat and not responses else "content"
            tokens = [(behaviour.reasoning_field, f"r{i} ") for i in range(behaviour.reasoning_tokens if chat else 0)]
            tokens += [(answer_field, piece) for piece in pieces]
            finish = "length" if len(tokens) >= max_tokens else "stop"
            tokens = tokens[:max_tokens]
            usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(tokens), "completion_tokens": len(tokens)}
            if behaviour.prefix_cache:  # what vLLM adds with --enable-prompt-tokens-details
                usage["prompt_tokens_details"] = {"cached_tokens": request.cached_prompt_tokens}
            first_at = (start + behaviour.base_latency_s + random.uniform(0, behaviour.ttft_jitter_s)
                        + (n_prompt - request.cached_prompt_tokens) / behaviour.prefill_tok_s)
            self.outcome.update(reason=finish, generated=len(tokens), first=first_at)
            if parsing:
                self.count_tool_parser("streaming" if body.get("stream") else "non_streaming", "no_tool_call",
                                       len(tokens) if body.get("stream") else 1)
            if body.get("stream") and responses:
                return self.stream_response(header, body, tokens, finish, first_at, usage, request.cached_prompt_tokens)
            if body.get("stream"):
                return self.stream(header, chat, tokens, finish, first_at, usage if wants_usage(body) else None,
                                   hang=fault == "hang")
            pause_until(first_at + len(tokens) / behaviour.decode_tok_s)
            behaviour.count_generated(len(tokens))
            text = "".join(piece for key, piece in tokens if key == answer_field)
            if responses:
                return self.reply(200, response_body(header, body, text, finish, usage, request.cached_prompt_tokens))
            if chat:
                return self.reply(200, chat_completion_body(header, {"content": text}, finish, usage))
            self.reply(200, {**header, "object": "text_completion",
                             "choices": [{"index": 0, "finish_reason": finish, "text": text}], "usage": usage})

        def messages(self, raw: bytes):
            """A text answer in vLLM's Anthropic shapes: one message, or streamed as its events
            (`event:` and `data:` lines: message_start, content_block_start, a text_delta per
            piece, content_block_stop, message_delta with the stop reason, message_stop)."""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return self.reply(400, anthropic_error("invalid_request_error", "request body is not JSON"))
            request = Request(MESSAGES_PATH, body, self.authorized())
            with behaviour._lock:
                behaviour.requests.append(request)
            if not request.authorized:
                return self.reply(401, {"error": "Unauthorized"})
            if body.get("model") != behaviour.model:
                return self.reply(404, anthropic_error("not_found_error", f"The model `{body.get('model')}` does not exist."))
            prompt = messages_text(body)
            max_tokens = max(1, int(body.get("max_tokens") or 16))
            answer = arithmetic_answer(prompt)
            pieces = ([answer] if answer else behaviour.engine(max_tokens))[:max_tokens]
            stop = "max_tokens" if not answer and len(pieces) >= max_tokens else "end_turn"
            behaviour.count_generated(len(pieces))
            message = {"id": f"msg_{random_id()}", "type": "message", "role": "assistant",
                       "content": [{"type": "text", "text": "".join(pieces)}], "model": behaviour.model,
                       "stop_reason": stop, "stop_sequence": None,
                       "usage": {"input_tokens": len(prompt) // 4, "output_tokens": len(pieces)}}
            if not body.get("stream"):
                return self.reply(200, message)
            self.start_stream()

            def send(kind: str, payload: dict) -> None:
                self.chunk(f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode())

            send("message_start", {"message": {**message, "content": [], "stop_reason": None,
                                               "usage": {"input_tokens": len(prompt) // 4, "output_tokens": 0}}})
            send("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            for piece in pieces:
                send("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
            send("content_block_stop", {"index": 0})
            send("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                   "usage": {"output_tokens": len(pieces)}})
            send("message_stop", {})
            self.wfile.write(b"0\r\n\r\n")

        def count_tool_parser(self, mode, outcome, times):
            with behaviour._lock:
                behaviour.stats.tool_parser[(mode, outcome, "chat_completions")] += times

        def tool_call(self, header, name, arguments, finish, usage, stream, hang, parsing):
            """As vLLM's hermes parser gave it (the second run's api.txt): not streamed, one message;
            streamed, the role chunk, the name alone with the call's id, the arguments in pieces
            (`content: null` beside each), an empty finish delta, then usage when asked for."""
            call_id = f"chatcmpl-tool-{random_id()}"
            if parsing:
                self.count_tool_parser("streaming" if stream else "non_streaming", "tool_call", 1)
            if not stream:
                message = {"tool_calls": [{"id": call_id, "type": "function",
                                           "function": {"name": name, "arguments": arguments}}]}
                return self.reply(200, chat_completion_body(header, message, finish, usage))
            self.start_stream()
            header = {**header, "object": "chat.completion.chunk"}
            self.role_chunk(header)
            first = {"content": None, "tool_calls": [{"id": call_id, "type": "function", "index": 0,
                                                      "function": {"name": name}}]}
            self.event({**header, "choices": [{"index": 0, "delta": first, "logprobs": None, "finish_reason": None,
                                               "token_ids": None}]})
            if hang:
                return hang_forever()
            for start in range(0, len(arguments), 6):  # arguments arrive in pieces, as vLLM streams them
                delta = {"content": None, "tool_calls": [{"index": 0, "function": {"arguments": arguments[start:start + 6]}}]}
                self.event({**header, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                   "finish_reason": None, "token_ids": None}]})
            self.finish_stream(header, {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish,
                                        "stop_reason": None, "token_ids": None}, usage)

        def role_chunk(self, header):
            """vLLM's chat stream opens with the role alone, when the first token is there (api.txt)."""
            self.event({**header, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "logprobs": None, "finish_reason": None}],
                        "prompt_token_ids": None, "prompt_text": None})

        def stream(self, header, chat, tokens, finish, first_at, usage, hang=False):
            self.start_stream()
            per_chunk = behaviour.tokens_per_chunk
            chunks = [tokens[i:i + per_chunk] for i in range(0, len(tokens), per_chunk)]
            header = {**header, "object": "chat.completion.chunk" if chat else "text_completion"}
            for i, chunk in enumerate(chunks):
                pause_until(first_at + i * per_chunk / behaviour.decode_tok_s)
                if chat and i == 0:
                    self.role_chunk(header)
                parts = {}
                for key, text in chunk:
                    parts[key] = parts.get(key, "") + text
                last = i == len(chunks) - 1
                choice = {"index": 0, **({"delta": parts} if chat else parts), "logprobs": None,
                          "finish_reason": finish if last else None}
                if chat:  # the keys vLLM's chat chunks carry (api.txt): the last one names its stop_reason
                    choice.update({"stop_reason": None, "token_ids": None} if last else {"token_ids": None})
                behaviour.count_generated(len(chunk))
                if last and not hang:
                    return self.finish_stream(header, choice, usage, fingerprint=chat)
                self.event({**header, "choices": [choice]})
                if hang:
                    return hang_forever()

        def finish_stream(self, header, choice, usage, fingerprint=True):
            """The last choice chunk, the usage chunk when asked for, [DONE]. The fingerprint goes on
            the stream's last JSON chunk: the usage one when sent, else the finish one (api.txt)."""
            usage = usage if behaviour.send_usage else None
            mark = {"system_fingerprint": SYSTEM_FINGERPRINT} if fingerprint else {}
            self.event({**header, "choices": [choice], **({} if usage is not None else mark)})
            if usage is not None:
                self.event({**header, "choices": [], "usage": usage, **mark})
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def stream_raw(self, data: bytes):
            self.start_stream()
            self.chunk(data)
            self.wfile.write(b"0\r\n\r\n")

        def stream_response(self, header, body, tokens, finish, first_at, usage, cached):
            """/v1/responses streamed as vLLM's api_router sends it (`event: TYPE` and `data: JSON`, each
            event numbered, no [DONE]): the response created and in progress, the message item and its
            text part added, a text delta per token, then each done, and the whole response completed."""
            self.start_stream()
            whole = response_body(header, body, "".join(piece for _, piece in tokens), finish, usage, cached)
            message = whole["output"][0]
            item_id, part = message["id"], message["content"][0]
            numbered = itertools.count()

            def send(kind: str, **payload) -> None:
                event = {"type": kind, "sequence_number": next(numbered), **payload}
                self.chunk(f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode())

            opening = {**whole, "status": "in_progress", "output": [], "usage": None}
            send("response.created", response=opening)
            send("response.in_progress", response=opening)
            send("response.output_item.added", output_index=0,
                 item={**message, "status": "in_progress", "content": []})
            send("response.content_part.added", item_id=item_id, output_index=0, content_index=0,
                 part={**part, "text": ""})
            for i, (_, piece) in enumerate(tokens):
                pause_until(first_at + i / behaviour.decode_tok_s)
                send("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece,
                     logprobs=[])
            behaviour.count_generated(len(tokens))
            send("response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=part["text"],
                 logprobs=[])
            send("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part)
            send("response.output_item.done", output_index=0, item=message)
            send("response.completed", response=whole)
            self.wfile.write(b"0\r\n\r\n")

        def start_stream(self):
            self.status = 200  # no Content-Length: vLLM's instrumentator counts a stream's size as 0
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def event(self, payload):
            self.chunk(("data: " + json.dumps(payload) + "\n\n").encode())

        def chunk(self, data: bytes):
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def wants_usage(body: dict) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def response_body(header: dict, body: dict, text: str, finish: str, usage: dict, cached: int) -> dict:
    """/v1/responses' answer, key for key as vLLM 0.24 gave it (api.txt)."""
    incomplete = finish == "length"
    return {
        "id": header["id"], "created_at": header["created"],
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": header["model"],
        "object": "response",
        "output": [{"id": f"msg_{random_id()}", "content": [{"annotations": [], "text": text, "type": "output_text",
                                                             "logprobs": None}],
                    "role": "assistant", "status": "completed", "type": "message", "phase": None}],
        "parallel_tool_calls": True, "temperature": float(body.get("temperature", 1.0)),
        "tool_choice": body.get("tool_choice", "auto" if body.get("tools") else "none"), "tools": body.get("tools", []),
        "top_p": float(body.get("top_p", 1.0)), "background": False,
        "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None, "previous_response_id": None,
        "prompt": None, "reasoning": None, "service_tier": "auto", "status": "incomplete" if incomplete else "completed",
        "text": None, "top_logprobs": None, "truncation": "disabled",
        "usage": {"input_tokens": usage["prompt_tokens"],
                  "input_tokens_details": {"cached_tokens": cached, "input_tokens_per_turn": [],
                                           "cached_tokens_per_turn": []},
                  "output_tokens": usage["completion_tokens"],
                  "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                            "output_tokens_per_turn": [], "tool_output_tokens_per_turn": []},
                  "total_tokens": usage["total_tokens"]},
        "user": None, "presence_penalty": 0.0, "frequency_penalty": 0.0, "kv_transfer_params": None,
        "input_messages": None, "output_messages": None,
    }


def pause_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class QuietAboutGoneClients:
    def handle_error(self, request, client_address):
        # a client that gave up mid-stream (a test's deadline) is not the stand-in's error; anything else is
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Server(QuietAboutGoneClients, ThreadingHTTPServer):
    daemon_threads = True
    _cancel: Optional[threading.Event] = None
    _listening: Optional[threading.Event] = None

    def listen_after(self, load_s: float) -> None:
        """Bound now (the port is known), listening once loaded: a connection before that is
        refused, as vLLM's is while its engine loads (it opens the socket last)."""
        self._cancel, self._listening = threading.Event(), threading.Event()

        def listen():
            self.server_activate()
            self._listening.set()

        def run():
            if load_s > 0:
                if self._cancel.wait(load_s):
                    return
                listen()
            self.serve_forever()

        if load_s <= 0:
            listen()

        threading.Thread(target=run, daemon=True).start()

    def shutdown(self):
        if self._cancel is None:
            return super().shutdown()
        self._cancel.set()
        if self._listening.is_set():
            super().shutdown()


class UnixServer(QuietAboutGoneClients, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """`vllm serve --uds PATH`: like vLLM's, the bind fails on a socket file left behind."""

    daemon_threads = True

    def get_request(self):
        request, _ = super().get_request()
        return request, ("uds", 0)  # the handler's log lines read client_address[0]


def make_server(behaviour: Behaviour, host: str = "127.0.0.1", port: int = 0, uds: Optional[str] = None,
                bind_and_activate: bool = True):
    if uds:
        return UnixServer(uds, make_handler(behaviour))
    return Server((host, port), make_handler(behaviour), bind_and_activate=bind_and_activate)


def serve(behaviour: Behaviour, host: str = "127.0.0.1", port: int = 0) -> Server:
    """Started on a daemon thread; `server.server_address[1]` is the port, `server.shutdown()` stops it.
    With `behaviour.load_s`, connections are refused for that long first."""
    server = make_server(behaviour, host, port, bind_and_activate=False)
    server.server_bind()
    server.listen_after(behaviour.load_s)
    return server


def engine_died(server, behaviour: Behaviour, exit: Callable[[int], None] = os._exit) -> None:
    """What vLLM 0.24's API server did once its EngineCore was killed (kill.txt): /health 503,
    then after ~3 s the connection refused, then after ~5 s the process gone with status 0."""
    behaviour.dead = True

    def wind_down():
        time.sleep(DEAD_SERVING_503_S)
        server.shutdown()
        server.server_close()  # a socket file stays behind: connecting to it is refused
        time.sleep(DEAD_EXIT_S - DEAD_SERVING_503_S)
        exit(0)

    threading.Thread(target=wind_down, daemon=True).start()
