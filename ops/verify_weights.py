"""verify-weights — hash every weights file on every node again, trusting no record.

`pulumi up` hashes a file only when its size, mtime, ctime or inode moved since it was last
verified (launch/weights.py's record): a bit that rots below the filesystem moves none of them.
This runs the same weights.py (sent over SSH stdin, as the weights steps send it) with
`verify --full` on every node at once: each file's sha256 against the head's manifest. A file
that fails is named and dropped from that node's record, so the `pulumi up --replace` printed
for it (the head's fetch, a worker's copy) hashes it and repairs it; nothing is deleted here,
and serving keeps the weights it loaded.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.text import Text

from core import contract

from .output import add_json_argument, human_console, print_json
from .inputs import InputError, one_line
from .nodes import NodeShell, add_ssh_arguments, check_pinned, ssh_shell
from .target import add_target_arguments, exported_resources, resolve_target, ssh_user

WEIGHTS_PROGRAM = Path(__file__).resolve().parent.parent / "launch" / "weights.py"
TIMEOUT_S = 3 * 3600  # a full model read at a few GB/s takes minutes; a slow disk, longer
EXIT_MARK = "twinspark-verify-exit "


@dataclass
class NodeVerdict:
    node: str
    role: str
    failures: list[str]  # weights.py's FAIL lines, without the FAIL
    summary: str  # "hashed N files: ..." or why the node could not be checked
    checked: bool  # the hash ran to its end (failures or not)

    def steps(self, names) -> list[str]:
        """The weights steps whose --replace repairs this node (docs/operating.md, Recovering)."""
        return [f"{self.node}-weights-fetch"] if self.role == "head" else copy_again_steps(self.node, names)


def copy_again_steps(worker: str, names) -> list[str]:
    """What a worker's copy needs replaced to run again: the copy, and around it the authorization
    of its source's sync key (a worker admits the key only while the steps that use it run) and its
    revocation; `names`: the stack's resource names (a relayed copy's are the relay-* ones)."""
    kind = "relay-" if f"{worker}-weights-relay-authorize" in names else ""
    return [f"{worker}-weights-{kind}authorize", f"{worker}-weights-sync", f"{worker}-weights-{kind}revoke"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, endpoint=False, nodes=True)
    add_json_argument(parser)
    add_ssh_arguments(parser)
    parser.add_argument("--dir", help="the model directory on the nodes (default: the stack's modelDir output)")


def remote_command(model_dir: str, node: str) -> str:
    """weights.py verify --full on stdin; its logs (stderr) are the answer, its file list (stdout)
    is not wanted; the exit status comes as the last line (ssh's own status would hide the text)."""
    flags = ["verify", "--full", "--dir", model_dir, "--manifest", f"{model_dir}/{contract.WEIGHTS_MANIFEST}",
             "--record", f"{model_dir}/{contract.WEIGHTS_RECORD}", "--node", node]
    return f"python3 - {shlex.join(flags)} 2>&1 >/dev/null; echo \"{EXIT_MARK}$?\""


def parse_verdict(node: dict, text: str) -> NodeVerdict:
    lines = text.splitlines()
    status = next((line[len(EXIT_MARK):] for line in reversed(lines) if line.startswith(EXIT_MARK)), None)
    failures = [line.split("FAIL ", 1)[1] for line in lines if "FAIL " in line]
    hashed = next((line.split(": ", 1)[1] for line in lines if line.startswith(f"{node['name']}: hashed ")), "")
    if status is None or (status != "0" and not failures):
        tail = one_line(" | ".join(line for line in lines if not line.startswith(EXIT_MARK))[-300:])
        return NodeVerdict(node["name"], node["role"], [], f"weights.py exited {status}: {tail or 'no output'}", False)
    return NodeVerdict(node["name"], node["role"], failures, hashed or "hashed nothing", True)


def verify_node(shell: NodeShell, node: dict, model_dir: str, program: str) -> NodeVerdict:
    try:
        return parse_verdict(node, shell(node, remote_command(model_dir, node["name"]), program, TIMEOUT_S))
    except (RuntimeError, subprocess.SubprocessError) as err:
        return NodeVerdict(node["name"], node["role"], [], f"not reached: {one_line(str(err))[-300:]}", False)


def verify_all(shell: NodeShell, nodes: list[dict], model_dir: str) -> list[NodeVerdict]:
    """Every node at once: each reads its own disk."""
    program = WEIGHTS_PROGRAM.read_text()
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return list(pool.map(lambda n: verify_node(shell, n, model_dir, program), nodes))


def repair_command(verdicts: list[NodeVerdict], urns: dict[str, str]) -> Optional[str]:
    """`urns`: {resource name: URN} of the stack (empty where it cannot be read: placeholders)."""
    steps = [step for v in verdicts if v.failures for step in v.steps(urns)]
    if not steps:
        return None
    urn_of = {step: urns.get(step, f"<urn of {step}: pulumi stack --show-urns>") for step in steps}
    return "pulumi up " + " ".join(f"--replace {shlex.quote(urn_of[step])}" for step in steps)


def stack_urns(args: argparse.Namespace) -> dict[str, str]:
    """{resource name: URN} from the stack's state; empty where no stack can be read."""
    return {name: r["urn"] for name, r in exported_resources(args).items()}


def report(verdicts: list[NodeVerdict], urns: dict[str, str], console: Console) -> int:
    for v in verdicts:
        state = "not checked" if not v.checked else f"{len(v.failures)} damaged" if v.failures else "intact"
        console.print(Text(f"{v.node}: {state}: {v.summary}"))
        for failure in v.failures:
            console.print(Text(f"  {failure}"))
    command = repair_command(verdicts, urns)
    if command:
        # one line whatever the width: a command to copy
        console.print(Text(f"repair (the weights step hashes what failed and fetches or sends it again): {command}"),
                      soft_wrap=True)
    return 0 if all(v.checked and not v.failures for v in verdicts) else 1


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, ("nodes", "ssh_user", "dir"))
    model_dir = args.dir or target.outputs.get("modelDir")
    if not model_dir:
        raise InputError("no model directory: pass --dir (model.dir of the stack) or run inside the Pulumi project "
                         "of a stack deployed with the `modelDir` output")
    if not model_dir.startswith("/"):
        raise InputError(f"--dir {model_dir!r}: expected an absolute path on the nodes (model.dir)")
    check_pinned(target.nodes)
    shell = ssh_shell(ssh_user(args, target), args.ssh_key, args.ssh_option)
    verdicts = verify_all(shell, target.nodes, model_dir)
    urns = stack_urns(args) if any(v.failures for v in verdicts) and not (args.outputs_file or args.nodes) else {}
    code = report(verdicts, urns, human_console(args, highlight=False))
    print_json(args, {"model_dir": model_dir, "intact": code == 0, "repair": repair_command(verdicts, urns),
                      "nodes": [{"node": v.node, "role": v.role, "checked": v.checked, "summary": v.summary,
                                 "damaged": v.failures} for v in verdicts]})
    return code
