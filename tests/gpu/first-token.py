#!/usr/bin/env python3
"""first-token.py URL MODEL — one streamed completion; prints the time to the first token and to the end.

POST URL/v1/completions {"prompt": "What is 2 + 3?", "max_tokens": 8, "stream": true,
"temperature": 0, "ignore_eos": true}; the first token is the first SSE data line whose choice
carries text. Prints one JSON line: ttft_s, total_s, chunks, text (random weights: noise).
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from urllib.parse import urlparse


def main() -> None:
    url, model = urlparse(sys.argv[1]), sys.argv[2]
    body = json.dumps({"model": model, "prompt": "What is 2 + 3?", "max_tokens": 8, "stream": True,
                       "temperature": 0, "ignore_eos": True})
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    started = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    chunks, text = 0, ""
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        piece = json.loads(line[5:])["choices"][0].get("text") or ""
        chunks += 1
        if first is None and piece:
            first = time.monotonic() - started
        text += piece
    total = time.monotonic() - started
    print(json.dumps({"status": resp.status, "ttft_s": round(first, 3) if first is not None else None,
                      "total_s": round(total, 3), "chunks": chunks, "text": text}))


if __name__ == "__main__":
    main()
