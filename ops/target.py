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
    elif not (args.endpoint and args.api_key and (args.nodes or not need_nodes)):
        outputs = stack_outputs(args.stack)
    endpoint = args.endpoint or outputs.get("endpoint")
    if not endpoint:
        raise TargetError("no endpoint: pass --endpoint http://HEAD:8000/v1 or run inside the Pulumi project")
    nodes = json.loads(args.nodes) if args.nodes else outputs.get("nodes", [])
    if need_nodes and not nodes:
        raise TargetError("no nodes: pass --nodes '[{\"name\":...,\"role\":...,\"host\":...,\"rails\":[...]}]'")
    return Target(
        endpoint=endpoint,
        api_key=args.api_key or outputs.get("apiKey") or "",
        model=args.model or outputs.get("model") or "",
        nodes=nodes,
        outputs=outputs,
    )
