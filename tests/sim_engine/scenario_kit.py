"""The simulator's scenarios' helpers (its fixtures and hooks are conftest.py's): the stack through
the real Pulumi CLI (`EngineStack`, `EngineRun`), and readings of the simulated nodes and of the
engine's state a scenario asserts on (containers, processes, the sync key's admissions, the
firewall's answers to probes, the guard's verdict), and the waits, on the session's timeline."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

import sim_images
import toolbox
from cluster import SIM_STACK, SimCluster
from core import contract
from ops.verify_weights import copy_again_steps
from program_harness import SECRET_SIG
from timeline import TIMELINE, deleted_twice, slowest_steps, step_trace

ROOT = Path(__file__).resolve().parents[2]
# The engine writes the stack's state once a command, not at every step: a fresh up's checkpoints
# are half its CPU (3 MB of state each time; docs/measurements/pulumi-skip-checkpoints-2026-12-06.md),
# and what a scenario asserts is the state a command leaves, written at its end, failed or not. The
# interrupted up keeps them, as a user's `pulumi up` does: what a ^C leaves is its point.
SKIP_CHECKPOINTS = "PULUMI_SKIP_CHECKPOINTS"
PASSPHRASE = "twinspark-sim"  # scripts/sim.sh's; Pulumi.sim.yaml's encryptionsalt is made with it
STACK = "sim"
HEAD, WORKER = "sim1", "sim2"
# The figures a scenario can measure beside what it asserts (the weight copy against the recipe's
# rsync, the fan-out against all from the head): timings, not behaviour, so only when asked
# (`TWINSPARK_SIM_FIGURES=1 ./scripts/test.sh tests/sim_engine -k ...`), not in CI's run
FIGURES = os.environ.get("TWINSPARK_SIM_FIGURES") == "1"
# pytest-xdist's worker (gw0, gw1), or none in a single process; its number is the site of its cluster
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
SITE = int(XDIST_WORKER.removeprefix("gw") or 0)


def engine_environment() -> dict[str, str]:
    """The environment `eval "$(scripts/engine.sh env)"` gives a shell."""
    out = subprocess.run(["bash", "-c", 'eval "$(scripts/engine.sh env)" && env -0'], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


@dataclass
class EngineRun:
    """One CLI command's result: the engine's own JSON (the events of up/refresh/destroy --json,
    the document of preview --json)."""
    events: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    text: str = ""

    @property
    def summary(self) -> dict[str, int]:
        for event in reversed(self.events):
            if "summaryEvent" in event:
                return event["summaryEvent"]["resourceChanges"]
            if "changeSummary" in event:
                return event["changeSummary"]
        return {}

    def errors(self) -> str:
        """The resources' own error diagnostics (which step failed, and its output's tail)."""
        return "\n".join(f"{e['diagnosticEvent'].get('urn', '').rsplit('::', 1)[-1] or 'pulumi'}: "
                         f"{e['diagnosticEvent']['message'][-12000:]}"
                         for e in self.events if "diagnosticEvent" in e and e["diagnosticEvent"].get("severity") == "error")

    def steps(self) -> list[dict]:
        """Each resource step the engine took (or, in a preview, would take): op, urn, ..."""
        out = []
        for event in self.events:
            if "steps" in event:  # preview --json
                out += event["steps"]
            elif "resOutputsEvent" in event:
                out.append(event["resOutputsEvent"]["metadata"])
        return out


class EngineStack:
    """The sim stack through the real CLI, every command against the session's config file."""

    def __init__(self, env: dict[str, str], project: Path):
        self.env, self.project = env, project
        self.config_file = project / SIM_STACK.name
        self.state = Path(urlsplit(env["PULUMI_BACKEND_URL"]).path)
        self._answers: dict[tuple, tuple[tuple, Any]] = {}  # CLI arguments: (the state's stamp, the answer)

    def _argv(self, *args: str) -> list[str]:
        return ["pulumi", *args, "--stack", STACK, "--non-interactive"]

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        with TIMELINE.span("cli", " ".join(args[:2])):
            return subprocess.run(self._argv(*args), cwd=self.project, env={**os.environ, **self.env},
                                  capture_output=True, text=True, check=check)

    def _run(self, *args: str) -> EngineRun:
        started = time.monotonic()
        with TIMELINE.span("pulumi", " ".join(a.rsplit("::", 1)[-1] for a in args
                                              if a not in ("--yes", "--skip-preview"))) as details:
            proc = self.cli(*args, "--json", check=False)
            seconds = round(time.monotonic() - started, 1)
            events = []
            for line in proc.stdout.splitlines() if args[0] != "preview" else [proc.stdout]:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
            details["steps"], details["trace"] = slowest_steps(events), step_trace(events)
        run = EngineRun(events, seconds, proc.stdout[-4000:] + proc.stderr[-4000:])
        if twice := deleted_twice(events):
            raise AssertionError(f"pulumi {' '.join(args)} deleted {', '.join(twice)} twice for one replacement "
                                 f"(exit {proc.returncode}):\n{run.errors()}")
        if proc.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} failed ({proc.returncode}):\n{run.errors() or run.text}")
        return run

    def up_interrupted(self, step: str, *args: str) -> tuple[EngineRun, int]:
        """`pulumi up` with SIGINT (a ^C) once the engine has started `step`: the run's events and
        the CLI's exit status."""
        started = time.monotonic()
        with TIMELINE.span("pulumi", f"up interrupted at {step}") as details:
            with_checkpoints = {k: v for k, v in {**os.environ, **self.env}.items() if k != SKIP_CHECKPOINTS}
            proc = subprocess.Popen(self._argv("up", "--yes", "--skip-preview", *args, "--json"), cwd=self.project,
                                    env=with_checkpoints, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            events = []
            for line in proc.stdout:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
                pre = events[-1].get("resourcePreEvent", {}).get("metadata", {})
                if pre.get("urn", "").endswith(f"::{step}") and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
                    events.append({"interrupted": step})
            proc.wait(timeout=600)
            details["steps"], details["trace"] = slowest_steps(events), step_trace(events)
        return EngineRun(events, round(time.monotonic() - started, 1), proc.stderr.read()[-4000:]), proc.returncode

    def up(self, *args: str) -> EngineRun:
        return self._run("up", "--yes", "--skip-preview", *args)

    def preview(self, *args: str) -> EngineRun:
        return self._run("preview", *args)

    def refresh(self, *args: str) -> EngineRun:
        return self._run("refresh", "--yes", "--skip-preview", *args)

    def destroy(self, *args: str) -> EngineRun:
        return self._run("destroy", "--yes", "--skip-preview", *args)

    def set_config(self, path: str, value: str) -> None:
        self.cli("config", "set", "--path", f"twinspark:{path}", value)

    def stack_file(self) -> dict[str, Any]:
        """The stack's Pulumi.sim.yaml as it is now (its `config`, its encryptionsalt)."""
        return yaml.safe_load(self.config_file.read_text())

    def state_stamp(self) -> tuple:
        """Each stack checkpoint of the file backend, by inode, size and mtime: whoever changes the
        stack (an up here, `ops upgrade`'s own CLI) writes one of them anew."""
        return tuple(sorted((str(f), st.st_ino, st.st_size, st.st_mtime_ns) for f in self.state.glob(".pulumi/stacks/**/*")
                            if f.is_file() and (st := f.stat())))

    def _as_of_the_state(self, *args: str) -> Any:
        """The CLI's JSON answer to `args`, asked again only when the state has changed since the
        last answer (a reading of the state costs a CLI start and a decrypt; ~80 a run)."""
        stamp = self.state_stamp()
        if self._answers.get(args, (None,))[0] != stamp:
            self._answers[args] = (stamp, json.loads(self.cli(*args).stdout))
        return copy.deepcopy(self._answers[args][1])

    def outputs(self) -> dict[str, Any]:
        """`pulumi stack output --json --show-secrets`, as of the state."""
        return self._as_of_the_state("stack", "output", "--json", "--show-secrets")

    def export(self, show_secrets: bool = False) -> dict:
        """The stack's state; with show_secrets its secret values in the clear (state_value unwraps
        them)."""
        return self._as_of_the_state("stack", "export", *(["--show-secrets"] if show_secrets else []))["deployment"]


def engine_stack(engine_env: dict[str, str], operator_home: Path, stack_file_text: str, name: str = "") -> EngineStack:
    """A project of the program's files (linked) with its own Pulumi.sim.yaml, state and
    first-contact host key records under operator_home (`name` tells a second one's apart)."""
    project, state, records = (operator_home / f"{name}{part}" for part in ("project", "state", "known_hosts.d"))
    project.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (SIM_STACK.name, ".twinspark", ".git", "build"):
            (project / entry.name).symlink_to(entry)
    (project / SIM_STACK.name).write_text(stack_file_text)
    state.mkdir(exist_ok=True)
    # the first-contact host key records too: this session's nodes are new, with keys of their own
    env = {**engine_env, "HOME": str(operator_home), "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
           "PULUMI_BACKEND_URL": f"file://{state}", "TWINSPARK_KNOWN_HOSTS_DIR": str(records),
           SKIP_CHECKPOINTS: "true"}
    engine = EngineStack(env, project)
    engine.cli("stack", "select", "--create")
    return engine


def timed_cluster(sim: SimCluster) -> None:
    """The cluster's power operations and logins on the session's timeline."""
    for method in ("up", "down", "add_node", "remove_node", "reboot", "reinstall"):
        TIMELINE.wrap(sim, method, "node", lambda *a, **k: " ".join(str(x) for x in a if isinstance(x, str)))
    TIMELINE.wrap(sim, "ssh", "ssh", lambda node, command, *a, **k: f"{node}: {command[:80]}")
    TIMELINE.wrap(sim, "node_exec", "ssh", lambda node, *argv, **k: f"{node}: {' '.join(map(str, argv))[:80]}")


SHIMS_LOG = "/var/log/twinspark-sim/shims.log"  # the recording shims' (tests/sim/shims): systemctl, sysctl, ...


def shim_calls(cluster, node: str, since: float = 0.0) -> list[str]:
    """The shims' records on that node ("EPOCH.NS CALL ARGS..."), those from `since` (epoch seconds) on."""
    out = cluster.node_exec(node, "cat", SHIMS_LOG, check=False).stdout
    return [line for line in out.splitlines() if line.strip() and float(line.split(None, 1)[0]) >= since]


@dataclass
class FreshUp:
    """The session's first `pulumi up`, and what only that moment shows: a fresh login's memlock
    before it, the shims' records and the engine's state right after it (later scenarios re-run
    steps, and a reinstall wipes a node's records)."""
    run: EngineRun
    login_memlock_before: dict[str, str]
    shim_calls: dict[str, list[str]]
    state: dict


# ---- what the scenarios read off the nodes and the endpoint -----------------------------------
def containers(cluster, node: str) -> dict[str, tuple[str, str]]:
    """name -> (id, started at), from the node's own dockerd."""
    out = cluster.ssh(node, "docker ps -aq | xargs -r docker inspect --format "
                            "'{{.Name}} {{.Id}} {{.State.StartedAt}}'").stdout
    return {name.lstrip("/"): (cid, started) for name, cid, started in (line.split() for line in out.splitlines())}


def completion(stack_outputs: dict, key: str) -> httpx.Response:
    return httpx.post(f"{stack_outputs['endpoint']}/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": stack_outputs["model"], "max_tokens": 8,
                            "messages": [{"role": "user", "content": "hello"}]})


