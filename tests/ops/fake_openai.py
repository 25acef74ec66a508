"""A local OpenAI-compatible stand-in with known timing and known answers, for the ops tools.

Prompt tokens are len(text) // 4. A streamed reply waits base_latency + prompt/prefill_tok_s
before its first token, then emits tokens at decode_tok_s, on a schedule kept against the
clock (no drift). Needle prompts are answered from the codes really planted in them,
bent by `needle_behaviors` (correct, wrong, missing, junk, refuse), one per request.
"""

from __future__ import annotations

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
            behaviour.requests.append(body)
            prompt = "".join(m.get("content", "") for m in body["messages"])
            n_prompt = prompt_tokens(body)
            if "access codes of the vaults" in prompt:
                kind = behaviour.needle_behaviors.pop(0) if behaviour.needle_behaviors else "correct"
                pieces = [w + " " for w in needle_answer(prompt, kind).replace("\n", " \n").split(" ") if w]
            else:
                pieces = [f"t{i} " for i in range(body["max_tokens"])]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            start = time.perf_counter()
            first_at = start + behaviour.base_latency_s + n_prompt / behaviour.prefill_tok_s
            for i, piece in enumerate(pieces):
                delay = first_at + i / behaviour.decode_tok_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                self.event({"choices": [{"index": 0, "delta": {"content": piece}}]})
            if body.get("stream_options", {}).get("include_usage"):
                self.event({"choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(pieces)}})
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
