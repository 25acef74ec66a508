"""Run the real __main__.py under Pulumi mocks, in a subprocess, and report what it asked for.

`run_program(config)` returns every registered resource (type, name, inputs, parent,
dependencies, provider, options seen by the monitor: deleteBeforeReplace, replaceWith,
ignoreChanges, replaceOnChanges, the outputs it was given), the exported outputs (with their
secret flags), or the error the program stopped with. A subprocess per run keeps Pulumi's
global runtime state from leaking between runs.

What the nodes answer is simulated: `image-pin-resolve` (and each monitoring image's
`observability-*-image-pin-resolve`) prints the digest the fake registry
(`registry`) serves for the tag, `{head}-weights-revision` the fake hub's (`hub`) head commit,
`{worker}-image-ship` the image ID it was given, `{node}-platform-facts` prints `facts` over the
recipe's platform. With `prior` (an earlier run: the state), a resource whose compared inputs are
unchanged keeps its earlier outputs, as the engine does for a resource without a diff.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional, Sequence

import yaml

ROOT = Path(__file__).resolve().parent.parent
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # how the engine marks a secret input
STACK_FILE = ROOT / "Pulumi.spark.yaml"

MOCK_PROGRAM = Path(__file__).resolve().parent / "mock_program.py"  # the program under mocks, run apart
MOCK_PROGRAM_FORKS = MOCK_PROGRAM.with_name("mock_program_forks.py")
RUN_TIMEOUT_S = 300  # a hang guard: a run takes seconds


class ForkingProcess:
    """One tests/mock_program_forks.py: a process that has imported Pulumi's SDKs (~0.9 of a run's
    ~1.4 CPU-s) and forks a child per run, started at its first run with that run's environment."""

    def __init__(self) -> None:
        self._server: Optional[subprocess.Popen] = None
        self.pythonpath: Optional[str] = None  # its sys.path is made from it at its start
        self._pending = b""  # what it said past the last whole line

    def started(self, env: dict[str, str]) -> "ForkingProcess":
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen([sys.executable, str(MOCK_PROGRAM_FORKS)], cwd=ROOT, env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.pythonpath, self._pending = env.get("PYTHONPATH"), b""
        return self

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
        server = self._server
        assert server is not None and server.stdin is not None
        with tempfile.TemporaryDirectory() as out:
            stdout, stderr = Path(out, "stdout"), Path(out, "stderr")
            server.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout),
                                           "stderr": str(stderr)}).encode() + b"\n")
            server.stdin.flush()
            child = self._answer(RUN_TIMEOUT_S)["pid"]
            try:
                status = self._answer(timeout_s)["status"]
            except subprocess.TimeoutExpired:
                os.kill(child, signal.SIGKILL)
                self._answer(RUN_TIMEOUT_S)
                raise
            return subprocess.CompletedProcess(argv, status, stdout.read_text(), stderr.read_text())

    def close(self) -> None:
        """It ends at the end of its input."""
        if self._server is not None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            self._server.wait(timeout=RUN_TIMEOUT_S)
            self._server = None

    def _answer(self, timeout_s: float) -> dict:
        """Its next line (read from its pipe unbuffered: a select on a buffered reader misses a line
        already in the buffer)."""
        server = self._server
        assert server is not None and server.stdout is not None
        with selectors.DefaultSelector() as ready:
            ready.register(server.stdout, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                if not ready.select(timeout_s):
                    raise subprocess.TimeoutExpired(str(MOCK_PROGRAM), timeout_s)
                said = os.read(server.stdout.fileno(), 4096)
                if not said:
                    raise AssertionError(f"{MOCK_PROGRAM_FORKS.name} exited ({server.wait()})")
                self._pending += said
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)


class ProgramForks:
    """The program's runs of a test process, each a child forked from a ForkingProcess (a few hundred
    runs a CI run, each ~0.9 CPU-s of imports cheaper). What a run sees is what a process of its own
    would see: its arguments, environment, working directory, stdout and stderr, and a hash seed
    other than the last run's (children share their forking process's: two of them take the runs in
    turn, so a test comparing two runs still compares two seeds). A run whose PYTHONPATH is not its
    forking process's runs as a process of its own."""

    def __init__(self) -> None:
        self._forking = (ForkingProcess(), ForkingProcess())
        self._runs = 0
        self._lock = threading.Lock()

    def run(self, argv: list[str], env: dict[str, str], cwd: Path,
            timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
        """`python ARGV...` (a script and its arguments) as subprocess.run with capture_output and text."""
        with self._lock:
            forking = self._forking[self._runs % len(self._forking)].started(env)
            self._runs += 1
            if env.get("PYTHONPATH") != forking.pythonpath:
                return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, env=env,
                                      timeout=timeout_s)
            return forking.run(argv, env, cwd, timeout_s)

    def close(self) -> None:
        for forking in self._forking:
            forking.close()


