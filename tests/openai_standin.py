"""The one OpenAI-compatible stand-in for vLLM in the tests: known timing, known answers.

Used by the day-2 tool tests (tests/ops), the readiness tests (tests/test_node_artifacts.py)
and the simulator's `vllm` (tests/sim/bin/vllm), which runs it inside the simulated nodes
under their python3: so the standard library only, nothing else.

It serves what vLLM serves and the tests touch: /health, /metrics, /v1/models,
/v1/completions and /v1/chat/completions, streamed in vLLM's format (`id`, `object`,
`created`, `model`, `choices`, a last chunk with `usage` when `stream_options.include_usage`
asks for it, then `data: [DONE]`) or as one JSON body. The API key, when set, is enforced
on /v1 only, as vLLM does. Every POST lands in `Behaviour.requests` with whether it was
authorized.

Prompt tokens are len(text) // 4. A reply waits base_latency + uncached prompt / prefill_tok_s
before its first token, then emits tokens at decode_tok_s, on a schedule kept against the
clock (no drift). `engine(n)` produces the token pieces (the simulator's runs its Ray forward
pass there); needle prompts are answered from the codes really planted in them, bent by
`needle_behaviors` (correct, wrong, missing, junk, refuse), one per request.

Off by default, so the plain stand-in stays simple:
- `prefix_cache`: a block-hashed prefix cache like vLLM's (salted by `cache_salt`); cached
  prompt tokens skip prefill, and usage reports them as `prompt_tokens_details.cached_tokens`;
- `tokens_per_chunk` > 1: several tokens per stream chunk, as under speculative decoding;
- `send_usage` False: no `usage` chunk even when asked, as some proxies and old servers do;
- `reasoning_tokens`: that many reasoning deltas (in `reasoning_field`) before the answer;
  reasoning and answer together stop at max_tokens with finish_reason "length";
- `chat_error`: (status, message) returned for every completion request;
- `accept_cache_salt` False: `cache_salt` is refused with 400, as vLLM's V0 engine does;
- `healthy_after`: /health answers 503 that many times before 200, as a loading server;
- `raw_stream` / `raw_models`: bytes sent as they are (status 200) instead of a completion
  stream / the model list: garbage for the clients' error paths;
- `fault()`: asked per completion request, the engine gone wrong while /health stays 200:
  "garbage" (wrong answers, tool-call arguments that are not JSON), "hang" (a stream stops
  after its first chunk, a plain reply never comes) or "unparsed-tool-call" (with tool_choice
  "auto" the call comes back as text in the model's markup: a tool parser that fails);
- `max_running`: at most that many requests decode at once (vLLM's max_num_seqs); the rest
  wait, counted in `vllm:num_requests_waiting`.
Known answers, as a healthy model gives them: "What is A + B?" is answered with the sum, and a
request naming a tool in `tool_choice`, or with tool_choice "auto" mentioning a tool's name,
gets a call of it (streamed as vLLM streams tool calls). /metrics counts generated tokens as
vLLM does (`vllm:generation_tokens_total`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import socketserver
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


def default_engine(tokens: int) -> list:
    return [f"t{i} " for i in range(tokens)]


@dataclass
class Request:
    path: str
    body: dict
    authorized: bool
    cached_prompt_tokens: int = 0


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
    healthy_after: int = 0
    metrics_text: Optional[str] = None  # None: the stand-in's own request counters, in vLLM's names
    needle_behaviors: list = field(default_factory=list)
    requests: list = field(default_factory=list)  # Request, one per POST, in arrival order
    prefix_cache: bool = False
    cache_block_chars: int = 16  # 4 tokens: finer than vLLM's 16-token blocks, so a stricter test
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
    finished: int = 0
    generated: int = 0  # tokens sent, every request together
    _cache: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    slots: threading.Semaphore = field(init=False, repr=False)  # one per request decoding at once

    def __post_init__(self):
        self.slots = threading.BoundedSemaphore(self.max_running or 1 << 20)

    def lookup_and_fill_cache(self, prompt: str, salt: str) -> int:
        """Prompt characters served from the cache: whole leading blocks seen before, chained like vLLM's."""
        block, digest, hit_chars, missed = self.cache_block_chars, salt.encode(), 0, False
        with self._lock:
            for start in range(0, len(prompt) - block + 1, block):
                digest = hashlib.sha256(digest + prompt[start:start + block].encode()).digest()
                if not missed and digest in self._cache:
                    hit_chars += block
                else:
                    missed = True
                    self._cache.add(digest)
        return hit_chars

    def metrics(self) -> str:
        if self.metrics_text is not None:
            return self.metrics_text
        label = f'{{model_name="{self.model}"}}'
        with self._lock:
            return (f"vllm:num_requests_running{label} {self.running}\n"
                    f"vllm:num_requests_waiting{label} {self.waiting}\n"
                    f"vllm:request_success_total{label} {self.finished}\n"
                    f"vllm:generation_tokens_total{label} {self.generated}\n")

    def count_generated(self, tokens: int) -> None:
        with self._lock:
            self.generated += tokens



