"""The stand-in (tests/openai_standin.py) answers as real vLLM 0.24.0 did on an H200
(tests/vllm_recording.py reads that recording): /metrics family for family, the JSON shapes
of /v1/models, /v1/responses and a streamed chat completion, tool calls through the hermes
parser (streamed and not, tool_choice auto and named: the second run), the refused connection
while loading and the wind-down after an engine death. Values may differ; names, types, labels,
keys, chunk order and finish reasons may not."""

import http.client
import json
import re
import socket
import time

import pytest

from openai_standin import DEAD_EXIT_S, DEAD_SERVING_503_S, Behaviour, engine_died, serve
from vllm_recording import (
    RECORDING,
    chunk_kind,
    chunk_sequence,
    families,
    recorded_exchanges,
    recorded_metrics,
    recorded_tool_calls,
    shape,
    shape_differences,
    stream_events,
    streamed_call,
)

RECORDED = recorded_exchanges()
TOOL_CALLS = recorded_tool_calls()
TOOL_CALL_ID = re.compile(r"chatcmpl-tool-[0-9a-f]{16}")
MODEL = RECORDED["/v1/responses"].request["model"]  # the requests name the recorded model: "tiny"


def call(port, method, path, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, json.dumps(body) if body is not None else None,
                       {"Content-Type": "application/json"} if body is not None else {})
    reply = connection.getresponse()
    answer = reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read().decode()
    connection.close()
    return answer


@pytest.fixture
def standin():
    """The stand-in as the simulator starts it (no key in front: the recording went through a
    gateway stand-in that checks none), after the recorded calls, in the recorded order."""
    behaviour = Behaviour(api_key=None, model=MODEL, decode_tok_s=float("inf"))
    server = serve(behaviour)
    port = server.server_address[1]
    answers = {}
    for path, exchange in RECORDED.items():
        answers[path] = call(port, "POST" if exchange.request else "GET", path, exchange.request or None)
    yield port, answers
    server.shutdown()


def test_the_recording_parses_into_the_families_and_calls_it_holds():
    recorded = families(recorded_metrics())
    assert len(recorded) >= 80 and recorded["vllm:request_success"].labels == {"engine", "finished_reason",
                                                                             "model_name"}
    assert [e.status for e in RECORDED.values()] == [200, 200, 200, 200]


def test_metrics_have_every_recorded_family_with_its_type_help_labels_and_buckets(standin):
    port, _ = standin
    status, headers, text = call(port, "GET", "/metrics")
    assert status == 200
    recorded, served = families(recorded_metrics()), families(text)
    missing = sorted(recorded.keys() - served.keys())
    extra = sorted(served.keys() - recorded.keys())
    different = {name: (recorded[name], served[name]) for name in recorded.keys() & served.keys()
                 if recorded[name] != served[name]}
    assert (missing, extra, different) == ([], [], {})
    assert "# TYPE vllm:generation_tokens_total counter" in text.splitlines()


def test_metrics_count_the_served_traffic(standin):
    """Values may differ from the recording's, but they move as vLLM's do."""
    port, _ = standin
    engine = f'engine="0",model_name="{MODEL}"'

    def values() -> dict[str, float]:
        text = call(port, "GET", "/metrics")[2]
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    # a request is counted once its handler is done, a moment after the client read its last
    # byte (vLLM's stats are as late: its logger records each engine step): wait for both
    deadline = time.monotonic() + 5
    while (value := values()).get(f"vllm:time_to_first_token_seconds_count{{{engine}}}", 0) < 2 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    # the responses call ("What is 2 + 3?": one token, "5") stopped; the stream ran to its max_tokens
    assert value[f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="{MODEL}"}}'] == 1
    assert value[f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}}'] == 1
    assert value[f"vllm:generation_tokens_total{{{engine}}}"] == 1 + RECORDED["/v1/chat/completions"].request["max_tokens"]
    assert value[f"vllm:time_to_first_token_seconds_count{{{engine}}}"] == 2
    assert value['http_requests_total{handler="/v1/models",method="GET",status="2xx"}'] == 1
    assert value[f'vllm:tool_call_parser_invocations_total{{mode="streaming",model_name="{MODEL}",'
                 'outcome="no_tool_call",request_type="chat_completions"}'] == 32  # once per delta, as recorded


