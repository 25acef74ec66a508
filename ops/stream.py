"""One streamed chat completion against an OpenAI-compatible endpoint, timed per token."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Optional

import httpx


@dataclass
class StreamResult:
    sent: float
    first_token: Optional[float]
    done: float
    output_tokens: int
    prompt_tokens: Optional[int]
    text: str
    error: Optional[str] = None

    @property
    def ttft_s(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def decode_s(self) -> Optional[float]:
        return None if self.first_token is None else self.done - self.first_token

    @property
    def tpot_s(self) -> Optional[float]:
        """Time per output token after the first (the decode rate a user feels)."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return self.decode_s / (self.output_tokens - 1)

    @property
    def decode_tok_s(self) -> Optional[float]:
        tpot = self.tpot_s
        return None if not tpot else 1.0 / tpot


def client(api_key: str, timeout: float = 600.0) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0),
                             limits=httpx.Limits(max_connections=64))


async def stream_chat(
    http: httpx.AsyncClient,
    endpoint: str,
    model: str,
    messages: list[dict],
    max_tokens: int,
    temperature: float,
    clock: Callable[[], float] = time.perf_counter,
    extra: Optional[dict] = None,
) -> StreamResult:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    sent, first, chunks, usage, parts = clock(), None, 0, None, []
    try:
        async with http.stream("POST", endpoint.rstrip("/") + "/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode(errors="replace")[:300]
                return StreamResult(sent, None, clock(), 0, None, "", f"HTTP {resp.status_code}: {detail}")
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                    if piece:
                        first = first if first is not None else clock()
                        chunks += 1
                        parts.append(delta.get("content") or "")
    except httpx.HTTPError as err:
        return StreamResult(sent, first, clock(), chunks, None, "".join(parts), f"{type(err).__name__}: {err}")
    done = clock()
    tokens = (usage or {}).get("completion_tokens") or chunks
    return StreamResult(sent, first, done, tokens, (usage or {}).get("prompt_tokens"), "".join(parts))
