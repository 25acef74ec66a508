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
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

ROOT = Path(__file__).resolve().parent.parent
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # how the engine marks a secret input
STACK_FILE = ROOT / "Pulumi.spark.yaml"

_CHILD = r'''
import asyncio, hashlib, json, os, runpy, string, sys, traceback
sys.path.insert(0, "tests")
from program_harness import without_ignored
import pulumi
from pulumi.runtime import mocks as pm
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import wait_for_rpcs

config, preview, secret_keys = json.loads(sys.argv[1]), sys.argv[2] == "preview", json.loads(sys.argv[3])
withheld = {getattr(resource_pb2, name) for name in json.loads(sys.argv[4])}  # engine features to deny
# {"registry": str, "hub": str, "facts": {node: {fact: value}}, "keyscan": {host: key} | None, "prior": {...}}:
# a file (a prior state is large)
nodes_say = json.loads(open(sys.argv[5]).read())
if nodes_say["keyscan"] is not None:  # what each host shows ssh-keyscan; a host not named does not answer
    from core import host_keys
    def scan(host, port=22, timeout_s=10, key_type=host_keys.KEY_TYPE):
        if host not in nodes_say["keyscan"]:
            raise host_keys.HostKeyError(f"ssh-keyscan got no {key_type} key from {host} port {port}")
        return nodes_say["keyscan"][host]
    host_keys.scan = scan
records, exports, kept, given = [], {}, {}, {}

RECIPE_FACTS = {"os": "DGX OS 7.2.3", "kernel": "6.17.0-1029-nvidia", "driver": "580.173.02", "cuda": "13.0",
                "gpu": "NVIDIA GB10", "bios_version": "5.36_0ACUM030", "bios_date": "2026-05-20",
                "cma_total_kb": "0", "cma_free_kb": "0", "vllm": "0.25.2.dev0+g752a3a504", "torch": "2.11.0",
                "nccl": "2.30.7", "nccl_pip": None, "image_cuda": "13.0", "ray": "2.57.0"}

def node_answer(name, inputs):
    """What a simulated node prints for the steps whose stdout the program reads."""
    import shlex
    if name.endswith("image-pin-resolve"):  # serving.image's and each monitoring image's
        return "sha256:" + hashlib.sha256((nodes_say["registry"] + inputs["create"]).encode()).hexdigest()
    if name.endswith("-platform-facts"):
        argv = shlex.split(inputs["create"])
        node, image = (argv[argv.index(f) + 1] for f in ("--node", "--image"))
        base = argv[argv.index("--base") + 1] if "--base" in argv else None  # only where it was built
        facts = {**RECIPE_FACTS, "image": image, "image_base": base, **nodes_say["facts"].get(node, {})}
        return "ok\n" + json.dumps({"node": node, "facts": facts, "errors": {}})
    if name.endswith("-image-ship"):  # as ship-image.sh: the image ID the worker now holds
        argv = shlex.split(inputs["create"])
        return f"12:00:00 ship-image: loaded\n{argv[argv.index('--id') + 1]}\n"
    if "sync-key" in name:
        return "ssh-ed25519 AAAAC3NzaFAKEKEY twinspark-weights@" + name.rsplit("-", 1)[-1]
    if name.endswith("-weights-revision"):  # as fetch-weights.sh resolve: a log line, then the commit
        argv = shlex.split(inputs["create"])
        asked = argv[argv.index("--revision") + 1] if "--revision" in argv else ""
        repo = argv[argv.index("--repo") + 1]
        commit = asked or hashlib.sha1((nodes_say["hub"] + repo).encode()).hexdigest()  # the hub's head
        return f"12:00:00 fetch-weights: resolved: {repo}@{asked} is commit {commit}\n{commit}\n"
    return ""

def fake_outputs(type_, name, inputs):
    out = dict(inputs)
    if type_ == "docker:index/image:Image":
        out["repoDigest"] = "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    if type_ == "docker:index/remoteImage:RemoteImage":
        out["imageId"] = "sha256:" + hashlib.sha256(inputs["name"].encode()).hexdigest()
    if type_ == "random:index/randomPassword:RandomPassword":
        # as the provider generates it: the length asked for, letters and digits (special=False);
        # each secret its own value, the same on every run
        alphabet = string.ascii_letters + string.digits
        seed = hashlib.sha256(name.encode()).digest() * 8
        out["result"] = "".join(alphabet[b % len(alphabet)] for b in seed)[:int(inputs["length"])]
    if type_ == "command:remote:Command":
        out["stdout"] = node_answer(name, inputs)
        out["stderr"] = ""
    return out

class Mocks(pm.Mocks):
    def new_resource(self, args):
        outputs = kept.pop(args.name, None) or fake_outputs(args.typ, args.name, args.inputs)
        given[args.name] = outputs
        return [args.name + "_id", outputs]
    def call(self, args):
        return {}

class RecordingMonitor(pm.MockMonitor):
    def GetDeploymentInfo(self, request):
        # an older engine: what it cannot do is missing from the features it reports
        info = super().GetDeploymentInfo(request)
        return resource_pb2.DeploymentInfo(supportedFeatures=[f for f in info.supportedFeatures if f not in withheld])

    def RegisterResource(self, request):
        from google.protobuf import json_format
        inputs = json_format.MessageToDict(request.object)
        before = nodes_say["prior"].get(request.name)
        now = without_ignored(inputs, list(request.ignoreChanges))
        if before is not None and before["compared"] == now:  # no diff: the state's outputs stay
            kept[request.name] = before["outputs"]
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            records.append({"urn": response.urn, "compared": now, "outputs": given.get(request.name, {}),
                "type": request.type, "name": request.name, "custom": request.custom,
                "parent": request.parent, "dependencies": list(request.dependencies),
                "provider": request.provider, "deleteBeforeReplace": request.deleteBeforeReplace,
                "replaceWith": list(request.replace_with),
                "ignoreChanges": list(request.ignoreChanges), "replaceOnChanges": list(request.replaceOnChanges),
                "inputs": inputs,
                "aliases": [json_format.MessageToDict(a) for a in request.aliases],
            })
        return response

mocks = Mocks()
# what the program says through pulumi.log at WARNING (the mock engine logs it to this logger)
import logging
warned = []
class Recording(logging.Handler):
    def emit(self, record):
        warned.append(record.getMessage())
engine_log = logging.getLogger("twinspark-engine")
engine_log.addHandler(Recording(logging.WARNING))
engine_log.propagate = False
pm.set_mocks(mocks, project="twinspark", stack="spark", preview=preview, monitor=RecordingMonitor(mocks),
             logger=engine_log)
pulumi.runtime.set_all_config(config, secret_keys)

def export(name, value):
    exports[name] = pulumi.Output.from_input(value)
pulumi.export = export

async def resolve():
    result = {}
    for name, out in exports.items():
        result[name] = {"value": await out.future(), "secret": await out.is_secret()}
    return result

loop = asyncio.get_event_loop()
error = None
try:
    runpy.run_path("__main__.py", run_name="__main__")
    outputs = loop.run_until_complete(resolve())
    loop.run_until_complete(wait_for_rpcs())
except pulumi.RunError as e:
    error, outputs = {"kind": "RunError", "message": str(e)}, {}
except Exception as e:
    error, outputs = {"kind": type(e).__name__, "message": traceback.format_exc()}, {}
if error is not None:
    # as the SDK does after a failed program (pulumi/runtime/stack.py, run_pulumi_func): what
    # was registered before the error still reaches the engine, so it is recorded here too
    try:
        loop.run_until_complete(wait_for_rpcs())
    except Exception:
        pass  # the failure already reported, seen again by an outstanding RPC
print("@@RESULT@@" + json.dumps({"resources": records, "outputs": outputs, "error": error, "warnings": warned},
                              default=str))
'''


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
    keyscan: Optional[dict[str, str]] = {},
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
        env = {**os.environ, "TWINSPARK_KNOWN_HOSTS_DIR": known_hosts, **(extra_env or {})}
        json.dump({"registry": registry, "hub": hub, "facts": facts or {}, "keyscan": keyscan,
                   "prior": {r.name: {"compared": r.compared, "outputs": r.outputs}
                             for r in (prior.resources if prior else [])}}, said)
        said.flush()
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(encoded), "preview" if preview else "up",
             json.dumps(list(secret_keys)), json.dumps(list(withheld_features)), said.name],
            cwd=ROOT, capture_output=True, text=True, env=env, timeout=300,
        )
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
