"""The docker provider built here (dev/engine/providers/docker) under the real Pulumi engine,
against a real dockerd reached as the program reaches the nodes: ssh://user@host.

A dockerd of the test's own (never the system's), an sshd on loopback whose sessions point
DOCKER_HOST at it, a base image imported from busybox-static (no registry is reachable), and a
tiny project with docker.Provider, docker.Image (skip_push) and a docker.Container from its
repo_digest. Nothing here skips: without the engine, the provider, dockerd or root the tests
fail and say what is missing (CI installs them; `scripts/engine.sh build docker` builds the
provider).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

import pulumi_docker
from pulumi._types import input_type_py_to_pulumi_names
from ssh_fixtures import new_key, sshd_argv
from toolbox import free_port, wait_for

REPO = Path(__file__).resolve().parents[1]
DOCKER_VERSION = json.loads((Path(pulumi_docker.__file__).parent / "pulumi-plugin.json").read_text())["version"]
BASE_IMAGE = "twinspark-base:1"
IMAGE = "twinspark-check:1"
CONTAINER = "twinspark-check"
BUSYBOX = Path("/usr/bin/busybox")  # Debian's busybox-static


@pytest.fixture(scope="module")
def engine(engine_env) -> dict[str, str]:
    """The engine's environment (conftest.py), with the docker provider built."""
    plugin = Path(engine_env["PULUMI_HOME"]) / "plugins" / f"resource-docker-v{DOCKER_VERSION}" / "pulumi-resource-docker"
    if not os.access(plugin, os.X_OK):
        pytest.fail(f"{plugin} is missing: scripts/engine.sh build docker")
    return engine_env


