"""How the day-2 tools reach the nodes (issue 19 items 8 and 9): held to the host key `pulumi up`
holds each node to (the `nodes` output's hostKey), with the credentials checked before any node
is reached. Against a real sshd on port 22 of a private network namespace."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ssh_fixtures import DEAD_AGENT_KINDS, OTHER_HOST_KEY, DeadAgent, new_key, sshd_argv
from program_harness import ROOT
from toolbox import one_clear_line

from core import host_keys
from core import contract

# sshd on 127.0.0.1:22 of a network namespace of its own, /run private to a mount namespace of
# its own (sshd's privsep directory, the guard's verdict), then the command; its exit code.
IN_NAMESPACES = """
set -u
ip link set lo up
mount -t tmpfs tmpfs /run
mkdir -p /run/sshd "$(dirname "$VERDICT_PATH")"
printf '%s' "$VERDICT" > "$VERDICT_PATH"
"$SSHD" "${SSHD_ARGS[@]}" 2>"$SSHD_LOG" & sshd=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/22) 2>/dev/null && break; sleep 0.05; done
"$@"; rc=$?
kill "$sshd"; exit "$rc"
"""
NOT_HELD = {"checked_at": 1.0, "ok": True, "failures": [], "consecutive_failures": 0, "restarts_in_window": 0,
            "hold": None}


class Node:
    """A node: a login key, an sshd with a host key of its own, and the operator's own known_hosts,
    which trusts whatever answers there (as after an `ssh` that accepted a new key)."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path
        self.login = new_key(tmp_path / "login")
        self.argv = sshd_argv(tmp_path, 22, Path(f"{self.login}.pub"))
        self.host_key = " ".join((tmp_path / "ssh_host_ed25519_key.pub").read_text().split()[:2])
        self.operator_known_hosts = tmp_path / "operator_known_hosts"
        self.operator_known_hosts.write_text(f"127.0.0.1 {self.host_key}\n")
        self.log = tmp_path / "sshd.log"

    def outputs_file(self, pinned: str) -> Path:
        """The stack outputs, the node held to `pinned`."""
        path = self.dir / "outputs.json"
        path.write_text(json.dumps({
            "endpoint": "http://127.0.0.1:9/v1", "apiKey": "sk-test-key-0123456789", "model": "m", "sshUser": "root",
            "fabric": {"mtu": 65536, "linkSpeedMbps": 200000},
            "nodes": [{"name": "spark1", "role": "head", "host": "127.0.0.1", "rayIp": "10.0.0.1",
                       "rails": [{"iface": "lo", "hca": "rocep1s0f0"}], "hostKey": pinned}]}))
        return path

    def run(self, *argv, env=None) -> subprocess.CompletedProcess:
        script = (f"SSHD={self.argv[0]}; SSHD_ARGS=({' '.join(repr(a) for a in self.argv[1:])})\n" + IN_NAMESPACES)
        env = {**os.environ, "SSH_AUTH_SOCK": "", "SSHD_LOG": str(self.log), "VERDICT": json.dumps(NOT_HELD),
               "VERDICT_PATH": contract.SERVING_GUARD_STATUS, **(env or {})}
        return subprocess.run(["unshare", "--net", "--mount", "bash", "-c", script, "in-namespaces", *argv],
                              cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)

    def ops(self, *args, env=None) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "ops", *args, env=env)


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def ssh_flags(node):
    # the operator's own known_hosts trusts the machine that answers: it must not count
    return ["--ssh-key", str(node.login), "--ssh-option", f"UserKnownHostsFile={node.operator_known_hosts}",
            "--ssh-option", "StrictHostKeyChecking=no"]


def test_a_node_showing_its_pinned_key_is_reached(node):
    proc = node.ops("clear-hold", "--outputs-file", str(node.outputs_file(node.host_key)), *ssh_flags(node))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "spark1: serving is not held; nothing to clear" in proc.stdout
    assert "Accepted publickey" in node.log.read_text()


def test_a_node_whose_host_key_changed_is_refused_in_one_line(node):
    """The stack pins another key than the one the machine at the node's address shows (a
    reinstalled node, or another machine): ops refuses it, whatever the operator's known_hosts says."""
    outputs = str(node.outputs_file(OTHER_HOST_KEY))
    proc = node.ops("clear-hold", "--outputs-file", outputs, *ssh_flags(node))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = one_clear_line(proc.stderr, "ops clear-hold: spark1 (127.0.0.1): refused", "pin-host-keys", "pulumi up",
                          host_keys.fingerprint(OTHER_HOST_KEY), f"it shows {host_keys.fingerprint(node.host_key)}")
    assert "nothing ran there" in line
    assert "Accepted publickey" not in node.log.read_text()  # refused before it logged in

    status = node.ops("status", "--json", "--outputs-file", outputs, *ssh_flags(node))
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stderr
    report = json.loads(status.stdout)
    refused = [p for p in report["problems"] if p.startswith("spark1 ")]
    assert len(refused) == 1 and refused[0].startswith("spark1 (127.0.0.1): refused") and "pin-host-keys" in refused[0]
    assert "Accepted publickey" not in node.log.read_text()