PROGRAM_FORKS = ProgramForks()


@dataclass
class Resource:
    type: str
    name: str
    urn: str
    inputs: dict[str, Any]
    parent: str
    dependencies: list[str]
    provider: str
    delete_before_replace: bool
    replace_with: list[str]
    ignore_changes: list[str]
    replace_on_changes: list[str]
    compared: dict[str, Any] = field(default_factory=dict)  # the inputs the engine diffs
    aliases: list[dict[str, Any]] = field(default_factory=list)  # as sent: {"urn": ...} or {"spec": {...}}
    outputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProgramRun:
    resources: list[Resource]
    outputs: dict[str, dict[str, Any]]
    error: Optional[dict[str, str]]
    warnings: list[str] = field(default_factory=list)  # pulumi.log.warn's messages
    by_name: dict[str, Resource] = field(init=False)

    def __post_init__(self):
        self.by_name = {r.name: r for r in self.resources}

    def of_type(self, type_: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_]

    def named(self, name: str) -> Resource:
        return self.by_name[name]

    def ancestors(self, resource: Resource) -> set[str]:
        """URNs of the resource and every component it sits under."""
        urns, parent = {resource.urn}, resource.parent
        by_urn = {r.urn: r for r in self.resources}
        while parent in by_urn:
            urns.add(parent)
            parent = by_urn[parent].parent
        return urns

    def depends_on(self, resource: Resource, target_name: str) -> bool:
        """Does `resource` (or a component above it) wait, directly or transitively, for target?"""
        by_urn = {r.urn: r for r in self.resources}
        target = self.named(target_name)
        seen, frontier = set(), set(self.ancestors(resource))
        while frontier:
            urn = frontier.pop()
            if urn in seen:
                continue
            seen.add(urn)
            if urn == target.urn or (urn in by_urn and target.urn in self.ancestors(by_urn[urn])):
                return True
            if urn in by_urn:
                for dep in by_urn[urn].dependencies:
                    frontier |= self.ancestors(by_urn[dep]) if dep in by_urn else {dep}
        return False


def stack_config(path: Path = STACK_FILE) -> dict[str, Any]:
    """The stack file's config as `twinspark:key -> value` (structured values kept)."""
    return dict(yaml.safe_load(path.read_text())["config"])