class Dockerd:
    """dockerd with data, exec root and socket of its own; host-network containers only."""

    def __init__(self):
        for need, what in ((os.geteuid() == 0, "root"), (shutil.which("dockerd"), "dockerd (docker.io)"),
                           (shutil.which("docker"), "the docker CLI"), (BUSYBOX.exists(), str(BUSYBOX))):
            if not need:
                pytest.fail(f"this test needs {what}")
        self.dir = Path(tempfile.mkdtemp(prefix="ts-dkr-", dir="/tmp"))  # short: a socket path
        self.sock = self.dir / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.log = open(self.dir / "dockerd.log", "w")
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.dir / "root"), "--exec-root", str(self.dir / "exec"),
             "--pidfile", str(self.dir / "pid"), "-H", self.host, "--iptables=false", "--ip6tables=false",
             "--bridge=none", "--storage-driver", "overlay2"],
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: self.proc.poll() is not None or self.docker("version", check=False).returncode == 0,
                     "dockerd answering", timeout_s=60)
        except AssertionError:  # never answered: its daemon goes with the test
            self.stop()
            raise
        if self.proc.poll() is not None:
            pytest.fail(f"dockerd exited: {(self.dir / 'dockerd.log').read_text()[-2000:]}")
        self.import_base()

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env={**os.environ, "DOCKER_HOST": self.host},
                              capture_output=True, text=True, check=check, timeout=120)

    def import_base(self) -> None:
        root = self.dir / "rootfs"
        (root / "bin").mkdir(parents=True)
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        for applet in ("sh", "sleep"):
            (root / "bin" / applet).symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
        subprocess.run(["docker", "import", "-", BASE_IMAGE], input=tar, capture_output=True, check=True,
                       env={**os.environ, "DOCKER_HOST": self.host})

    def inspect(self, *what: str) -> dict | None:
        out = self.docker("inspect", *what, check=False)
        return json.loads(out.stdout)[0] if out.returncode == 0 else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        # dockerd leaves its netns bind mount (exec/netns/default) behind: unmount, then remove
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for target in reversed([m for m in mounts if m.startswith(f"{self.dir}/")]):
            subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def dockerd():
    d = Dockerd()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def ssh_host(dockerd, tmp_path_factory):
    """root@127.0.0.1:PORT, whose sessions have DOCKER_HOST set to the test's daemon."""
    work = tmp_path_factory.mktemp("sshd")
    key = new_key(work / "id")
    port = free_port()
    log = open(work / "sshd.log", "w")
    proc = subprocess.Popen([*sshd_argv(work, port, work / "id.pub"), "-o", f"SetEnv=DOCKER_HOST={dockerd.host}"],
                            stdout=log, stderr=subprocess.STDOUT)

    def listening():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_for(listening, "sshd listening")
    yield f"ssh://root@127.0.0.1:{port}", ["-i", str(key), "-o", "StrictHostKeyChecking=no",
                                           "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


PROGRAM = '''
import os

import pulumi
import pulumi_docker as docker

env = os.environ
provider = docker.Provider("node", host=env["TS_DOCKER_HOST"], ssh_opts=env["TS_SSH_OPTS"].split())
opts = pulumi.ResourceOptions(provider=provider)
image = docker.Image(
    "image", image_name="%(image)s", skip_push=True,
    build=docker.DockerBuildArgs(context=env["TS_CONTEXT"], dockerfile=os.path.join(env["TS_CONTEXT"], "Dockerfile"),
                                 platform="linux/amd64", network="host",  # RUN: the daemon has no bridge
                                 args={"FLAVOUR": env.get("TS_FLAVOUR", "plain")}),
    opts=opts)
container = docker.Container(
    "box", name="%(container)s", image=image.repo_digest,
    entrypoints=["/bin/busybox"], command=["sleep", "100000"], envs=["TS_CHECK=1"],
    network_mode="host", ipc_mode="host", restart="unless-stopped",
    labels=[docker.ContainerLabelArgs(label="twinspark.check", value=env.get("TS_LABEL", "one"))],
    mounts=[docker.ContainerMountArgs(type="bind", source=env["TS_DATA"], target="/data", read_only=True,
                                      bind_options=docker.ContainerMountBindOptionsArgs(propagation="rprivate"))],  \
# rslave: / is private here
    volumes=[docker.ContainerVolumeArgs(host_path=env["TS_DATA"], container_path="/logs")],
    ulimits=[docker.ContainerUlimitArgs(name="stack", soft=8388608, hard=8388608)],
    capabilities=docker.ContainerCapabilitiesArgs(adds=["SYS_PTRACE"]),
    devices=[docker.ContainerDeviceArgs(host_path="/dev/null", container_path="/dev/ts-null")],
    log_driver="json-file", log_opts={"max-size": "10m", "max-file": "2"},
    stop_signal="SIGTERM", stop_timeout=5, destroy_grace_seconds=5,
    must_run=True, wait=False, opts=opts)
# as the observability containers: a RemoteImage (here already on the host: no registry is
# reachable) and a container from its image_id
base = docker.RemoteImage("base", name="%(base)s", platform="linux/amd64", keep_locally=True, opts=opts)
side = docker.Container("side", name="%(container)s-side", image=base.image_id,
                        command=["/bin/busybox", "sleep", "100000"], network_mode="host", restart="unless-stopped",
                        wait=False, opts=opts)
pulumi.export("baseId", base.image_id)
pulumi.export("repoDigest", image.repo_digest)
pulumi.export("containerId", container.id)
''' % {"image": IMAGE, "container": CONTAINER, "base": BASE_IMAGE}

DOCKERFILE = f"""FROM {BASE_IMAGE}
ARG FLAVOUR=plain
LABEL twinspark.flavour=$FLAVOUR
COPY hello.txt /hello.txt
RUN /bin/busybox echo "built $FLAVOUR" > /flavour.txt
"""


def errors(stdout: str) -> str:
    """The engine's error diagnostics in a --json run (the tail of the stream is the program's traceback)."""
    found = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line).get("diagnosticEvent") or {}
            if event.get("severity") == "error":
                found.append(f"{event.get('urn', '')}: {event.get('message', '').strip()}")
    return "\n".join(found)


