"""Bad input and a bad endpoint, in every tool that reaches the endpoint: one clear line and a
nonzero exit (issue 9), before any request where the input is at fault."""

import json
import os
import time

import pytest
from rich.console import Console

from ops import status
from ops_helpers import SMALL_FLAGS, dead_endpoint, run_ops, target_flags
from toolbox import one_clear_line


@pytest.mark.parametrize("tool, flags, words", [
    ("bench", ["--sweep", "1,x"], ["--sweep", "'x' is not a whole number"]),
    ("bench", ["--runs", "0"], ["--runs", "not above zero"]),
    ("bench", ["--sweep-repeats", "0"], ["--sweep-repeats", "not above zero"]),
    ("bench", ["-o", "/nonexistent-dir/r.json"], ["no such directory"]),
    ("bench", ["--deadline-min", "soon"], ["--deadline-min", "not a number"]),
    ("needle", ["--sizes", "12q"], ["--sizes", "'12q' is not a number of tokens"]),
    ("needle", ["--sizes", "2k,abc"], ["--sizes", "'abc'"]),
    ("needle", ["--sizes", "inf"], ["--sizes", "'inf'"]),
    ("needle", ["--sizes", "0"], ["--sizes", "not above zero"]),
    ("needle", ["--trials", "-1"], ["--trials"]),
    # issue 37: nan or inf turned the gate off (a 73 % decode drop passed)
    ("bench", ["--tolerance", "nan"], ["--tolerance", "nan is not a finite number above zero"]),
    ("bench", ["--tolerance", "inf"], ["--tolerance", "not a finite number above zero"]),
    ("bench", ["--tolerance", "-0.1"], ["--tolerance", "not a finite number above zero"]),
    ("bench", ["--tolerance", "0"], ["--tolerance", "not a finite number above zero"]),
])
def test_bad_flags_are_one_line_before_any_request(endpoint, capsys, tool, flags, words):
    behaviour, target = endpoint
    extra = SMALL_FLAGS if tool == "bench" else []
    code, err, _ = run_ops(capsys, tool, *target_flags(target), *extra, *flags)
    assert code == 2
    assert one_clear_line(err, *words).startswith((f"ops {tool}: ", f"python -m ops {tool}: "))
    assert behaviour.requests == []


@pytest.mark.parametrize("tool", ["bench", "needle"])
def test_a_dead_endpoint_or_a_refused_key_is_an_error(endpoint, capsys, tool):
    behaviour, target = endpoint
    code, err, _ = run_ops(capsys, tool, "--endpoint", dead_endpoint(), "--api-key", "k", "--model", target.model)
    assert code == 1
    one_clear_line(err, f"ops {tool}: cannot reach", "ConnectError")
    code, err, _ = run_ops(capsys, tool, "--endpoint", target.endpoint, "--api-key", "wrong", "--model", target.model)
    assert code == 1
    one_clear_line(err, f"ops {tool}: ", "refused the API key (HTTP 401)")
    behaviour.model = "another-model"
    code, err, _ = run_ops(capsys, tool, *target_flags(target))
    assert code == 1
    one_clear_line(err, "does not serve 'fake-model' (it serves another-model)")
    assert all(r.path == "/v1/chat/completions" and not r.authorized for r in behaviour.requests) or not behaviour.requests