def completion_status(outputs: dict, key: str):
    """The gateway's answer to a completion, or None while nothing answers."""
    try:
        return completion(outputs, key).status_code
    except httpx.HTTPError:
        return None


def node_processes(cluster, node: str, pattern: str) -> dict[str, str]:
    """The node's processes whose command line matches `pattern`: {pid: command}, as the node's
    pgrep sees them (the pattern's own pgrep, and whatever runs it on the node, left out)."""
    out = cluster.node_exec(node, "pgrep", "-af", pattern, check=False).stdout
    return dict(line.split(" ", 1) for line in out.splitlines()
                if " " in line and "pgrep" not in line and "nsenter" not in line)


def sshd_throttled_lines(cluster, node: str) -> int:
    """The lines where the node's sshd refused a login at MaxStartups (OpenSSH logs the throttling's
    start and each connection it drops)."""
    log = cluster.node_exec(node, "cat", "/var/log/twinspark-sim/sshd.log").stdout
    return sum("MaxStartups throttling" in line or "drop connection" in line for line in log.splitlines())


def sync_key_access(cluster, node: str) -> dict[str, object]:
    """On `node`: the sync keys its authorized_keys admits (their sources), and whether the forced
    command they would run is installed. After an `up`, every key's steps are done: none admitted."""
    keys = cluster.node_exec(node, "cat", f"/home/{cluster.cfg.ssh.user}/.ssh/authorized_keys", check=False).stdout
    forced = cluster.node_exec(node, "test", "-f", f"{contract.SYNC_KEY_COMMAND_DIR}/sync-key-command.py",
                               check=False)
    return {"admitted": sorted(line.split('"')[1] for line in keys.splitlines()
                               if f" {contract.SYNC_KEY_COMMENT}@" in line),
            "forced command": forced.returncode == 0}


