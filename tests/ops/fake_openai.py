"""A local OpenAI-compatible stand-in with known timing and known answers, for the ops tools.

Prompt tokens are len(text) // 4. A streamed reply waits base_latency + prompt/prefill_tok_s
before its first token, then emits tokens at decode_tok_s, on a schedule kept against the
clock (no drift). Needle prompts are answered from the codes really planted in them,
bent by `needle_behaviors` (correct, wrong, missing, junk, refuse), one per request.

Off by default, so the plain stand-in stays as simple as it was:
- `prefix_cache`: a block-hashed prefix cache like vLLM's (salted by `cache_salt`); cached
  prompt tokens skip prefill, so a repeated prompt gets a much faster first token, and usage
  reports them as `prompt_tokens_details.cached_tokens`;
- `tokens_per_chunk` > 1: several tokens per stream chunk, as under speculative decoding;
- `send_usage` False: no `usage` chunk even when asked, as some proxies and old servers do;
- `reasoning_tokens`: that many reasoning deltas (in `reasoning_field`) before the answer;
  reasoning and answer together stop at max_tokens with finish_reason "length";
- `chat_error`: (status, message) returned for every chat request;
- `accept_cache_salt` False: `cache_salt` is refused with 400, as vLLM's V0 engine does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Behaviour:
    api_key: str = "sk-fake"
    model: str = "fake-model"
    base_latency_s: float = 0.02
    prefill_tok_s: float = 20000.0
    decode_tok_s: float = 100.0
    needle_behaviors: list = field(default_factory=list)
    metrics_text: str = ""
    requests: list = field(default_factory=list)
    prefix_cache: bool = False
    cache_block_chars: int = 16  # 4 tokens: finer than vLLM's 16-token blocks, so a stricter test
    cached_prompt_tokens: list = field(default_factory=list)  # per request, in the order of `requests`
    tokens_per_chunk: int = 1
    send_usage: bool = True
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning_content"
    chat_error: tuple = None
    accept_cache_salt: bool = True
    _cache: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

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


def prompt_tokens(body: dict) -> int:
    return sum(len(m.get("content", "")) for m in body.get("messages", [])) // 4


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


def serve(behaviour: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code, body, content_type="application/json"):
            data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self):
            if self.headers.get("Authorization") != f"Bearer {behaviour.api_key}":
                self.send(401, {"error": "unauthorized"})
                return False
            return True

        def do_GET(self):
            if self.path == "/health":
                return self.send(200, b"")
            if self.path == "/metrics":
                return self.send(200, behaviour.metrics_text, "text/plain")
            if self.path == "/v1/models" and self.authorized():
                return self.send(200, {"data": [{"id": behaviour.model}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self.authorized():
                return
            start = time.perf_counter()
            if behaviour.chat_error:
                return self.send(behaviour.chat_error[0], {"error": {"message": behaviour.chat_error[1]}})
            if "cache_salt" in body and not behaviour.accept_cache_salt:
                return self.send(400, {"error": {"message": "Parameter 'cache_salt' is not supported"}})
            prompt = "".join(m.get("content", "") for m in body["messages"])
            n_prompt = prompt_tokens(body)
            cached = 0
            if behaviour.prefix_cache:
                cached = min(n_prompt, behaviour.lookup_and_fill_cache(prompt, body.get("cache_salt", "")) // 4)
            with behaviour._lock:
                behaviour.requests.append(body)
                behaviour.cached_prompt_tokens.append(cached)
            if "access codes of the vaults" in prompt:
                kind = behaviour.needle_behaviors.pop(0) if behaviour.needle_behaviors else "correct"
                pieces = [w + " " for w in needle_answer(prompt, kind).replace("\n", " \n").split(" ") if w]
            else:
                pieces = [f"t{i} " for i in range(body["max_tokens"])]
            tokens = [(behaviour.reasoning_field, f"r{i} ") for i in range(behaviour.reasoning_tokens)]
            tokens += [("content", piece) for piece in pieces]
            finish = "length" if len(tokens) >= body["max_tokens"] else "stop"
            tokens = tokens[:body["max_tokens"]]
            per_chunk = behaviour.tokens_per_chunk
            chunks = [tokens[i:i + per_chunk] for i in range(0, len(tokens), per_chunk)]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            first_at = start + behaviour.base_latency_s + (n_prompt - cached) / behaviour.prefill_tok_s
            for i, chunk in enumerate(chunks):
                delay = first_at + i * per_chunk / behaviour.decode_tok_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                delta = {}
                for key, text in chunk:
                    delta[key] = delta.get(key, "") + text
                choice = {"index": 0, "delta": delta}
                if i == len(chunks) - 1:
                    choice["finish_reason"] = finish
                self.event({"choices": [choice]})
            if body.get("stream_options", {}).get("include_usage") and behaviour.send_usage:
                usage = {"prompt_tokens": n_prompt, "completion_tokens": len(tokens)}
                if behaviour.prefix_cache:  # what vLLM adds with --enable-prompt-tokens-details
                    usage["prompt_tokens_details"] = {"cached_tokens": cached}
                self.event({"choices": [], "usage": usage})
            self.chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def event(self, payload):
            self.chunk(("data: " + json.dumps(payload) + "\n\n").encode())

        def chunk(self, data: bytes):
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
