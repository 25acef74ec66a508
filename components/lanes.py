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

from core import contract

from .config import ServedLane, StackConfig, Topology


@dataclass(frozen=True)
class LaneParts:
    """One lane as the program builds it: its view of the stack, and its resources' names."""

    lane: ServedLane
    view: StackConfig
    named: bool  # another lane than the head's, beside it: its own resources carry its name

    def name(self, resource: str) -> str:
        return f"{self.lane.name}-{resource}" if self.named else resource


def lane_parts(cfg: StackConfig) -> list[LaneParts]:
    head = cfg.head_lane
    return [LaneParts(lane, cfg.lane_view(lane), lane != head) for lane in cfg.served_lanes]


def lane_addresses(cfg: StackConfig, topology: Topology) -> list[tuple[str, str]]:
    """(lane, HOST:PORT of its gateway) as the router on the head reaches them, in the stack's order."""
    def host(lane: ServedLane) -> str:
        head = cfg.lane_head(lane)
        return "127.0.0.1" if head == cfg.head else topology.ray_ip(head)
    return [(lane.name, f"{host(lane)}:{contract.LANE_GATEWAY_PORT}") for lane in cfg.served_lanes]