def stored_authorization(state: dict, worker: str, relay: bool = False) -> str:
    """The authorized_keys line the engine's `{worker}-weights-[relay-]authorize` step installs (its payload)."""
    stdin = stored_step(state, f"{worker}-weights-{'relay-' if relay else ''}authorize")["inputs"]["stdin"]
    return next(line for line in reversed(stdin.splitlines()) if line.startswith('from="'))


@contextmanager
def sync_key_admitted(cluster, worker: str, line: str, directory: str = "", plain: bool = False):
    """`line` (stored_authorization) in the worker's authorized_keys while the block runs, as the
    authorize step leaves it for its steps: for a measurement that runs a step's command itself
    after `up` revoked the key. `directory`: its forced command bound to another model directory;
    `plain`: without the forced command (the recipe's rsync over ssh: a login)."""
    if directory:
        line = re.sub(r"--dir \S+", f"--dir {shlex.quote(directory)}", line)
    if plain:
        line = re.sub(r',command="[^"]*"', "", line)
    keys = f"/home/{cluster.cfg.ssh.user}/.ssh/authorized_keys"
    cluster.node_exec(worker, "sh", "-c", 'printf "%s\\n" "$1" >> "$0"', keys, line)
    try:
        yield
    finally:
        cluster.node_exec(worker, "python3", "-c", "import sys; p, gone = sys.argv[1:]; lines = open(p).read().splitlines(); "
                          "open(p, 'w').write(''.join(l + chr(10) for l in lines if l != gone))", keys, line)


