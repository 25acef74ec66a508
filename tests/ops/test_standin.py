"""The stand-in endpoint the day-2 tools' tests run against streams as vLLM does."""

import json


def test_standin_streams_vllms_chunk_format(endpoint):
    """Every event is a whole chat.completion.chunk (one id for the stream), so any OpenAI client can read it;
    the first carries the role alone, as vLLM's does (tests/test_standin_matches_vllm.py holds the rest)."""
    import httpx

    behaviour, target = endpoint
    behaviour.decode_tok_s = 5000.0
    body = {"model": target.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    resp = httpx.post(target.endpoint + "/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {target.api_key}"})
    lines = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    assert len(events) == 5 and len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == "fake-model" and isinstance(e["created"], int)
               for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["finish_reason"] for e in events[:4]] == [None, None, None, "length"]
    assert events[4]["choices"] == [] and events[4]["usage"]["completion_tokens"] == 3
