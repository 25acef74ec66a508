"""Where the day-2 tools point: the stack's outputs, or flags that stand in for them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional


class TargetError(RuntimeError):
    """The tools cannot tell which endpoint to talk to; the message says what to pass."""


@dataclass
class Target:
    endpoint: str  # .../v1
    api_key: str
    model: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    ssh_user: Optional[str] = None
    fabric: dict[str, Any] = field(default_factory=dict)  # {"mtu": .., "linkSpeedMbps": ..}

    @property
    def base_url(self) -> str:
        return self.endpoint.rstrip("/").removesuffix("/v1")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("target (default: the outputs of the current Pulumi stack)")
    group.add_argument("--stack", help="Pulumi stack to read outputs from")
    group.add_argument("--endpoint", help="OpenAI base URL, e.g. http://192.168.1.10:8000/v1")
    group.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"), help="default: $VLLM_API_KEY")
    group.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    group.add_argument("--nodes", help="JSON list of nodes as in the `nodes` stack output")
    group.add_argument("--outputs-file", help="a saved `pulumi stack output --json --show-secrets`")


def stack_outputs(stack: Optional[str]) -> dict[str, Any]:
    command = ["pulumi", "stack", "output", "--json", "--show-secrets"] + (["--stack", stack] if stack else [])
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise TargetError("the Pulumi CLI is not on PATH: pass --endpoint and --api-key (and --nodes)") from None
    if proc.returncode != 0:
        raise TargetError(f"`{' '.join(command)}` failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def resolve_target(args: argparse.Namespace, need_nodes: bool = False) -> Target:
    """Flags win over stack outputs; the stack is read only when a flag is missing."""
    outputs: dict[str, Any] = {}
    if args.outputs_file:
        with open(args.outputs_file) as f:
            outputs = json.load(f)
    elif not (args.endpoint and args.api_key and (not need_nodes or status_flags_complete(args))):
        outputs = stack_outputs(args.stack)
    endpoint = args.endpoint or outputs.get("endpoint")
    if not endpoint:
        raise TargetError("no endpoint: pass --endpoint http://HEAD:8000/v1 or run inside the Pulumi project")
    try:
        nodes = json.loads(args.nodes) if args.nodes else outputs.get("nodes", [])
    except json.JSONDecodeError as err:
        raise TargetError(f"--nodes is not JSON ({err.msg}): pass the `nodes` stack output") from None
    if need_nodes:
        if not nodes:
            raise TargetError("no nodes: pass --nodes '[{\"name\":...,\"role\":...,\"host\":...,\"rayIp\":...,\"rails\":[...]}]'")
        lacking = [str(n.get("name", i)) for i, n in enumerate(nodes) if not NODE_FIELDS <= set(n)]
        if lacking:
            raise TargetError(f"nodes {', '.join(lacking)} lack one of {', '.join(sorted(NODE_FIELDS))}: "
                              "pass the `nodes` output of the current stack")
    return Target(
        endpoint=endpoint,
        api_key=args.api_key or outputs.get("apiKey") or "",
        model=args.model or outputs.get("model") or "",
        nodes=nodes,
        outputs=outputs,
        ssh_user=outputs.get("sshUser"),
        fabric=outputs.get("fabric") or {},
    )


NODE_FIELDS = {"name", "role", "host", "rayIp", "rails"}


def status_flags_complete(args: argparse.Namespace) -> bool:
    """Flags alone say everything `status` needs: the stack need not be read."""
    return all(getattr(args, a, None) for a in ("nodes", "ssh_user", "expect_mtu", "expect_speed_mbps"))


@dataclass
class StatusExpectations:
    ssh_user: str
    mtu: int
    speed_mbps: int


def status_expectations(args: argparse.Namespace, target: Target) -> StatusExpectations:
    """The SSH user and what every rail must show: from the stack, flags overriding."""
    values = {
        "--ssh-user": args.ssh_user or target.ssh_user,
        "--expect-mtu": args.expect_mtu or target.fabric.get("mtu"),
        "--expect-speed-mbps": args.expect_speed_mbps or target.fabric.get("linkSpeedMbps"),
    }
    missing = [flag for flag, value in values.items() if not value]
    if missing:
        raise TargetError(f"the stack outputs do not say {', '.join(missing)}: pass "
                          + " and ".join(missing) + " (or run inside the Pulumi project)")
    return StatusExpectations(*values.values())
