"""`python -m ops pin-host-keys` against a real sshd on loopback."""

import os
import shlex
import subprocess
import sys

import pytest
import yaml
from ssh_fixtures import OTHER_HOST_KEY, new_key
from program_harness import ROOT
from ssh_fixtures import Sshd


@pytest.fixture
def sshd(tmp_path):
    server = Sshd(tmp_path, new_key(tmp_path / "login").with_suffix(".pub"))
    yield server
    server.stop()


def stack_file(tmp_path, nodes):
    path = tmp_path / "Pulumi.lab.yaml"
    path.write_text(yaml.safe_dump({"config": {"twinspark:ssh": {"user": "nvidia"}, "twinspark:nodes": nodes}}))
    return path


def pin(path, port, *flags, answer="", path_dir=None):
    env = dict(os.environ)
    if path_dir:
        env["PATH"] = f"{path_dir}:{env['PATH']}"
    return subprocess.run([sys.executable, "-m", "ops", "pin-host-keys", "--stack-file", str(path), "--port", str(port),
                           "--timeout", "5", *flags], cwd=ROOT, input=answer, capture_output=True, text=True, env=env,
                          timeout=120)


def printed_commands(stdout):
    return [shlex.split(line) for line in stdout.splitlines() if line.strip().startswith("pulumi config set")]


def test_it_shows_ssh_keygens_fingerprint_and_prints_the_config_commands(tmp_path, sshd):
    nodes = [{"name": "spark1", "host": "127.0.0.1"}, {"name": "spark2", "host": "127.0.0.2"}]
    proc = pin(stack_file(tmp_path, nodes), sshd.port)
    shown = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "ssh_host_ed25519_key.pub")],
                           capture_output=True, text=True, check=True).stdout.split()[1]
    spark1 = next(line for line in proc.stdout.splitlines() if "spark1" in line)
    assert shown in spark1 and "new" in spark1, proc.stdout
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in proc.stdout
    # spark2's address has no sshd: named, the others still pinned, and a failing exit
    assert "spark2" in proc.stdout and "FAILED" in proc.stdout and proc.returncode == 1
    assert printed_commands(proc.stdout) == [
        ["pulumi", "config", "set", "--stack", "lab", "--path", "nodes[0].hostKey", sshd.host_key]]


def test_a_pinned_key_is_checked_and_a_changed_one_flagged(tmp_path, sshd):
    proc = pin(stack_file(tmp_path, [{"name": "spark1", "host": "127.0.0.1", "hostKey": sshd.host_key}]), sshd.port)
    assert "pinned already" in proc.stdout and "Nothing to record" in proc.stdout and proc.returncode == 0
    proc = pin(stack_file(tmp_path, [{"name": "spark1", "host": "127.0.0.1", "hostKey": OTHER_HOST_KEY}]), sshd.port)
    assert "CHANGED" in proc.stdout and printed_commands(proc.stdout)[0][-1] == sshd.host_key


@pytest.mark.parametrize("answer, recorded", [("yes\n", True), ("no\n", False)])
def test_apply_runs_the_commands_only_after_a_yes(tmp_path, sshd, answer, recorded):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "pulumi-calls"
    (bin_dir / "pulumi").write_text(f'#!/bin/bash\nprintf "%s\\n" "$PWD" "$@" >> {log}\n')
    (bin_dir / "pulumi").chmod(0o755)
    path = stack_file(tmp_path, [{"name": "spark1", "host": "127.0.0.1"}])
    proc = pin(path, sshd.port, "--apply", answer=answer, path_dir=bin_dir)
    if recorded:
        assert proc.returncode == 0, proc.stdout
        assert log.read_text().splitlines() == [str(tmp_path), "config", "set", "--stack", "lab", "--path",
                                                "nodes[0].hostKey", sshd.host_key]
    else:
        assert proc.returncode == 1 and "Nothing recorded" in proc.stdout and not log.exists()


def test_a_stack_file_without_nodes_is_one_line(tmp_path):
    path = tmp_path / "Pulumi.lab.yaml"
    path.write_text("config: {}\n")
    proc = pin(path, 22)
    assert proc.returncode == 2 and proc.stdout.strip().endswith("a list of nodes with a host each")
    assert "Traceback" not in proc.stderr
