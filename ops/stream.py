"""One streamed chat completion against an OpenAI-compatible endpoint, timed per token."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Optional

import httpx
from pydantic import ValidationError

from .api import ChatChunk, first_problem

# Where a request's token count came from: the server's `usage`, or counting stream chunks
# (an undercount when one chunk carries several tokens, as under speculative decoding).
USAGE_FROM_SERVER = "server"
USAGE_FROM_CHUNKS = "chunks"


@dataclass
class StreamResult:
    sent: float
    first_token: Optional[float]
    done: float
    output_tokens: int
    prompt_tokens: Optional[int]
    text: str  # the answer (`content`) only
    error: Optional[str] = None
    usage_source: str = USAGE_FROM_SERVER
    finish_reason: Optional[str] = None  # "length" when max_tokens cut the reply
    reasoning_text: str = ""
    cached_prompt_tokens: Optional[int] = None  # prefix-cache hits, when the server reports them

    @property
    def ttft_s(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def decode_s(self) -> Optional[float]:
        return None if self.first_token is None else self.done - self.first_token

    @property
    def tpot_s(self) -> Optional[float]:
        """Time per output token after the first (the decode rate a user feels)."""
        decode_s = self.decode_s  # None without a first token
        if decode_s is None or self.output_tokens < 2:
            return None
        return decode_s / (self.output_tokens - 1)

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
        # vLLM then ends the stream with a chunk carrying `usage`: the only exact token count
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    sent, first, chunks, usage, finish = clock(), None, 0, None, None
    content: list[str] = []
    reasoning: list[str] = []

    def partial(error: str) -> StreamResult:
        return StreamResult(sent, first, clock(), chunks, None, "".join(content), error,
                            USAGE_FROM_CHUNKS, finish, "".join(reasoning))

    try:
        async with http.stream("POST", endpoint.rstrip("/") + "/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                detail = (await resp.aread()).decode(errors="replace")[:300]
                return partial(f"HTTP {resp.status_code}: {detail}")
            done = False
            async for line in resp.aiter_lines():
                if not line or line.startswith(":"):  # event separators and SSE comments (keep-alives)
                    continue
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name in ("event", "id", "retry"):
                    continue
                if name != "data":
                    return partial(f"not a server-sent event line: {line[:200]!r}")
                if value == "[DONE]":
                    done = True
                    break
                try:
                    event = ChatChunk.model_validate_json(value)
                except ValidationError as err:
                    return partial(f"malformed stream event ({first_problem(err)}): {value[:200]}")
                if event.error:  # vLLM reports a failure mid-stream as an event
                    return partial(f"server error in stream: {json.dumps(event.error)[:300]}")
                usage = event.usage or usage
                for choice in event.choices or []:
                    thought = choice.delta.reasoning_content or choice.delta.reasoning or ""
                    answer = choice.delta.content or ""
                    if thought or answer:
                        first = first if first is not None else clock()
                        chunks += 1
                        reasoning.append(thought)
                        content.append(answer)
                    finish = choice.finish_reason or finish
            if not done:
                return partial("the stream ended before `data: [DONE]`")
    except httpx.HTTPError as err:
        return partial(f"{type(err).__name__}: {err}")
    done_at = clock()
    if usage and usage.completion_tokens is not None:
        tokens, source = usage.completion_tokens, USAGE_FROM_SERVER
    else:
        tokens, source = chunks, USAGE_FROM_CHUNKS
    cached = usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else None
    return StreamResult(sent, first, done_at, tokens, usage.prompt_tokens if usage else None, "".join(content), None,
                        source, finish, "".join(reasoning), cached)
