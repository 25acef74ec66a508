#!/usr/bin/env python3
"""serving-guard.py — the head's guard over serving: answer canary, wedge and crash-loop guard.

Runs on the head's host under systemd (twinspark-serving-guard.service), not in vLLM's
container: it outlives the engine it watches. Standard library only (the host's python3).

Canary: every --interval seconds, and as soon as serving answers /health after each (re)start,
three requests go at once through the API gateway with the key — the path clients use:
- a known answer: "What is A + B?" with fresh A and B; the reply must contain the sum
  (garbage output, with /health still 200, fails it);
- a streamed call of a named tool: its arguments must parse as JSON with the required field
  (streamed tool calls break while plain answers look fine);
- a streamed completion that must end within --deadline (a wedged engine accepts requests and
  answers /health, but never finishes one).
A failed round is retried after --retry-interval; --failures failed rounds in a row restart the
serving container (`docker restart`), logged with the reason.

Crash-loop guard: every serving restart — docker's own (the container's RestartCount) and the
guard's — is counted over --window seconds. At --restart-limit the guard stops restarting:
it sets the container's restart policy to "no", stops it, and writes the hold file saying why
and what to do. On GB10 a crashed engine leaks unified memory that only a reboot frees, so
restarting on would only shrink the memory until the box stops answering. The hold file and
the restart count live on tmpfs: a reboot clears them, and removing the hold file
(`python -m ops clear-hold`) clears it too; the guard then puts the restart policy back and
starts serving.

Its verdict is written to --status-file after every look, for `ops status` and `ops upgrade`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

TICK_S = 2.0
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


class CanaryFailure(Exception):
    """One canary request gave a wrong, malformed or late answer."""


# ---- the API, as a client sees it ----------------------------------------------------------
@dataclass
class Api:
    base: str  # http://127.0.0.1:PORT — the gateway
    key: str
    deadline_s: float

    def _request(self, path: str, body: Optional[dict] = None, timeout: Optional[float] = None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        request = urllib.request.Request(self.base + path, data=data, headers=headers)
        return urllib.request.urlopen(request, timeout=timeout or self.deadline_s)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as reply:
                return reply.status == 200
        except (OSError, http.client.HTTPException):
            return False

    def json(self, path: str, body: Optional[dict] = None) -> dict:
        try:
            with self._request(path, body) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as err:
            raise CanaryFailure(f"{path}: HTTP {err.code}") from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise CanaryFailure(f"{path}: {type(err).__name__}: {err}") from None

    def stream(self, path: str, body: dict):
        """The events of a streamed reply; fails unless it ends with [DONE] within the deadline."""
        deadline = time.monotonic() + self.deadline_s
        try:
            with self._request(path, {**body, "stream": True}) as reply:
                for raw in reply:
                    if time.monotonic() > deadline:
                        raise CanaryFailure(f"{path}: stream still running after {self.deadline_s:.0f} s")
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield json.loads(data)
        except urllib.error.HTTPError as err:
            raise CanaryFailure(f"{path}: HTTP {err.code}") from None
        except TimeoutError:
            raise CanaryFailure(f"{path}: stream stalled (nothing for {self.deadline_s:.0f} s)") from None
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise CanaryFailure(f"{path}: {type(err).__name__}: {err}") from None
        raise CanaryFailure(f"{path}: stream ended without [DONE]")


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


def streamed_tool_call(api: Api, model: str) -> None:
    arguments, name = "", ""
    for event in api.stream("/v1/chat/completions", {
        "model": model, "temperature": 0, "max_tokens": 256,
        "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
        "tools": [CANARY_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }):
        for choice in event.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                function = call.get("function") or {}
                name += function.get("name") or ""
                arguments += function.get("arguments") or ""
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


CHECKS = (known_answer, streamed_tool_call, completion_in_time)


def canary_round(api: Api) -> list[str]:
    """The failures of one round (empty: every answer right and in time)."""
    try:
        model = (api.json("/v1/models").get("data") or [{}])[0].get("id")
    except (CanaryFailure, AttributeError, IndexError) as failure:
        return [f"/v1/models: {failure}"]
    if not model:
        return ["/v1/models: no model listed"]

    def run(check) -> Optional[str]:
        try:
            check(api, model)
        except CanaryFailure as failure:
            return str(failure)
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as err:  # a reply of the wrong shape
            return f"{check.__name__}: malformed reply ({type(err).__name__}: {err})"
        return None

    # at once: a wedged engine then costs one deadline per round, not one per check
    with ThreadPoolExecutor(max_workers=len(CHECKS)) as pool:
        return [failure for failure in pool.map(run, CHECKS) if failure]


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
    consecutive: int = 0
    last: dict = field(default_factory=dict)  # the last round: checked_at, ok, failures
    was_held: bool = False  # saw the hold file: its removal (ops clear-hold) clears the count

    @property
    def restarts_file(self) -> Path:
        return Path(self.args.status_file).with_name("restarts.json")

    def load(self) -> None:
        try:
            self.restarts = json.loads(self.restarts_file.read_text())
        except (OSError, ValueError):
            self.restarts = []

    def record_restart(self, reason: str, count: int = 1) -> None:
        self.restarts += [{"at": time.time(), "reason": reason}] * count
        self.restarts = [r for r in self.restarts if r["at"] > time.time() - self.args.window]
        write_json(self.restarts_file, self.restarts)
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
        self.was_held = True
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

    def lower_policy(self, container: Container) -> None:
        """Docker restarts no more; the attempt running now keeps its chance."""
        if container.policy == "no":
            return
        mark = Path(self.args.held_mark)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(container.id + "\n")
        docker("update", "--restart=no", self.args.container)
        log(f"{self.in_window()} restarts in {self.args.window // 60} min: docker restarts {self.args.container} no more")

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
            self.restarts = []
            write_json(self.restarts_file, self.restarts)
        self.was_held = False

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
        failures = canary_round(self.api)
        self.last = {"checked_at": time.time(), "ok": not failures, "failures": failures}
        if not failures:
            if self.consecutive:
                log("canary passes again")
            self.consecutive = 0
            self.next_round = time.monotonic() + self.args.interval
            return
        self.consecutive += 1
        log(f"canary failed ({self.consecutive}/{self.args.failures}): " + "; ".join(failures))
        self.next_round = time.monotonic() + self.args.retry_interval
        if self.consecutive >= self.args.failures:
            self.restart_serving(failures)

    def tick(self) -> None:
        container = inspect(self.args.container)
        if container is None:
            return
        if self.hold():
            self.was_held = True
            self.enforce_hold()
            return
        self.clear_if_released()
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
        if not container.running or not self.api.healthy():
            return
        if container.started_at != self.canaried_start or time.monotonic() >= self.next_round:
            self.canaried_start = container.started_at
            self.check()

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
        })


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(value, indent=1) + "\n")
    os.chmod(staged, 0o644)
    staged.replace(path)


def read_api_key(secrets_file: str) -> str:
    for line in Path(secrets_file).read_text().splitlines():
        name, _, value = line.partition("=")
        if name == "VLLM_API_KEY":
            return value.strip().strip("'\"")
    raise SystemExit(f"serving-guard: no VLLM_API_KEY in {secrets_file}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", required=True, help="the API gateway, e.g. http://127.0.0.1:8000")
    parser.add_argument("--secrets-file", required=True, help="holds VLLM_API_KEY=...")
    parser.add_argument("--container", required=True)
    parser.add_argument("--restart-policy", required=True, help="the container's own, put back after a hold")
    parser.add_argument("--status-file", required=True, help="the verdict, JSON; restarts.json beside it")
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
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    guard = Guard(args, Api(args.endpoint.rstrip("/"), read_api_key(args.secrets_file), args.deadline))
    guard.load()
    log(f"watching {args.container} through {args.endpoint}: canary every {args.interval:.0f} s, "
        f"restart after {args.failures} failed rounds, hold at {args.restart_limit} restarts in {args.window // 60} min")
    while True:
        try:
            guard.tick()
        except Exception as err:  # noqa: BLE001 — keep guarding whatever broke; say what it was
            log(f"check skipped: {type(err).__name__}: {err}")
        guard.write_status()
        time.sleep(TICK_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
