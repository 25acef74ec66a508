"""The pin and the facts steps as a node runs them: the program's own command line and stdin,
real bash and python3, and fake `docker` and `nvidia-smi` first on PATH.

The fake docker answers from a directory: `images/<ref>` holds an image's layer list (JSON),
`images/<ref>.id` its ID, `images/<ref>.digests` its RepoDigests; `registry/<ref>` is what a
pull of <ref> brings; `probe.json` what the image's python3 prints.
"""

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from components.platform_facts import PROGRAM, SCRIPT, facts_args
from components.remote import launch_file, runner_stdin, script_command, script_text
from components.serving_image import RESOLVE_SCRIPT
from core.platform_gate import evaluate, parse_report
from toolbox import load_launch

FAKE_DOCKER = r"""#!/usr/bin/env bash
set -euo pipefail
d=$FAKE_DOCKER_DIR
echo "docker $*" >> "$d/calls"
key() { printf '%s' "$1" | tr '/:@' '___'; }
last="${*: -1}"
case "$1 $2" in
  "image inspect")
    f="$d/images/$(key "$last")"
    [ -e "$f" ] || { echo "Error: No such image: $last" >&2; exit 1; }
    case "$4" in
      '{{.Id}}') cat "$f.id" ;;
      '{{json .RootFS.Layers}}') cat "$f" ;;
      *RepoDigests*) cat "$f.digests" ;;
      *) echo "fake docker: format $4" >&2; exit 1 ;;
    esac ;;
  "pull --quiet")
    src="$d/registry/$(key "$last")"
    [ -e "$src" ] || { echo "Error: manifest unknown: $last" >&2; exit 1; }
    for ext in "" .id .digests; do cp "$src$ext" "$d/images/$(key "$last")$ext" 2>/dev/null || true; done
    echo "$last" ;;
  "run --rm")
    cat > /dev/null  # the probe program
    cat "$d/probe.json" ;;
  *) echo "fake docker: unsupported: $*" >&2; exit 1 ;;
esac
"""
FAKE_NVIDIA_SMI = r"""#!/usr/bin/env bash
if [ "${1:-}" = --query-gpu=driver_version,name ]; then echo "590.44.01, NVIDIA GB10"; exit 0; fi
printf '| NVIDIA-SMI 590.44.01      Driver Version: 590.44.01      CUDA Version: 13.1     |\n'
"""
BASE = "ghcr.io/owner/vllm@sha256:" + "a" * 64
BASE_LAYERS = ["sha256:" + c * 64 for c in "123"]


def key(ref):
    return ref.replace("/", "_").replace(":", "_").replace("@", "_")


