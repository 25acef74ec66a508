"""python -m ops pin-host-keys: read each node's SSH host key once, show its fingerprint to compare
with the one the node itself shows, and record it as `twinspark:nodes[i].hostKey`.

`pulumi up` refuses a node without a pinned key (unless ssh.trustOnFirstUse): this is how it
gets one. The node list comes from the stack file (read only). The keys are recorded by the
Pulumi CLI (`pulumi config set --path`), which owns the stack file's format: the tool prints
those commands, or runs them with --apply after you confirm that the fingerprints match.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional, TextIO

import yaml

from core import host_keys
from core import contract

from .inputs import port_number, positive_int
from .output import add_json_argument, print_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description, p.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    p.add_argument("--stack-file", type=Path, default=Path("Pulumi.spark.yaml"), help="default: %(default)s")
    p.add_argument("--stack", help="stack name for `pulumi config set` (default: from the file name)")
    p.add_argument("--port", type=port_number, default=contract.SSH_PORT,
                   help=f"SSH port of the nodes (default: {contract.SSH_PORT})")
    p.add_argument("--timeout", type=positive_int, default=10, help="seconds per node (default: 10)")
    p.add_argument("--apply", action="store_true", help="run the `pulumi config set` commands once you confirm")
    add_json_argument(p)


def stack_name(stack_file: Path) -> str:
    name = stack_file.name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")) and name.count(".") == 2:
        return name.split(".")[1]
    raise ValueError(f"{stack_file}: not named Pulumi.<stack>.yaml — pass --stack")


def config_set_command(stack: str, index: int, key: str) -> list[str]:
    return ["pulumi", "config", "set", "--stack", stack, "--path", f"nodes[{index}].hostKey", key]


def run(args: argparse.Namespace, stdin: TextIO = sys.stdin, out: Optional[TextIO] = None) -> int:
    """Under --json what a person reads goes to stderr and stdout gets one document at the end: each
    node's key, fingerprint and state (or error), the commands, whether they were recorded."""
    found: dict = {"nodes": [], "commands": [], "recorded": False}
    code = read_and_pin(args, stdin, out or (sys.stderr if args.json else sys.stdout), found)
    print_json(args, found)
    return code


def read_and_pin(args: argparse.Namespace, stdin: TextIO, out: TextIO, found: dict) -> int:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    try:
        stack = args.stack or stack_name(args.stack_file)
        config = (yaml.safe_load(args.stack_file.read_text()) or {}).get("config") or {}
    except (OSError, ValueError, yaml.YAMLError) as err:
        say(f"pin-host-keys: {err}")
        return 2
    nodes = config.get("twinspark:nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and n.get("host") for n in nodes) or not nodes:
        say(f"pin-host-keys: {args.stack_file}: expected twinspark:nodes, a list of nodes with a host each")
        return 2

    commands, failed = [], False
    say(f"{host_keys.KEY_TYPE} host keys, as read over the network now:")
    for i, node in enumerate(nodes):
        label = f"  {str(node.get('name', f'nodes[{i}]')):<10} {str(node['host']):<16}"
        try:
            key = host_keys.scan(str(node["host"]), args.port, args.timeout)
        except host_keys.HostKeyError as err:
            say(f"{label} FAILED: {err}")
            found["nodes"].append({"name": node.get("name"), "host": node["host"], "error": str(err)})
            failed = True
            continue
        pinned = node.get("hostKey")
        if pinned == key:
            state = "pinned already"
        elif pinned:
            state = "CHANGED: differs from the pinned key (reinstalled? or not the node you think it is)"
        else:
            state = "new"
        say(f"{label} {host_keys.fingerprint(key)}  {state}")
        found["nodes"].append({"name": node.get("name"), "host": node["host"], "key": key,
                               "fingerprint": host_keys.fingerprint(key), "state": state.split(":")[0].lower()})
        if pinned != key:
            commands.append(config_set_command(stack, i, key))
    found["commands"] = [shlex.join(command) for command in commands]
    if not commands:
        say("Nothing to record." if not failed else "Nothing recorded: fix the failures above and run again.")
        return 1 if failed else 0

    say()
    say("Compare each fingerprint with the one the node shows on its own console (not over this network):")
    say(f"    ssh-keygen -lf {host_keys.NODE_KEY_FILE}")
    say(f"then record them (in {args.stack_file.resolve().parent}):")
    for command in commands:
        say("    " + shlex.join(command))
    if not args.apply:
        return 1 if failed else 0

    say()
    say('Type "yes" if every fingerprint above matches what its node shows: ')
    if stdin.readline().strip() != "yes":
        say("Nothing recorded.")
        return 1
    for command in commands:
        proc = subprocess.run(command, cwd=args.stack_file.resolve().parent, capture_output=True, text=True)
        if proc.returncode != 0:
            say(f"pin-host-keys: `{shlex.join(command[:7])} ...` failed: {proc.stderr.strip()[-300:]}")
            return 1
    say(f"Recorded {len(commands)} host key(s) in the {stack} stack's config.")
    found["recorded"] = True
    return 1 if failed else 0