class Project:
    def __init__(self, root: Path, engine: dict[str, str], ssh_host):
        self.dir = root / "project"
        self.context = root / "context"
        for d in (self.dir, self.context, root / "state", root / "data"):
            d.mkdir(parents=True)
        (self.dir / "Pulumi.yaml").write_text(
            "name: docker-provider-check\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
            f"    virtualenv: {REPO / '.venv'}\n")
        (self.dir / "__main__.py").write_text(PROGRAM)
        (self.context / "Dockerfile").write_text(DOCKERFILE)
        (self.context / "hello.txt").write_text("hello\n")
        (self.context / ".dockerignore").write_text("ignored.txt\n")
        (self.context / "ignored.txt").write_text("not sent to the daemon\n")
        host, ssh_opts = ssh_host
        self.env = {**os.environ, **engine, "PULUMI_BACKEND_URL": f"file://{root / 'state'}",
                    "PULUMI_CONFIG_PASSPHRASE": "test", "TS_DOCKER_HOST": host, "TS_SSH_OPTS": " ".join(ssh_opts),
                    "TS_CONTEXT": str(self.context), "TS_DATA": str(root / "data")}
        self.pulumi("stack", "init", "check")

    def pulumi(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        out = subprocess.run(["pulumi", *args, "--non-interactive"], cwd=self.dir, env={**self.env, **env},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"pulumi {' '.join(args)}: rc={out.returncode}\n{errors(out.stdout)}\n" \
                                    f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    def changes(self, command: str, *args: str, **env: str) -> dict[str, int]:
        """Run up/refresh/destroy; the engine's own summary event counts what happened."""
        out = self.pulumi(command, "--yes", "--skip-preview", "--json", *args, **env)
        summary = None
        for line in out.stdout.splitlines():
            if line.strip().startswith("{"):
                summary = json.loads(line).get("summaryEvent", summary)
        assert summary is not None, out.stdout[-3000:]
        return summary["resourceChanges"]

    def outputs(self) -> dict:
        return json.loads(self.pulumi("stack", "output", "--json").stdout)

    def urns(self) -> set[str]:
        state = json.loads(self.pulumi("stack", "export").stdout)
        return {r["urn"] for r in state["deployment"].get("resources") or []}


def test_up_update_refresh_destroy(engine, dockerd, ssh_host, tmp_path):
    p = Project(tmp_path, engine, ssh_host)

    # up creates: the provider, the image (built on the daemon behind ssh), the container, the
    # remote image and its container
    assert p.changes("up") == {"create": 6}
    out = p.outputs()
    built = dockerd.inspect("--type", "image", IMAGE)
    assert built and out["repoDigest"] == built["Id"]  # skip_push: repo_digest is the local image id
    assert built["Config"]["Labels"]["twinspark.flavour"] == "plain"
    box = dockerd.inspect("--type", "container", CONTAINER)
    assert box["Id"] == out["containerId"] and box["State"]["Running"], box["State"]
    assert box["Image"] == out["repoDigest"]
    host = box["HostConfig"]
    assert host["NetworkMode"] == "host" and host["RestartPolicy"]["Name"] == "unless-stopped"
    assert {"Name": "stack", "Soft": 8388608, "Hard": 8388608} in host["Ulimits"]
    assert box["Config"]["Labels"]["twinspark.check"] == "one"
    assert sorted((m["Type"], m["Destination"], m["RW"]) for m in box["Mounts"]) == \
        [("bind", "/data", False), ("bind", "/logs", True)]
    assert [m["Propagation"] for m in box["Mounts"] if m["Destination"] == "/data"] == ["rprivate"]
    assert box["Path"] == "/bin/busybox" and box["Args"] == ["sleep", "100000"] and "TS_CHECK=1" in box["Config"]["Env"]
    assert host["IpcMode"] == "host" and host["CapAdd"] == ["CAP_SYS_PTRACE"]  # the provider adds CAP_
    assert host["Devices"][0]["PathOnHost"] == "/dev/null" and host["Devices"][0]["PathInContainer"] == "/dev/ts-null"
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "10m", "max-file": "2"}}
    assert box["Config"]["StopSignal"] == "SIGTERM" and box["Config"]["StopTimeout"] == 5
    base = dockerd.inspect("--type", "image", BASE_IMAGE)["Id"]
    assert out["baseId"] == base and dockerd.inspect("--type", "container", f"{CONTAINER}-side")["Image"] == base

    # nothing changed: every resource is the same (the context digest included)
    assert p.changes("up", "--expect-no-changes") == {"same": 6}

    # a label is ForceNew in the provider: the container is replaced
    assert p.changes("up", TS_LABEL="two") == {"replace": 1, "same": 5}
    box2 = dockerd.inspect("--type", "container", CONTAINER)
    assert box2["Id"] != box["Id"] and box2["Config"]["Labels"]["twinspark.check"] == "two"

    # a preview does not build
    p.pulumi("preview", TS_LABEL="two", TS_FLAVOUR="spicy")
    assert dockerd.inspect("--type", "image", IMAGE)["Id"] == built["Id"]

    # a build arg: the image is built again (an update) and the container follows its new id
    assert p.changes("up", TS_LABEL="two", TS_FLAVOUR="spicy") == {"update": 1, "replace": 1, "same": 4}
    rebuilt = dockerd.inspect("--type", "image", IMAGE)
    assert rebuilt["Id"] != built["Id"] and rebuilt["Config"]["Labels"]["twinspark.flavour"] == "spicy"
    assert p.outputs()["repoDigest"] == rebuilt["Id"]
    assert dockerd.inspect("--type", "container", CONTAINER)["Image"] == rebuilt["Id"]
    assert dockerd.docker("exec", CONTAINER, "/bin/busybox", "cat", "/flavour.txt").stdout == "built spicy\n"

    # the context's contents: the same again
    (p.context / "hello.txt").write_text("hello again\n")
    assert p.changes("up", TS_LABEL="two", TS_FLAVOUR="spicy") == {"update": 1, "replace": 1, "same": 4}
    assert dockerd.inspect("--type", "image", IMAGE)["Id"] != rebuilt["Id"]
    # … but not a file .dockerignore leaves out
    (p.context / "ignored.txt").write_text("changed, still not sent\n")
    assert p.changes("up", "--expect-no-changes", TS_LABEL="two", TS_FLAVOUR="spicy") == {"same": 6}

    # a container removed by hand: refresh drops it from the state, up creates it again
    dockerd.docker("rm", "-f", CONTAINER)
    assert p.changes("refresh", TS_LABEL="two", TS_FLAVOUR="spicy").get("delete") == 1
    assert not [urn for urn in p.urns() if urn.endswith("docker:index/container:Container::box")]
    assert p.changes("up", TS_LABEL="two", TS_FLAVOUR="spicy") == {"create": 1, "same": 5}
    assert dockerd.inspect("--type", "container", CONTAINER)["State"]["Running"]

    # destroy removes the containers and leaves the images on the host
    assert p.changes("destroy", TS_LABEL="two", TS_FLAVOUR="spicy") == {"delete": 6}
    assert dockerd.inspect("--type", "container", CONTAINER) is None
    assert dockerd.inspect("--type", "image", IMAGE) is not None
    assert dockerd.inspect("--type", "container", f"{CONTAINER}-side") is None
    assert dockerd.inspect("--type", "image", BASE_IMAGE) is not None  # keep_locally


