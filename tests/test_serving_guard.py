"""The serving guard (launch/serving-guard.py) for real: its canary against the OpenAI stand-in,
its docker calls against a recording fake docker, its hold file and status as `ops` reads them.
The simulator runs the same guard as a systemd service on the head (tests/sim_engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import contract
from components import launch_bundle
from components.config import ServingGuard as GuardConfig
from components.serving_guard import ServingGuardArgs, guard_argv, render_guard_unit
from openai_standin import Behaviour, serve
from toolbox import load_launch, wait_for
from vllm_recording import recorded_exchanges, recorded_tool_calls

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
KEY = "sk-guard-test-0123456789abcdef"

FAKE_DOCKER = r'''#!/usr/bin/env python3
"""docker, as far as the guard uses it: one container, its state in $FAKE_DOCKER_STATE."""
import json, os, sys, time
path = os.environ["FAKE_DOCKER_STATE"]
state = json.load(open(path))
args = sys.argv[1:]
with open(path + ".calls", "a") as calls:
    calls.write(" ".join(args) + "\n")
if args[0] == "inspect":
    print(json.dumps([{"Id": state["id"], "RestartCount": state["restart_count"],
                       "State": {"Running": state["running"], "StartedAt": state["started_at"], "ExitCode": 1},
                       "HostConfig": {"RestartPolicy": {"Name": state["policy"]}}}]))
elif args[0] == "update":
    state["policy"] = args[1].split("=", 1)[1]
elif args[0] == "stop":
    state["running"] = False
elif args[0] in ("start", "restart"):  # StartedAt as docker writes it: RFC 3339, nanoseconds, UTC
    state["running"] = True
    state["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".%09dZ" % (time.time() % 1 * 1e9)
json.dump(state, open(path, "w"))
'''


class Node:
    """A head for the guard: a fake docker with one container, the stand-in as its API."""

    def __init__(self, tmp_path: Path, fault=None, **behaviour):
        self.tmp = tmp_path
        self.fault = fault
        self.behaviour = Behaviour(**{"api_key": KEY, "model": "canary-model", "decode_tok_s": float("inf"),
                                      "fault": lambda: self.fault, **behaviour})
        self.server = serve(self.behaviour)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "docker").write_text(FAKE_DOCKER)
        (bin_dir / "docker").chmod(0o755)
        self.state_path = tmp_path / "docker-state.json"
        self.set(id="c1", restart_count=0, running=True, started_at="t0", policy=contract.SERVING_RESTART_POLICY)
        (tmp_path / "secrets.env").write_text(launch_bundle.render_secrets_env(KEY))
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_STATE": str(self.state_path)}
        self.proc = None
        self.guard_script = LAUNCH / contract.SERVING_GUARD_SCRIPT  # where the guard runs from
        self.fabric_flags: list[str] = []  # tests/test_fabric_watch.py's rails, drain and plan

    def set(self, **changes):
        state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        self.state_path.write_text(json.dumps({**state, **changes}))

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def calls(self) -> list[str]:
        path = Path(f"{self.state_path}.calls")
        return [c for c in path.read_text().splitlines() if not c.startswith("inspect")] if path.exists() else []

    @property
    def status(self) -> dict:
        return json.loads((self.tmp / "guard" / "status.json").read_text())

    @property
    def hold_file(self) -> Path:
        return self.tmp / "serving-hold"

    @property
    def restarts_file(self) -> Path:
        return self.tmp / "state" / "restarts.json"

    @property
    def textfile(self) -> Path:
        return self.tmp / "textfile" / "twinspark-guard.prom"

    def rotate_key(self, key, gateway_too=True):
        (self.tmp / "secrets.env").write_text(launch_bundle.render_secrets_env(key))
        if gateway_too:
            self.behaviour.api_key = key

    def start(self, failures=2, restart_limit=3, interval=60, tool_parser="deepseek_v4"):
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        argv = [sys.executable, str(self.guard_script),
                "--endpoint", base, "--metrics-url", base + "/metrics",
                "--secrets-file", str(self.tmp / "secrets.env"), "--container", contract.SERVING_CONTAINER,
                "--restart-policy", contract.SERVING_RESTART_POLICY, "--status-file", str(self.tmp / "guard" / "status.json"),
                "--restarts-file", str(self.restarts_file), "--textfile", str(self.textfile),
                "--hold-file", str(self.hold_file), "--held-mark", str(self.tmp / "state" / "held-container"),
                "--nodes", "spark1 and spark2", "--vllm-log", "/var/log/twinspark/vllm.log",
                "--interval", str(interval), "--retry-interval", "1", "--deadline", "3",
                "--failures", str(failures), "--restart-limit", str(restart_limit), "--window", "1800",
                *(["--tool-parser", tool_parser] if tool_parser else []), *self.fabric_flags]
        self.log = open(self.tmp / "guard.log", "w")
        self.proc = subprocess.Popen(argv, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
        self.server.shutdown()

    def terminate_guard(self):
        """What systemd's stop does: SIGTERM."""
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc = None

    def guard_log(self) -> str:
        return (self.tmp / "guard.log").read_text()


