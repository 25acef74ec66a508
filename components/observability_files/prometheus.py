"""prometheus.yml: vLLM's /metrics on the head's loopback (the gateway; several lanes: each lane's
gateway, labelled lane), node + GPU exporters on every node's Ray address (Topology.ray_ip), rail
labels on the fabric series; with the alert rules, the files the Prometheus container reads."""

from __future__ import annotations

from core import contract

from .alerts import render_alert_rules
from .metrics import JOB_GPU, JOB_NODE, JOB_PROMETHEUS, JOB_VLLM
from .plan import ObservabilityPlan, RenderedFile, yaml_text

RULES_FILE = "twinspark-alerts.yml"
CONTAINER_RULES_DIR = f"{contract.PROMETHEUS_CONTAINER_CONFIG_DIR}/rules"
PROMETHEUS_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/prometheus"


# The head's guard writes each worker's PCIe and AER series (from its looks, launch/fabric_watch.py
# metrics) labelled peer="<worker>": they become that worker's, as if its own exporter had them.
PEER_LABEL = "peer"
PEER_RELABELS = [
    {"source_labels": [PEER_LABEL], "regex": "(.+)", "target_label": "node"},
    {"source_labels": [PEER_LABEL], "regex": "(.+)", "target_label": "role", "replacement": "worker"},
    {"regex": PEER_LABEL, "action": "labeldrop"},
]


def _rail_relabels(plan: ObservabilityPlan) -> list[dict]:
    """Label the series of each rail's netdev and RDMA device with rail="<index>"."""
    relabels = []
    for node in plan.nodes:
        for index, rail in enumerate(node.rails):
            devices = "|".join(name.replace(".", r"\.") for name in (rail.iface, rail.hca))
            relabels.append(
                {
                    "source_labels": ["node", "device"],
                    "regex": f"{node.name};({devices})",
                    "target_label": "rail",
                    "replacement": str(index),
                }
            )
    return relabels


def _per_node_targets(plan: ObservabilityPlan, port: int) -> list[dict]:
    return [
        {"targets": [f"{n.rail_ip}:{port}"], "labels": {"node": n.name, "role": n.role}} for n in plan.nodes
    ]


def render_prometheus_config(plan: ObservabilityPlan, rules_dir: str = CONTAINER_RULES_DIR) -> str:
    s = plan.settings
    interval = f"{s.scrape_interval_seconds}s"
    head = plan.head
    config: dict = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": f"{min(s.scrape_interval_seconds, 10)}s",
            "evaluation_interval": interval,
            "external_labels": {"cluster": "twinspark"},
        },
        "rule_files": [f"{rules_dir}/{RULES_FILE}"],
    }
    if plan.alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{plan.alertmanager_port}"]}]}]}
    config["scrape_configs"] = [
        {
            # The API gateway serves vLLM's /metrics alone on the head's loopback; Prometheus
            # shares the head's network namespace, so it reads them without the key. Several lanes:
            # each lane's gateway, a worker's on its Ray address (the firewall admits the head alone).
            "job_name": JOB_VLLM,
            "static_configs": [
                {"targets": [e.address], "labels": {"node": e.node, "role": e.role, **({"lane": e.lane} if e.lane else {})}}
                for e in plan.engines
            ],
        },
        {
            "job_name": JOB_NODE,
            "static_configs": _per_node_targets(plan, plan.node_exporter_port),
            "metric_relabel_configs": PEER_RELABELS + _rail_relabels(plan),
        },
        {"job_name": JOB_GPU, "static_configs": _per_node_targets(plan, plan.gpu_exporter_port)},
        {
            "job_name": JOB_PROMETHEUS,
            "static_configs": [
                {"targets": [f"127.0.0.1:{plan.prometheus_port}"], "labels": {"node": head.name, "role": head.role}}
            ],
        },
    ]
    return "# prometheus.yml — rendered by twinspark (components/observability_files.py)\n" + yaml_text(config)


def prometheus_files(plan: ObservabilityPlan) -> list[RenderedFile]:
    """What the Prometheus container reads (PROMETHEUS_HOST_DIR is its /etc/prometheus)."""
    return [
        RenderedFile("prometheus-config", f"{PROMETHEUS_HOST_DIR}/prometheus.yml", render_prometheus_config(plan)),
        RenderedFile("alert-rules", f"{PROMETHEUS_HOST_DIR}/rules/{RULES_FILE}", render_alert_rules(plan)),
    ]
