#!/usr/bin/env python3
"""serving-guard.py — the head's guard over serving: answer canary, wedge and crash-loop guard.

Runs on the head's host under systemd (twinspark-serving-guard.service), not in vLLM's
container: it outlives the engine it watches. Standard library only (the host's python3).

Canary: every --interval seconds, and as soon as serving answers /health after each (re)start,
three requests go at once through the API gateway with the key (read from --secrets-file each
round, so a rotated key is followed) — the path clients use:
- a known answer: "What is A + B?" with fresh A and B; the reply must contain the sum
  (garbage output, with /health still 200, fails it);
- a streamed tool call the way agents make one (tool_choice "auto", a prompt that needs the
  tool): the model's tool parser (--tool-parser, the recipe's canaryToolParser) must turn it
  into a call whose arguments parse as JSON (streamed tool calls break while plain answers look
  fine); without --tool-parser the round has no tool call (a model served without a tool parser
  never answers one, and a canary that demands it would restart a healthy engine forever);
- a streamed completion that must end within --deadline (a wedged engine accepts requests and
  answers /health, but never finishes one).
What a failed round means:
- a wrong or malformed answer counts, however busy the engine;
- late answers count only when the engine makes no progress: the guard reads vLLM's own
  counters (--metrics-url) over the round's last PROGRESS_WINDOW_S (at most half the deadline);
  requests pending and tokens being generated is a busy engine (the canary queued behind real
  work), which is never restarted;
- the gateway refusing the key (401/403) is the gateway's answer, never the engine failing.
A counted round is retried --retry-interval after it began; --failures counted rounds in a row restart the
serving container (`docker restart`), logged with the reason.

Crash-loop guard: every serving restart — docker's own (the container's RestartCount), the
guard's, and a reboot of the head (a kernel panic loop is one too) — is counted over --window
seconds. At --restart-limit the guard stops restarting: it sets the container's restart policy
to "no", stops it, and writes the hold file saying why and what to do. On GB10 a crashed engine
leaks unified memory that only a reboot frees, so restarting on would only shrink the memory
until the box stops answering. The hold file lives on tmpfs; the count on disk
(--restarts-file), with the boot it was taken in: a reboot after a hold (the cure the hold asks
for) clears both, and removing the hold file (`python -m ops clear-hold`) clears them too; the
guard then puts the restart policy back and starts serving. A guard that is stopped (disabled,
removed) puts back a restart policy it lowered, so serving is not left without one.

Fabric while serving (launch/fabric_watch.py, with --rail): every look reads the head's rails
(link, speed, MTU, RoCE port, error counters, the HCA's PCIe link and AER counters) and, after
each (re)start, which network NCCL chose in vLLM's processes (--nccl-debug-dir). A rail down or
below its speed (link or PCIe) on two looks in a row, or NCCL on Socket, is acted on at once:
the gateway drains (--drain-file: new requests get 503 with Retry-After; streams in flight get up
to --drain-seconds to finish), serving stops, and --requalify-plan's checks run (launch/
requalify.py: every node's fabric check, then the NCCL check of every rank). So is a node held out
of serving since its unclean boot (--unclean-boot-hold here; a worker's look says so, and while
serving is down the workers are looked at every WORKER_LOOK_WHILE_DOWN_S). Serving starts again
when they pass (a serving restart, counted as any other); when they fail the guard holds with
the checks' failures as the reason, runs them again every --requalify-interval seconds and
serves again the first time they pass (or after `ops clear-hold`).

With --textfile, each look also writes the guard's metrics for the node exporter's textfile
collector (twinspark_guard_* and the fabric's twinspark_fabric_*: the alerts and the overview's
guard row read them).

Its verdict is written to --status-file after every look, for `ops status` and `ops upgrade`.
"""

from __future__ import annotations

import argparse
import calendar
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fabric_watch.py beside it (root-owned, the same install)
import fabric_watch  # noqa: E402

TICK_S = 2.0
# a rail must fail on this many looks in a row before serving stops: a flap shorter than a look
# is not worth a restart (NCCL retries it), one that lasts is
FABRIC_LOOKS_TO_ACT = 2
# while not serving (a worker rebooted, its engine gone): the workers' looks this often, not every
# --worker-look-interval, so one held after an unclean boot is re-qualified in seconds
WORKER_LOOK_WHILE_DOWN_S = 3
# a worker's series (from its looks) are exported this many --worker-look-interval after its last
# look, then withdrawn: a worker that stopped answering has no PCIe link to report
WORKER_READINGS_KEPT_LOOKS = 3
REQUALIFY_TIMEOUT_S = 1800
# how long the guard watches vLLM's counters at the end of a round: long enough for a busy
# engine's streams to emit tokens (several per second each), short beside the deadline
PROGRESS_WINDOW_S = 5.0
CANARY_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} serving-guard: {message}", flush=True)


# What a failed canary request says about the engine
WRONG = "wrong"  # a wrong or malformed answer: the engine is broken, however busy
LATE = "late"  # no whole answer within the deadline: a wedge, or a queue behind real work
REFUSED = "refused"  # the gateway refused the key: not the engine's doing
ERROR = "error"  # another HTTP status, a refused or dropped connection


class CanaryFailure(Exception):
    """One canary request gave a wrong, malformed, late or refused answer."""

    def __init__(self, message: str, kind: str = WRONG):
        super().__init__(message)
        self.kind = kind


def http_failure(path: str, err: urllib.error.HTTPError) -> CanaryFailure:
    if err.code in (401, 403):
        return CanaryFailure(f"{path}: HTTP {err.code} from the gateway (the key in secrets.env refused)", REFUSED)
    return CanaryFailure(f"{path}: HTTP {err.code}", ERROR)


