"""launch/lane-router.py (issue 41, part 2): the real router, as its own process, in front of two
OpenAI stand-ins on unix sockets (each a lane's engine): a request reaches the lane serving the
model it names, an unknown model gets vLLM's own 404, /v1/models lists both, a stream comes back
as it is made and a client that leaves aborts it, and one lane's drain leaves the other serving."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import threading

import pytest
from openai_standin import Behaviour, make_server
from toolbox import HANG_GUARD_S, LAUNCH_DIR, wait_for

from core import contract

ROUTER = LAUNCH_DIR / contract.LANE_ROUTER_SCRIPT

LANES = {"coder": "qwen3-coder", "fast": "gpt-oss-20b"}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30):
        super().__init__("lane-router", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def call(router, method, path, body=None):
    conn = UnixConnection(router["socket"])
    payload = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=payload, headers={"Content-Type": "application/json"} if payload else {})
    reply = conn.getresponse()
    return reply.status, dict(reply.getheaders()), reply.read()


@contextlib.contextmanager
def router_before(servers, listen, *lanes: str):
    """The router on `listen` (its --lane and other flags: `lanes`) in front of `servers`, each serving on a thread."""
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    proc = subprocess.Popen([sys.executable, str(ROUTER), "--listen", str(listen), *lanes],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(listen.exists, "the router listening", HANG_GUARD_S)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=HANG_GUARD_S)
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def router(tmp_path):
    behaviours = {lane: Behaviour(api_key=None, model=model, decode_tok_s=200.0) for lane, model in LANES.items()}
    servers = [make_server(behaviours[lane], uds=str(tmp_path / f"{lane}.sock")) for lane in LANES]
    drain = tmp_path / "drain"
    drain.mkdir()
    listen = tmp_path / "router.sock"
    with router_before(servers, listen, *(a for lane in LANES for a in ("--lane", f"{lane}={tmp_path / lane}.sock")),
                       "--drain-dir", str(drain)) as proc:
        yield {"socket": str(listen), "drain": drain, "behaviours": behaviours, "proc": proc}

def chat(model=None, stream=False, max_tokens=8):
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": max_tokens,
            "stream": stream}
    return {**body, "model": model} if model else body


def test_each_model_is_answered_by_its_own_lanes_engine(router):
    for lane, model in LANES.items():
        status, _, body = call(router, "POST", "/v1/chat/completions", chat(model))
        assert status == 200, body
        assert json.loads(body)["model"] == model
        assert [r.body["model"] for r in router["behaviours"][lane].requests] == [model], lane
    # no model named: the first lane's, as vLLM serves its first name
    status, _, _ = call(router, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "model": "qwen3-coder"})
    assert status == 200
    status, _, body = call(router, "POST", "/v1/chat/completions", chat())
    assert len(router["behaviours"]["coder"].requests) == 3 and len(router["behaviours"]["fast"].requests) == 1


def test_an_unknown_model_gets_vllms_own_404_and_the_list_names_every_lanes_models(router):
    status, _, body = call(router, "POST", "/v1/chat/completions", chat("no-such-model"))
    assert (status, json.loads(body)) == (404, {"error": {"message": "The model `no-such-model` does not exist.",
                                                          "type": "NotFoundError", "param": None, "code": 404}})
    status, _, body = call(router, "POST", "/v1/messages?beta=true",
                           {"model": "no-such-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert (status, json.loads(body)["error"]["type"]) == (404, "not_found_error")
    assert not any(b.requests for b in router["behaviours"].values()), "nothing reached an engine"
    status, _, body = call(router, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == list(LANES.values())


def test_a_stream_comes_back_as_it_is_made_and_a_client_that_leaves_aborts_it(router):
    conn = UnixConnection(router["socket"])
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat("gpt-oss-20b", stream=True, max_tokens=4000)),
                 headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    first = reply.readline()
    assert reply.status == 200 and first.startswith(b"data: "), first
    # 4000 tokens at 200 tok/s take 20 s: the first chunk came before the last was made (the engine's
    # count, not a clock: a router that buffers hands nothing over before all 4000 are)
    fast = router["behaviours"]["fast"]
    assert fast.stats.generated < 4000, fast.stats.generated
    reply.close()  # the client leaves mid-stream
    conn.close()
    wait_for(lambda: fast.stats.finished["abort"] == 1, "the lane's engine told the client left", HANG_GUARD_S)


def test_a_draining_lane_answers_503_and_the_other_serves_on(router):
    (router["drain"] / "coder").touch()
    status, headers, body = call(router, "POST", "/v1/chat/completions", chat("qwen3-coder"))
    assert status == 503 and headers["Retry-After"] == "60" and "draining" in json.loads(body)["error"]["message"]
    status, _, _ = call(router, "POST", "/v1/chat/completions", chat("gpt-oss-20b"))
    assert status == 200
    (router["drain"] / "coder").unlink()
    assert call(router, "POST", "/v1/chat/completions", chat("qwen3-coder"))[0] == 200


def test_a_lane_swapped_to_another_model_is_found_without_a_restart(router):
    router["behaviours"]["fast"].model = "gpt-oss-120b"  # the lane's engine now serves another model
    status, _, body = call(router, "POST", "/v1/chat/completions", chat("gpt-oss-120b"))
    assert status == 200 and json.loads(body)["model"] == "gpt-oss-120b"
    assert call(router, "POST", "/v1/chat/completions", chat("gpt-oss-20b"))[0] == 404


def test_a_lane_on_another_node_is_reached_through_its_gateway_with_the_requests_own_key(tmp_path):
    """A lane's engine on another node sits behind that node's gateway, which checks the key again: the
    router keeps no key, it passes the request's on, and learns that lane's models with it."""
    local = Behaviour(api_key=None, model="qwen3-coder", decode_tok_s=200.0)
    remote = Behaviour(api_key="sk-lane", model="gpt-oss-20b", decode_tok_s=200.0)
    servers = [make_server(local, uds=str(tmp_path / "coder.sock")), make_server(remote, "127.0.0.1", 0)]
    listen = tmp_path / "router.sock"
    with router_before(servers, listen, "--lane", f"coder={tmp_path / 'coder.sock'}",
                       "--lane", f"fast=127.0.0.1:{servers[1].server_address[1]}"):

        def ask(model, key):
            conn = UnixConnection(str(listen))
            headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
            conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(model)), headers=headers)
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read())

        # without a key the remote lane's models are not known: the name is unknown to the router
        assert ask("gpt-oss-20b", None)[0] == 404 and not remote.requests
        status, body = ask("gpt-oss-20b", "sk-lane")
        assert (status, body["model"]) == (200, "gpt-oss-20b")
        assert ask("gpt-oss-20b", "sk-wrong")[0] == 401  # the lane's gateway refused it, not the router
        assert ask("qwen3-coder", None)[0] == 200 and len(local.requests) == 1
        conn = UnixConnection(str(listen))
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer sk-lane"})
        assert [m["id"] for m in json.loads(conn.getresponse().read())["data"]] == ["qwen3-coder", "gpt-oss-20b"]


@pytest.mark.parametrize("argv, says", [
    (["--lane", "coder"], "--lane expects NAME=/absolute/socket/path or NAME=HOST:PORT, got 'coder'"),
    (["--lane", "coder=10.0.0.2"], "got 'coder=10.0.0.2'"),
    (["--lane", "coder=10.0.0.2:70000"], "got 'coder=10.0.0.2:70000'"),
    (["--lane", "a=/x.sock", "--lane", "a=/y.sock"], "--lane names must differ, got a, a"),
])
def test_bad_lanes_are_refused_by_name(tmp_path, argv, says):
    proc = subprocess.run([sys.executable, str(ROUTER), "--listen", str(tmp_path / "r.sock"),
                           *argv], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