def serves(outputs: dict) -> bool:
    """The gateway answers a completion with the outputs' key. The outputs are read once by the
    caller: a wait that ran the CLI each poll took a core from the recovery it waits on."""
    return completion_status(outputs, outputs["apiKey"]) == 200


def serving_answers(stack) -> int:
    outputs = stack.outputs()
    return completion(outputs, outputs["apiKey"]).status_code


def file_state(cluster, node: str, path: str):
    """[mode, owner, group, mtime (nanoseconds, as stat prints it)] of a file on the node; None where it is absent."""
    out = cluster.node_exec(node, "stat", "-c", "%a %U %G %y", path, check=False)
    return out.stdout.split() if out.returncode == 0 else None


def state_value(value):
    """A value of `pulumi stack export --show-secrets` with its secrets unwrapped (each is
    {SECRET_SIG: ..., "plaintext": JSON}), at any depth."""
    if isinstance(value, dict):
        if SECRET_SIG in value:
            plaintext = value.get("plaintext")
            if plaintext is None:
                raise AssertionError("a secret without its plaintext: export the state with show_secrets=True")
            return state_value(json.loads(plaintext))
        return {k: state_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [state_value(v) for v in value]
    return value


def stored_step(state: dict, name: str) -> dict:
    """One command:remote:Command as the engine keeps it: {"inputs": {create, delete, stdin,
    connection, ...}, "outputs": {stdout, stderr, ...}}, secrets unwrapped (state: export(show_secrets=True))."""
    (resource,) = [r for r in state["resources"] if r["urn"].endswith(f"::{name}") and r["type"] == "command:remote:Command"]
    return {"inputs": state_value(resource.get("inputs", {})), "outputs": state_value(resource.get("outputs", {}))}


def hub_commit(stack, repo: str) -> str:
    """The commit the hub stand-in (conftest.py `hub`, on this machine) publishes for the repo, as a client reads it."""
    port = urlsplit(stack.stack_file()["config"]["twinspark:model"]["hubEndpoint"]).port
    trust = ssl.create_default_context(cafile=sim_images.REGISTRY_CA)
    trust.check_hostname = False  # on loopback, not the name the nodes reach it by (the certificate's)
    answer = httpx.get(f"https://127.0.0.1:{port}/api/models/{repo}", timeout=30, verify=trust)
    answer.raise_for_status()
    return answer.json()["sha"]


@contextmanager
def rails_throttled(cluster, node: str, rate: str):
    """The node's egress on every rail held to `rate` (tc's token bucket): a copy from it is slow
    enough to be caught in flight."""
    rails = [rail.iface for rail in cluster.nodes[node].spec.rails]
    for rail in rails:
        cluster.in_netns(node, "tc", "qdisc", "add", "dev", rail, "root", "tbf", "rate", rate,
                         "burst", "256kb", "latency", "400ms")
    try:
        yield
    finally:
        for rail in rails:
            cluster.in_netns(node, "tc", "qdisc", "del", "dev", rail, "root", check=False)


def urn_of(stack, name: str) -> str:
    (urn,) = [r["urn"] for r in stack.export()["resources"] if r["urn"].endswith(f"::{name}")]
    return urn


def copy_again_args(stack, worker: str, *before: str) -> list[str]:
    """`--replace` of `before` (step names) and of the worker's copy as docs/operating.md and `ops
    verify-weights` give it: the copy with its source's key admitted around it, then revoked."""
    urns = {r["urn"].rsplit("::", 1)[-1]: r["urn"] for r in stack.export()["resources"]}
    return [a for name in [*before, *copy_again_steps(worker, urns)] for a in ("--replace", urns[name])]


def serving_events(cluster, node: str, since: float, action: str) -> list[float]:
    """When the node's serving container had `action` (die, start, restart) since `since`, from
    dockerd's own event log (a `docker restart` is the guard's; a start without one, the policy's)."""
    out = cluster.ssh(node, f"docker events --since {since:.3f} --until \"$(date +%s.%N)\" --filter type=container "
                            f"--filter container={contract.SERVING_CONTAINER} "
                            f"--filter event={action} --format '{{{{.TimeNano}}}}'")
    assert out.returncode == 0, out.stderr
    return [int(t) / 1e9 for t in out.stdout.split()]


def serving_pid(cluster, node: str) -> str:
    return cluster.ssh(node, f"docker inspect --format '{{{{.State.Pid}}}}' {contract.SERVING_CONTAINER}").stdout.strip()


def prometheus(cluster, path: str, query: str = "") -> dict:
    """The head's Prometheus (loopback only), asked on the head."""
    url = f"http://127.0.0.1:{contract.PROMETHEUS_PORT}{path}"
    out = cluster.node_exec(HEAD, "curl", "-sfG", url, *(["--data-urlencode", f"query={query}"] if query else []),
                            check=False)
    return json.loads(out.stdout)["data"] if out.returncode == 0 else {"result": [], "alerts": []}  # not up yet


def scrape_s(stack) -> float:
    """One scrape and one rule evaluation (observability.scrapeIntervalSeconds, default 15)."""
    return stack.stack_file()["config"].get("twinspark:observability", {}).get("scrapeIntervalSeconds", 15)


def guard_verdict(cluster) -> dict:
    out = cluster.node_exec(HEAD, "cat", contract.SERVING_GUARD_STATUS, check=False).stdout
    return json.loads(out) if out.strip() else {}


def wait_for(check, what: str, timeout_s: float, **options):
    """toolbox.wait_for on the session's timeline, asking once a second (a node's answer costs a
    login)."""
    with TIMELINE.span("wait", what, bound=timeout_s):
        return toolbox.wait_for(check, what, timeout_s, interval_s=options.pop("interval_s", 1.0), **options)


def pause(seconds: float, why: str) -> None:
    """A fixed wait, on the timeline (prefer wait_for on the event itself)."""
    with TIMELINE.span("pause", why, bound=seconds):
        time.sleep(seconds)


def vllm_argv(cluster, head: str = HEAD) -> list[str]:
    """What the head's engine was started with (the vLLM stand-in writes it to the log dir)."""
    out = cluster.node_exec(head, "cat", f"{contract.LOG_DIR}/vllm-argv.json").stdout
    return json.loads(out)["argv"]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def serving_settings(stack) -> dict:
    return stack.stack_file()["config"]["twinspark:serving"]


def guard_round_s(stack) -> float:
    """The longest a guard round can take, its retries included (interval, then each failing
    attempt's deadline and retry pause, up to failuresBeforeRestart)."""
    g = serving_settings(stack)["guard"]
    return g["intervalSeconds"] + g["failuresBeforeRestart"] * (g["deadlineSeconds"] + g["retrySeconds"])


def with_an_empty_restart_count(cluster, stack) -> None:
    """Serving answers and the guard has passed a round with an empty restart count: the faults
    before restarted the head on purpose, not in a loop (two faults within the guard's restart
    window would count together and rightly hold serving)."""
    wait_for(lambda: serving_answers(stack) == 200, "serving before the fault", readiness_s(stack))
    cluster.node_exec(HEAD, "bash", "-c", f"systemctl stop {contract.SERVING_GUARD_UNIT}; rm -f {contract.SERVING_HOLD} "
                      f"{contract.SERVING_GUARD_RESTARTS} {contract.SERVING_GUARD_STATUS}; "
                      f"systemctl start {contract.SERVING_GUARD_UNIT}")
    wait_for(lambda: guard_verdict(cluster).get("ok") is True, "a passing guard round", 2 * guard_round_s(stack))


def readiness_s(stack) -> float:
    """What `pulumi up` waits for serving (serving.readinessTimeoutMinutes): a recovery is due within it."""
    return serving_settings(stack)["readinessTimeoutMinutes"] * 60


def recorder(cluster, node: str, *verb: str) -> dict:
    """The node recorder's `list` or `show NAME` on a node, as JSON (launch/node-recorder.py)."""
    done = cluster.node_exec(node, "python3", contract.NODE_RECORDER, *verb, "--dir", contract.FORENSICS_DIR)
    return json.loads(done.stdout)


def run_ops(*args: str) -> subprocess.CompletedProcess:
    with TIMELINE.span("ops", args[0]):
        return subprocess.run([sys.executable, "-m", "ops", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def ops_access(cluster, outputs: dict, operator_home: Path) -> list[str]:
    """A day-2 tool's flags for this cluster: the outputs as `pulumi stack output --json
    --show-secrets` gives them, the operator's key, the sim's throwaway host keys."""
    outputs_file = operator_home / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    return ["--outputs-file", str(outputs_file), "--ssh-key", str(cluster.key),
            "--ssh-option", "StrictHostKeyChecking=no", "--ssh-option", "UserKnownHostsFile=/dev/null"]


# ---- the host firewall against its table of flows (docs/security.md, components/firewall.py) ------
FIREWALL_PROBE = """
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
jobs = json.loads(sys.argv[1])
def reach(job):
    source, address, port = job
    with socket.socket() as s:
        s.settimeout(1.5)
        s.bind((source, 0))
        return s.connect_ex((address, port)) == 0
with ThreadPoolExecutor(max(1, min(512, len(jobs)))) as pool:  # a dropped port costs its timeout: all at once
    print(json.dumps(list(pool.map(reach, jobs))))
"""


def listening_sockets(cluster, node: str) -> set[tuple[str, int]]:
    """(address, port) of each TCP listener but loopback's; address "" for a wildcard."""
    found = set()
    for line in cluster.in_netns(node, "ss", "-Hltn").stdout.splitlines():
        address, port = line.split()[3].rsplit(":", 1)
        address = address.strip("[]").split("%")[0]
        if address.startswith(("127.", "::1", "::ffff:127.")):
            continue
        found.add(("" if address in ("0.0.0.0", "::", "*") else address.removeprefix("::ffff:"), int(port)))
    return found


def stack_topology(stack):
    """What the program's Topology is for the stack as it is now (its nodes, executor, observability)."""
    from components.config import Topology, parse_stack_config, resolve_node_addresses

    config = {k.split(":", 1)[1]: v for k, v in stack.stack_file()["config"].items()
              if k.startswith("twinspark:") and not (isinstance(v, dict) and "secure" in v)}
    cfg = parse_stack_config(config)
    return Topology(cfg, resolve_node_addresses(cfg.nodes))


def firewall_mismatches(cluster, stack) -> tuple[int, list[str]]:
    """Every TCP port each node listens on, tried from every other node's addresses (its LAN
    address to the node's, each of its rail addresses to the node's end of that rail), against
    what the node's flows admit (components/firewall.py: the table docs/security.md shows; the
    weight copy's set empty, no copy running). (probes, mismatches)."""
    from components.firewall import firewall_policy

    topology = stack_topology(stack)
    nodes = {n.name: n for n in topology.cfg.nodes}
    listening = {name: listening_sockets(cluster, name) for name in nodes}
    jobs: dict[str, list[tuple[str, str, int, str, bool]]] = {name: [] for name in nodes}
    for target, spec in nodes.items():
        admits = firewall_policy(spec, topology).admits
        for prober, other in nodes.items():
            if prober == target:
                continue
            ends = [(other.host, spec.host, None)]  # the LAN: never a rail's interface
            ends += [(mine.ip, theirs.ip, theirs.iface) for mine, theirs in topology.link_rails(other, spec)]
            for source, address, iface in ends:
                for bound, port in sorted(listening[target]):
                    if bound not in ("", address):
                        continue
                    admitted = any(lo <= port <= hi for a in admits for lo, hi in a.ports
                                   if (not a.sources or source in a.sources) and a.iface in (None, iface))
                    jobs[prober].append((source, address, port, target, admitted))
    wrong, probes = [], 0
    for prober, batch in jobs.items():
        probes += len(batch)
        if not batch:
            continue
        got = json.loads(cluster.in_netns(prober, sys.executable, "-c", FIREWALL_PROBE,
                                          json.dumps([[s, a, p] for s, a, p, _, _ in batch])).stdout)
        wrong += [(prober, *job, reached) for job, reached in zip(batch, got) if job[-1] != reached]
    # a listener that closed meanwhile (a Ray worker's) is no mismatch: it was not there to reach
    still = {name: {port for _, port in listening_sockets(cluster, name)} for name in nodes}
    return probes, [f"{prober} {source} -> {target} {address}:{port}: {'reached' if reached else 'dropped'}, "
                    f"the flows say {'admit' if admitted else 'drop'}"
                    for prober, source, address, port, target, admitted, reached in wrong
                    if reached or port in still[target]]


def name_of(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def changes(run) -> dict[str, str]:
    """resource name -> the engine's op, for every step that is not `same`."""
    return {name_of(m["urn"]): m["op"] for m in run.steps() if m["op"] != "same"}


def copy_again(stack, worker: str = WORKER, *before: str):
    """`pulumi up --replace` of `before` and of the worker's copy, its key's window around it."""
    return stack.up(*copy_again_args(stack, worker, *before))


def step_output(stack, name: str) -> str:
    """What the step printed (stdout, then stderr) as the engine keeps it in the state."""
    deployment = json.loads(stack.cli("stack", "export", "--show-secrets").stdout)["deployment"]
    (outputs,) = [r.get("outputs", {}) for r in deployment["resources"] if r["urn"].endswith(f"::{name}")]
    return f"{outputs.get('stdout', '')}\n{outputs.get('stderr', '')}"


def model_dir(stack) -> str:
    return stack.stack_file()["config"]["twinspark:model"]["dir"]


def manifest(cluster, stack) -> dict:
    """The head's manifest (launch/weights.py `pin`): {repo, revision, files: {path: {size, sha256}}}."""
    return json.loads(cluster.node_exec(HEAD, "cat", f"{model_dir(stack)}/{contract.WEIGHTS_MANIFEST}").stdout)


def worker_matches_head(cluster, stack) -> bool:
    return sha256s(cluster, stack, WORKER) == {f: e["sha256"] for f, e in manifest(cluster, stack)["files"].items()}


def each_rail_rx_bytes(cluster, node: str = WORKER) -> list[int]:
    """What each rail of the node received so far, in the node's rail order."""
    return [int(cluster.in_netns(node, "cat", f"/sys/class/net/{rail.iface}/statistics/rx_bytes").stdout)
            for rail in cluster.nodes[node].spec.rails]


def rails_rx_bytes(cluster, node: str = WORKER) -> int:
    return sum(each_rail_rx_bytes(cluster, node))


def heals(cluster, stack, worker: str, report, prefix: str) -> None:
    """What the pair's healing scenarios do, at this size: the head's engine killed (every worker
    leaves the dead cluster and joins the next), then one worker powered off and on, each from an
    empty restart count as the pair's are."""
    outputs = stack.outputs()
    with_an_empty_restart_count(cluster, stack)
    since = time.time()
    cluster.node_exec(HEAD, "kill", "-9", serving_pid(cluster, HEAD))
    wait_for(lambda: serving_events(cluster, worker, since, "die"), f"{worker} leaving the dead head",
             readiness_s(stack))
    wait_for(lambda: serves(outputs), "serving after the head's engine was killed", readiness_s(stack))
    report[f"{prefix}_head_killed_to_serving_s"] = round(time.time() - since, 1)
    with_an_empty_restart_count(cluster, stack)
    since = time.time()
    cluster.reboot(worker)
    wait_for(lambda: serves(outputs), f"serving after {worker} rebooted", readiness_s(stack))
    report[f"{prefix}_worker_rebooted_to_serving_s"] = round(time.time() - since, 1)


def sha256s(cluster, stack, node: str) -> dict[str, str]:
    """Every weights file's sha256 on that node, hashed here by sha256sum, not by weights.py."""
    files = sorted(manifest(cluster, stack)["files"])
    out = cluster.node_exec(node, "bash", "-c", 'cd "$0" && sha256sum -- "$@"', model_dir(stack), *files,
                            check=False).stdout
    return {line.split(None, 1)[1].strip(): line.split()[0] for line in out.splitlines()}
