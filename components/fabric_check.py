"""FabricCheck: fail `pulumi up` early when a node's QSFP fabric is not what NCCL needs.

Creates one remote command per node running launch/fabric-check.sh (fed on stdin) in a
fresh SSH login, after HostPrep on every node (pings need the peers' addresses). It re-runs
whenever the check or what HostPrep manages changes.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

from .config import Node, StackConfig
from .remote import connection, launch_file, script_command, script_stdin, sha256_text

SCRIPT = "fabric-check.sh"


def fabric_check_args(cfg: StackConfig, node: Node) -> list[str]:
    args = ["--node", node.name, "--mtu", str(cfg.fabric.mtu), "--speed-mbps", str(cfg.fabric.link_speed_mbps)]
    for index, rail in enumerate(node.rails):
        peers = ",".join(cfg.peers_on_rail(node, index))
        args += ["--rail", f"{rail.iface}:{rail.hca}:{peers}"]
    return args


class FabricCheck(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        node: Node,
        host_prep_hashes: Sequence[str],
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:fabric_check:FabricCheck", name, None, opts)
        args = fabric_check_args(cfg, node)
        self.command = remote.Command(
            f"{name}-run",
            connection=connection(cfg.ssh, node),
            create=script_command(SCRIPT, args),
            stdin=script_stdin(SCRIPT),
            triggers=[sha256_text(launch_file(SCRIPT), *host_prep_hashes)],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"report": self.command.stdout})
