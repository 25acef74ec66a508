"""forensics — what a node's unclean boots left: list the reports, or show one.

Every node's recorder (launch/node-recorder.py) keeps a report when a boot did not end cleanly
(a freeze, a panic, a power cut, a power cycle by the watch): the previous boot's kernel log,
pstore, the GPU's Xid lines, the OOM kills and the last memory picture before the end, with a
one-line likely cause. `twinspark forensics` lists them on every node, newest first, and whether
a node is still held out of serving until the fabric and NCCL checks pass; `twinspark forensics
NODE REPORT` prints one report whole.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import time

from rich.text import Text

from core import contract

from .inputs import ToolError
from .nodes import add_ssh_arguments, check_pinned, ssh_shell
from .output import add_json_argument, human_console, print_json
from .target import add_target_arguments, resolve_target, ssh_user


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", nargs="?", help="only this node's reports")
    parser.add_argument("report", nargs="?", help="print this report whole (a name `forensics` lists)")
    add_target_arguments(parser, endpoint=False, nodes=True)
    add_ssh_arguments(parser)
    add_json_argument(parser)


def recorder_command(*args: str) -> str:
    return "sudo -n python3 " + shlex.join([contract.NODE_RECORDER, *args, "--dir", contract.FORENSICS_DIR])


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, ("nodes", "ssh_user"))
    nodes = target.nodes
    if args.node:
        nodes = [n for n in nodes if n["name"] == args.node]
        if not nodes:
            raise ToolError(f"no node {args.node!r} in the stack: expected one of "
                            f"{', '.join(n['name'] for n in target.nodes)}")
    check_pinned(nodes)
    shell, console = ssh_shell(ssh_user(args, target), args.ssh_key, args.ssh_option), human_console(args)

    def ask(node: dict, *verb: str) -> dict:
        try:
            return json.loads(shell(node, recorder_command(*verb), ""))
        except (RuntimeError, subprocess.SubprocessError) as err:
            raise ToolError(f"{node['name']}: cannot read its reports: {err}") from None
        except ValueError:
            raise ToolError(f"{node['name']}: its recorder did not answer JSON (is {contract.NODE_RECORDER_UNIT} "
                            "installed? `pulumi up` installs it)") from None

    if args.report:
        report = ask(nodes[0], "show", args.report)
        print_json(args, report)
        if not args.json:
            console.print(Text(json.dumps(report, indent=1)))
        return 0
    found = {n["name"]: ask(n, "list") for n in nodes}
    print_json(args, found)
    for name, listing in found.items():
        pending = listing.get("pending_requalification")
        console.print(Text(f"{name}: " + (f"HELD out of serving since the unclean boot {pending}, until the fabric and "
                                          "NCCL checks pass (the head's guard runs them)" if pending else
                                          f"{len(listing.get('reports', []))} report(s)")))
        for report in listing.get("reports", []):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.get("found_at") or 0))
            console.print(Text(f"  {report.get('name')}  {when}  {report.get('summary')}"))
    return 0