def wait_on_guard(check, what, node, timeout=30):
    """A wait on the guard's files, which it writes while the test reads them (half a JSON, none
    yet): named with the guard's log."""
    return wait_for(check, what, timeout, ignoring=(OSError, ValueError, KeyError), why=node.guard_log)


@pytest.fixture
def head(tmp_path):
    node = Node(tmp_path)
    yield node
    node.stop()


def test_a_healthy_engine_passes_every_check_and_nothing_restarts(head):
    head.start()
    wait_on_guard(lambda: head.status["ok"] is True, "a passing canary round", head)
    status = head.status
    assert status["failures"] == [] and status["hold"] is None and status["restarts_in_window"] == 0
    assert head.calls() == []
    # every check went through with the key, the three kinds of request among them
    posted = [(r.path, bool(r.body.get("tools")), bool(r.body.get("stream"))) for r in head.behaviour.requests]
    assert {("/v1/chat/completions", False, False), ("/v1/chat/completions", True, True),
            ("/v1/completions", False, True)} <= set(posted)
    assert all(r.authorized for r in head.behaviour.requests)


@pytest.mark.parametrize("fault, reason", [
    ("garbage", "known answer"),  # wrong sum, and tool-call arguments that are not JSON
    ("hang", "stalled"),  # a wedged engine: /health 200, the stream stops after one chunk, no token since
    ("unparsed-tool-call", "the tool parser (deepseek_v4) did not recognise"),  # tool_choice auto: the call came as text
])
def test_a_bad_engine_is_restarted_after_repeated_failures_with_the_reason(head, fault, reason):
    head.fault = fault
    head.start(failures=2)
    wait_on_guard(lambda: any(c.startswith("restart ") for c in head.calls()), "the guard restarting serving", head,
             timeout=60)
    assert head.calls() == [f"restart {contract.SERVING_CONTAINER}"]
    log = head.guard_log()
    assert "canary failed (2/2)" in log and reason in log, log
    assert "not counted" not in log
    if fault == "garbage":
        assert "tool call: arguments are not JSON" in log
    head.fault = None  # the restarted engine is healthy
    wait_on_guard(lambda: head.status["ok"] is True, "the canary passing after the restart", head)
    assert head.status["restarts_in_window"] == 1
    assert "canary failed" in head.status["last_restart"]["reason"]
    assert KEY not in log


def test_a_restart_loop_is_held_and_cleared_by_removing_the_hold(head):
    head.start(restart_limit=3)
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    for count in (1, 2, 3):  # docker's own restarts: the engine keeps dying at start
        head.set(restart_count=count, started_at=f"t{count}")
        wait_on_guard(lambda count=count: head.status["restarts_in_window"] == count, f"restart {count} counted", head)
    # at the limit docker restarts no more; the attempt running now still has its chance
    wait_on_guard(lambda: head.state()["policy"] == "no", "the restart policy lowered", head)
    assert not head.hold_file.exists()
    head.set(running=False)  # ... and fails too
    wait_on_guard(lambda: head.hold_file.exists(), "the hold", head)
    hold = json.loads(head.hold_file.read_text())
    assert "restart loop: 3 serving restarts in 30 min (limit 3)" in hold["reason"]
    assert "reboot spark1 and spark2" in hold["reason"] and "python -m ops clear-hold" in hold["reason"]
    wait_on_guard(lambda: head.status["hold"] == hold, "the hold in the status", head)
    assert head.state()["running"] is False
    head.hold_file.unlink()  # what `ops clear-hold` does
    wait_on_guard(lambda: head.state()["running"] is True, "serving started again", head)
    assert head.state()["policy"] == contract.SERVING_RESTART_POLICY
    wait_on_guard(lambda: head.status["restarts_in_window"] == 0 and head.status["hold"] is None, "the count cleared", head)
    assert head.calls() == [f"update --restart=no {contract.SERVING_CONTAINER}",
                            f"update --restart={contract.SERVING_RESTART_POLICY} {contract.SERVING_CONTAINER}",
                            f"start {contract.SERVING_CONTAINER}"]


