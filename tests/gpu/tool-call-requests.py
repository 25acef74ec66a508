#!/usr/bin/env python3
"""tool-call-requests.py — the chat bodies vllm-single-gpu.sh sends to see real tool calls, one a line.

Dummy weights never write a call of their own, so the model's text is forced with vLLM's
structured outputs (`structured_outputs.regex`, vLLM 0.24's ChatCompletionRequest field; it is
allowed beside tool_choice "auto") to the exact markup the hermes parser reads. The parser is
untouched: it still has to find the call in the text, as with a real model.
- auto, streamed (usage asked for), then auto, not streamed: the parser's two paths;
- a named tool_choice, streamed: vLLM builds that call itself (with hermes and the default
  VLLM_ENFORCE_STRICT_TOOL_CALLING, a structural tag in hermes' markup); the city's length is
  capped so the dummy model's random string ends well within max_tokens.
Standard library only (the device's python3).
"""

import json

# what a Qwen2.5-style model writes for a call, and what tests/gpu/tiny-model.py's template shows it
FORCED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MESSAGES = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]


def tool(city_schema: dict) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": city_schema}, "required": ["city"], "additionalProperties": False}}}


def literal_regex(text: str) -> str:
    """`text` as a regex matching only itself (xgrammar's regex: braces escaped, the rest literal)."""
    return "".join("\\" + c if c in "\\^$.*+?()[]{}|" else c for c in text)


def bodies() -> list[dict]:
    forced = {"model": "tiny", "temperature": 0, "max_tokens": 128, "messages": MESSAGES,
              "tools": [tool({"type": "string"})], "tool_choice": "auto",
              "structured_outputs": {"regex": literal_regex(FORCED_CALL)}}
    named = {"model": "tiny", "temperature": 0, "max_tokens": 256, "messages": MESSAGES, "stream": True,
             "stream_options": {"include_usage": True}, "tools": [tool({"type": "string", "maxLength": 8})],
             "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    return [{**forced, "stream": True, "stream_options": {"include_usage": True}}, forced, named]


if __name__ == "__main__":
    for body in bodies():
        print(json.dumps(body))
