"""NcclCheck: cross-node NCCL all-reduce over the rails, before any model loads (recipe §1).

Creates one remote command per node (`{node}-nccl-check`) running launch/nccl-check.sh: its
rank of launch/nccl-allreduce-check.py in a throwaway container of that node's serving
image, with the serving containers' docker options and the bundle's environment
(NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...). The head is rank 0 and hosts the rendezvous on its
first rail. `pulumi up` stops when the bus bandwidth is under fabric.minBusBandwidthGBps or
NCCL fell back to sockets. The ranks share one trigger covering every node's image,
environment and identity (user@host) and the check itself, so they always re-run together.
A floor of 0 switches the check off: the component then creates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

import node_contract as contract

from .remote import NodeScript, launch_file, node_command, node_identity, script_text, sha256_text

SCRIPT = "nccl-check.sh"
CHECK_PROGRAM = "nccl-allreduce-check.py"
TIMEOUT_S = 1200


@dataclass(frozen=True)
class NcclRank:
    node_name: str
    connection: remote.ConnectionArgs
    image_id: pulumi.Input[str]
    env_hash: pulumi.Input[str]  # the node's twinspark.env, which the check runs with


@dataclass(frozen=True)
class NcclCheckArgs:
    ranks: Sequence[NcclRank]  # rank 0 (the head) first
    master_ip: str  # the head's first rail
    min_bus_bandwidth_gbps: float  # 0 switches the check off


def check_args(args: NcclCheckArgs, rank: int) -> list[str]:
    return [
        "--node", args.ranks[rank].node_name,
        "--rank", str(rank),
        "--world-size", str(len(args.ranks)),
        "--master", f"{args.master_ip}:{contract.NCCL_RENDEZVOUS_PORT}",
        "--min-busbw-gbps", f"{args.min_bus_bandwidth_gbps:g}",
        "--require-network", "IB",
    ]


def rank_script_args(args: NcclCheckArgs, rank: int, image_id: str) -> list[str]:
    flags = ["--node", args.ranks[rank].node_name, "--image", image_id,
             "--env-file", f"{contract.BUNDLE_DIR}/{contract.ENV_FILE}",
             "--container", contract.NCCL_CHECK_CONTAINER, "--timeout-s", str(TIMEOUT_S)]
    flags += [a for flag in contract.docker_run_flags() for a in ("--docker-flag", flag)]
    flags += [a for arg in check_args(args, rank) for a in ("--check-arg", arg)]
    return flags


class NcclCheck(pulumi.ComponentResource):
    def __init__(self, name: str, args: NcclCheckArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:nccl_check:NcclCheck", name, None, opts)
        self.commands: list[remote.Command] = []
        if args.min_bus_bandwidth_gbps <= 0:
            self.register_outputs({})
            return
        # every node's identity too: another machine for one rank replaces every rank
        identities = [node_identity(r.connection) for r in args.ranks]
        shared_trigger = pulumi.Output.all(*(r.image_id for r in args.ranks), *(r.env_hash for r in args.ranks)).apply(
            lambda facts: sha256_text(script_text(SCRIPT), launch_file(CHECK_PROGRAM), *facts, *identities)
        )
        for rank, node in enumerate(args.ranks):
            image_id = pulumi.Output.from_input(node.image_id)
            self.commands.append(
                node_command(
                    f"{node.node_name}-nccl-check", node.connection,
                    NodeScript(SCRIPT, image_id.apply(lambda i, r=rank: rank_script_args(args, r, i)),
                               payload=launch_file(CHECK_PROGRAM)),
                    parent=self, triggers=[shared_trigger],
                )
            )
        self.register_outputs({})
