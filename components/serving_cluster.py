"""ServingCluster: the Ray/vLLM containers, one per node, with the recipe's docker options.

Creates one worker container per worker node (entrypoint boot-worker.sh), one head
container (boot-head.sh, vLLM as PID 1 on a Unix socket) that depends on every worker, and on the
head the API gateway container (api-gateway.sh: nginx on serving.port, the key on every
path). All restart `unless-stopped`, with docker's own log capped. Each carries its node's
bundle hash and image id, so a parameter change replaces them (the head stops first, workers
come back before it, the head starts last) and a no-op changes nothing.

Every node's serving container has the same name and a resource named by the node, never
by its role: making another node the head replaces each node's container in place, the old
one stopped (60 s grace) before the new one starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.settings import monitor_supports_feature

from core import contract


STOP_GRACE_SECONDS = 60
# The engine learned replaceWith in Pulumi v3.207.0 (2025-11-12, pulumi/pulumi#20693).
MIN_PULUMI_CLI = "3.207.0"


def require_engine_support() -> None:
    """Refuse an engine without replaceWith before any resource exists.

    The SDK itself raises only when the head container registers (pulumi/runtime/resource.py,
    prepare_resource), by which time a real `pulumi up` has run every step before it. The
    features are known from the start: run_in_stack loads them before the program runs.
    """
    if not monitor_supports_feature(resource_pb2.RESOURCE_MONITOR_FEATURE_REPLACE_WITH):
        raise pulumi.RunError(
            "this Pulumi CLI's engine does not support the replaceWith resource option, which the "
            f"serving containers need — upgrade the Pulumi CLI to ≥ {MIN_PULUMI_CLI} (`pulumi version` shows yours)"
        )


@dataclass(frozen=True)
class NodeServingArgs:
    """What one node's container is made from."""

    node_name: str
    role: str
    provider: docker.Provider
    image_id: pulumi.Input[str]
    bundle_hash: pulumi.Input[str]
    ready_after: Sequence[pulumi.Resource]  # bundle files, weights, NCCL check
    installation: pulumi.Resource  # the node as installed (remote.node_installation): a reinstall recreates
    gateway_hash: Optional[pulumi.Input[str]] = None  # head: the API gateway's files and key
    executor: str = "ray"  # serving.executor: which boot scripts are the entrypoint


@dataclass(frozen=True)
class ServingClusterArgs:
    """One lane's engine (one lane: the stack's)."""

    nodes: Sequence[NodeServingArgs]
    model_dir: str  # on the host
    model_container_dir: str
    # several lanes (components/lanes.py): the lane's gateway is a lane gateway (LANE_GATEWAY_PORT, its own
    # container name)
    several_lanes: bool = False
    # several lanes, the stack head's: registered after every other lane's engine (ServingCluster)
    stack_head_lane: bool = False


# vLLM's API socket: in the head's serving container, which creates it, and the API gateway,
# which alone opens it; no other container mounts it (Grafana, Prometheus, the exporters).
VLLM_SOCKET_VOLUME = docker.ContainerVolumeArgs(host_path=contract.VLLM_SOCKET_DIR, container_path=contract.VLLM_SOCKET_DIR)


def common_args(node: NodeServingArgs, entrypoint: str, label: pulumi.Input[str], stop_signal: str) -> dict:
    """What every twinspark container shares: the image, host network, restart, logs, bundle."""
    return dict(
        image=node.image_id,
        entrypoints=["/bin/bash", f"{contract.CONTAINER_BUNDLE_DIR}/{entrypoint}"],
        network_mode=contract.NETWORK_MODE,
        restart=contract.SERVING_RESTART_POLICY,
        # The same grace for `pulumi up` replacing or destroying it (destroy_grace_seconds;
        # the provider's own default is 0 s) and for a `docker stop` or a reboot (stop_timeout):
        # in-flight requests finish and vLLM frees the GPU's unified memory before it goes.
        stop_signal=stop_signal,
        stop_timeout=STOP_GRACE_SECONDS,
        destroy_grace_seconds=STOP_GRACE_SECONDS,
        log_driver="json-file",
        log_opts=contract.DOCKER_LOG_OPTIONS,
        mounts=[
            docker.ContainerMountArgs(
                type="bind", source=contract.BUNDLE_DIR, target=contract.CONTAINER_BUNDLE_DIR, read_only=True
            ),
        ],
        volumes=[docker.ContainerVolumeArgs(host_path=contract.LOG_DIR, container_path=contract.LOG_DIR)],
        labels=[docker.ContainerLabelArgs(label=contract.BUNDLE_LABEL, value=label)],
        wait=False,
    )


