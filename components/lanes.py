"""Lanes (issue 41): each lane's view of the stack and its resources' names, and where the router finds them.

A stack serves one lane, as it always did (its resources named as before), or several: then each
lane is a one-lane stack of its own (StackConfig.lane_view: its nodes, model and serving, its head
the stack's head where the lane has it) whose gateway listens on contract.LANE_GATEWAY_PORT. The head's
lane keeps the stack's resource names (a stack that takes on a second lane downloads nothing again on
the head); another lane's are `{lane}-...`, but every node's containers stay under the one
`serving` component (a node that changes lanes keeps its container's resource: replaced in place,
never a second container of the same name). On the head (components/serving_cluster.py) the lane router
(launch/lane-router.py; its own container, as nobody, on loopback LANE_ROUTER_PORT) hands each request
to the gateway of the lane serving the `model` it names, and the stack's gateway on serving.port is
its front (the same nginx and key check). Every lane's gateway checks the key again, so the router
holds no secret and nothing reaches an engine on the router's word alone; a worker's lane gateway
admits the head's rail address alone (the firewall's `lane-gateway` flow).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pulumi
from pulumi_command import remote as pulumi_remote

from core import contract

from .config import ServedLane, StackConfig, Topology
from .remote import NodeScript, node_command


@dataclass(frozen=True)
class LaneParts:
    """One lane as the program builds it: its view of the stack, and its resources' names."""

    lane: ServedLane
    view: StackConfig
    topology: Topology  # the view's: its head's Ray address, its copy's rails, its NCCL pairs
    named: bool  # another lane than the head's, beside it: its own resources carry its name

    def name(self, resource: str) -> str:
        return f"{self.lane.name}-{resource}" if self.named else resource


def lane_parts(cfg: StackConfig, addresses: Mapping[str, Sequence[str]]) -> list[LaneParts]:
    """Every lane; `addresses`: the nodes' resolved LAN addresses (resolve_node_addresses)."""
    head = cfg.head_lane
    views = [(lane, cfg.lane_view(lane)) for lane in cfg.served_lanes]
    return [LaneParts(lane, view, Topology(view, addresses), lane != head) for lane, view in views]


def serving_order(parts: Sequence[LaneParts]) -> list[LaneParts]:
    """The lanes in the order their engines are placed: the stack head's last (ServingCluster says why)."""
    return sorted(parts, key=lambda part: not part.named)


def lane_addresses(cfg: StackConfig, topology: Topology) -> list[tuple[str, str]]:
    """(lane, HOST:PORT of its gateway) as the router on the head reaches them, in the stack's order."""
    def host(lane: ServedLane) -> str:
        head = cfg.lane_head(lane)
        return "127.0.0.1" if head == cfg.head else topology.ray_ip(head)
    return [(lane.name, f"{host(lane)}:{contract.LANE_GATEWAY_PORT}") for lane in cfg.served_lanes]


DRAIN_SCRIPT = "lane-drain.sh"  # a lane's gateway drained before `up` swaps its engine, opened after


@dataclass(frozen=True)
class LaneSwapArgs:
    node_name: str  # the lane's head, whose gateway is drained
    connection: pulumi_remote.ConnectionArgs
    port: int  # its gateway's (the engine's /metrics beside it: contract.metrics_loopback_port)
    deadline_s: int  # serving.guard.drainSeconds: how long running requests get to finish
    swapped_by: Sequence[pulumi.Input[str]]  # what replaces the lane's containers: images, bundle and gateway hashes


def drain_flags(args: LaneSwapArgs) -> list[str]:
    return ["--node", args.node_name, "--drain-file", contract.DRAIN_FILE]


class LaneSwap(pulumi.ComponentResource):
    """A lane's engine swapped while the other lanes serve: whenever what replaces its containers
    changes, its gateway turns new requests away and its running ones finish (up to the deadline)
    before the containers go (`drain`, which they wait on); `open_after` takes the drain away once the
    new ones are in place. The other lanes' gateways, engines and the router are not touched."""

    def __init__(self, name: str, args: LaneSwapArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:lanes:LaneSwap", name, None, opts)
        self._args = args
        metrics = f"http://127.0.0.1:{contract.metrics_loopback_port(args.port)}/metrics"
        self.drain = node_command(
            f"{args.node_name}-lane-drain", args.connection,
            NodeScript(DRAIN_SCRIPT, ["drain", *drain_flags(args), "--metrics-url", metrics,
                                                    "--deadline-s", str(args.deadline_s)]),
            parent=self, triggers=list(args.swapped_by))
        self.register_outputs({})

    def open_after(self, containers: Sequence[pulumi.CustomResource]) -> pulumi.Resource:
        return node_command(
            f"{self._args.node_name}-lane-open", self._args.connection,
            NodeScript(DRAIN_SCRIPT, ["open", *drain_flags(self._args)]),
            parent=self, triggers=[*self._args.swapped_by, *(c.id for c in containers)], depends_on=list(containers))
