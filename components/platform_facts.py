"""PlatformFacts: every node's platform, checked before NCCL or vLLM touches it (the platform gate).

Creates one remote command per node (`{node}-platform-facts`) running
launch/platform-facts.sh: the facts program (launch/platform-facts.py) reads DGX OS, kernel,
driver, CUDA, GPU, BIOS, CMA, ConnectX firmware, the serving image's ID and, inside it, vLLM,
torch, NCCL and Ray; on the head, where the image was built, it fails the step when the image
was not built from the pinned base. The step re-runs when the node's serving image or the
facts program changes.

`platform_gate.evaluate` then judges the facts of all nodes on every `pulumi up` (a changed
acknowledgement or known-issues list counts at once, with no step re-run): nodes that differ
in driver or kernel, or a platform on the known-issues list, fail `pulumi up` with the entries'
text unless `platform.acknowledge` names them; nodes on another image ID, vLLM, torch, NCCL or
Ray fail it whatever it names. `gated(value)` hands a value on only
once the gate has passed: the NCCL check and the serving containers take their image through
it, so none starts on a refused platform, and the value itself is unchanged (no diff).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote as pulumi_remote

from core import platform_gate

from .remote import NodeHandle, NodeScript, launch_file, node_command

SCRIPT = "platform-facts.sh"
PROGRAM = "platform-facts.py"


@dataclass(frozen=True)
class NodeFacts(NodeHandle):
    image_id: pulumi.Input[str]  # the node's serving image
    built_here: bool = False  # the head: its image is checked against the pinned base


@dataclass(frozen=True)
class PlatformFactsArgs:
    nodes: Sequence[NodeFacts]
    base_image: pulumi.Input[str]  # the pinned REPO@sha256:... the image was built from
    acknowledged: Sequence[str]  # platform.acknowledge
    engines: Sequence[Sequence[str]] = ()  # the nodes of each lane's engine (one lane: every node), one build each


def facts_args(node_name: str, image_id: str, base_image: Optional[str]) -> list[str]:
    """Where the image was built, --base: it must start with the base's layers. A worker holds
    the head's image (the `image` fact compares the IDs), not the base."""
    return ["--node", node_name, "--image", image_id] + (["--base", base_image] if base_image else [])


def parsed(outs: Sequence[str], names: Sequence[str]) -> dict[str, dict]:
    try:
        return {n: platform_gate.parse_report(out, n) for n, out in zip(names, outs)}
    except ValueError as err:
        raise pulumi.RunError(f"platform gate: {err}") from None


def verdict(facts_by_node: dict[str, dict], acknowledged: Sequence[str], engines: Sequence[Sequence[str]] = ()) -> str:
    """'passed', or a RunError with every finding's text: `pulumi up` stops before the containers."""
    findings = platform_gate.evaluate(facts_by_node, list(acknowledged), groups=engines)
    if findings:
        raise pulumi.RunError(platform_gate.refusal(findings))
    return "passed"


class PlatformFacts(pulumi.ComponentResource):
    def __init__(self, name: str, args: PlatformFactsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:platform_facts:PlatformFacts", name, None, opts)
        self.commands: dict[str, pulumi_remote.Command] = {}
        for node in args.nodes:
            # mypy cannot type a lambda whose default binds the loop's node
            script_args = pulumi.Output.all(node.image_id, args.base_image).apply(
                lambda v, n=node: facts_args(n.name, v[0], v[1] if n.built_here else None))  # type: ignore[misc]
            self.commands[node.name] = node_command(
                f"{node.name}-platform-facts", node.connection,
                NodeScript(SCRIPT, script_args, payload=launch_file(PROGRAM)), parent=self,
            )
        names = list(self.commands)
        self.facts: pulumi.Output[dict] = pulumi.Output.all(*(c.stdout for c in self.commands.values())).apply(
            lambda outs: parsed(outs, names))
        self.verdict = self.facts.apply(lambda facts: verdict(facts, args.acknowledged, args.engines))
        self.register_outputs({"facts": self.facts, "verdict": self.verdict})

    def gated(self, value: pulumi.Input[str]) -> pulumi.Output[str]:
        """`value`, once the gate has passed (and carrying the facts steps as dependencies)."""
        return pulumi.Output.all(value, self.verdict).apply(lambda v: v[0])