UPGRADE_CHECK = """
import json, sys
from ops.inputs import ToolError
from ops.target import target_from_outputs
from ops.upgrade import ssh_access_check
target = target_from_outputs(json.load(open(sys.argv[1])), "outputs")
try:
    ssh_access_check("root", sys.argv[2], sys.argv[3:])(target)()
except ToolError as err:
    print(f"{type(err).__name__}: {err}")
    sys.exit(err.exit_code)
print("reached every node")
"""


@pytest.mark.parametrize("pin", ["its own", "another"])
def test_upgrade_checks_every_node_before_it_changes_anything(node, pin):
    """ops upgrade's first step (before the baseline, the config, the deploy): `true` on every node,
    held to the key the stack pins."""
    outputs = node.outputs_file(node.host_key if pin == "its own" else OTHER_HOST_KEY)
    proc = node.run(sys.executable, "-c", UPGRADE_CHECK, str(outputs), str(node.login),
                    f"UserKnownHostsFile={node.operator_known_hosts}")
    if pin == "its own":
        assert proc.returncode == 0 and "reached every node" in proc.stdout, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stdout.startswith("HostKeyRefused: spark1 (127.0.0.1): refused"), proc.stdout


@pytest.fixture(params=DEAD_AGENT_KINDS)
def dead_agent(request):
    a = DeadAgent(request.param)
    yield a
    a.stop()


def test_a_dead_agent_beside_a_key_file_is_left_out(node, dead_agent):
    proc = node.ops("clear-hold", "--outputs-file", str(node.outputs_file(node.host_key)), *ssh_flags(node),
                    env=dead_agent.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "spark1: serving is not held; nothing to clear" in proc.stdout


def recording_ssh(tmp_path):
    """An `ssh` first on PATH that records each call: none must come."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/ssh-calls\nexit 255\n')
    (bin_dir / "ssh").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("tool", [
    ["status"],
    ["clear-hold"],
    ["upgrade", "--stack", "spark", "--set", "serving.maxModelLen=65536"],
])
def test_a_dead_agent_is_one_line_before_any_node_is_reached(tmp_path, dead_agent, tool):
    outputs = Node(tmp_path).outputs_file(OTHER_HOST_KEY)
    flags = [] if tool[0] == "upgrade" else ["--outputs-file", str(outputs)]
    proc = subprocess.run([sys.executable, "-m", "ops", *tool, *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **recording_ssh(tmp_path), **dead_agent.env})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    one_clear_line(proc.stderr, f"ops {tool[0]}: SSH_AUTH_SOCK={dead_agent.sock}: no ssh-agent answers there",
                   "--ssh-key", "ssh-add")
    assert not (tmp_path / "ssh-calls").exists()


def test_a_dead_agent_with_a_passphrase_key_is_one_line(tmp_path, dead_agent):
    locked = new_key(tmp_path / "locked", "a passphrase")
    outputs = Node(tmp_path).outputs_file(OTHER_HOST_KEY)
    proc = subprocess.run([sys.executable, "-m", "ops", "clear-hold", "--outputs-file", str(outputs), "--ssh-key",
                           str(locked)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **recording_ssh(tmp_path), **dead_agent.env})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    one_clear_line(proc.stderr, f"ops clear-hold: --ssh-key {locked}: ", "no ssh-agent answers there",
                   f"ssh-add {locked}")
    assert not (tmp_path / "ssh-calls").exists()


def test_stack_outputs_without_host_keys_are_one_line(tmp_path, capsys):
    """A stack deployed before the outputs carried the keys: nothing reached unverified."""
    outputs = json.loads(Node(tmp_path).outputs_file(OTHER_HOST_KEY).read_text())
    del outputs["nodes"][0]["hostKey"]
    path = tmp_path / "old-outputs.json"
    path.write_text(json.dumps(outputs))
    proc = subprocess.run([sys.executable, "-m", "ops", "clear-hold", "--outputs-file", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, **recording_ssh(tmp_path)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    one_clear_line(proc.stderr, "ops clear-hold: spark1: no hostKey", "pulumi up")
    assert not (tmp_path / "ssh-calls").exists()