# ---- the schema the provider serves against the Python SDK it must match ------------------
def sdk_props(cls) -> dict[str, str]:
    """An input type's Pulumi names with their annotations, e.g. {"bindOptions": "...Args'..."}."""
    names = input_type_py_to_pulumi_names(cls)
    return {pulumi_name: str(getattr(cls, py).fget.__annotations__.get("return", ""))
            for py, pulumi_name in names.items()}


def check_against(cls, props: dict, types: dict, where: str, seen: set) -> list[str]:
    errors = []
    for name, annotation in sdk_props(cls).items():
        spec = props.get(name)
        if spec is None:
            errors.append(f"{where}.{name}: not in the schema")
            continue
        # MaxItemsOne: a list in the SDK must be an array in the schema, an object an object
        is_list = "Sequence[" in annotation
        if is_list != (spec.get("type") == "array"):
            errors.append(f"{where}.{name}: the SDK has {annotation}, the schema {json.dumps(spec)[:120]}")
        nested = re.search(r"'(\w+)Args'", annotation)
        if nested and nested.group(1) not in seen:
            seen.add(nested.group(1))
            ref = (spec.get("items") or spec).get("$ref", "")
            target = types.get(ref.rsplit(":", 1)[-1])
            if target is None or ref.rsplit(":", 1)[-1] != nested.group(1):
                errors.append(f"{where}.{name}: the SDK's {nested.group(1)}Args, the schema's {ref!r}")
            else:
                errors += check_against(getattr(pulumi_docker, nested.group(1) + "Args"), target.get("properties", {}),
                                        types, nested.group(1), seen)
    return errors


