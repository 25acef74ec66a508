"""Lanes (issue 41): each lane's resources, and the head's one endpoint in front of several lanes.

A stack serves one lane, as it always did (its resources named as before), or several: then each
lane is a one-lane stack of its own (StackConfig.lane_view: its nodes, model and serving, its head
the stack's head where the lane has it) whose gateway listens on contract.LANE_GATEWAY_PORT, its
resources named `{lane}-...`, and the head runs LaneFront:

- the lane router (launch/lane-router.py) in a container of its own, as nobody, on the head's
  loopback (contract.LANE_ROUTER_PORT): each request to the gateway of the lane serving the
  `model` it names, the head's own lane on loopback and another node's over the first rail (the
  `lane-gateway` flow of the firewall admits the head's address alone);
- the front gateway on serving.port: the lane gateways' nginx and key check, in front of the router.

Every lane's gateway checks the key again, so the router holds no secret and nothing reaches an
engine on the router's word alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker
from pulumi_command import remote as pulumi_remote

from core import contract

from .config import ServedLane, StackConfig, Topology
from .launch_bundle import FRONT, bundle_file, render_api_gateway_conf
from .remote import files_hash, launch_file, managed_file_commands
from .serving_cluster import NodeServingArgs, common_args


@dataclass(frozen=True)
class LaneParts:
    """One lane as the program builds it: its view of the stack, and its resources' names."""

    lane: ServedLane
    view: StackConfig
    several: bool  # the stack serves several lanes: the lane's own resources carry its name

    def name(self, resource: str) -> str:
        return f"{self.lane.name}-{resource}" if self.several else resource


def lane_addresses(cfg: StackConfig, topology: Topology) -> list[tuple[str, str]]:
    """(lane, HOST:PORT of its gateway) as the router on the head reaches them, in the stack's order."""
    def host(lane: ServedLane) -> str:
        head = cfg.lane_head(lane)
        return "127.0.0.1" if head == cfg.head else topology.ray_ip(head)
    return [(lane.name, f"{host(lane)}:{contract.LANE_GATEWAY_PORT}") for lane in cfg.served_lanes]


def router_argv(lanes: Sequence[tuple[str, str]]) -> list[str]:
    return ["python3", f"{contract.CONTAINER_BUNDLE_DIR}/{contract.LANE_ROUTER_SCRIPT}",
            "--listen", f"127.0.0.1:{contract.LANE_ROUTER_PORT}",
            *(arg for name, at in lanes for arg in ("--lane", f"{name}={at}"))]


@dataclass(frozen=True)
class LaneFrontArgs:
    head: NodeServingArgs  # the head's image, provider and installation (its bundle already holds the key)
    connection: pulumi_remote.ConnectionArgs
    port: int  # serving.port
    lanes: Sequence[tuple[str, str]]  # lane_addresses
    label_key: pulumi.Input[str]
    after: Sequence[pulumi.Resource]  # every lane's readiness: the front opens once they serve


def lane_front_args(cfg: StackConfig, topology: Topology, connection: pulumi_remote.ConnectionArgs,
                    head: NodeServingArgs, label_key: pulumi.Input[str],
                    after: Sequence[pulumi.Resource]) -> LaneFrontArgs:
    return LaneFrontArgs(head, connection, cfg.serving.port, lane_addresses(cfg, topology), label_key, after)


def front_files(args: LaneFrontArgs):
    return [bundle_file(contract.API_FRONT_CONF, render_api_gateway_conf(args.port, FRONT), "0644"),
            bundle_file(contract.LANE_ROUTER_SCRIPT, launch_file(contract.LANE_ROUTER_SCRIPT), "0755")]


def router_container_args(args: LaneFrontArgs, label: pulumi.Input[str]) -> dict:
    base = common_args(args.head, contract.LANE_ROUTER_SCRIPT, label, "SIGTERM")
    return dict(base, name=contract.LANE_ROUTER_CONTAINER, entrypoints=router_argv(args.lanes), user="nobody")


def front_container_args(args: LaneFrontArgs, label: pulumi.Input[str]) -> dict:
    # SIGQUIT is nginx's graceful stop: open streams finish, new connections are refused
    base = common_args(args.head, contract.API_GATEWAY_SCRIPT, label, "SIGQUIT")
    return dict(base, name=contract.API_FRONT_CONTAINER, entrypoints=[*base["entrypoints"], contract.API_FRONT_CONF],
                # the key map and nginx's pid on a tmpfs of the container's own: never on a disk
                tmpfs={contract.API_GATEWAY_RUN_DIR: contract.API_GATEWAY_RUN_DIR_TMPFS})


class LaneFront(pulumi.ComponentResource):
    def __init__(self, name: str, args: LaneFrontArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:lanes:LaneFront", name, None, opts)
        head = args.head.node_name
        files = front_files(args)
        commands = managed_file_commands(head, "lanes", args.connection, files, parent=self,
                                         depends_on=list(args.after))
        label = files_hash(files, key=args.label_key)
        placed = pulumi.ResourceOptions(parent=self, provider=args.head.provider, depends_on=commands,
                                        delete_before_replace=True, replace_with=[args.head.installation])
        self.router = docker.Container(f"{head}-lane-router", **router_container_args(args, label), opts=placed)
        self.front = docker.Container(f"{head}-api-front", **front_container_args(args, label),
                                      opts=pulumi.ResourceOptions.merge(placed, pulumi.ResourceOptions(
                                          depends_on=[self.router])))
        self.register_outputs({})