def test_needle_counts_trials_without_an_answer_as_errors_not_model_failures(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.chat_error = (500, "engine dead")
    out = tmp_path / "needle.json"
    code, _, stdout = run_ops(capsys, "needle", *target_flags(target), "--sizes", "2k", "--trials", "2", "-o", str(out))
    assert code == 1
    row = json.loads(out.read_text())["sizes"][0]
    assert (row["errors"], row["real_failures"], row["passes"]) == (2, 0, 0)
    assert "ERROR: 2 of 2 trials got no answer to score" in stdout


GARBAGE_STREAMS = [
    (b"<html><body>502 Bad Gateway</body></html>\n", "not a server-sent event line"),
    (b"data: {not json\n\n", "malformed stream event"),
    (b'data: {"choices": "abc"}\n\n', "malformed stream event (choices: Input should be a valid array)"),
    (b"data: [1, 2]\n\n", "malformed stream event"),
    (b'data: {"choices": [{"delta": "x"}]}\n\n', "malformed stream event (choices[0].delta"),
    (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', "the stream ended before `data: [DONE]`"),
]


@pytest.mark.parametrize("garbage, message", GARBAGE_STREAMS)
def test_garbage_streams_are_request_errors_not_tracebacks(endpoint, tmp_path, capsys, garbage, message):
    behaviour, target = endpoint
    behaviour.raw_stream = garbage
    out = tmp_path / "r.json"
    assert run_ops(capsys, "bench", *target_flags(target), *SMALL_FLAGS, "-o", str(out))[0] == 1
    errors = json.loads(out.read_text())["errors"]
    assert len(errors) == 1 + 8 and all(message in e for e in errors)
    out = tmp_path / "n.json"
    assert run_ops(capsys, "needle", *target_flags(target), "--sizes", "2k", "--trials", "1", "-o", str(out))[0] == 1
    assert json.loads(out.read_text())["sizes"][0]["errors"] == 1


@pytest.mark.parametrize("body, message", [
    (b"<html>it works</html>", "not a model list"),
    (b'{"data": []}', "data: List should have at least 1 item"),
    (b'{"data": [{"name": "m"}]}', "data[0].id: Field required"),
    (b"[1, 2]", "not a model list"),
])
def test_status_judges_what_v1_models_says(endpoint, capsys, body, message):
    behaviour, target = endpoint
    behaviour.raw_models = body
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key, target.model), "nodes": []}
    assert [p for p in status.problems(report, 9000, 200000) if message in p and "/v1/models" in p]
    code, err, _ = run_ops(capsys, "bench", *target_flags(target))  # bench and needle check it before any request
    assert code == 1 and message in one_clear_line(err)


def test_status_flags_a_model_other_than_the_stacks(endpoint):
    behaviour, target = endpoint
    behaviour.model = "something-else"
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key, "fake-model"), "nodes": []}
    assert status.problems(report, 9000, 200000) == [
        f"endpoint {target.base_url}: serves something-else, not the stack's model fake-model"]


def test_status_prints_what_servers_say_literally(endpoint, capsys):
    behaviour, target = endpoint
    behaviour.raw_models = b"[/oops] [bold]"  # rich would read it as markup and raise
    console = Console(record=True, width=300, file=open(os.devnull, "w"))
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key), "nodes": [
        {"node": "spark1", "error": "ssh nvidia@h1 failed: [/x] closed"}]}
    status.render(report, status.problems(report, 9000, 200000), console)
    text = console.export_text()
    assert "[/x] closed" in text and "[/oops] [bold]" in text


@pytest.mark.parametrize("nodes, words", [
    ("not json", ["--nodes: not JSON"]),
    ('{"name": "spark1"}', ["--nodes: the top level: Input should be a valid array"]),
    ("[1]", ["--nodes: [0]: Input should be an object"]),
    ('[{"name": "spark1"}]', ["--nodes: [0].role: Field required"]),
    ('[{"name": "a", "role": "boss", "host": "h", "rayIp": "10.0.0.1", "rails": []}]', ["--nodes: [0].role: "]),
    ('[{"name": "a", "role": "worker", "host": "h", "rayIp": "10.0.0.1", "rails": [{"iface": "x"}]}]',
     ["--nodes: [0].rails[0].hca: Field required"]),
    ('[{"name": "a", "role": "worker", "host": "h", "rayIp": "10.0.0.1", "rails": []}]', ["exactly one with role head"]),
    ('[{"name": "a", "role": "head", "host": "h", "rayIp": "10.0.0.1", "rails": [], "hostKey": "ssh-ed25519 AAAA!"}]',
     ["--nodes: [0].hostKey: ", "not a base64 SSH public key"]),
    ('[{"name": "a", "role": "head", "host": "h", "rayIp": "10.0.0.1", "rails": []}]', ["a: no hostKey", "pulumi up"]),
])
def test_bad_nodes_are_one_line(endpoint, capsys, nodes, words):
    behaviour, target = endpoint
    code, err, _ = run_ops(capsys, "status", *target_flags(target), "--nodes", nodes, "--ssh-user", "u",
                        "--expect-mtu", "9000", "--expect-speed-mbps", "200000")
    assert code == 2
    one_clear_line(err, "ops status: ", *words)