def container_args(args: ServingClusterArgs, node: NodeServingArgs) -> dict:
    """Every docker option of the recipe (§4): host network and IPC, all GPUs, RDMA devices."""
    # SIGTERM: vLLM (PID 1 on the head) drains and exits; the boot scripts leave Ray at once
    base = common_args(node, contract.boot_script(node.role, node.executor), node.bundle_hash, "SIGTERM")
    return dict(
        base,
        name=contract.SERVING_CONTAINER,
        ipc_mode=contract.IPC_MODE,
        gpus=contract.GPUS,
        ulimits=[docker.ContainerUlimitArgs(name=name, soft=limit, hard=limit) for name, limit in contract.ULIMITS.items()],
        capabilities=docker.ContainerCapabilitiesArgs(adds=contract.CAPABILITIES),
        devices=[docker.ContainerDeviceArgs(host_path=dev, container_path=dev) for dev in contract.DEVICES],
        # `docker exec` (the day-2 tools) gets these too: Ray refuses clients without the token
        # (serving.executor mp runs no Ray)
        envs=[f"{name}={value}" for name, value in contract.ray_auth_env().items()] if node.executor == "ray" else [],
        mounts=[
            docker.ContainerMountArgs(type="bind", source=args.model_dir, target=args.model_container_dir, read_only=True),
            *base["mounts"],
            # the memory check before load names the slice that holds the memory the model needs
            docker.ContainerMountArgs(type="bind", source="/sys/fs/cgroup", target=contract.HOST_CGROUP_DIR,
                                      read_only=True),
        ],
        volumes=[*base["volumes"], *[docker.ContainerVolumeArgs(host_path=d, container_path=d)
                                     for d in (contract.CACHE_DIR, contract.RUN_DIR)],
                 *([VLLM_SOCKET_VOLUME] if node.role == "head" else [])],
        # apart from sessions and services, whose slices HostPrep caps (co-tenants)
        cgroup_parent=contract.CONTAINER_SLICE,
    )


def nginx_args(node: NodeServingArgs, volumes: Sequence[docker.ContainerVolumeArgs] = ()) -> dict:
    """An API gateway: the serving image's nginx, nothing of the GPU."""
    assert node.gateway_hash is not None  # the head's bundle holds the gateway's files
    # SIGQUIT is nginx's graceful stop: open streams finish, new connections are refused
    gateway = common_args(node, contract.API_GATEWAY_SCRIPT, node.gateway_hash, "SIGQUIT")
    return dict(gateway, name=contract.API_GATEWAY_CONTAINER, volumes=[*gateway["volumes"], *volumes],
                # the key map and nginx's pid on a tmpfs of the container's own: never on a disk
                tmpfs={contract.API_GATEWAY_RUN_DIR: contract.API_GATEWAY_RUN_DIR_TMPFS})


def gateway_args(node: NodeServingArgs) -> dict:
    """The head's API gateway in front of vLLM's socket."""
    # the serving guard's drain file, read-only: the guard alone writes it, on the host
    drain = docker.ContainerVolumeArgs(host_path=contract.DRAIN_DIR, container_path=contract.DRAIN_DIR, read_only=True)
    return nginx_args(node, [VLLM_SOCKET_VOLUME, drain])


def router_argv(lanes: Sequence[tuple[str, str]]) -> list[str]:
    return ["python3", f"{contract.CONTAINER_BUNDLE_DIR}/{contract.LANE_ROUTER_SCRIPT}",
            "--listen", f"127.0.0.1:{contract.LANE_ROUTER_PORT}",
            *(arg for name, at in lanes for arg in ("--lane", f"{name}={at}"))]