def transport_failure(path: str, err: Exception) -> CanaryFailure:
    reason = getattr(err, "reason", err)  # urllib wraps a connect timeout in URLError
    if isinstance(err, TimeoutError) or isinstance(reason, TimeoutError):
        return CanaryFailure(f"{path}: no answer within the deadline", LATE)
    if isinstance(err, ValueError):
        return CanaryFailure(f"{path}: {type(err).__name__}: {err}", WRONG)
    return CanaryFailure(f"{path}: {type(err).__name__}: {err}", ERROR)


# ---- the API, as a client sees it ----------------------------------------------------------
@dataclass
class Api:
    base: str  # http://127.0.0.1:PORT — the gateway
    secrets_file: str  # the gateway's own: the key is read again before every round
    deadline_s: float
    key: str = ""

    def reload_key(self) -> None:
        self.key = read_api_key(self.secrets_file)

    def _request(self, path: str, body: Optional[dict] = None, timeout: Optional[float] = None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        request = urllib.request.Request(self.base + path, data=data, headers=headers)
        return urllib.request.urlopen(request, timeout=timeout or self.deadline_s)

    def health_status(self) -> Optional[int]:
        """/health's HTTP status (502 from the gateway: vLLM is down), None: the gateway is down."""
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as reply:
                return reply.status
        except urllib.error.HTTPError as err:
            return err.code
        except (OSError, http.client.HTTPException):
            return None

    def json(self, path: str, body: Optional[dict] = None) -> dict:
        try:
            with self._request(path, body) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as err:
            raise http_failure(path, err) from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise transport_failure(path, err) from None

    def stream(self, path: str, body: dict):
        """The events of a streamed reply; fails unless it ends with [DONE] within the deadline."""
        deadline = time.monotonic() + self.deadline_s
        try:
            with self._request(path, {**body, "stream": True}) as reply:
                for raw in reply:
                    if time.monotonic() > deadline:
                        raise CanaryFailure(f"{path}: stream still running after {self.deadline_s:.0f} s", LATE)
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield json.loads(data)
        except urllib.error.HTTPError as err:
            raise http_failure(path, err) from None
        except TimeoutError:
            raise CanaryFailure(f"{path}: stream stalled (nothing for {self.deadline_s:.0f} s)", LATE) from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise transport_failure(path, err) from None
        raise CanaryFailure(f"{path}: stream ended without [DONE]", ERROR)


# ---- the three checks ----------------------------------------------------------------------
def known_answer(api: Api, model: str) -> None:
    a, b = random.randint(100, 899), random.randint(100, 899)
    reply = api.json("/v1/chat/completions", {
        "model": model, "temperature": 0, "max_tokens": 512,
        "messages": [{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}],
    })
    try:
        message = reply["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise CanaryFailure("known answer: reply has no choices[0].message") from None
    # a reasoning model may put its working in a field of its own; the sum must be somewhere
    text = " ".join(str(message.get(k) or "") for k in ("content", "reasoning_content", "reasoning"))
    if str(a + b) not in text:
        raise CanaryFailure(f"known answer: {a} + {b} gave {text.strip()[:80]!r}, not {a + b}")


def streamed_tool_call(api: Api, model: str, parser: str) -> None:
    """As agents call tools: tool_choice "auto", so the model writes the call in its own markup and
    vLLM's tool parser (--tool-call-parser, here `parser`) must find it; naming the tool would let
    structured output produce the call and leave the parser untested."""
    arguments, name, text = "", "", ""
    for event in api.stream("/v1/chat/completions", {
        "model": model, "temperature": 0, "max_tokens": 256,
        "messages": [{"role": "user", "content": "What is the weather in Paris right now? Call get_weather to find out."}],
        "tools": [CANARY_TOOL], "tool_choice": "auto",
    }):
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                name += function.get("name") or ""
                arguments += function.get("arguments") or ""
    if not name and not arguments:
        raise CanaryFailure(f"tool call: no tool call came back (tool_choice auto), only text {text.strip()[:80]!r}: "
                            f"the tool parser ({parser}) did not recognise the model's call")
    try:
        parsed = json.loads(arguments)
    except ValueError:
        raise CanaryFailure(f"tool call: arguments are not JSON: {arguments[:80]!r}") from None
    if name != "get_weather" or not isinstance(parsed, dict) or not isinstance(parsed.get("city"), str):
        raise CanaryFailure(f"tool call: expected get_weather with a city, got {name!r} {arguments[:80]!r}")


def completion_in_time(api: Api, model: str) -> None:
    tokens = 0
    for event in api.stream("/v1/completions", {"model": model, "prompt": "Count from 1 to 20:", "max_tokens": 32,
                                                 "temperature": 0}):
        tokens += len(event.get("choices") or [])
    if tokens == 0:
        raise CanaryFailure("completion: finished without a token")


def round_checks(tool_parser: Optional[str]) -> list:
    """(name, check) of a round: the tool call only where a tool parser is there to exercise."""
    checks = [("known_answer", known_answer), ("completion_in_time", completion_in_time)]
    if tool_parser:
        checks.insert(1, ("streamed_tool_call", lambda api, model: streamed_tool_call(api, model, tool_parser)))
    return checks


def canary_round(api: Api, tool_parser: Optional[str] = None) -> list[CanaryFailure]:
    """The failures of one round (empty: every answer right and in time)."""
    try:
        api.reload_key()
    except (OSError, SystemExit) as err:
        return [CanaryFailure(f"cannot read the key: {err}", REFUSED)]
    try:
        model = (api.json("/v1/models").get("data") or [{}])[0].get("id")
    except CanaryFailure as failure:
        return [failure]
    except (AttributeError, IndexError) as err:
        return [CanaryFailure(f"/v1/models: malformed reply ({type(err).__name__}: {err})")]
    if not model:
        return [CanaryFailure("/v1/models: no model listed")]

    def run(named) -> Optional[CanaryFailure]:
        name, check = named
        try:
            check(api, model)
        except CanaryFailure as failure:
            return failure
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as err:  # a reply of the wrong shape
            return CanaryFailure(f"{name}: malformed reply ({type(err).__name__}: {err})")
        return None

    # at once: a wedged engine then costs one deadline per round, not one per check
    checks = round_checks(tool_parser)
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        return [failure for failure in pool.map(run, checks) if failure]


# ---- the engine's own counters (vLLM's /metrics) ---------------------------------------------
@dataclass(frozen=True)
class EngineLoad:
    running: float
    waiting: float
    generated: float  # tokens generated since the engine started, every request together


LOAD_SERIES = re.compile(r"^(vllm:(?:num_requests_running|num_requests_waiting|generation_tokens_total))"
                         r"(?:\{[^}]*\})?\s+(\S+)")


def engine_load(url: str) -> Optional[EngineLoad]:
    """The engine's running and waiting requests and generated tokens (summed over the series of
    every model); None when /metrics does not answer or lacks the token counter."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = LOAD_SERIES.match(line)
        if match:
            try:
                sums[match[1]] = sums.get(match[1], 0.0) + float(match[2])
            except ValueError:
                return None
    if "vllm:generation_tokens_total" not in sums:
        return None
    return EngineLoad(sums.get("vllm:num_requests_running", 0.0), sums.get("vllm:num_requests_waiting", 0.0),
                      sums["vllm:generation_tokens_total"])


class ProgressWatch:
    """vLLM's counters over the last part of a canary round, read while the round runs: once
    deadline - window seconds in, and again when the round ends late. The canary's own first
    tokens come before the window, so a wedge shows none in it, while a busy engine's streams
    do; no window of its own after the round (it cost every late round PROGRESS_WINDOW_S more)."""

    def __init__(self, url: str, deadline_s: float):
        self.url = url
        self.window_s = min(PROGRESS_WINDOW_S, deadline_s / 2)
        self.before: Optional[EngineLoad] = None
        self.read_at = 0.0
        self.ended = threading.Event()
        self.reader = threading.Thread(target=self.read_before, args=(deadline_s - self.window_s,), daemon=True)
        self.reader.start()

    def read_before(self, after_s: float) -> None:
        if not self.ended.wait(after_s):
            self.read_at, self.before = time.monotonic(), engine_load(self.url)

    def end(self) -> None:
        """The round answered in time: no reading wanted."""
        self.ended.set()

    def busy_not_wedged(self) -> Optional[str]:
        """Why late answers are no wedge (requests pending, tokens being generated), or None."""
        self.reader.join()
        after = engine_load(self.url)
        if self.before is None or after is None:
            return None
        produced = after.generated - self.before.generated
        if after.running + after.waiting > 0 and produced > 0:
            return (f"busy, not wedged: {after.running:.0f} running, {after.waiting:.0f} waiting, "
                    f"{produced:.0f} tokens in {time.monotonic() - self.read_at:.0f} s")
        return None


# ---- docker --------------------------------------------------------------------------------
def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@dataclass
class Container:
    id: str
    running: bool
    restart_count: int
    started_at: str
    exit_code: int
    policy: str


def inspect(name: str) -> Optional[Container]:
    result = docker("inspect", name, timeout=30)
    if result.returncode != 0:
        return None
    try:
        doc = json.loads(result.stdout)[0]
        state = doc.get("State") or {}
        return Container(doc["Id"], bool(state.get("Running")), int(doc.get("RestartCount") or 0),
                         str(state.get("StartedAt") or ""), int(state.get("ExitCode") or 0),
                         ((doc.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "")
    except (ValueError, IndexError, KeyError, AttributeError, TypeError):
        return None


def docker_time(text: str) -> float:
    """Docker's StartedAt (RFC 3339, nanoseconds, UTC) as a Unix time; 0 when unreadable."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", text or "")
    if not match:
        return 0.0
    return calendar.timegm(time.strptime(match[1], "%Y-%m-%dT%H:%M:%S")) + float("0" + (match[2] or ""))


# ---- the guard -----------------------------------------------------------------------------
@dataclass
class Guard:
    args: argparse.Namespace
    api: Api
    restarts: list = field(default_factory=list)  # {"at": unix s, "reason": str}
    container_id: str = ""
    restart_count: int = 0
    started_at: str = ""
    canaried_start: str = ""
    next_round: float = 0.0
    round_ran: bool = False  # the last tick ran a canary round
    held_rails_failing: bool = False  # held for the fabric: the head's rails failed at the last look
    consecutive: int = 0
    last: dict = field(default_factory=dict)  # the last round: checked_at, ok, failures, duration_s, note
    was_held: bool = False  # saw the hold file: its removal (ops clear-hold) clears the count
    held_at_boot: bool = False  # on disk: serving was held, so the next boot is the hold's cure
    restarts_total: int = 0  # every restart ever counted (the textfile's counter)
    gateway_up: Optional[bool] = None  # the last look at /health got an HTTP answer
    rails: list = field(default_factory=list)  # fabric_watch.Rail of each of the head's rails
    fabric_before: dict = field(default_factory=dict)  # iface -> the last look's RailReading
    fabric_streak: int = 0  # looks in a row with a finding acted on
    fabric: dict = field(default_factory=dict)  # the last look: findings, NCCL's network, the re-qualification
    nccl_network: Optional[str] = None
    requalifications_total: int = 0
    next_requalify: float = 0.0  # held for the fabric: when the checks run again
    next_worker_look: float = 0.0
    last_worker_look: float = 0.0
    worker_before: dict = field(default_factory=dict)  # (worker, iface) -> its last look's RailReading
    worker_readings: dict = field(default_factory=dict)  # worker -> (when, its last look's RailReadings)
    worker_streak: int = 0

    @property
    def restarts_file(self) -> Path:
        return Path(self.args.restarts_file)

    @property
    def boot_marker(self) -> Path:
        """On tmpfs beside the status: absent when the guard starts means the head rebooted."""
        return Path(self.args.status_file).with_name("booted")

    def load(self) -> None:
        try:
            saved = json.loads(self.restarts_file.read_text())
            self.restarts = list(saved["restarts"])
            self.held_at_boot, self.restarts_total = bool(saved.get("held")), int(saved.get("total") or 0)
        except (OSError, ValueError, KeyError, TypeError):
            self.restarts, self.held_at_boot, self.restarts_total = [], False, 0

    def save(self) -> None:
        write_json(self.restarts_file, {"restarts": self.restarts, "held": self.held_at_boot,
                                        "total": self.restarts_total})

    def note_boot(self) -> None:
        """A reboot after a hold is the cure the hold asked for: the count starts again. Any other
        reboot of the head is one more restart: a kernel panic loop gets held like a crash loop."""
        rebooted = not self.boot_marker.exists() and self.restarts_file.exists()
        self.boot_marker.parent.mkdir(parents=True, exist_ok=True)
        self.boot_marker.write_text(f"{time.time()}\n")
        if not rebooted:
            if not self.restarts_file.exists():
                self.save()  # the disk now knows this head: its next unmarked boot is a reboot
            return
        if self.held_at_boot:
            log("the head rebooted after a hold: the restart count starts again")
            self.restarts, self.held_at_boot = [], False
            self.save()
        else:
            self.record_restart("the head rebooted")

    def record_restart(self, reason: str, count: int = 1) -> None:
        self.restarts += [{"at": time.time(), "reason": reason}] * count
        self.restarts = [r for r in self.restarts if r["at"] > time.time() - self.args.window]
        self.restarts_total += count
        self.save()
        log(f"serving restart ({reason}): {len(self.restarts)} in the last {self.args.window // 60} min")

    def in_window(self) -> int:
        return sum(1 for r in self.restarts if r["at"] > time.time() - self.args.window)

    def hold(self) -> Optional[dict]:
        try:
            return json.loads(Path(self.args.hold_file).read_text())
        except (OSError, ValueError):
            return None

    def raise_hold(self, why: str) -> None:
        reason = (f"{why}: {self.in_window()} serving restarts in {self.args.window // 60} min "
                  f"(limit {self.args.restart_limit}). A crashed engine leaks GPU memory that only a reboot "
                  f"frees: reboot {self.args.nodes} (see {self.args.vllm_log}), or run `python -m ops clear-hold` "
                  "to try again without one")
        write_json(Path(self.args.hold_file), {"reason": reason, "since": time.time()})
        self.was_held = self.held_at_boot = True
        self.save()
        log(f"HOLD: {reason}")
        self.enforce_hold()

    def enforce_hold(self) -> None:
        """No restarts while held: policy "no" (remembered, for after the reboot) and stopped."""
        container = inspect(self.args.container)
        if container is None:
            return
        self.lower_policy(container)
        if container.running:
            docker("stop", self.args.container)

    def lower_policy(self, container: Container, why: Optional[str] = None) -> None:
        """Docker restarts no more; the attempt running now keeps its chance. The mark on disk lets
        a guard that starts again (a crash, a reboot) put the policy back."""
        if container.policy == "no":
            return
        mark = Path(self.args.held_mark)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(container.id + "\n")
        docker("update", "--restart=no", self.args.container)
        why = why or f"{self.in_window()} restarts in {self.args.window // 60} min"
        log(f"{why}: docker restarts {self.args.container} no more")

    def restore_policy(self, container: Container) -> None:
        """Ours lowered it, and the hold is gone (a reboot, ops clear-hold) or the window moved on."""
        log(f"restart policy of {self.args.container} back to {self.args.restart_policy}")
        docker("update", f"--restart={self.args.restart_policy}", self.args.container)
        Path(self.args.held_mark).unlink(missing_ok=True)
        if not container.running:
            docker("start", self.args.container)

    def clear_if_released(self) -> None:
        """A hold file removed by hand (ops clear-hold) clears the count with it."""
        if self.hold() is None and self.was_held:
            log("hold cleared: serving starts again")
            self.restarts, self.held_at_boot = [], False
            self.save()
        self.was_held = False

    def release_on_stop(self) -> None:
        """The guard stopped (disabled, removed, or the head shutting down) while docker restarts
        the container no more: give it a policy docker acts on by itself. "always", because a
        container the hold stopped is one docker's "unless-stopped" would leave down after the
        reboot the hold asks for; a guard that runs again puts its own policy back (restore_policy,
        as the mark stays)."""
        container = inspect(self.args.container)
        if container is not None and container.policy == "no" and self.lowered_policy_of(container):
            docker("update", "--restart=always", self.args.container, timeout=30)
            log(f"stopping: {self.args.container} restarts on its own again (policy always)")

    def lowered_policy_of(self, container: Container) -> bool:
        """Did the guard set this container's policy to "no"? (A mark naming another is stale.)"""
        mark = Path(self.args.held_mark)
        try:
            if mark.read_text().strip() == container.id:
                return True
        except OSError:
            return False
        mark.unlink(missing_ok=True)
        return False

    def follow_container(self, container: Container) -> None:
        """Count docker's own restarts (RestartCount of the same container) as serving restarts.
        A new container (pulumi up) starts without a restart; the count so far stays, as the
        memory its crashes leaked does."""
        if container.id != self.container_id:
            self.container_id, self.restart_count = container.id, container.restart_count
        elif container.restart_count > self.restart_count:
            self.record_restart(f"engine exited (exit code {container.exit_code})",
                                container.restart_count - self.restart_count)
            self.restart_count = container.restart_count
        self.started_at = container.started_at

    def restart_serving(self, failures: list[str]) -> None:
        if self.in_window() + 1 > self.args.restart_limit:
            self.raise_hold("wrong or missing answers with the restart limit reached")
            return
        reason = "canary failed " + f"{self.consecutive} times: " + "; ".join(failures)
        self.record_restart(reason)
        log(f"restarting {self.args.container}: {reason}")
        docker("restart", self.args.container, timeout=300)
        self.consecutive = 0

    def check(self) -> None:
        self.round_ran = True
        # rounds are spaced from their starts: a late round has already waited its deadline,
        # so the next one (a retry above all) does not wait the spacing again after it
        started = time.monotonic()
        progress = ProgressWatch(self.args.metrics_url, self.args.deadline)
        failures = canary_round(self.api, self.args.tool_parser)
        progress.end()
        messages = [str(f) for f in failures]
        # ok: the round passed (None: failed but not counted, see not_counted and note)
        self.last = {"checked_at": time.time(), "ok": not failures, "failures": messages,
                     "duration_s": round(time.monotonic() - started, 2), "not_counted": None, "note": None}
        if not failures:
            if self.consecutive:
                log("canary passes again")
            self.consecutive = 0
            self.next_round = started + self.args.interval
            return
        kinds = {f.kind for f in failures}
        if REFUSED in kinds:  # a key rotation under way, or a gateway with another key: not the engine
            self.last.update(ok=None, not_counted="key refused",
                             note="the gateway refused the key (not counted): " + "; ".join(messages))
            log(f"canary not counted: {messages[0]}")
            self.next_round = started + self.args.retry_interval
            return
        if kinds == {LATE}:
            busy = progress.busy_not_wedged()
            if busy:
                self.last.update(ok=None, not_counted="busy", note=busy)
                log(f"canary late, {busy}: not counted")
                self.consecutive = 0
                self.next_round = started + self.args.interval
                return
        self.consecutive += 1
        log(f"canary failed ({self.consecutive}/{self.args.failures}): " + "; ".join(messages))
        self.next_round = started + self.args.retry_interval
        if self.consecutive >= self.args.failures:
            self.restart_serving(messages)

    def pause_s(self) -> float:
        """Until the next tick: TICK_S, or less when the next canary round falls due sooner (a retry
        right after a late round: at once); one not run because serving was down waits the full tick."""
        until_round = self.next_round - time.monotonic()
        if self.round_ran and until_round < TICK_S:
            return max(0.0, until_round)
        return TICK_S

    def tick(self) -> None:
        self.round_ran = False
        container = inspect(self.args.container)
        if container is None:
            return
        hold = self.hold()
        if hold:
            self.was_held = True
            self.enforce_hold()
            if hold.get("kind") == "fabric" and (self.head_rails_mended() or time.monotonic() >= self.next_requalify):
                self.retry_fabric_hold(hold)
            return
        self.clear_if_released()
        self.end_drain()
        self.follow_container(container)
        ours = self.lowered_policy_of(container)
        if self.in_window() >= self.args.restart_limit:
            if ours and not container.running:  # the last allowed attempt failed too
                self.raise_hold("restart loop")
                return
            self.lower_policy(container)
        elif ours:
            self.restore_policy(container)
            return
        if container.running and self.rails:
            acted = self.look_at_fabric(container) or self.look_at_workers()
            if acted:
                self.requalify(acted)
                return
        health = self.api.health_status()
        self.gateway_up = health is not None
        if not container.running or health != 200:
            # not serving: a worker held since an unclean boot would keep it so, and says so at its look
            self.next_worker_look = min(self.next_worker_look, self.last_worker_look + WORKER_LOOK_WHILE_DOWN_S)
            return
        if container.started_at != self.canaried_start or time.monotonic() >= self.next_round:
            self.canaried_start = container.started_at
            self.check()

    # ---- the fabric while serving --------------------------------------------------------
    def look_at_fabric(self, container: Container) -> list:
        """Read the rails and NCCL's choice; the findings to stop serving for, or none."""
        readings = [fabric_watch.read_rail(rail, Path(self.args.sys_root)) for rail in self.rails]
        findings = [f for r in readings for f in fabric_watch.judge(r, self.fabric_before.get(r.rail.iface))]
        self.fabric_before = {r.rail.iface: r for r in readings}
        if self.args.nccl_debug_dir:
            network, path = fabric_watch.nccl_network(Path(self.args.nccl_debug_dir), docker_time(container.started_at))
            self.nccl_network = network
            if network not in (None, "IB"):
                findings.append(fabric_watch.Finding("nccl", "nccl", f"NCCL chose {network}, not IB, in the serving "
                                                                     f"start of {container.started_at} ({path})"))
        held = fabric_watch.unclean_boot(self.args.unclean_boot_hold)
        if held:
            findings.append(fabric_watch.Finding(fabric_watch.UNCLEAN_BOOT, "boot", f"this node: {held}"))
        self.fabric_streak, acted = self.weigh(findings, "findings", self.fabric_streak)
        self.fabric.update(nccl_network=self.nccl_network, readings=readings)
        return acted

    def look_at_workers(self) -> list:
        """Every --worker-look-interval s, each worker's own rails (requalify.py peers-look, over the
        re-qualification key): the findings to stop serving for, or none. A worker that does not answer is
        no finding here (rebooting, or its own rail gone: the head's look and the checks say so)."""
        if time.monotonic() < self.next_worker_look:
            return []
        self.last_worker_look = time.monotonic()
        self.next_worker_look = self.last_worker_look + self.args.worker_look_interval
        try:
            done = subprocess.run([sys.executable, str(HERE / "requalify.py"), "peers-look", "--plan",
                                   self.args.requalify_plan], capture_output=True, text=True, timeout=60)
            looks = json.loads(done.stdout) if done.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, ValueError):
            looks = {}
        findings = []
        looked_at = self.fabric.setdefault("workers_looked_at", {})
        self.fabric["worker_errors"] = {worker: look["error"][-300:] for worker, look in looks.items() if "error" in look}
        for worker, look in sorted(looks.items()):
            if "rails" in look:
                looked_at[worker] = round(time.time(), 1)
            if look.get("unclean_boot"):
                findings.append(fabric_watch.Finding(fabric_watch.UNCLEAN_BOOT, "boot", f"{worker}: {look['unclean_boot']}"))
            readings = []
            for record in look.get("rails") or []:
                try:
                    reading = fabric_watch.reading_of(record)
                except (KeyError, TypeError):
                    continue  # not a reading of this version's: the next `up` installs the same on every node
                key = (worker, reading.rail.iface)
                findings += [fabric_watch.Finding(f.kind, f"{worker} {f.rail}", f"{worker} {f.message}")
                             for f in fabric_watch.judge(reading, self.worker_before.get(key))]
                self.worker_before[key] = reading
                readings.append(reading)
            if readings:
                self.worker_readings[worker] = (time.time(), readings)
        self.worker_streak, acted = self.weigh(findings, "worker_findings", self.worker_streak)
        return acted

    def weigh(self, findings: list, said: str, streak: int) -> tuple[int, list]:
        """Log the findings the last look (self.fabric[said]) had not, keep them there; (the streak of
        looks with one acted on, the findings to stop serving for: such a finding on FABRIC_LOOKS_TO_ACT
        looks in a row, or NCCL's or an unclean boot's at once; none otherwise)."""
        for finding in findings:
            if finding.message not in self.fabric.get(said, []):
                log(f"fabric: {finding.message}")
        self.fabric[said] = [f.message for f in findings]
        acted = fabric_watch.act_on(findings)
        streak = streak + 1 if acted else 0
        if acted and (streak >= FABRIC_LOOKS_TO_ACT or any(f.rail in fabric_watch.AT_ONCE for f in acted)):
            return streak, acted
        return streak, []

    def drain(self, reason: str) -> None:
        """New requests get the gateway's 503; the ones in flight get --drain-seconds to finish."""
        write_atomically(Path(self.args.drain_file), reason + "\n")
        deadline = time.monotonic() + self.args.drain_seconds
        while time.monotonic() < deadline:
            load = engine_load(self.args.metrics_url)
            if load is None or load.running + load.waiting == 0:
                return
            time.sleep(1)
        log(f"drain: requests still running after {self.args.drain_seconds:.0f} s; stopping serving anyway")

    def end_drain(self) -> None:
        if not self.args.drain_file:
            return
        drain = Path(self.args.drain_file)
        if drain.exists():
            drain.unlink(missing_ok=True)
            log("drain ended: the gateway takes requests again")

    def run_checks(self) -> tuple[bool, str]:
        """launch/requalify.py run: every node's fabric check, then every NCCL rank."""
        self.requalifications_total += 1
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, str(HERE / "requalify.py"), "run", "--plan", self.args.requalify_plan],
                                  capture_output=True, text=True, timeout=REQUALIFY_TIMEOUT_S)
            passed, said = done.returncode == 0, (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            passed, said = False, f"the re-qualification did not finish: {err}"
        for line in said.splitlines():
            log(f"requalify: {line}")
        failures = [line for line in said.splitlines() if line.startswith("FAIL ")]
        summary = "; ".join(failures) if failures else (said.splitlines() or ["no output"])[-1]
        self.fabric["last_requalification"] = {"at": time.time(), "passed": passed, "summary": summary[-1500:],
                                               "duration_s": round(time.monotonic() - started, 1)}
        return passed, summary

    def requalify(self, acted: list) -> None:
        """Drain, stop serving, run the checks; serve again when they pass, hold when not."""
        reason = "; ".join(f.message for f in acted)
        log(f"fabric: {reason}: draining, stopping serving, re-qualifying the fabric and NCCL")
        self.fabric["requalifying"] = reason
        self.write_status()
        self.drain(f"fabric: {reason}")
        container = inspect(self.args.container)
        if container is not None:  # a guard that dies meanwhile finds the mark and starts serving again
            self.lower_policy(container, "re-qualifying the fabric")
        docker("stop", self.args.container, timeout=300)
        passed, summary = self.run_checks()
        self.fabric["requalifying"] = None
        self.fabric_streak, self.fabric_before = 0, {}
        self.worker_streak, self.worker_before, self.next_worker_look = 0, {}, 0.0
        if passed:
            # an unclean boot's hold alone: its reboot (the head's) or the engine's exit it caused (a worker's) was
            # counted already, so a panic loop is held after the same number of boots as without the recorder
            self.serve_again(f"fabric re-qualified after: {reason}",
                             counted={f.kind for f in acted} != {fabric_watch.UNCLEAN_BOOT})
            return
        self.next_requalify = time.monotonic() + self.args.requalify_interval
        # a rail of the head's among the causes: its reading healthy again re-qualifies at once (head_rails_mended)
        self.held_rails_failing = any(f.rail in {rail.iface for rail in self.rails} for f in acted)
        write_json(Path(self.args.hold_file), {
            "kind": "fabric", "since": time.time(),
            "reason": f"fabric: {reason}. The re-qualification failed: {summary}. Serving stays stopped; the guard "
                      f"runs the checks again every {self.args.requalify_interval:.0f} s (serving.guard.requalifySeconds) "
                      "and serves again the first time they pass; `twinspark clear-hold` serves at once, unchecked"})
        self.was_held = True
        log(f"HOLD (fabric): {reason}: {summary}")
        self.enforce_hold()

    def head_rails_mended(self) -> bool:
        """Held for the fabric: the head's rails are read every tick (sysfs, nothing more); one that
        failed at the last look and none now (a cable plugged back, a card reseated) re-qualifies at
        once, not up to --requalify-interval later."""
        failing = bool(fabric_watch.act_on([f for rail in self.rails for f in fabric_watch.judge(
            fabric_watch.read_rail(rail, Path(self.args.sys_root)))]))
        mended, self.held_rails_failing = self.held_rails_failing and not failing, failing
        if mended:
            log("fabric: the head's rails read healthy again: re-qualifying now")
        return mended

    def retry_fabric_hold(self, hold: dict) -> None:
        passed, summary = self.run_checks()
        if not passed:
            self.next_requalify = time.monotonic() + self.args.requalify_interval
            log(f"fabric still failing: {summary}")
            return
        Path(self.args.hold_file).unlink(missing_ok=True)
        self.was_held = False  # a hold the fabric's pass released: the restart count stays
        self.serve_again(f"fabric re-qualified after the hold: {hold.get('reason', '')[:200]}")

    def serve_again(self, reason: str, counted: bool = True) -> None:
        """Start serving after a re-qualification that passed. Not `counted`: no restart recorded, and at the
        restart limit the policy stays lowered (the last allowed attempt: a next crash or panic is held)."""
        if counted:
            if self.in_window() + 1 > self.args.restart_limit:
                self.raise_hold(f"{reason}, with the restart limit reached")
                return
            self.record_restart(reason)
        else:
            log(f"serving again: {reason}")
        container = inspect(self.args.container)
        if container is not None and self.lowered_policy_of(container) and (
                counted or self.in_window() < self.args.restart_limit):
            self.restore_policy(container)  # starts it
        else:
            docker("start", self.args.container, timeout=120)
        self.end_drain()

    def write_status(self) -> None:
        write_json(Path(self.args.status_file), {
            "updated_at": time.time(),
            **{"checked_at": None, "ok": None, "failures": []}, **self.last,
            "consecutive_failures": self.consecutive,
            "restarts_in_window": self.in_window(),
            "restart_limit": self.args.restart_limit,
            "window_s": self.args.window,
            "last_restart": self.restarts[-1] if self.restarts else None,
            "hold": self.hold(),
            "serving_started_at": self.started_at,
            "fabric": {k: v for k, v in self.fabric.items() if k != "readings"},
        })
        self.write_metrics()

    def write_metrics(self) -> None:
        """The guard's series for the node exporter's textfile collector (GUARD_METRICS in
        components/observability_files.py): a busy engine's late round counts as passing."""
        if not self.args.textfile:
            return
        values: dict[str, float] = {"twinspark_guard_restarts_total": self.restarts_total,
                                    "twinspark_guard_hold": 1 if self.hold() else 0}
        if self.gateway_up is not None:
            values["twinspark_guard_gateway_up"] = int(self.gateway_up)
        if self.last:  # no canary yet: its series stay absent (TwinsparkCanaryStale watches for that)
            values.update({
                # the engine serves: a passing round, or a busy engine's late one
                "twinspark_guard_canary_success": int(self.last.get("ok") is True
                                                      or self.last.get("not_counted") == "busy"),
                "twinspark_guard_canary_last_run_timestamp_seconds": round(self.last["checked_at"], 3),
                "twinspark_guard_canary_duration_seconds": self.last.get("duration_s", 0),
            })
        if self.rails:
            values["twinspark_guard_requalifications_total"] = self.requalifications_total
            values["twinspark_guard_draining"] = int(Path(self.args.drain_file).exists())
            values.update(fabric_watch.metrics(self.fabric.get("readings", []), self.nccl_network))
            # the workers' rails as their last looks read them (PCIe link, AER), while those are recent
            recent = time.time() - WORKER_READINGS_KEPT_LOOKS * self.args.worker_look_interval
            for worker, (looked, readings) in sorted(self.worker_readings.items()):
                if looked >= recent:
                    values.update(fabric_watch.metrics(readings, None, peer=worker))
        text, typed = "", set()
        # a family's series together (the text format wants them so), the families in a fixed order
        for series, value in sorted(values.items(), key=lambda item: item[0].split("{")[0]):
            name = series.split("{")[0]
            if name not in typed:  # one TYPE line a family, before its first series
                typed.add(name)
                text += f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}\n"
            text += f"{series} {value}\n"
        write_atomically(Path(self.args.textfile), text)

    def withdraw_metrics(self) -> None:
        """A stopped guard's series would claim a canary nobody runs (after a role swap, on a
        worker); absent, TwinsparkCanaryStale's absent() says no guard probes."""
        if self.args.textfile:
            Path(self.args.textfile).unlink(missing_ok=True)


