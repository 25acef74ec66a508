"""NcclCheck: cross-node NCCL all-reduce over the rails, before any model loads (recipe §1).

Creates one remote command per node running launch/nccl-allreduce-check.py (fed on stdin)
in a throwaway container of that node's serving image, with the serving containers' docker
flags and the bundle's environment (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...). The head is rank
0 and hosts the rendezvous on its first rail. `pulumi up` stops when the bus bandwidth is
under fabric.minBusBandwidthGBps or NCCL fell back to sockets. Re-runs when the image, the
environment, the script or the fabric changes.
"""

from __future__ import annotations

import shlex
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

from .config import Node, StackConfig
from .launch_bundle import BUNDLE_DIR, render_env_file
from .remote import bash, connection, launch_file, sha256_text
from .serving_cluster import docker_run_flags

SCRIPT = "nccl-allreduce-check.py"
RENDEZVOUS_PORT = 29555
CONTAINER_NAME = "twinspark-nccl-check"


def check_args(cfg: StackConfig, node: Node) -> list[str]:
    return [
        "--node", node.name,
        "--rank", str(ranks(cfg)[node.name]),
        "--world-size", str(len(cfg.nodes)),
        "--master", f"{cfg.head.ray_ip}:{RENDEZVOUS_PORT}",
        "--min-busbw-gbps", f"{cfg.fabric.min_bus_bandwidth_gbps:g}",
        "--require-network", "IB",
    ]


def ranks(cfg: StackConfig) -> dict[str, int]:
    """Head is rank 0; workers follow in config order."""
    order = [cfg.head] + cfg.workers
    return {n.name: i for i, n in enumerate(order)}


def render_check_command(cfg: StackConfig, node: Node, image_id: str) -> str:
    args = check_args(cfg, node)
    docker_run = ["docker", "run", "--rm", "-i", "--name", CONTAINER_NAME, *docker_run_flags(),
                  "--env-file", f"{BUNDLE_DIR}/twinspark.env", "--entrypoint", "python3", image_id, "-", *args]
    return bash(
        f"""set -euo pipefail
docker rm -f {CONTAINER_NAME} >/dev/null 2>&1 || true
timeout 1200 {" ".join(shlex.quote(a) for a in docker_run)}
"""
    )


class NcclCheck(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        image_ids: dict[str, pulumi.Input[str]],
        fabric_hashes: Sequence[str],
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:nccl_check:NcclCheck", name, None, opts)
        self.commands = []
        for node in cfg.nodes:
            image_id = pulumi.Output.from_input(image_ids[node.name])
            self.commands.append(
                remote.Command(
                    f"{name}-{node.name}",
                    connection=connection(cfg.ssh, node),
                    create=image_id.apply(lambda i, n=node: render_check_command(cfg, n, i)),
                    stdin=launch_file(SCRIPT),
                    triggers=[image_id, sha256_text(launch_file(SCRIPT), render_env_file(cfg, node), *fabric_hashes)],
                    add_previous_output_in_env=False,
                    opts=pulumi.ResourceOptions(parent=self),
                )
            )
        self.register_outputs({})