def test_schema_matches_python_sdk(engine):
    """GetSchema of the plugin the engine loads: the SDK's every input, name and list-or-object."""
    out = subprocess.run(["pulumi", "package", "get-schema", f"docker@{DOCKER_VERSION}"], env={**os.environ, **engine},
                         capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-3000:]
    schema = json.loads(out.stdout)
    assert schema["name"] == "docker" and schema["version"] == DOCKER_VERSION
    types = {tok.rsplit(":", 1)[-1]: spec for tok, spec in schema["types"].items()}
    errors = check_against(pulumi_docker.ProviderArgs, schema["provider"]["inputProperties"], types, "Provider", set())
    for cls, token in ((pulumi_docker.ContainerArgs, "docker:index/container:Container"),
                       (pulumi_docker.RemoteImageArgs, "docker:index/remoteImage:RemoteImage"),
                       (pulumi_docker.ImageArgs, "docker:index/image:Image"),
                       (pulumi_docker.NetworkArgs, "docker:index/network:Network"),
                       (pulumi_docker.VolumeArgs, "docker:index/volume:Volume")):
        resource = schema["resources"].get(token)
        if resource is None:
            errors.append(f"{token}: not in the schema")
            continue
        errors += check_against(cls, resource["inputProperties"], types, token, set())
    assert not errors, "\n".join(errors)