def prompt_text(body: dict) -> str:
    if "messages" in body:
        return "".join(m.get("content", "") for m in body["messages"])
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


def arithmetic_answer(prompt: str) -> Optional[str]:
    match = SUM_QUESTION.search(prompt)
    return str(int(match[1]) + int(match[2])) if match else None


def called_tool(body: dict, prompt: str) -> Optional[str]:
    """The tool a healthy model calls: the one named in tool_choice, or with tool_choice "auto"
    (the default) one of the tools whose name the prompt mentions — the model writes the call in
    its own markup and the server's tool parser turns it into `tool_calls`."""
    tools = [((t.get("function") or {}).get("name") or "") for t in body.get("tools") or []]
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        return ((choice.get("function") or {}).get("name")) if tools else None
    return next((name for name in tools if name and choice == "auto" and name in prompt), None)


def hang_forever() -> None:
    threading.Event().wait()


def make_handler(behaviour: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, code, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            return not behaviour.api_key or self.headers.get("Authorization") == f"Bearer {behaviour.api_key}"

        def do_GET(self):
            if self.path == "/health":
                with behaviour._lock:
                    behaviour.health_calls += 1
                    loading = behaviour.health_calls <= behaviour.healthy_after
                return self.reply(503 if loading else 200, "", "text/plain")
            if self.path == "/metrics":
                return self.reply(200, behaviour.metrics(), "text/plain")
            if self.path == "/v1/models":
                if not self.authorized():
                    return self.reply(401, {"error": "Unauthorized"})
                if behaviour.raw_models is not None:
                    return self.reply(200, behaviour.raw_models)
                return self.reply(200, {"object": "list", "data": [{"id": behaviour.model, "object": "model"}]})
            self.reply(404, {"error": "not found"})

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
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
            try:
                self.complete(request)
            finally:
                with behaviour._lock:
                    behaviour.running -= 1
                    behaviour.finished += 1
                behaviour.slots.release()

        def complete(self, request: Request):
            start = time.perf_counter()
            body, chat = request.body, request.path.endswith("chat/completions")
            prompt = prompt_text(body)
            n_prompt = len(prompt) // 4
            if behaviour.prefix_cache:
                cached = behaviour.lookup_and_fill_cache(prompt, body.get("cache_salt", "")) // 4
                request.cached_prompt_tokens = min(n_prompt, cached)
            max_tokens = max(1, int(body.get("max_tokens") or 16))
            try:
                pieces = behaviour.engine(max_tokens)  # every request runs the engine, needle or not
            except Exception as err:  # the simulator's engine: a Ray worker died
                self.reply(500, {"error": "engine dead"})
                if behaviour.on_engine_error:
                    behaviour.on_engine_error(err)
                return
            if behaviour.raw_stream is not None:
                return self.stream_raw(behaviour.raw_stream)
            fault = behaviour.fault()
            if fault == "hang" and not body.get("stream"):
                return hang_forever()
            header = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
                      "model": behaviour.model}
            tool = called_tool(body, prompt) if chat else None
            if tool and not (fault == "unparsed-tool-call" and body.get("tool_choice", "auto") == "auto"):
                arguments = '{"city": "Par\u00bf<unk>' if fault == "garbage" else '{"city": "Paris"}'
                return self.tool_call(header, tool, arguments, bool(body.get("stream")), fault == "hang")
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
            answer_field = "content" if chat else "text"
            tokens = [(behaviour.reasoning_field, f"r{i} ") for i in range(behaviour.reasoning_tokens if chat else 0)]
            tokens += [(answer_field, piece) for piece in pieces]
            finish = "length" if len(tokens) >= max_tokens else "stop"
            tokens = tokens[:max_tokens]
            usage = {"prompt_tokens": n_prompt, "completion_tokens": len(tokens),
                     "total_tokens": n_prompt + len(tokens)}
            if behaviour.prefix_cache:  # what vLLM adds with --enable-prompt-tokens-details
                usage["prompt_tokens_details"] = {"cached_tokens": request.cached_prompt_tokens}
            first_at = start + behaviour.base_latency_s + random.uniform(0, behaviour.ttft_jitter_s) + (n_prompt - request.cached_prompt_tokens) / behaviour.prefill_tok_s
            if body.get("stream"):
                return self.stream(header, chat, tokens, finish, first_at,
                                   usage if (body.get("stream_options") or {}).get("include_usage") else None,
                                   hang=fault == "hang")
            pause_until(first_at + len(tokens) / behaviour.decode_tok_s)
            behaviour.count_generated(len(tokens))
            text = "".join(piece for key, piece in tokens if key == answer_field)
            choice = {"index": 0, "finish_reason": finish}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            self.reply(200, {**header, "object": "chat.completion" if chat else "text_completion",
                             "choices": [choice], "usage": usage})

        def tool_call(self, header, name, arguments, stream, hang):
            call = {"index": 0, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function"}
            if not stream:
                message = {"role": "assistant", "content": None,
                           "tool_calls": [{**call, "function": {"name": name, "arguments": arguments}}]}
                return self.reply(200, {**header, "object": "chat.completion",
                                        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
            self.start_stream()
            header = {**header, "object": "chat.completion.chunk"}
            first = {"role": "assistant", "tool_calls": [{**call, "function": {"name": name, "arguments": ""}}]}
            self.event({**header, "choices": [{"index": 0, "delta": first, "finish_reason": None}]})
            if hang:
                return hang_forever()
            for start in range(0, len(arguments), 6):  # arguments arrive in pieces, as vLLM streams them
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": arguments[start:start + 6]}}]}
                self.event({**header, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            self.event({**header, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def stream(self, header, chat, tokens, finish, first_at, usage, hang=False):
            self.start_stream()
            per_chunk = behaviour.tokens_per_chunk
            chunks = [tokens[i:i + per_chunk] for i in range(0, len(tokens), per_chunk)]
            header = {**header, "object": "chat.completion.chunk" if chat else "text_completion"}
            for i, chunk in enumerate(chunks):
                pause_until(first_at + i * per_chunk / behaviour.decode_tok_s)
                parts = {}
                for key, text in chunk:
                    parts[key] = parts.get(key, "") + text
                choice = {"index": 0, **({"delta": parts} if chat else parts), "logprobs": None,
                          "finish_reason": finish if i == len(chunks) - 1 else None}
                self.event({**header, "choices": [choice]})
                behaviour.count_generated(len(chunk))
                if hang:
                    return hang_forever()
            if usage is not None and behaviour.send_usage:
                self.event({**header, "choices": [], "usage": usage})
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def stream_raw(self, data: bytes):
            self.start_stream()
            self.chunk(data)
            self.wfile.write(b"0\r\n\r\n")

        def start_stream(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def event(self, payload):
            self.chunk(("data: " + json.dumps(payload) + "\n\n").encode())

        def chunk(self, data: bytes):
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


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


class UnixServer(QuietAboutGoneClients, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """`vllm serve --uds PATH`: like vLLM's, the bind fails on a socket file left behind."""

    daemon_threads = True

    def get_request(self):
        request, _ = super().get_request()
        return request, ("uds", 0)  # the handler's log lines read client_address[0]


def make_server(behaviour: Behaviour, host: str = "127.0.0.1", port: int = 0, uds: Optional[str] = None):
    if uds:
        return UnixServer(uds, make_handler(behaviour))
    return Server((host, port), make_handler(behaviour))


def serve(behaviour: Behaviour, host: str = "127.0.0.1", port: int = 0) -> Server:
    """Started on a daemon thread; `server.server_address[1]` is the port, `server.shutdown()` stops it."""
    server = make_server(behaviour, host, port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