def test_a_new_container_is_a_fresh_start_not_a_restart(head):
    head.set(restart_count=5)  # the old container's count is history
    head.start(restart_limit=3)
    wait_on_guard(lambda: head.status["ok"] is True, "a passing round", head)
    head.set(id="c2", restart_count=0, started_at="t9")  # pulumi up replaced it
    wait_on_guard(lambda: head.status["serving_started_at"] == "t9", "the new container seen", head)
    assert head.status["restarts_in_window"] == 0 and head.calls() == []


def test_without_a_tool_parser_the_canary_makes_no_tool_call_and_a_healthy_engine_passes(head):
    """A recipe that names no canaryToolParser: its model answers tool calls as text (as a model
    served without --tool-call-parser does), which must not count as a failure round after round."""
    head.fault = "unparsed-tool-call"
    head.start(failures=1, tool_parser=None)
    wait_on_guard(lambda: head.status["ok"] is True, "a passing canary round", head)
    assert head.calls() == [] and not any(r.body.get("tools") for r in head.behaviour.requests)
    assert "(no tool parser: no tool call)" in head.guard_log()


def load_guard():
    return load_launch(contract.SERVING_GUARD_SCRIPT)


@pytest.mark.parametrize("recorded, verdict", [
    # the second GPU run: hermes turned the model's (forced) <tool_call> text into a streamed call
    (lambda: recorded_tool_calls()["auto-stream"], None),
    # the first: the dummy model wrote no call, hermes passed the text through
    (lambda: recorded_exchanges()["/v1/chat/completions"], "the tool parser (hermes) did not recognise"),
])
def test_the_tool_call_check_reads_real_vllm_streams(recorded, verdict):
    """The guard's own check against real vLLM 0.24's streams, replayed byte for byte: the name
    alone in the first tool delta (no `arguments` key), `content: null` beside each piece, the
    usage chunk with no choices — a real call passes, a real no-call fails as designed."""
    guard = load_guard()
    server = serve(Behaviour(api_key=KEY, model="tiny", raw_stream=recorded().body.encode() + b"\n\n"))
    try:
        api = guard.Api(f"http://127.0.0.1:{server.server_address[1]}", "", 30.0, key=KEY)
        if verdict is None:
            guard.streamed_tool_call(api, "tiny", "hermes")
        else:
            with pytest.raises(guard.CanaryFailure, match=re.escape(verdict)):
                guard.streamed_tool_call(api, "tiny", "hermes")
    finally:
        server.shutdown()


def test_the_unit_names_the_recipes_tool_parser_or_none():
    def argv(parser):
        return guard_argv(ServingGuardArgs("spark1", None, 8000, ["spark1", "spark2"], GuardConfig(), parser))

    assert argv("glm47")[-2:] == ["--tool-parser", "glm47"]
    assert "--tool-parser" not in argv(None)


def test_the_unit_runs_the_guard_with_no_secret_in_its_command_line():
    args = ServingGuardArgs("spark1", None, 8000, ["spark1", "spark2"], GuardConfig())
    unit = render_guard_unit(args)
    argv = guard_argv(args)
    assert argv[argv.index("--secrets-file") + 1] == "/opt/twinspark/secrets.env"
    assert "--interval 120" in " ".join(argv) and "--window 1800" in " ".join(argv)
    assert "Restart=always" in unit and "ExecStart=/usr/bin/python3 /usr/local/lib/twinspark/serving-guard.py" in unit
    # a changed script changes the unit, which the managed file's `service` action restarts
    assert "serving-guard.py and fabric_watch.py sha256 " in unit