def router_args(head: NodeServingArgs, lanes: Sequence[tuple[str, str]]) -> dict:
    """Several lanes: the lane router on the head's loopback, as nobody (it holds no secret)."""
    assert head.gateway_hash is not None  # the head's bundle holds the router
    base = common_args(head, contract.LANE_ROUTER_SCRIPT, head.gateway_hash, "SIGTERM")
    return dict(base, name=contract.LANE_ROUTER_CONTAINER, entrypoints=router_argv(lanes), user="nobody")


def front_args(head: NodeServingArgs) -> dict:
    """Several lanes: the stack's gateway on serving.port, in front of the router (api-front.conf)."""
    front = nginx_args(head)
    return dict(front, entrypoints=[*front["entrypoints"], contract.API_FRONT_CONF])


@dataclass(frozen=True)
class LaneContainers:
    head: docker.Container  # the lane's engine (vLLM as PID 1)
    gateway: docker.Container  # the lane's gateway in front of it


class ServingCluster(pulumi.ComponentResource):
    """Every lane's containers under one component: a node's container keeps its resource (and the one
    docker name) whichever lane it serves, so a lane added or taken away replaces it in place.

    The stack head's lane is served last, its engine registered only once every other lane's engine is
    in place: the one-lane stack's head container names the workers' in its `replace_with`, and the engine
    (v3.274.1, step_generator.go) cascades that from the OLD state without checking whether the head's own
    replacement already deleted it. Registered first, the head's old container gets a second delete whose
    `docker rm` returns while the first still removes it, and its replacement finds the name taken
    ("Conflict. The container name ... is already in use"). Registered after, the worker's replacement
    deletes it once and the head's own sees it pending (as in one lane, where the head waits on its workers)."""

    def __init__(self, name: str, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:serving_cluster:ServingCluster", name, None, opts)
        self._engines: list[docker.Container] = []  # every lane's engine containers placed so far

    def serve(self, args: ServingClusterArgs) -> LaneContainers:
        if args.stack_head_lane:
            args = replace(args, nodes=[replace(n, ready_after=[*n.ready_after, *self._engines]) for n in args.nodes])
        workers = [self._container(args, node, []) for node in args.nodes if node.role == "worker"]
        head = next(n for n in args.nodes if n.role == "head")
        engine = self._container(args, head, workers)
        self._engines += [*workers, engine]
        # independent of vLLM's restarts: clients get a 502 while it reloads, not a refused port
        if args.several_lanes:  # the lane's own; the stack's gateway is the router's front (front below)
            gateway = docker.Container(f"{head.node_name}-lane-gateway",
                                       **dict(gateway_args(head), name=contract.LANE_GATEWAY_CONTAINER),
                                       opts=self._placed(head))
        else:
            gateway = docker.Container(f"{head.node_name}-serving-gateway", **gateway_args(head), opts=self._placed(head))
            self.register_outputs({"headContainerId": engine.id})
        return LaneContainers(engine, gateway)

    def front(self, head: NodeServingArgs, lanes: Sequence[tuple[str, str]], after: Sequence[pulumi.Resource]) -> None:
        """Several lanes, on the head: the router (`lanes`: each lane and its gateway's HOST:PORT) and the stack's
        gateway in front of it, once `after` (every lane's readiness) is done."""
        router = docker.Container(f"{head.node_name}-lane-router", **router_args(head, lanes), opts=self._placed(head))
        # the one-lane gateway's resource and container (the same port): replaced in place when lanes come or go
        docker.Container(f"{head.node_name}-serving-gateway", **front_args(head),
                         opts=self._placed(head, router, *after))
        self.register_outputs({})

    def _placed(self, head: NodeServingArgs, *after: pulumi.Resource) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=head.provider, depends_on=[*head.ready_after, *after],
                                      delete_before_replace=True, replace_with=[head.installation])

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
                replace_with=[node.installation, *after],
            ),
        )
