"""What every rendered file of the monitoring stack depends on (ObservabilityPlan, built from the
config with no Pulumi objects) and what a rendered file becomes (RenderedFile: a managed file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import yaml

from core import contract

from ..client_outputs import auto_compact_limit
from ..config import Observability, StackConfig, Topology, resolve_node_addresses


@dataclass(frozen=True)
class ObservedRail:
    iface: str  # netdev name, e.g. enp1s0f0np0
    hca: str  # RDMA device, e.g. rocep1s0f0


@dataclass(frozen=True)
class ObservedNode:
    name: str
    role: str  # "head" | "worker"
    rail_ip: str  # Topology.ray_ip (direct, switch: the first rail; ring: the LAN): the exporters bind here
    rails: tuple[ObservedRail, ...]


@dataclass(frozen=True)
class ObservabilityPlan:
    """Everything the rendered files depend on (no Pulumi objects)."""

    nodes: tuple[ObservedNode, ...]
    vllm_port: int
    expected_mtu: int
    expected_link_speed_mbps: int
    bootstrap_iface: str  # NCCL's socket fallback would show up here (the LAN)
    settings: Observability
    alertmanager: bool  # an alert webhook is configured: Prometheus sends to Alertmanager
    platform: str  # serving.platform: what the images are pulled for
    compaction_fence_tokens: int  # the agents' auto-compaction fence (client outputs), drawn on the prompt sizes
    panels: tuple[str, ...] = ("overview", "spec-decode", "nodes")  # the recipe's: spec decode where it speculates
    spec_decode_advice: str = ""  # the recipe's, for the acceptance-collapse alert
    prometheus_port: int = contract.PROMETHEUS_PORT
    node_exporter_port: int = contract.NODE_EXPORTER_PORT
    gpu_exporter_port: int = contract.GPU_EXPORTER_PORT
    alertmanager_port: int = contract.ALERTMANAGER_PORT

    @property
    def head(self) -> ObservedNode:
        return next(n for n in self.nodes if n.role == "head")


def plan_from_config(cfg: StackConfig, alertmanager: bool, topology: Optional[Topology] = None,
                     vllm_port: int = contract.METRICS_LOOPBACK_PORT) -> ObservabilityPlan:
    """The stack's facts the monitoring stack needs (alertmanager: an alert webhook is set;
    topology: None, the config's with the nodes' addresses resolved now; vllm_port: where the head's
    gateway serves vLLM's /metrics on loopback)."""
    topology = topology or Topology(cfg, resolve_node_addresses(cfg.nodes))
    return ObservabilityPlan(
        nodes=tuple(ObservedNode(n.name, n.role, topology.ray_ip(n),
                                 tuple(ObservedRail(r.iface, r.hca) for r in n.rails)) for n in cfg.nodes),
        vllm_port=vllm_port,
        expected_mtu=cfg.fabric.mtu,
        expected_link_speed_mbps=cfg.fabric.link_speed_mbps,
        bootstrap_iface=cfg.fabric.bootstrap_iface,
        settings=cfg.observability,
        alertmanager=alertmanager,
        platform=cfg.serving.platform,
        compaction_fence_tokens=auto_compact_limit(cfg),
        panels=cfg.serving.recipe_spec.panels,
        spec_decode_advice=cfg.serving.recipe_spec.spec_decode_advice,
    )



def yaml_text(data) -> str:
    """YAML in the order written (the rendered files are compared byte for byte between runs)."""
    return yaml.safe_dump(data, sort_keys=False, width=120)


@dataclass(frozen=True)
class RenderedFile:
    step: str  # the managed file's step: {head}-observability-{step}
    path: str  # on the host
    content: str