@pytest.mark.parametrize("tool", ["status", "bench", "needle", "client-setup"])
@pytest.mark.parametrize("content, words", [
    (None, ["--outputs-file", "no such file"]),
    ("{oops", ["--outputs-file", "not JSON"]),
    ("[1, 2]", ["--outputs-file", "not `pulumi stack output --json --show-secrets`"]),
    ('{"endpoint": "http://h:8000/v1", "nodes": 5}', ["nodes: Input should be a valid list"]),
    ('{"endpoint": ["http://h"]}', ["endpoint: Input should be a valid string"]),
])
def test_bad_outputs_file_is_one_line(tmp_path, capsys, tool, content, words):
    outputs = tmp_path / "outputs.json"
    if content is not None:
        outputs.write_text(content)
    code, err, _ = run_ops(capsys, tool, "--outputs-file", str(outputs))
    assert code == 2
    one_clear_line(err, f"ops {tool}: ", *words)


@pytest.mark.parametrize("tool, flags", [
    ("bench", ["--max-tokens", "100000", "--deadline-min", "0.02"]),
    ("needle", ["--sizes", "1k,2k", "--trials", "1", "--max-tokens", "100000", "--deadline-min", "0.02"]),
])
def test_bench_and_needle_stop_at_their_overall_deadline(endpoint, capsys, tool, flags):
    behaviour, target = endpoint
    behaviour.decode_tok_s = 5.0  # a server that has all but stopped answering
    started = time.monotonic()
    code, err, _ = run_ops(capsys, tool, *target_flags(target), *flags)
    assert code == 1 and time.monotonic() - started < 10
    one_clear_line(err, f"ops {tool}: stopped at the overall deadline of 0.02 min (--deadline-min)")


def test_needle_keeps_the_sizes_done_at_the_deadline(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.decode_tok_s = 50000.0
    out = tmp_path / "n.json"
    calls = []

    def hangs_after_the_first_size(tokens):
        calls.append(tokens)
        if len(calls) > 1:
            time.sleep(5)  # past the deadline; the client has given up by then
        return [f"t{i} " for i in range(tokens)]

    behaviour.engine = hangs_after_the_first_size
    code, err, _ = run_ops(capsys, "needle", *target_flags(target), "--sizes", "1k,2k", "--trials", "1",
                        "--deadline-min", "0.03", "-o", str(out))
    assert code == 1
    one_clear_line(err, "overall deadline", "1 of 2 sizes were done and are written to")
    result = json.loads(out.read_text())
    assert result["complete"] is False and [row["size"] for row in result["sizes"]] == [1000]


@pytest.mark.parametrize("args, words", [
    (["upgrade", "--tolerance", "nan"], ["--tolerance", "nan is not a finite number above zero"]),
    (["upgrade", "--tolerance", "inf"], ["--tolerance", "not a finite number above zero"]),
    (["pin-host-keys", "--port", "0"], ["--port", "0 is not above zero"]),
    (["pin-host-keys", "--port", "70000"], ["--port", "70000 is not a port"]),
    (["pin-host-keys", "--timeout", "-1"], ["--timeout", "-1 is not above zero"]),
    (["status", "--expect-mtu", "0"], ["--expect-mtu", "0 is not above zero"]),
])
def test_numbers_out_of_range_are_one_line_before_anything_runs(capsys, args, words):
    """Issue 37: these reached the gate, ssh-keyscan and the fabric check unchecked."""
    code, err, _ = run_ops(capsys, *args)
    assert code == 2
    one_clear_line(err, *words)


def test_needle_sizes_beyond_the_served_context_are_refused_before_any_trial(endpoint, capsys):
    """Issue 37: `--sizes 5m` built a 5M-token prompt (minutes of CPU, past the deadline) for a model
    that serves 4,096 tokens."""
    behaviour, target = endpoint
    code, err, _ = run_ops(capsys, "needle", *target_flags(target), "--sizes", "2k,5m", "--trials", "1")
    assert code == 2
    one_clear_line(err, "sizes 5,000,000 tokens: beyond the context", f"({behaviour.max_model_len:,} tokens")
    assert [r for r in behaviour.requests if r.path == "/v1/chat/completions"] == []

