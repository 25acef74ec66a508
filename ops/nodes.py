"""Node access for every day-2 tool: OpenSSH held to the host key `pulumi up` holds each node to.

`ssh_shell` runs a command on a node; `ssh_runner` feeds it one of the probes under launch/ that
ops reads (node-status.py, platform-facts.py). Both hold OpenSSH to the node's pinned key (the
`nodes` output's hostKey, through host_keys.pinned_ssh_options, as the docker provider's ssh):
a node showing another is refused in one line. ssh-agent is checked before any node is reached.
`add_ssh_arguments` gives a tool the flags that say how it reaches the nodes.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from core import host_keys

from .inputs import InputError, ToolError, one_line

NODE_PROBE = Path(__file__).resolve().parent.parent / "launch" / "node-status.py"
FACTS_PROBE = NODE_PROBE.with_name("platform-facts.py")
DOCTOR_PROBE = NODE_PROBE.with_name("doctor-facts.py")  # what `doctor` reads beyond status: PCIe, C-states, hashes

# A function that runs a probe (default: the node probe) on a node and returns its stdout (JSON).
NodeRunner = Callable[..., str]


# A function that runs a shell command on a node (stdin given) and returns its stdout.
NodeShell = Callable[..., str]


class HostKeyRefused(ToolError):
    """A node showed another SSH host key than the one `pulumi up` held it to: nothing ran there."""


def add_ssh_arguments(parser: argparse.ArgumentParser) -> None:
    """How the tools reach the nodes, always held to each node's pinned host key."""
    parser.add_argument("--ssh-user", default=os.environ.get("TWINSPARK_SSH_USER"), help="default: the stack's ssh.user")
    parser.add_argument("--ssh-key", help="private key (default: ssh's own choice / the agent)")
    parser.add_argument("--ssh-option", action="append", default=[],
                        help="extra `ssh -o` option, repeatable (the host key check comes first: none loosens it)")


def pinned_key(node: dict) -> str:
    """The host key `pulumi up` held the node to (the `nodes` output's hostKey)."""
    key = node.get("hostKey")
    if not key:
        raise InputError(f"{node['name']}: no hostKey for it in the stack's `nodes` output, so it cannot be "
                         "verified: run `pulumi up` once (it exports the key it holds each node to), or pass "
                         "--nodes with each node's hostKey")
    return key


def check_pinned(nodes: Sequence[dict]) -> None:
    """Every node verifiable, before any is reached."""
    for node in nodes:
        pinned_key(node)


def agent_options(key: Optional[str], env: Optional[Mapping[str, str]] = None) -> list[str]:
    """Checked before any node is reached: an SSH_AUTH_SOCK where no agent answers is left out
    (IdentityAgent=none) when --ssh-key opens without a passphrase, else it ends the tool here."""
    agent = host_keys.agent_state(os.environ if env is None else env)
    if not agent.dead:
        return []
    if key is None:
        raise InputError(f"{agent.describe()} — start ssh-agent and `ssh-add` your key, pass --ssh-key, or "
                         "`unset SSH_AUTH_SOCK`")
    problem = host_keys.key_file_problem(key)
    if problem:
        raise InputError(f"--ssh-key {key}: {problem}, and {agent.describe()} — start ssh-agent and `ssh-add {key}`")
    return ["IdentityAgent=none"]  # the key file is enough: ssh need not ask the dead agent


def host_key_refusal(node: dict, key: str, stderr: str) -> str:
    shown = re.search(r"key sent by the remote host is\s+(SHA256:[A-Za-z0-9+/=]+)", stderr)
    return host_keys.refusal(node["name"], node["host"], key, shown.group(1) if shown else None)


def ssh_shell(user: str, key: Optional[str], options: Sequence[str] = ()) -> NodeShell:
    """Runs a command on a node with OpenSSH, holding it to the node's pinned host key with the
    options `pulumi up` gives the docker provider's ssh (host_keys.pinned_ssh_options); they come
    first, so no --ssh-option can loosen them. The agent is checked here, before any node."""
    identity = agent_options(key)

    def run(node: dict, remote_command: str, stdin: str = "", timeout: float = 60) -> str:
        pinned = pinned_key(node)
        with tempfile.TemporaryDirectory(prefix="twinspark-ops-") as tmp:
            known_hosts = host_keys.write_known_hosts(Path(tmp) / "known_hosts", node["host"], pinned)
            settings = [*host_keys.pinned_ssh_options(known_hosts, pinned), "BatchMode=yes", "ConnectTimeout=10",
                        *identity, *options]
            command = ["ssh", *(a for option in settings for a in ("-o", option))] + (["-i", key] if key else [])
            command += [f"{user}@{node['host']}", remote_command]
            proc = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 255 and "Host key verification failed" in proc.stderr:
            raise HostKeyRefused(host_key_refusal(node, pinned, proc.stderr))
        if proc.returncode != 0:
            raise RuntimeError(f"ssh {user}@{node['host']} failed: {one_line(proc.stderr)[-300:]}")
        return proc.stdout

    return run


def ssh_runner(user: str, key: Optional[str], options: Sequence[str] = ()) -> NodeRunner:
    shell = ssh_shell(user, key, options)

    def run(node: dict, args: list[str], probe: Path = NODE_PROBE) -> str:
        # the facts probe starts a container of the serving image (torch's import): give it time
        return shell(node, "python3 - " + shlex.join(args), probe.read_text(), 360 if probe == FACTS_PROBE else 60)

    return run