def image_project(root: Path, host: str, name: str) -> Path:
    """A project of one docker.Image (context: the project's folder) on a provider at HOST."""
    project = root / name
    project.mkdir()
    (project / "Pulumi.yaml").write_text(
        f"name: docker-{name}\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
        f"    virtualenv: {REPO / '.venv'}\n")
    (project / "__main__.py").write_text(
        "import pulumi, pulumi_docker as docker\n"
        f"p = docker.Provider('node', host='{host}', ssh_opts=['-o', 'BatchMode=yes'])\n"
        "docker.Image('image', image_name='x:1', skip_push=True,\n"
        "             build=docker.DockerBuildArgs(context='.', platform='linux/amd64'),\n"
        "             opts=pulumi.ResourceOptions(provider=p))\n")
    (project / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\n")
    return project


def pulumi_runner(engine: dict[str, str], state: Path):
    """pulumi in a project folder, its stacks kept under STATE."""
    env = {**os.environ, **engine, "PULUMI_BACKEND_URL": f"file://{state}", "PULUMI_CONFIG_PASSPHRASE": "test"}

    def pulumi_in(project: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["pulumi", *args, "--non-interactive"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120)
    return pulumi_in


def test_an_unreachable_daemon_over_ssh_is_found_by_the_build_and_any_other_by_configure(engine, tmp_path):
    """As pulumi-docker v5.1.0 (provider/image.go, configureDockerClient, lines 946-953): Configure
    never asks an ssh:// daemon (kreuzwerker's issue 262: fewer connections to the remote host), so
    a preview of an unreachable node passes and the first build fails naming where it tried; a
    daemon at any other address that does not answer fails Configure, in preview already."""
    closed = free_port()  # nothing listens there
    pulumi_in = pulumi_runner(engine, tmp_path)
    over_ssh = image_project(tmp_path, f"ssh://root@127.0.0.1:{closed}", "over-ssh")
    assert pulumi_in(over_ssh, "stack", "init", "over-ssh").returncode == 0
    preview = pulumi_in(over_ssh, "preview")
    assert preview.returncode == 0, preview.stdout[-3000:] + preview.stderr[-2000:]
    assert "+ 3 to create" in preview.stdout, preview.stdout[-3000:]
    up = pulumi_in(over_ssh, "up", "--yes")
    assert up.returncode != 0, up.stdout[-3000:]
    said = up.stdout + up.stderr
    # the build asked the daemon over ssh (docker's ssh connection helper: `docker.example.com` stands
    # for the ssh-tunnelled host), and ssh said why it could not; under load ssh's exit can beat the
    # helper's first write, which then fails with a broken pipe and ssh's words are lost (the rehearsal
    # of 31afbb0)
    assert "docker.example.com" in said and "_ping" in said, said[-3000:]
    assert f"port {closed}: Connection refused" in said or "write |1: broken pipe" in said, said[-3000:]

    over_tcp = image_project(tmp_path, f"tcp://127.0.0.1:{closed}", "over-tcp")
    assert pulumi_in(over_tcp, "stack", "init", "over-tcp").returncode == 0
    preview = pulumi_in(over_tcp, "preview")
    assert preview.returncode != 0
    assert "failed to connect to any docker daemon" in preview.stdout + preview.stderr, preview.stdout[-3000:]


def go_file_mode(mode: int) -> str:
    """os.FileMode.String() of a regular file (-) or symlink (L) with these permission bits."""
    kind = "L" if stat.S_ISLNK(mode) else "-"
    return kind + "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))


def pulumi_docker_context_digest(context: Path, ignored: set[str]) -> str:
    """The digest of a build context given as '.' (the program's folder, the provider's working
    directory), as pulumi-docker v5.1.0 computes it (provider/provider.go:553-640, hashContext): a
    record per file, the Dockerfile first as "Dockerfile" with mode 0, then each file the ignore
    file keeps, in lexical order; a record is the slash path, the Go file mode, the raw sha256 of
    the content (of a symlink: its resolved path, relative as the context is) and a NUL; the
    digest is the hex sha256 of the records."""
    def record(name: str, mode: str, content: bytes) -> bytes:
        return name.encode() + mode.encode() + hashlib.sha256(content).digest() + b"\0"

    records = [record("Dockerfile", "----------", (context / "Dockerfile").read_bytes())]
    for path in sorted(p for p in context.rglob("*") if not p.is_dir() or p.is_symlink()):
        rel = path.relative_to(context).as_posix()
        if rel in ignored:
            continue
        mode = path.lstat().st_mode
        content = os.path.relpath(os.path.realpath(path), context).encode() if path.is_symlink() else path.read_bytes()
        records.append(record(rel, go_file_mode(mode), content))
    return hashlib.sha256(b"".join(records)).hexdigest()


def test_the_build_context_is_digested_as_pulumi_docker_does(engine, tmp_path):
    """A stack moved between the real pulumi-docker and the stand-in must see no change: both digest
    the context to the same build.contextDigest (an executable, a symlink, a file in a folder, an
    ignored one)."""
    project = image_project(tmp_path, f"ssh://root@127.0.0.1:{free_port()}", "digest")
    (project / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (project / "run.sh").chmod(0o755)
    (project / "conf").mkdir()
    (project / "conf" / "a.txt").write_text("a\n")
    (project / "conf" / "link").symlink_to("../run.sh")
    (project / ".dockerignore").write_text("secret.txt\n")
    (project / "secret.txt").write_text("never sent\n")
    for path in project.rglob("*"):
        if not path.is_symlink() and path.is_file() and path.name != "run.sh":
            path.chmod(0o644)
    pulumi_in = pulumi_runner(engine, tmp_path)
    assert pulumi_in(project, "stack", "init", "digest").returncode == 0
    preview = pulumi_in(project, "preview", "--json")
    assert preview.returncode == 0, preview.stdout[-3000:] + preview.stderr[-2000:]
    steps = json.loads(preview.stdout)["steps"]
    image = next(s for s in steps if s["urn"].endswith("docker:index/image:Image::image"))
    want = pulumi_docker_context_digest(project, ignored={"secret.txt"})
    assert image["newState"]["inputs"]["build"]["contextDigest"] == want
