"""ServingCluster: the Ray/vLLM containers, one per node, with the recipe's docker flags.

Creates one worker container per worker node (entrypoint boot-worker.sh) and one head
container (boot-head.sh, vLLM as PID 1) that depends on every worker, all with restart
`unless-stopped`. Each carries its node's bundle hash and image id, so a parameter change
replaces them (the head stops first, workers come back before it, the head starts last)
and a no-op changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker

from .config import Node, StackConfig
from .launch_bundle import BUNDLE_DIR, CONTAINER_BUNDLE_DIR, LOG_DIR

BUNDLE_LABEL = "twinspark.bundle-sha256"
# The recipe's docker options (§4), once: the serving containers and NcclCheck's `docker run`.
NETWORK_MODE = IPC_MODE = "host"
GPUS = "all"
ULIMITS = {"memlock": -1, "stack": 67108864}
CAPABILITIES = ["IPC_LOCK"]
DEVICES = ["/dev/infiniband"]


def docker_run_flags() -> list[str]:
    """The same options as `docker run` flags."""
    flags = ["--network", NETWORK_MODE, "--ipc", IPC_MODE, "--gpus", GPUS]
    flags += [a for name, limit in ULIMITS.items() for a in ("--ulimit", f"{name}={limit}")]
    flags += [a for cap in CAPABILITIES for a in ("--cap-add", cap)]
    flags += [a for dev in DEVICES for a in ("--device", dev)]
    return flags


def container_name(role: str) -> str:
    """The serving container on a node of that role (also what `ops status` inspects)."""
    return f"twinspark-{role}"


def entrypoint(node: Node) -> list[str]:
    return ["/bin/bash", f"{CONTAINER_BUNDLE_DIR}/boot-{node.role}.sh"]


@dataclass(frozen=True)
class NodeServingInputs:
    """What one node's container is made from."""

    node: Node
    provider: docker.Provider
    image_id: pulumi.Input[str]
    bundle_hash: pulumi.Input[str]
    ready_after: Sequence[pulumi.Resource]  # bundle files, weights, fabric check


def container_args(cfg: StackConfig, inputs: NodeServingInputs) -> dict:
    """Every docker option of the recipe (§4): host network and IPC, all GPUs, RDMA devices."""
    return dict(
        name=container_name(inputs.node.role),
        image=inputs.image_id,
        entrypoints=entrypoint(inputs.node),
        network_mode=NETWORK_MODE,
        ipc_mode=IPC_MODE,
        gpus=GPUS,
        ulimits=[docker.ContainerUlimitArgs(name=name, soft=limit, hard=limit) for name, limit in ULIMITS.items()],
        capabilities=docker.ContainerCapabilitiesArgs(adds=CAPABILITIES),
        devices=[docker.ContainerDeviceArgs(host_path=dev, container_path=dev) for dev in DEVICES],
        restart="unless-stopped",
        mounts=[
            docker.ContainerMountArgs(type="bind", source=cfg.model.dir, target=cfg.model.container_dir, read_only=True),
            docker.ContainerMountArgs(type="bind", source=BUNDLE_DIR, target=CONTAINER_BUNDLE_DIR, read_only=True),
        ],
        volumes=[docker.ContainerVolumeArgs(host_path=LOG_DIR, container_path=LOG_DIR)],
        labels=[docker.ContainerLabelArgs(label=BUNDLE_LABEL, value=inputs.bundle_hash)],
        wait=False,
    )


class ServingCluster(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        per_node: Sequence[NodeServingInputs],
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:serving_cluster:ServingCluster", name, None, opts)
        self.workers = [
            self._container(cfg, inputs, []) for inputs in per_node if inputs.node.role == "worker"
        ]
        head_inputs = next(i for i in per_node if i.node.role == "head")
        self.head = self._container(cfg, head_inputs, self.workers)
        self.register_outputs({"headContainerId": self.head.id})

    def _container(self, cfg, inputs: NodeServingInputs, after: list) -> docker.Container:
        return docker.Container(
            f"{inputs.node.name}-{container_name(inputs.node.role)}",
            **container_args(cfg, inputs),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=inputs.provider,
                depends_on=[*inputs.ready_after, *after],
                delete_before_replace=True,  # the container name is fixed
                # a replaced worker means a fresh raylet: the head must re-form the cluster
                # after it (recipe gotcha 11: bounce the worker first, then the head)
                replace_with=after or None,
            ),
        )
