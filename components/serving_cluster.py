"""ServingCluster: the Ray/vLLM containers, one per node, with the recipe's docker options.

Creates one worker container per worker node (entrypoint boot-worker.sh) and one head
container (boot-head.sh, vLLM as PID 1) that depends on every worker, all with restart
`unless-stopped` and docker's own log capped. Each carries its node's bundle hash and image
id, so a parameter change replaces them (the head stops first, workers come back before it,
the head starts last) and a no-op changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker

import node_contract as contract


STOP_GRACE_SECONDS = 60


@dataclass(frozen=True)
class NodeServingArgs:
    """What one node's container is made from."""

    node_name: str
    role: str
    provider: docker.Provider
    image_id: pulumi.Input[str]
    bundle_hash: pulumi.Input[str]
    ready_after: Sequence[pulumi.Resource]  # bundle files, weights, NCCL check


@dataclass(frozen=True)
class ServingClusterArgs:
    nodes: Sequence[NodeServingArgs]
    model_dir: str  # on the host
    model_container_dir: str


def container_args(args: ServingClusterArgs, node: NodeServingArgs) -> dict:
    """Every docker option of the recipe (§4): host network and IPC, all GPUs, RDMA devices."""
    return dict(
        name=contract.serving_container_name(node.role),
        image=node.image_id,
        entrypoints=["/bin/bash", f"{contract.CONTAINER_BUNDLE_DIR}/{contract.boot_script(node.role)}"],
        network_mode=contract.NETWORK_MODE,
        ipc_mode=contract.IPC_MODE,
        gpus=contract.GPUS,
        ulimits=[docker.ContainerUlimitArgs(name=name, soft=limit, hard=limit) for name, limit in contract.ULIMITS.items()],
        capabilities=docker.ContainerCapabilitiesArgs(adds=contract.CAPABILITIES),
        devices=[docker.ContainerDeviceArgs(host_path=dev, container_path=dev) for dev in contract.DEVICES],
        restart="unless-stopped",
        # docker stop with this grace on replace and destroy (0 s otherwise): vLLM finishes
        # its shutdown and frees the GPU's unified memory before the container is removed
        destroy_grace_seconds=STOP_GRACE_SECONDS,
        log_driver="json-file",
        log_opts=contract.DOCKER_LOG_OPTIONS,
        mounts=[
            docker.ContainerMountArgs(type="bind", source=args.model_dir, target=args.model_container_dir, read_only=True),
            docker.ContainerMountArgs(
                type="bind", source=contract.BUNDLE_DIR, target=contract.CONTAINER_BUNDLE_DIR, read_only=True
            ),
        ],
        volumes=[docker.ContainerVolumeArgs(host_path=contract.LOG_DIR, container_path=contract.LOG_DIR)],
        labels=[docker.ContainerLabelArgs(label=contract.BUNDLE_LABEL, value=node.bundle_hash)],
        wait=False,
    )


class ServingCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:serving_cluster:ServingCluster", name, None, opts)
        self.workers = [self._container(args, node, []) for node in args.nodes if node.role == "worker"]
        self.head = self._container(args, next(n for n in args.nodes if n.role == "head"), self.workers)
        self.register_outputs({"headContainerId": self.head.id})

    def _container(self, args: ServingClusterArgs, node: NodeServingArgs, after: list) -> docker.Container:
        return docker.Container(
            f"{node.node_name}-serving-container",
            **container_args(args, node),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.provider,
                depends_on=[*node.ready_after, *after],
                delete_before_replace=True,  # the container name is fixed
                # a replaced worker means a fresh raylet: the head must re-form the cluster
                # after it (recipe gotcha 11: bounce the worker first, then the head)
                replace_with=after or None,
            ),
        )
