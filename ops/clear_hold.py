"""clear-hold — let serving start again after the guard held it (a restart loop).

The guard on the head holds serving after too many restarts in its window (the hold file,
on tmpfs, says why). A reboot of the nodes clears it, and is what the hold recommends: a
crashed engine leaks unified memory that only a reboot frees. This clears it without one:
it removes the hold file on the head over SSH, then waits until the guard has put the
restart policy back and says so in its verdict.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import time
from typing import Optional

from rich.console import Console
from rich.text import Text

from core import contract

from .output import add_json_argument, human_console, print_json
from .inputs import ToolError
from .nodes import NodeShell, add_ssh_arguments, check_pinned, ssh_shell
from .target import add_target_arguments, resolve_target, ssh_user

WAIT_S = 60
READ_VERDICT = f"cat {shlex.quote(contract.SERVING_GUARD_STATUS)}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, endpoint=False, nodes=True)
    add_ssh_arguments(parser)
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, ("nodes", "ssh_user"))
    check_pinned(target.nodes)
    outcome: dict = {}
    code = clear_hold(target, ssh_shell(ssh_user(args, target), args.ssh_key, args.ssh_option), human_console(args),
                      outcome=outcome)
    print_json(args, outcome)
    return code


def release_hold(shell: NodeShell, head: dict) -> None:
    """Remove the head's hold file (the guard does the rest); `ops upgrade` uses it too."""
    shell(head, f"sudo -n rm -f {shlex.quote(contract.SERVING_HOLD)}", "")


def read_verdict(shell: NodeShell, head: dict) -> dict:
    try:
        verdict = json.loads(shell(head, READ_VERDICT, ""))
    except (RuntimeError, ValueError, subprocess.SubprocessError) as err:
        raise ToolError(f"cannot read the guard's verdict on {head['name']}: {err}") from None
    if not isinstance(verdict, dict):
        raise ToolError(f"the guard's verdict on {head['name']} is not a JSON object")
    return verdict


def clear_hold(target, shell: NodeShell, console: Console, wait_s: float = WAIT_S, outcome: Optional[dict] = None) -> int:
    """`outcome` (for --json) gets the head, the hold found (null: none) and whether serving was let go."""
    head = next(n for n in target.nodes if n["role"] == "head")
    hold = read_verdict(shell, head).get("hold")
    if outcome is not None:
        outcome.update(node=head["name"], hold=hold or None, cleared=False)
    if not hold:
        console.print(Text(f"{head['name']}: serving is not held; nothing to clear"))
        return 0
    console.print(Text(f"{head['name']}: clearing the hold: {hold.get('reason') if isinstance(hold, dict) else hold}"))
    try:
        release_hold(shell, head)
    except (RuntimeError, subprocess.SubprocessError) as err:
        raise ToolError(f"cannot remove the hold on {head['name']}: {err}") from None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(2)
        verdict = read_verdict(shell, head)
        if not verdict.get("hold") and verdict.get("restarts_in_window") == 0:
            if outcome is not None:
                outcome["cleared"] = True
            console.print(Text(f"{head['name']}: hold cleared; serving is starting (watch with `twinspark status`)",
                               style="green"))
            return 0
    raise ToolError(f"the hold file is gone but the guard on {head['name']} has not released serving within "
                    f"{wait_s:.0f} s: is {contract.SERVING_GUARD_UNIT} running? (journalctl -u {contract.SERVING_GUARD_UNIT})")