def config_blocks(config: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A stack's config (`twinspark:key -> value`; the stack file's when none is given) as
    parse_stack_config takes it: `key -> value`."""
    return {k.split(":", 1)[1]: v for k, v in (stack_config() if config is None else config).items()}


def run_program(
    config: dict[str, Any], preview: bool = False, extra_env: Optional[dict] = None,
    secret_keys: Sequence[str] = (),
    withheld_features: tuple[str, ...] = (),
    registry: str = "registry-day-1",
    hub: str = "",
    facts: Optional[dict[str, dict[str, Any]]] = None,
    prior: Optional[ProgramRun] = None,
    keyscan: Optional[Mapping[str, str]] = MappingProxyType({}),
) -> ProgramRun:
    """`secret_keys`: config keys the engine would mark secret (set with --secret).
    `withheld_features`: RESOURCE_MONITOR_FEATURE_* names the mock engine reports unsupported.
    `registry`: what the fake registry serves (another value: the tag moved); `hub`: what the fake
    hub's head is for an unset model.revision (another value: the branch moved); `facts`: per node,
    facts that differ from the recipe's platform; `prior`: the run whose state this one updates;
    `keyscan`: what each host shows `ssh-keyscan` (host -> key); by default no node answers (the
    program's host key check then leaves them to the steps), None runs the real ssh-keyscan
    (a test that puts its own on PATH).

    The per-node known_hosts files go to a fresh directory unless extra_env names one, so a run
    never sees, nor overwrites, what an operator's own deployment from this checkout recorded.
    """
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}
    with tempfile.TemporaryDirectory() as known_hosts, tempfile.NamedTemporaryFile("w", suffix=".json") as said:
        env = {**os.environ, "TWINSPARK_KNOWN_HOSTS_DIR": known_hosts, **(extra_env or {}),
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        json.dump({"registry": registry, "hub": hub, "facts": facts or {}, "keyscan": None if keyscan is None else dict(keyscan),
                   "prior": {r.name: {"compared": r.compared, "outputs": r.outputs}
                             for r in (prior.resources if prior else [])}}, said)
        said.flush()
        proc = PROGRAM_FORKS.run(
            [str(MOCK_PROGRAM), json.dumps(encoded), "preview" if preview else "up",
             json.dumps(list(secret_keys)), json.dumps(list(withheld_features)), said.name], env, ROOT)
    marker = proc.stdout.rfind("@@RESULT@@")
    if marker < 0:
        raise AssertionError(f"program run crashed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.loads(proc.stdout[marker + len("@@RESULT@@"):])
    resources = [
        Resource(
            type=r["type"], name=r["name"], urn=r["urn"], inputs=r["inputs"], parent=r["parent"],
            dependencies=r["dependencies"], provider=r["provider"], delete_before_replace=r["deleteBeforeReplace"],
            replace_with=r["replaceWith"], ignore_changes=r["ignoreChanges"], replace_on_changes=r["replaceOnChanges"],
            compared=r["compared"], outputs=r["outputs"], aliases=r["aliases"],
        )
        for r in data["resources"]
    ]
    return ProgramRun(resources, data["outputs"], data["error"], data["warnings"])


def unwrap(value):
    """Strip Pulumi's secret wrappers from recorded inputs."""
    if isinstance(value, dict):
        if SECRET_SIG in value:
            return unwrap(value["value"])
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


def plain_occurrences(value, needle, path="") -> list[str]:
    """Paths where `needle` appears in recorded inputs outside a secret wrapper."""
    if isinstance(value, dict):
        if SECRET_SIG in value:
            return []
        return [p for k, v in value.items() for p in plain_occurrences(v, needle, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in plain_occurrences(v, needle, f"{path}[{i}]")]
    return [path] if isinstance(value, str) and needle in value else []


@dataclass
class RunnerCall:
    """A remote command as the script runner sees it (components/remote.py)."""

    script: str
    args: list[str]
    secrets: dict[str, str]
    payload: str


def runner_call(resource: Resource, field: str = "create") -> RunnerCall:
    """Split a recorded command into its launch/ script, arguments, stdin secrets and payload."""
    import base64
    import re
    import shlex

    from components.remote import script_text

    argv = shlex.split(unwrap(resource.inputs[field]))
    assert argv[:2] == ["bash", "-c"], f"{resource.name}.{field} is not a runner call: {argv[:3]}"
    secret_names = re.findall(r"IFS= read -r (\w+);", argv[2])
    script, args = argv[3], argv[4:]
    stdin = unwrap(resource.inputs.get("stdin", ""))
    lines = stdin.split("\n", len(secret_names))
    secrets = {name: base64.b64decode(line).decode() for name, line in zip(secret_names, lines)}
    rest = lines[len(secret_names)] if secret_names else stdin
    text = script_text(script)
    assert rest.startswith(text), f"{resource.name}: stdin does not carry {script} behind the prelude"
    return RunnerCall(script, args, secrets, rest[len(text):])


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def compared_inputs(resource: Resource) -> dict[str, Any]:
    """The inputs as the engine compares them with the state: a path in ignore_changes keeps its
    stored value (pulumi/pulumi pkg/resource/deploy/step_generator.go, processIgnoreChanges ->
    PropertyPath.Reset), so it can never cause a diff; it is left out here (dotted paths only)."""
    return without_ignored(resource.inputs, resource.ignore_changes)


def without_ignored(recorded: dict[str, Any], ignore_changes: Sequence[str]) -> dict[str, Any]:
    inputs = unwrap(recorded)
    for path in ignore_changes:
        *parents, leaf = path.split(".")
        target = inputs
        for part in parents:
            target = target.get(part) if isinstance(target, dict) else None
        if isinstance(target, dict):
            target.pop(leaf, None)
    return inputs