@pytest.mark.parametrize("path", ["/v1/models", "/v1/responses"])
def test_json_answers_have_the_recorded_shape(standin, path):
    _, answers = standin
    status, headers, body = answers[path]
    recorded = RECORDED[path]
    assert status == recorded.status
    assert headers["content-type"] == recorded.headers["content-type"]
    assert shape_differences(shape(json.loads(recorded.body)), shape(json.loads(body))) == []


def test_health_answers_as_recorded(standin):
    _, answers = standin
    status, headers, body = answers["/health"]
    recorded = RECORDED["/health"]
    assert (status, body, "content-type" in headers) == (recorded.status, recorded.body, "content-type" in recorded.headers)


def test_a_streamed_chat_completion_has_the_recorded_chunk_sequence(standin):
    """Role-only chunk first, then content deltas, a last chunk naming finish and stop reasons,
    then [DONE] — the same request as recorded (tools, tool_choice auto, no call made)."""
    _, answers = standin
    status, headers, body = answers["/v1/chat/completions"]
    recorded = RECORDED["/v1/chat/completions"]
    assert (status, headers["content-type"]) == (recorded.status, recorded.headers["content-type"])
    want, got = stream_events(recorded.body), stream_events(body)
    assert got[-1] == want[-1] == "[DONE]"
    assert want[0]["choices"][0]["delta"] == got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for name, (a, b) in {"first": (want[0], got[0]), "middle": (want[1], got[1]), "last": (want[-2], got[-2])}.items():
        assert shape_differences(shape(a), shape(b)) == [], name
    assert len({e["id"] for e in got[:-1]}) == 1 and re.fullmatch(r"chatcmpl-[0-9a-f]{16}", got[0]["id"])


