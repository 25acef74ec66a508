"""NcclCheck: cross-node NCCL all-reduce over the rails, before any model loads (recipe §1).

Creates one remote command per node (`{node}-nccl-check`) running launch/nccl-check.sh: its
rank of launch/nccl-allreduce-check.py in a throwaway container of that node's serving
image, with the serving containers' docker options and the bundle's environment
(NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...). The head is rank 0 and hosts the rendezvous on its
first rail. `pulumi up` stops when the bus bandwidth is under fabric.minBusBandwidthGBps or
NCCL fell back to sockets. A floor of 0 switches the check off: the component then creates
nothing.

The ranks run together or not at all: `nccl-run` (a random id) keeps every rank's
connection, image and environment and the check itself, and every rank is replaced with it.
A rank replaced alone (`pulumi up --replace` of that rank) finds no peer at the roll call
and fails within a few minutes, naming `pulumi up --replace` of `nccl-run`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_random as random
from pulumi_command import remote

import node_contract as contract

from .remote import NodeScript, compared_connection, launch_file, node_command, script_text, sha256_text

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
    master_ip: str  # Topology.head_ray_ip: the head's first rail (ring: its LAN address)
    min_bus_bandwidth_gbps: float  # 0 switches the check off


def check_args(args: NcclCheckArgs, rank: int, rerun_all: str) -> list[str]:
    return [
        "--node", args.ranks[rank].node_name,
        "--rank", str(rank),
        "--world-size", str(len(args.ranks)),
        "--nodes", ",".join(r.node_name for r in args.ranks),
        "--master", f"{args.master_ip}:{contract.NCCL_RENDEZVOUS_PORT}",
        "--min-busbw-gbps", f"{args.min_bus_bandwidth_gbps:g}",
        "--require-network", "IB",
        "--rerun-all", rerun_all,
    ]


def rank_script_args(args: NcclCheckArgs, rank: int, image_id: str, rerun_all: str) -> list[str]:
    flags = ["--node", args.ranks[rank].node_name, "--image", image_id,
             "--env-file", f"{contract.BUNDLE_DIR}/{contract.ENV_FILE}",
             "--container", contract.NCCL_CHECK_CONTAINER, "--timeout-s", str(TIMEOUT_S)]
    flags += [a for flag in contract.docker_run_flags() for a in ("--docker-flag", flag)]
    flags += [a for arg in check_args(args, rank, rerun_all) for a in ("--check-arg", arg)]
    return flags


def run_keepers(args: NcclCheckArgs) -> dict[str, pulumi.Input[str]]:
    """What makes another NCCL run: the check itself, and each rank's connection (its identity,
    host key, port), image and environment: every input of a rank that differs between nodes."""
    keepers: dict[str, pulumi.Input[str]] = {"check": sha256_text(script_text(SCRIPT), launch_file(CHECK_PROGRAM))}
    for r in args.ranks:
        keepers[f"{r.node_name}.connection"] = compared_connection(r.connection)
        keepers[f"{r.node_name}.image"] = r.image_id
        keepers[f"{r.node_name}.env"] = r.env_hash
    return keepers


class NcclCheck(pulumi.ComponentResource):
    def __init__(self, name: str, args: NcclCheckArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:nccl_check:NcclCheck", name, None, opts)
        self.commands: list[remote.Command] = []
        self.run: Optional[random.RandomId] = None
        if args.min_bus_bandwidth_gbps <= 0:
            self.register_outputs({})
            return
        # Why an anchor: a rank re-runs alone whenever only its own inputs change (pulumi-command
        # runs create again on an update; a new host key is one), and ranks cannot name each other
        # in replace_with (a resource can name only those registered before it). Every rank names
        # this one instead, and the engine replaces every rank in the run that replaces it
        # (pulumi/pulumi pkg/resource/deploy/step_generator.go, diff: ReplaceWith). Nothing can
        # make `--replace` of one rank reach the others: that rank fails fast at the roll call.
        self.run = random.RandomId(f"{name}-run", byte_length=8, keepers=run_keepers(args),
                                   opts=pulumi.ResourceOptions(parent=self))
        rerun_all = self.run.urn.apply(lambda urn: f"pulumi up --replace '{urn}'")
        for rank, node in enumerate(args.ranks):
            script_args = pulumi.Output.all(node.image_id, rerun_all).apply(
                lambda v, r=rank: rank_script_args(args, r, v[0], v[1]))
            self.commands.append(
                node_command(
                    f"{node.node_name}-nccl-check", node.connection,
                    NodeScript(SCRIPT, script_args, payload=launch_file(CHECK_PROGRAM)),
                    parent=self, replace_with=[self.run],
                )
            )
        self.register_outputs({})