@pytest.fixture
def node(tmp_path):
    """PATH with the fakes first; returns (run(script, args, payload), docker_dir)."""
    bin_dir, docker = tmp_path / "bin", tmp_path / "docker"
    for d in (bin_dir, docker / "images", docker / "registry"):
        d.mkdir(parents=True)
    for name, text in (("docker", FAKE_DOCKER), ("nvidia-smi", FAKE_NVIDIA_SMI)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (docker / "probe.json").write_text(json.dumps({"vllm": "0.25.2", "torch": "2.11.0", "ray": "2.57.0",
                                                   "nccl_pip": "2.28.9", "nccl": "2.28.9", "image_cuda": "13.0"}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_DIR": str(docker)}

    def run(script, args, payload=""):
        return subprocess.run(["bash", "-c", script_command(script, args)], input=runner_stdin([], script_text(script),
                              payload), capture_output=True, text=True, env=env, timeout=60)

    return run, docker


def image(docker: Path, ref: str, layers, where="images", digests=()):
    (docker / where / key(ref)).write_text(json.dumps(layers))
    (docker / where / f"{key(ref)}.id").write_text("sha256:" + hashlib.sha256(ref.encode()).hexdigest() + "\n")
    (docker / where / f"{key(ref)}.digests").write_text("".join(d + "\n" for d in digests))


def facts_of(run, serving_image="twinspark-vllm:ray", base=BASE):
    return run(SCRIPT, facts_args("spark2", serving_image, base), launch_file(PROGRAM))


def test_facts_of_a_node_built_from_the_pinned_base(node):
    run, docker = node
    image(docker, BASE, BASE_LAYERS, where="registry")  # BuildKit left it out of the image list
    image(docker, "twinspark-vllm:ray", BASE_LAYERS + ["sha256:" + "9" * 64])
    proc = facts_of(run)
    assert proc.returncode == 0, proc.stderr
    facts = parse_report(proc.stdout, "spark2")
    assert (facts["driver"], facts["gpu"], facts["cuda"]) == ("590.44.01", "NVIDIA GB10", "13.1")
    assert facts["kernel"] == os.uname().release
    assert facts["image_base"] == BASE
    assert facts["image"] == (docker / "images" / f"{key('twinspark-vllm:ray')}.id").read_text().strip()  # its ID
    assert (facts["vllm"], facts["nccl"], facts["nccl_pip"]) == ("0.25.2", "2.28.9", "2.28.9")
    assert f"docker pull --quiet {BASE}" in (docker / "calls").read_text()  # a digest: no platform to choose
    # and the gate judges what the node printed: this platform is on the list twice
    assert {f.key for f in evaluate({"spark2": facts})} == {"driver-590-cudagraph-deadlock", "nccl-pip-2.28.9-hang"}


def test_facts_of_a_worker_read_its_image_and_never_pull_the_base(node):
    """A worker holds the head's image (shipped), not the base: no --base, no 20 GB pull."""
    run, docker = node
    image(docker, BASE, BASE_LAYERS, where="registry")
    image(docker, "twinspark-vllm:ray", BASE_LAYERS + ["sha256:" + "9" * 64])
    proc = facts_of(run, base=None)
    assert proc.returncode == 0, proc.stderr
    facts = parse_report(proc.stdout, "spark2")
    assert facts["image"] == (docker / "images" / f"{key('twinspark-vllm:ray')}.id").read_text().strip()
    assert facts["image_base"] is None and facts["ray"] == "2.57.0"
    assert "pull" not in (docker / "calls").read_text()


def test_connectx_firmware_is_read_per_rdma_device(tmp_path):
    program = load_launch(PROGRAM)
    for device, version in (("roceP2p1s0f0", "28.45.1020"), ("rocep1s0f0", "28.45.1020")):
        (tmp_path / device).mkdir()
        (tmp_path / device / "fw_ver").write_text(version + "\n")
    errors = {}
    assert program.cx_firmware(errors, str(tmp_path)) == "roceP2p1s0f0=28.45.1020,rocep1s0f0=28.45.1020"
    assert program.cx_firmware(errors, str(tmp_path / "absent")) is None and "cx_firmware" in errors


def test_a_serving_image_not_built_from_the_base_fails_the_step_naming_both(node):
    run, docker = node
    image(docker, BASE, BASE_LAYERS)
    image(docker, "twinspark-vllm:ray", ["sha256:" + "7" * 64] + BASE_LAYERS[1:] + ["sha256:" + "9" * 64])
    proc = facts_of(run)
    assert proc.returncode == 1
    assert "spark2: the serving image sha256:" in proc.stderr
    assert f"was not built from {BASE}: its first 3 layers are not the base's" in proc.stderr


def test_facts_step_refuses_a_base_without_digest(node):
    run, _ = node
    proc = facts_of(run, base="ghcr.io/owner/vllm:1.0.0")
    assert proc.returncode == 2
    assert "--base must name a digest" in proc.stdout + proc.stderr


def test_resolve_prints_the_registry_digest_of_the_tag(node):
    run, docker = node
    tag = "ghcr.io/owner/vllm:0.1.1"
    digest = "sha256:" + "b" * 64
    image(docker, tag, BASE_LAYERS, where="registry", digests=["other.io/mirror/vllm@sha256:" + "c" * 64,
                                                                f"ghcr.io/owner/vllm@{digest}"])
    proc = run(RESOLVE_SCRIPT, ["--image", tag, "--platform", "linux/arm64"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == digest
    assert f"docker pull --quiet --platform linux/arm64 {tag}" in (docker / "calls").read_text()


def test_resolve_fails_when_docker_names_no_digest(node):
    run, docker = node
    tag = "localbuild:1.0.0"
    image(docker, tag, BASE_LAYERS, where="registry", digests=[])  # built here, never pulled
    proc = run(RESOLVE_SCRIPT, ["--image", tag, "--platform", "linux/arm64"])
    assert proc.returncode == 1
    assert "localbuild:1.0.0: docker names no registry digest for localbuild" in proc.stderr
