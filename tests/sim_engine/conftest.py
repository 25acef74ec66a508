"""The simulator driven by the real engine: `pulumi up --stack sim` of the unmodified program
onto simulated Sparks that run real sshd and dockerd (tests/sim/cluster.py, docker="real"),
pulling from the sim's registry (scripts/sim-images.sh), through the Pulumi CLI, its language
host and its providers as scripts/engine.sh built them, driven by the Automation API.

One cluster per session, as scripts/sim.sh makes it. The engine runs with HOME set to a temp
folder (the operator's key lies where Pulumi.sim.yaml names it, ~/.cache/twinspark-sim), a
file backend in it, and a copy of Pulumi.sim.yaml as the stack's config file, so a scenario's
`config set` never writes the repository's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest
from pulumi import automation as auto

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sim"))
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "scripts"))

import sim_images  # noqa: E402
from cluster import SIM_STACK, SimCluster  # noqa: E402

PASSPHRASE = "twinspark-sim"  # scripts/sim.sh's; Pulumi.sim.yaml's encryptionsalt is made with it
STACK = "sim"
REPORT = ROOT / "build" / "sim-engine-report.json"


def engine_environment() -> dict[str, str]:
    """The environment `eval "$(scripts/engine.sh env)"` gives a shell."""
    out = subprocess.run(["bash", "-c", 'eval "$(scripts/engine.sh env)" && env -0'], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


@dataclass
class EngineRun:
    """One CLI command's result and the engine's own events."""
    summary: dict[str, int]
    events: list[dict] = field(default_factory=list)
    stdout: str = ""
    seconds: float = 0.0

    def steps(self, op: Optional[str] = None) -> list[dict]:
        """The resource steps the engine reported (resOutputsEvent's metadata), of `op` if given."""
        meta = [e["resOutputsEvent"]["metadata"] for e in self.events if "resOutputsEvent" in e]
        return [m for m in meta if op is None or m["op"] == op]


class EngineStack:
    """The sim stack through the Automation API, every call against the session's config file."""

    def __init__(self, stack: auto.Stack, config_file: Path):
        self.stack, self.config_file = stack, config_file

    def _events(self):
        events: list[dict] = []
        return events, lambda e: events.append(_event_dict(e))

    def up(self, **kw) -> EngineRun:
        events, on_event = self._events()
        started = time.monotonic()
        result = self.stack.up(config_file=str(self.config_file), on_event=on_event, color="never", **kw)
        return EngineRun(dict(result.summary.resource_changes or {}), events, result.stdout,
                         round(time.monotonic() - started, 1))

    def preview(self, **kw) -> EngineRun:
        events, on_event = self._events()
        started = time.monotonic()
        result = self.stack.preview(config_file=str(self.config_file), on_event=on_event, color="never", **kw)
        return EngineRun(dict(result.change_summary or {}), events, result.stdout, round(time.monotonic() - started, 1))

    def refresh(self, **kw) -> EngineRun:
        events, on_event = self._events()
        started = time.monotonic()
        result = self.stack.refresh(config_file=str(self.config_file), on_event=on_event, color="never", **kw)
        return EngineRun(dict(result.summary.resource_changes or {}), events, result.stdout,
                         round(time.monotonic() - started, 1))

    def destroy(self, **kw) -> EngineRun:
        events, on_event = self._events()
        started = time.monotonic()
        result = self.stack.destroy(config_file=str(self.config_file), on_event=on_event, color="never", **kw)
        return EngineRun(dict(result.summary.resource_changes or {}), events, result.stdout,
                         round(time.monotonic() - started, 1))

    def set_config(self, path: str, value: str) -> None:
        """`pulumi config set --path twinspark:PATH VALUE --config-file COPY`."""
        self._cli("config", "set", "--path", f"twinspark:{path}", value)

    def outputs(self) -> dict[str, Any]:
        return {k: v.value for k, v in self.stack.outputs().items()}

    def export(self) -> dict:
        return self.stack.export_stack().deployment

    def _cli(self, *args: str) -> str:
        ws = self.stack.workspace
        env = {**os.environ, **ws.env_vars}
        return subprocess.run(["pulumi", *args, "--stack", STACK, "--config-file", str(self.config_file),
                               "--non-interactive"], cwd=ws.work_dir, env=env, capture_output=True, text=True,
                              check=True).stdout


def _event_dict(event: auto.EngineEvent) -> dict:
    """An engine event as the CLI's --json stream writes it (its camelCase keys)."""
    for name in ("res_outputs_event", "diagnostic_event", "summary_event", "res_op_failed_event", "resource_pre_event"):
        value = getattr(event, name, None)
        if value is not None:
            key = "".join(w.capitalize() if i else w for i, w in enumerate(name.split("_")))
            return {key: _plain(value)}
    return {}


def _plain(value: Any) -> Any:
    if hasattr(value, "__dict__"):
        return {_camel(k): _plain(v) for k, v in vars(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if hasattr(value, "value"):  # enums
        return value.value
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


@pytest.fixture(scope="session")
def report():
    figures: dict = {}
    yield figures
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def engine_env() -> dict[str, str]:
    status = subprocess.run([str(ROOT / "scripts" / "engine.sh"), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        pytest.fail(f"the engine is not built (run scripts/engine.sh build):\n{status.stdout}{status.stderr}")
    return engine_environment()


@pytest.fixture(scope="session")
def registry() -> str:
    """The sim's images, built where their inputs changed, served while the session lasts."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "sim_images.py"), "build"], check=True)
    server = sim_images.serve_registry()
    yield sim_images.REGISTRY
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture(scope="session")
def operator_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("operator")


@pytest.fixture(scope="session")
def cluster(operator_home, registry, report):
    if os.geteuid() != 0:
        pytest.fail("the simulator needs root (namespaces, mounts): run scripts/test.sh as root")
    sim = SimCluster.from_stack_file(operator_home / ".cache" / "twinspark-sim", docker="real", registry=registry)
    try:
        sim.up()
        yield sim
    finally:
        sim.down()
        report["leftovers_after_teardown"] = sim.leftovers()


@pytest.fixture(scope="session")
def stack(engine_env, cluster, operator_home) -> EngineStack:
    config_file = operator_home / "Pulumi.sim.yaml"
    shutil.copy(SIM_STACK, config_file)
    env = {**engine_env, "HOME": str(operator_home), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
           "PULUMI_BACKEND_URL": f"file://{operator_home}/state"}
    (operator_home / "state").mkdir(exist_ok=True)
    cli = auto.PulumiCommand(root=env["TWINSPARK_ENGINE_CACHE"])  # its bin/pulumi, not whatever is on PATH
    workspace = auto.LocalWorkspace(work_dir=str(ROOT), env_vars=env, pulumi_command=cli)
    return EngineStack(auto.Stack.create_or_select(STACK, workspace), config_file)
