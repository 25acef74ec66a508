"""What every rendered file of the monitoring stack depends on (ObservabilityPlan, built from the
config with no Pulumi objects) and what a rendered file becomes (RenderedFile: a managed file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import yaml

from core import contract

from ..client_outputs import auto_compact_limit
from ..config import Node, Observability, StackConfig, Topology, resolve_node_addresses


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
class ObservedEngine:
    """A lane's vLLM /metrics, where the head's Prometheus reads them: its gateway's metrics listener."""

    address: str  # host:port; the head's on loopback, a worker's on its Ray address
    node: str  # the lane's head
    role: str  # that node's role in the stack
    lane: Optional[str] = None  # several lanes: the series' `lane` label (one lane: none, the files as before lanes)


@dataclass(frozen=True)
class ObservabilityPlan:
    """Everything the rendered files depend on (no Pulumi objects)."""

    nodes: tuple[ObservedNode, ...]
    engines: tuple[ObservedEngine, ...]  # each lane's
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

    @property
    def lanes(self) -> tuple[str, ...]:
        """The lanes the dashboards pick from; none for one lane."""
        return tuple(e.lane for e in self.engines if e.lane)


def scraped_over_the_rail(cfg: StackConfig, topology: Topology, node: Node) -> Optional[str]:
    """The address a lane head's gateway also serves /metrics on, for the head's Prometheus: a worker's Ray
    address (several lanes, observability on); None where Prometheus reads it on loopback, or not at all."""
    return topology.ray_ip(node) if cfg.several_lanes and cfg.observability.enabled and node.name != cfg.head.name \
        else None


def observed_engines(cfg: StackConfig, topology: Topology) -> tuple[ObservedEngine, ...]:
    """Where each lane's gateway serves its vLLM's /metrics to the head's Prometheus."""
    engines = []
    for lane in cfg.served_lanes:
        node = cfg.lane_head(lane)
        host = scraped_over_the_rail(cfg, topology, node) or "127.0.0.1"
        port = contract.metrics_loopback_port(cfg.lane_view(lane).serving.port)
        engines.append(ObservedEngine(f"{host}:{port}", node.name, node.role, lane.name if cfg.several_lanes else None))
    return tuple(engines)


def plan_from_config(cfg: StackConfig, alertmanager: bool, topology: Optional[Topology] = None) -> ObservabilityPlan:
    """The stack's facts the monitoring stack needs (alertmanager: an alert webhook is set;
    topology: None, the config's with the nodes' addresses resolved now). The agents' fence is the
    clients' default model's (the head's lane)."""
    topology = topology or Topology(cfg, resolve_node_addresses(cfg.nodes))
    views = cfg.client_views
    # spec decode's dashboard and advice where any lane speculates
    recipe = next((r for r in (v.serving.recipe_spec for v in views) if r.speculates), views[0].serving.recipe_spec)
    return ObservabilityPlan(
        nodes=tuple(ObservedNode(n.name, n.role, topology.ray_ip(n),
                                 tuple(ObservedRail(r.iface, r.hca) for r in n.rails)) for n in cfg.nodes),
        engines=observed_engines(cfg, topology),
        expected_mtu=cfg.fabric.mtu,
        expected_link_speed_mbps=cfg.fabric.link_speed_mbps,
        bootstrap_iface=cfg.fabric.bootstrap_iface,
        settings=cfg.observability,
        alertmanager=alertmanager,
        platform=cfg.serving.platform,
        compaction_fence_tokens=auto_compact_limit(views[0]),
        panels=recipe.panels,
        spec_decode_advice=recipe.spec_decode_advice,
    )



def yaml_text(data) -> str:
    """YAML in the order written (the rendered files are compared byte for byte between runs)."""
    return yaml.safe_dump(data, sort_keys=False, width=120)


@dataclass(frozen=True)
class RenderedFile:
    step: str  # the managed file's step: {head}-observability-{step}
    path: str  # on the host
    content: str
