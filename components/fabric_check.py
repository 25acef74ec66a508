"""FabricCheck: fail `pulumi up` early when a node's QSFP fabric is not what NCCL needs.

Creates one remote command per node running launch/fabric-check.sh in a fresh SSH login,
after HostPrep on every node (pings need the peers' addresses). It re-runs whenever the
check or what HostPrep manages on any node changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote as pulumi_remote

from .remote import NodeScript, node_command, script_text, sha256_text

SCRIPT = "fabric-check.sh"


@dataclass(frozen=True)
class RailProbe:
    iface: str
    hca: str
    peers: Sequence[str]  # the other nodes' addresses on this rail


@dataclass(frozen=True)
class FabricCheckArgs:
    node_name: str
    connection: pulumi_remote.ConnectionArgs
    mtu: int
    link_speed_mbps: int
    rails: Sequence[RailProbe]
    far_ends: Sequence[tuple[str, str, str]]  # (address, node, iface) of every other node's rails
    host_prep_hashes: Sequence[pulumi.Input[str]]  # every node's: the pings cross them all


def fabric_check_args(args: FabricCheckArgs) -> list[str]:
    flags = ["--node", args.node_name, "--mtu", str(args.mtu), "--speed-mbps", str(args.link_speed_mbps)]
    for rail in args.rails:
        flags += ["--rail", f"{rail.iface}:{rail.hca}:{','.join(rail.peers)}"]
    for address, node, iface in args.far_ends:
        flags += ["--far-end", f"{address}={node}:{iface}"]
    return flags


class FabricCheck(pulumi.ComponentResource):
    def __init__(self, name: str, args: FabricCheckArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:fabric_check:FabricCheck", name, None, opts)
        trigger = pulumi.Output.all(*args.host_prep_hashes).apply(lambda hashes: sha256_text(script_text(SCRIPT), *hashes))
        self.command = node_command(
            f"{args.node_name}-fabric-check", args.connection, NodeScript(SCRIPT, fabric_check_args(args)),
            parent=self, triggers=[trigger],
        )
        self.register_outputs({"report": self.command.stdout})