def write_atomically(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one. The temporary name starts
    with a dot and does not end in .prom: the textfile collector skips it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(text)
    os.chmod(staged, 0o644)
    staged.replace(path)


def write_json(path: Path, value) -> None:
    write_atomically(path, json.dumps(value, indent=1) + "\n")


def read_api_key(secrets_file: str) -> str:
    for line in Path(secrets_file).read_text().splitlines():
        name, _, value = line.partition("=")
        if name == "VLLM_API_KEY":
            return value.strip().strip("'\"")
    raise SystemExit(f"serving-guard: no VLLM_API_KEY in {secrets_file}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", required=True, help="the API gateway, e.g. http://127.0.0.1:8000")
    parser.add_argument("--secrets-file", required=True, help="holds VLLM_API_KEY=... (read before every round)")
    parser.add_argument("--metrics-url", required=True, help="vLLM's /metrics: running, waiting, generated tokens")
    parser.add_argument("--container", required=True)
    parser.add_argument("--restart-policy", required=True, help="the container's own, put back after a hold")
    parser.add_argument("--status-file", required=True, help="the verdict, JSON (tmpfs)")
    parser.add_argument("--restarts-file", required=True, help="the restart count, JSON (on disk: survives a reboot)")
    parser.add_argument("--textfile", help="the guard's metrics for the node exporter's textfile collector")
    parser.add_argument("--hold-file", required=True)
    parser.add_argument("--held-mark", required=True)
    parser.add_argument("--nodes", required=True, help="what to reboot, as the hold says it")
    parser.add_argument("--vllm-log", required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--retry-interval", type=float, required=True)
    parser.add_argument("--deadline", type=float, required=True)
    parser.add_argument("--failures", type=int, required=True)
    parser.add_argument("--restart-limit", type=int, required=True)
    parser.add_argument("--window", type=int, required=True, help="seconds")
    parser.add_argument("--tool-parser", help="the served tool parser the canary's tool call exercises (the "
                                              "recipe's canaryToolParser); absent: no tool call in the round")
    fabric = parser.add_argument_group("the fabric while serving (all or none of --rail, --drain-file, --requalify-plan)")
    fabric.add_argument("--rail", action="append", default=[], metavar="IFACE:HCA", help="a rail of this node")
    fabric.add_argument("--rail-speed-mbps", type=int, help="each rail's link speed (fabric.linkSpeedMbps)")
    fabric.add_argument("--rail-mtu", type=int, help="each rail's MTU (fabric.mtu)")
    fabric.add_argument("--nccl-debug-dir", help="where vLLM's processes write NCCL's INFO lines")
    fabric.add_argument("--drain-file", help="while it exists the gateway answers 503")
    fabric.add_argument("--drain-seconds", type=float, default=30.0)
    fabric.add_argument("--requalify-plan", help="launch/requalify.py's plan")
    fabric.add_argument("--requalify-interval", type=float, default=60.0, help="held for the fabric: seconds between checks")
    # every 5 min: the rehearsals with the look every 30 s ran the simulator 17-26 % slower than the one
    # without it (docs/testing.md, 2026-12-06), a cost not measured yet; a worker's rail down is also
    # TwinsparkRailDown's at once, and on a direct cable the head's own end goes down with it
    fabric.add_argument("--worker-look-interval", type=float, default=300.0,
                        help="seconds between looks at the workers' own rails (an SSH login to each: a worker's end of "
                             "a direct cable going down the head sees at its own end within seconds)")
    fabric.add_argument("--unclean-boot-hold", help="this node's hold after an unclean boot (launch/node-recorder.py): "
                                                    "while it exists, re-qualify; the workers' looks report theirs")
    fabric.add_argument("--sys-root", default="/sys", help="where sysfs is (a test stages one)")
    args = parser.parse_args(argv)
    if args.rail and not (args.rail_speed_mbps and args.rail_mtu and args.drain_file and args.requalify_plan):
        parser.error("--rail needs --rail-speed-mbps, --rail-mtu, --drain-file and --requalify-plan")
    return args


def rails_of(args: argparse.Namespace) -> list:
    rails = []
    for spec in args.rail:
        iface, _, hca = spec.partition(":")
        rails.append(fabric_watch.Rail(iface, hca, args.rail_speed_mbps, args.rail_mtu))
    return rails


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    api = Api(args.endpoint.rstrip("/"), args.secrets_file, args.deadline)
    api.reload_key()  # a missing key file stops the guard at once, saying so
    guard = Guard(args, api, rails=rails_of(args))
    guard.load()
    guard.note_boot()
    log(f"watching {args.container} through {args.endpoint}: canary every {args.interval:.0f} s "
        + (f"(tool call through {args.tool_parser}), " if args.tool_parser else "(no tool parser: no tool call), ")
        + f"restart after {args.failures} failed rounds, hold at {args.restart_limit} restarts in {args.window // 60} min")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # systemd's stop: run the finally below
    try:
        while True:
            try:
                guard.tick()
            except Exception as err:  # noqa: BLE001 — keep guarding whatever broke; say what it was
                log(f"check skipped: {type(err).__name__}: {err}")
            guard.write_status()
            time.sleep(guard.pause_s())
    finally:
        guard.release_on_stop()
        guard.withdraw_metrics()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
