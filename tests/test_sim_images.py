"""The sim's images, for real: dev/sim_images.py builds them (its cache makes a second run
a no-op), a private dockerd pulls them from the registry as the nodes will (read-only, by tag
and by digest), and each does what the program asks of it:

- the serving base: launch/serving-image/Dockerfile builds FROM base@digest with no network
  (its pip and apt-get find everything installed), and the result has nginx, Ray at
  serving.rayVersion, the vLLM stand-in, the real huggingface_hub and the socket group;
- Debian's Prometheus, Alertmanager and node exporter print their version and start with the
  program's own flags and rendered config (components/observability.py);
- the Grafana and GPU exporter stand-ins say they are stand-ins and start as the program runs them.

Root, dockerd and docker-registry are required: a missing one fails, it does not skip.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import contract
from components.observability import (
    alertmanager_command,
    gpu_exporter_command,
    grafana_env,
    node_exporter_command,
    prometheus_command,
)
from components.observability_files import (
    ALERTMANAGER_CONFIG,
    AlertReceivers,
    GRAFANA_HOST_DIR,
    PROMETHEUS_HOST_DIR,
    grafana_files,
    plan_from_config,
    prometheus_files,
    render_alertmanager_config,
)
from components.config import SERVING_IMAGE_LOCK
import sim_images
from private_dockerd import private_dockerd
from toolbox import free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
STACK = sim_images.sim_stack()
PLAN = plan_from_config(STACK, alertmanager=True)
# in `--network none` each container has a loopback of its own: the program's fixed ports cannot clash
NODE = dataclasses.replace(PLAN.head, rail_ip="127.0.0.1")


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    """{reference: digest} as `sim_images.py build` prints them (a warm cache: about a second)."""
    proc = subprocess.run([sys.executable, str(ROOT / "dev/sim_images.py"), "build"], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    digests = {}
    for line in proc.stdout.splitlines():
        ref, _, digest = line.replace("@", " ", 1).partition(" ")
        digests[ref] = digest
    assert set(digests) == {r.ref for r in sim_images.recipes(STACK)}, proc.stdout
    return digests


@pytest.fixture(scope="module")
def registry(built):
    """The registry as the nodes get it (serve_registry: read-only), on a free loopback port."""
    addr = f"127.0.0.1:{free_port()}"
    proc = sim_images.serve_registry(addr)
    reg = sim_images.Registry(addr, tls=True)
    try:
        wait_for(lambda: proc.poll() is None and reg.answers(), "the read-only registry", 30)
        yield reg
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def docker():
    with private_dockerd() as d:
        yield d


def local(registry, ref: str) -> str:
    path, tag = sim_images.split_reference(ref)
    return f"{registry.addr}/{path}:{tag}"


def pulled(docker, registry, ref: str) -> str:
    docker("pull", "--platform", STACK.serving.platform, local(registry, ref))
    return local(registry, ref)


def started(docker, name: str, image: str, args: list[str], expect: str, *options: str) -> str:
    """Runs the image detached (no network) and waits for `expect` in its log; its log."""
    docker("run", "-d", "--name", name, "--network", "none", *options, image, *args)
    try:
        deadline, logs = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            logs = docker("logs", name, check=False).stderr + docker("logs", name, check=False).stdout
            if expect in logs:
                state = docker("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
                assert state == "true", logs
                return logs
            time.sleep(0.5)
        raise AssertionError(f"{name}: no {expect!r} in 60 s:\n{logs[-3000:]}")
    finally:
        docker("rm", "-f", name, check=False)


def test_a_second_build_finds_everything_in_its_cache(built):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "dev/sim_images.py"), "build"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "building" not in proc.stderr, proc.stderr
    assert time.monotonic() - started < 30
    assert {line.replace("@", " ", 1).split()[0] for line in proc.stdout.splitlines()} == set(built)


def test_the_registry_serves_the_base_by_tag_and_by_digest(built, registry, docker):
    path, tag = sim_images.split_reference(STACK.serving.image)
    digest = built[STACK.serving.image]
    assert digest.startswith("sha256:") and len(digest) == 71
    assert registry.manifest_digest(path, tag) == digest
    docker("pull", f"{registry.addr}/{path}@{digest}")
    # read-only: the nodes may pull, never push
    docker("tag", f"{registry.addr}/{path}@{digest}", f"{registry.addr}/{path}:pushed-by-a-node")
    assert docker("push", f"{registry.addr}/{path}:pushed-by-a-node", check=False).returncode != 0


def test_the_serving_dockerfile_builds_on_the_base_offline(built, registry, docker):
    path, _ = sim_images.split_reference(STACK.serving.image)
    base = f"{registry.addr}/{path}@{built[STACK.serving.image]}"
    docker("pull", base)
    image = "twinspark-vllm:sim-test"
    docker("build", "--network", "none", "--platform", STACK.serving.platform, "-t", image,
           "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"APT_PACKAGES={' '.join(STACK.serving.apt_packages)}",
           "--build-arg", f"API_SOCKET_GROUP={contract.API_SOCKET_GROUP}",
           "--build-arg", f"API_SOCKET_GID={contract.API_SOCKET_GID}", ROOT / "launch/serving-image")

    def inside(*argv) -> str:
        proc = docker("run", "--rm", "--network", "none", "--entrypoint", argv[0], image, *argv[1:])
        return proc.stdout + proc.stderr

    assert "nginx version: nginx/" in inside("nginx", "-v")
    assert f"ray, version {STACK.serving.ray_version}" in inside("ray", "--version")
    # offline, the locked install found every locked package already there, at the lock's version
    frozen = set(inside("python3", "-m", "pip", "list", "--format=freeze").split())
    locked = set(re.findall(r"^([a-z0-9-]+==\S+)", SERVING_IMAGE_LOCK.read_text(), re.M))
    assert locked <= {line.lower().replace("_", "-") for line in frozen}, locked - frozen
    assert "STAND-IN" in inside("vllm", "--help")
    assert f"{contract.API_SOCKET_GROUP}:x:{contract.API_SOCKET_GID}:" in inside("getent", "group",
                                                                                contract.API_SOCKET_GROUP)
    # the stand-ins the program's own code imports inside the image: the vLLM stand-in's HTTP side
    # and weights.py's huggingface_hub (fetch-weights.sh runs it in the base image)
    assert "ok" in inside("python3", "-c", "import openai_standin, huggingface_hub; "
                                           "assert huggingface_hub.HfApi and huggingface_hub.snapshot_download; "
                                           "print('ok')")
    assert inside("uname", "-m").strip() == "x86_64"


def test_debians_prometheus_runs_the_programs_flags_and_config(built, registry, docker, tmp_path):
    image = pulled(docker, registry, STACK.observability.images.prometheus)
    version = docker("run", "--rm", "--network", "none", image, "--version")
    assert "prometheus, version 2.42.0" in version.stdout + version.stderr
    config, data = tmp_path / "prometheus", tmp_path / "data"
    for f in prometheus_files(PLAN):
        target = config / Path(f.path).relative_to(PROMETHEUS_HOST_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
    data.mkdir()
    os.chown(data, contract.PROMETHEUS_UID, contract.PROMETHEUS_UID)
    started(docker, "sim-images-prometheus", image, prometheus_command(PLAN), "Server is ready to receive web requests",
            "-v", f"{config}:{contract.PROMETHEUS_CONTAINER_CONFIG_DIR}:ro",
            "-v", f"{data}:{contract.PROMETHEUS_CONTAINER_DATA_DIR}")


def test_debians_alertmanager_runs_the_programs_flags_and_config(built, registry, docker, tmp_path):
    image = pulled(docker, registry, STACK.observability.images.alertmanager)
    version = docker("run", "--rm", "--network", "none", image, "--version")
    assert "alertmanager, version 0.25.0" in version.stdout + version.stderr
    config, data = tmp_path / "alertmanager", tmp_path / "data"
    config.mkdir()
    (config / ALERTMANAGER_CONFIG).write_text(render_alertmanager_config(AlertReceivers(webhook_url="http://127.0.0.1:9/hook")))
    data.mkdir()
    os.chown(data, contract.ALERTMANAGER_UID, 0)
    started(docker, "sim-images-alertmanager", image, alertmanager_command(), "Listening",
            "--user", f"{contract.ALERTMANAGER_UID}:0",
            "-v", f"{config}:{contract.ALERTMANAGER_CONTAINER_CONFIG_DIR}:ro",
            "-v", f"{data}:{contract.ALERTMANAGER_CONTAINER_DATA_DIR}")


def test_debians_node_exporter_runs_the_programs_flags(built, registry, docker):
    image = pulled(docker, registry, STACK.observability.images.node_exporter)
    version = docker("run", "--rm", "--network", "none", image, "--version")
    assert "node_exporter, version 1.5.0" in version.stdout + version.stderr
    logs = started(docker, "sim-images-node-exporter", image, node_exporter_command(NODE), "Listening on",
                   # rslave as the program asks needs / shared or slave, which this machine's is not
                   "--pid", "host", "-v", f"/:{contract.NODE_EXPORTER_HOST_ROOT}:ro")
    assert "collector=textfile" in logs and "collector=infiniband" in logs and "collector=netclass" in logs, logs


def test_the_grafana_stand_in_says_so_and_serves_as_the_program_runs_it(built, registry, docker, tmp_path):
    image = pulled(docker, registry, STACK.observability.images.grafana)
    help_text = docker("run", "--rm", "--network", "none", image, "--help")
    assert "STAND-IN" in help_text.stdout + help_text.stderr
    files = tmp_path / "grafana"
    for f in grafana_files(PLAN):
        target = files / Path(f.path).relative_to(GRAFANA_HOST_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)
    password, data = tmp_path / "password", tmp_path / "data"
    password.write_text("a-password-of-the-stack")
    data.mkdir()
    os.chown(data, contract.GRAFANA_UID, contract.GRAFANA_GID)
    env = [a for e in grafana_env(PLAN) for a in ("-e", e)]
    started(docker, "sim-images-grafana", image, [], f"listening on :{PLAN.settings.grafana_port}", *env,
            "-v", f"{files}/provisioning:{contract.GRAFANA_CONTAINER_PROVISIONING_DIR}:ro",
            "-v", f"{files}/dashboards:{contract.GRAFANA_CONTAINER_DASHBOARDS_DIR}:ro",
            "-v", f"{data}:{contract.GRAFANA_CONTAINER_DATA_DIR}",
            "-v", f"{password}:{contract.GRAFANA_CONTAINER_PASSWORD_FILE}:ro")
    assert (data / "standin-admin.json").exists()


def test_the_gpu_exporter_stand_in_says_so_and_takes_the_programs_flags(built, registry, docker):
    image = pulled(docker, registry, STACK.observability.images.gpu_exporter)
    help_text = docker("run", "--rm", "--network", "none", image, "--help", check=False)
    assert "STAND-IN" in help_text.stdout + help_text.stderr
    started(docker, "sim-images-gpu-exporter", image, gpu_exporter_command(NODE), "listening on 127.0.0.1:")


def test_the_sim_stack_pulls_every_image_from_the_sims_registry():
    for ref in (STACK.serving.image, *STACK.observability.images.model_dump().values()):
        assert ref.startswith(sim_images.REGISTRY + "/"), ref