def stream_for(port, seconds_of_tokens, tokens_per_s):
    """A long agent stream, read to its end in the background; its outcome lands in the list."""
    import threading
    import urllib.request

    outcome = []

    def run():
        body = json.dumps({"model": "canary-model", "prompt": "write a long story", "stream": True,
                           "max_tokens": int(seconds_of_tokens * tokens_per_s)}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Authorization": f"Bearer {KEY}"})
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                outcome.append("[DONE]" in reply.read().decode())
        except OSError as err:
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_saturated_engine_that_makes_progress_is_never_restarted(tmp_path):
    """Every decode slot held by long streams (max_num_seqs): the canary queues behind them and
    is late round after round, but tokens flow, so nothing is counted and every stream ends."""
    head = Node(tmp_path, max_running=2, decode_tok_s=20.0)
    try:
        port = head.server.server_address[1]
        streams = [stream_for(port, 18, 20.0) for _ in range(2)]
        wait_on_guard(lambda: head.behaviour.running == 2, "both slots taken", head)
        head.start(failures=1)  # one counted round would restart at once
        wait_on_guard(lambda: "not counted" in head.guard_log(), "a late round seen as busy", head, timeout=30)
        for thread, _ in streams:
            thread.join(timeout=60)
        assert [outcome for _, outcome in streams] == [[True], [True]], "every stream ran to its end"
        log = head.guard_log()
        assert "busy, not wedged" in log and "waiting" in log, log
        assert head.calls() == [], "a busy engine is never restarted"
        wait_on_guard(lambda: head.status["ok"] is True, "the canary passing once the streams ended", head, timeout=90)
    finally:
        head.stop()


def test_the_guard_follows_a_rotated_key_and_a_refusal_is_not_the_engines_fault(head):
    head.start(failures=1, interval=2)
    wait_on_guard(lambda: head.status["ok"] is True, "a passing round", head)
    # pulumi up wrote the new key; the gateway still has the old one for a moment
    head.rotate_key("sk-rotated-key-0123456789abcdefgh", gateway_too=False)
    wait_on_guard(lambda: head.status["ok"] is None and "refused the key" in head.status["note"], "a refusal noted", head)
    head.behaviour.api_key = "sk-rotated-key-0123456789abcdefgh"  # the new gateway is up
    wait_on_guard(lambda: head.status["ok"] is True, "the canary passing with the new key", head)
    assert head.calls() == [] and head.status["restarts_in_window"] == 0 and head.status["hold"] is None
    assert "sk-rotated-key" not in head.guard_log()


def test_a_reboot_counts_as_a_restart_so_a_panic_loop_is_held(head):
    """The count survives the reboot (on disk); the reboot itself is one more restart."""
    head.restarts_file.parent.mkdir(parents=True)
    now = time.time()
    head.restarts_file.write_text(json.dumps({"restarts": [{"at": now - 60, "reason": "the head rebooted"},
                                                           {"at": now - 30, "reason": "the head rebooted"}],
                                              "held": False, "total": 2}))
    head.start(restart_limit=3)  # no boot marker on the tmpfs: the head has just booted
    wait_on_guard(lambda: head.status["restarts_in_window"] == 3, "the reboot counted", head)
    wait_on_guard(lambda: head.state()["policy"] == "no", "the restart policy lowered at the limit", head)
    assert "serving restart (the head rebooted): 3 in the last 30 min" in head.guard_log()


def test_the_first_reboot_of_a_fresh_head_is_counted_too(head):
    """A head whose guard never restarted anything: its first boot leaves the count on disk, so
    the reboot after it (a panic) is one restart, and a panic loop from day one gets held."""
    head.start(restart_limit=3)
    wait_on_guard(lambda: head.status["ok"] is True, "the first round", head)
    head.terminate_guard()
    (head.tmp / "guard" / "booted").unlink()  # the reboot: the tmpfs beside the status is empty again
    head.start(restart_limit=3)
    wait_on_guard(lambda: head.status["restarts_in_window"] == 1, "the reboot counted", head)
    assert json.loads(head.restarts_file.read_text())["restarts"][0]["reason"] == "the head rebooted"


def test_a_stopped_guard_withdraws_its_series(head):
    """Stopped (disabled, removed, a role swap that made the head a worker), the guard's textfile
    must go: left, its last verdict would claim a canary nobody runs."""
    head.start()
    wait_on_guard(lambda: "twinspark_guard_canary_success 1" in head.textfile.read_text(), "the guard's series", head)
    head.terminate_guard()
    assert not head.textfile.exists()


def test_the_reboot_a_hold_asks_for_clears_the_count(head):
    head.restarts_file.parent.mkdir(parents=True)
    now = time.time()
    head.restarts_file.write_text(json.dumps({"restarts": [{"at": now - 60, "reason": "x"}] * 3, "held": True,
                                              "total": 3}))
    head.start(restart_limit=3)
    wait_on_guard(lambda: head.status["ok"] is True, "serving after the cure", head)
    assert head.status["restarts_in_window"] == 0 and head.calls() == []
    assert "rebooted after a hold" in head.guard_log()


def test_a_guard_stopped_while_holding_gives_serving_a_policy_docker_acts_on(head):
    head.start(restart_limit=1)
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    head.set(restart_count=1, started_at="t1")
    wait_on_guard(lambda: head.state()["policy"] == "no", "the restart policy lowered", head)
    head.set(running=False)
    wait_on_guard(lambda: head.hold_file.exists(), "the hold", head)
    head.terminate_guard()  # systemctl disable --now, or the head shutting down
    assert head.state()["policy"] == "always", "docker must start serving after the reboot the hold asks for"
    assert head.state()["running"] is False, "the hold itself stands until then"


def test_the_guard_writes_its_metrics_for_the_textfile_collector(head):
    from components.observability_files import GUARD_METRICS

    head.start()
    wait_on_guard(lambda: head.textfile.exists() and "canary_success 1" in head.textfile.read_text(), "the textfile", head)
    series = {line.split()[0]: float(line.split()[1]) for line in head.textfile.read_text().splitlines()
              if not line.startswith("#")}
    assert set(series) == set(GUARD_METRICS)
    assert series["twinspark_guard_hold"] == 0 and series["twinspark_guard_restarts_total"] == 0
    assert abs(series["twinspark_guard_canary_last_run_timestamp_seconds"] - time.time()) < 30
    assert oct(head.textfile.stat().st_mode & 0o777) == "0o644"


def test_a_retry_after_a_late_round_runs_at_once_and_rounds_are_spaced_from_their_starts(monkeypatch):
    """Issue 42 item 4: a late round has already waited its deadline; neither the retry's spacing
    nor the guard's tick is waited again after it (each cost a wedge's every round seconds)."""
    guard = load_guard()
    clock = [1000.0]
    monkeypatch.setattr(guard.time, "monotonic", lambda: clock[0])

    def late_round(*_):
        clock[0] += 6.0  # the deadline, waited
        return [guard.CanaryFailure("/v1/completions: stream stalled (nothing for 6 s)", guard.LATE)]

    monkeypatch.setattr(guard, "canary_round", late_round)
    monkeypatch.setattr(guard, "ProgressWatch", lambda *_: type("Watch", (), {
        "end": lambda self: None, "busy_not_wedged": lambda self: None})())
    args = guard.parse_args(["--endpoint", "http://127.0.0.1:1", "--secrets-file", "/dev/null", "--metrics-url",
                             "http://127.0.0.1:1/metrics", "--container", "c", "--status-file", "/dev/null",
                             "--restarts-file", "/dev/null", "--hold-file", "/dev/null", "--interval", "5",
                             "--retry-interval", "2", "--deadline", "6", "--failures", "3", "--restart-limit", "3",
                             "--window", "120", "--restart-policy", "always", "--held-mark", "/dev/null",
                             "--nodes", "sim1 and sim2", "--vllm-log", "/dev/null"])
    watch = guard.Guard(args, api=None)
    watch.check()
    assert watch.consecutive == 1 and watch.next_round == 1002.0, "the retry is due 2 s after the round began"
    assert watch.pause_s() == 0.0, "a round due now runs at the next tick, at once"
    watch.round_ran = False  # a tick that found serving down ran no round: no busy loop
    assert watch.pause_s() == guard.TICK_S
