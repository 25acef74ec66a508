"""Each day-2 tool runs from its own flags alone, offers only the flags it reads, and where a flag
is missing and no stack can be read, the error names the missing flags (issue 39)."""

import json

import pytest
from ops_helpers import run_ops
from ssh_fixtures import new_key
from toolbox import free_port, one_clear_line

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.fixture
def no_stack(monkeypatch):
    """No Pulumi CLI on PATH and no SSH user from the environment: nothing but the flags."""
    monkeypatch.setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    monkeypatch.delenv("TWINSPARK_SSH_USER", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def node_flags(tmp_path):
    """One head on loopback at a port where nothing listens: a tool that got this far read no stack."""
    nodes = [{"name": "spark1", "role": "head", "host": "127.0.0.1", "rayIp": "10.0.0.1", "rails": [],
              "hostKey": HOST_KEY}]
    return ["--nodes", json.dumps(nodes), "--ssh-user", "nvidia", "--ssh-key", str(new_key(tmp_path / "id")),
            "--ssh-option", f"Port={free_port()}"]


def test_clear_hold_needs_no_stack_with_its_flags(no_stack, tmp_path, capsys):
    code, err, _ = run_ops(capsys, "clear-hold", *node_flags(tmp_path))
    assert code == 1
    one_clear_line(err, "ops clear-hold: cannot read the guard's verdict on spark1: ssh nvidia@127.0.0.1 failed")


def test_verify_weights_needs_no_stack_with_its_flags(no_stack, tmp_path, capsys):
    code, err, out = run_ops(capsys, "verify-weights", *node_flags(tmp_path), "--dir", "/home/nvidia/models/m")
    assert code == 1 and err == ""
    assert "spark1: not checked: not reached: ssh nvidia@127.0.0.1 failed" in out, out


@pytest.mark.parametrize("tool, flags, missing", [
    ("clear-hold", ["--ssh-user", "nvidia"], "--nodes"),
    ("verify-weights", ["--ssh-user", "nvidia", "--nodes", "[]"], "--dir"),
    ("status", ["--endpoint", "http://h:8000/v1", "--api-key", "k"],
     "--nodes and --ssh-user and --expect-mtu and --expect-speed-mbps"),
    ("bench", ["--endpoint", "http://h:8000/v1"], "--api-key"),
])
def test_a_missing_flag_without_a_stack_is_named(no_stack, monkeypatch, capsys, tool, flags, missing):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code, err, _ = run_ops(capsys, tool, *flags)
    assert code == 2
    one_clear_line(err, f"ops {tool}: the Pulumi CLI is not on PATH (README, Prerequisites; the simulator's: "
                   'eval "$(scripts/sim.sh env)"), so no stack can be read: pass ' + f"{missing}, "
                   "or run inside the Pulumi project")


@pytest.mark.parametrize("tool, flag", [
    ("clear-hold", "--endpoint"), ("clear-hold", "--api-key"), ("verify-weights", "--model"),
    ("client-setup", "--endpoint"), ("client-setup", "--nodes"), ("bench", "--nodes"), ("needle", "--nodes"),
])
def test_a_tool_refuses_a_flag_it_does_not_read(capsys, tool, flag):
    code, err, _ = run_ops(capsys, tool, flag, "x")
    assert code == 2
    one_clear_line(err, f"unrecognized arguments: {flag} x")