def test_the_second_recording_holds_tool_calls_made_by_the_parser():
    """The forced text came back as calls, not text: the parser found them (auto), and vLLM's
    own named path made one; "tool_calls" ends an auto call, "stop" a named one."""
    finish = {kind: (stream_events(e.body)[-3] if kind.endswith("stream") else json.loads(e.body))["choices"][0]["finish_reason"]
              for kind, e in TOOL_CALLS.items()}
    assert finish == {"auto-stream": "tool_calls", "auto": "tool_calls", "named-stream": "stop"}
    assert streamed_call(stream_events(TOOL_CALLS["auto-stream"].body)) == ("get_weather", '{"city": "Paris"}')
    message = json.loads(TOOL_CALLS["auto"].body)["choices"][0]["message"]
    assert message["content"] is None and [c["function"] for c in message["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    name, arguments = streamed_call(stream_events(TOOL_CALLS["named-stream"].body))
    assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)


@pytest.fixture(scope="module")
def standin_tool_calls():
    """The stand-in's answers to the second run's tool-call requests, sent as recorded."""
    server = serve(Behaviour(api_key=None, model=MODEL, decode_tok_s=float("inf")))
    port = server.server_address[1]
    yield {kind: call(port, "POST", "/v1/chat/completions", e.request) for kind, e in TOOL_CALLS.items()}
    server.shutdown()


@pytest.mark.parametrize("kind", ["auto-stream", "named-stream"])
def test_a_streamed_tool_call_has_the_recorded_chunks(standin_tool_calls, kind):
    """Role chunk, the name (with the call's id) alone, the arguments in pieces, a finish chunk
    with an empty delta, the usage chunk (asked for) carrying the fingerprint, [DONE]: each kind
    of chunk in the recorded shape, and the call put together as a client does."""
    status, headers, body = standin_tool_calls[kind]
    want, got = stream_events(TOOL_CALLS[kind].body), stream_events(body)
    assert (status, headers["content-type"]) == (200, TOOL_CALLS[kind].headers["content-type"])
    assert chunk_sequence(got) == chunk_sequence(want)
    for recorded in want[:-1]:  # the first chunk of each kind, shape for shape
        served = next(e for e in got if chunk_kind(e) == chunk_kind(recorded))
        assert shape_differences(shape(recorded), shape(served)) == [], chunk_kind(recorded)
    assert [chunk_kind(e) for e in got if e != "[DONE]" and "system_fingerprint" in e] == ["usage"]
    assert got[-3]["choices"][0]["finish_reason"] == want[-3]["choices"][0]["finish_reason"]
    ids = [c["id"] for e in got[:-1] for ch in e["choices"] for c in ch["delta"].get("tool_calls") or [] if "id" in c]
    assert len(ids) == 1 and TOOL_CALL_ID.fullmatch(ids[0])
    name, arguments = streamed_call(got)
    assert name == "get_weather" and isinstance(json.loads(arguments)["city"], str)
    assert len([e for e in got if chunk_kind(e) == "tool_arguments"]) > 1  # in pieces, as recorded


def test_a_tool_call_not_streamed_has_the_recorded_shape(standin_tool_calls):
    status, headers, body = standin_tool_calls["auto"]
    recorded, served = json.loads(TOOL_CALLS["auto"].body), json.loads(body)
    assert (status, headers["content-type"]) == (200, TOOL_CALLS["auto"].headers["content-type"])
    assert shape_differences(shape(recorded), shape(served)) == []
    choice = served["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and TOOL_CALL_ID.fullmatch(choice["message"]["tool_calls"][0]["id"])
    assert choice["message"]["tool_calls"][0]["function"] == recorded["choices"][0]["message"]["tool_calls"][0]["function"]


def test_a_loading_server_refuses_the_connection_as_vllm_does():
    """vllm.log: polled every second from the start, vLLM logged no request before its
    "Application startup complete" (it binds the socket last); the stand-in refuses too."""
    log = (RECORDING / "vllm.log").read_text().splitlines()
    ready = next(i for i, line in enumerate(log) if "Application startup complete" in line)
    assert not any('"GET /health' in line for line in log[:ready])
    assert any('"GET /health HTTP/1.1" 200' in line for line in log[ready:ready + 3])
    behaviour = Behaviour(load_s=1.5)
    server = serve(behaviour)
    port = server.server_address[1]
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        time.sleep(2.0)
        assert call(port, "GET", "/health")[0] == 200
        assert behaviour.health_calls == 1
    finally:
        server.shutdown()


def test_after_an_engine_death_health_is_503_then_refused_then_the_server_exits_0():
    """kill.txt: the EngineCore killed, /health 200 -> 503 for 3 s -> refused, exit 0 after 5 s."""
    lines = (RECORDING / "kill.txt").read_text().splitlines()
    seconds = [(int(m[1]), m[2]) for m in (re.match(r"(\d+) s health (\d+)$", line) for line in lines) if m]
    assert [code for _, code in seconds] == ["200", "503", "503", "503", "000"]
    assert "engine exit 0 after 5 s" in lines
    behaviour, exits = Behaviour(), []
    server = serve(behaviour)
    port = server.server_address[1]
    time.sleep(0.1)
    died = time.monotonic()
    engine_died(server, behaviour, exit=exits.append)
    assert call(port, "GET", "/health")[0] == 503
    # Polled, not slept: the server's shutdown waits for its serve loop's next poll, late on a busy box.
    refused_after = None
    while refused_after is None and not exits and time.monotonic() - died < DEAD_EXIT_S + 30:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        except ConnectionRefusedError:
            refused_after = time.monotonic() - died
        except ConnectionResetError:  # taken into the closing listener's backlog, then dropped: still winding down
            pass
        time.sleep(0.1)
    assert refused_after is not None and refused_after >= DEAD_SERVING_503_S and not exits
    while not exits and time.monotonic() - died < DEAD_EXIT_S + 30:
        time.sleep(0.1)
    assert exits == [0] and time.monotonic() - died >= DEAD_EXIT_S
