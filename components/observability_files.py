"""The observability component's files, rendered from the config (pure: no Pulumi, no resources).

- `render_prometheus_config`  prometheus.yml: vLLM's /metrics on the head's loopback (the gateway), node + GPU exporters on
                               every node's Ray address (Topology.ray_ip), rail labels on the fabric series
- `alert_groups` / `render_alert_rules`  the alert rules (serving, guard, fabric, nodes, GPU)
- `render_alertmanager_config`  Alertmanager's route to the webhook (only with alertWebhookUrl)
- `render_grafana_datasource` / `render_grafana_dashboard_provider`  Grafana provisioning YAML
- `render_dashboards`         the three dashboards as JSON, built with grafana-foundation-sdk
- `prometheus_files` / `grafana_files`  the above as (step, path, content) for managed files

Metric names, by source:
- vLLM: every name below is one real vLLM 0.24.0 exports, as recorded on an H200
  (docs/measurements/vllm-0.24-h200-2026-12-02/metrics.txt; vllm-project/vllm
  `vllm/v1/metrics/loggers.py`): num_requests_running and _waiting, kv_cache_usage_perc,
  prompt_tokens, generation_tokens, num_preemptions, prefix_cache_queries and _hits,
  time_to_first_token_seconds, inter_token_latency_seconds; counters gain `_total`, every series
  carries `model_name` and `engine`. The older names (gpu_cache_usage_perc,
  time_per_output_token_seconds) are gone upstream and not queried. `vllm/v1/spec_decode/metrics.py`
  (spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens, _num_accepted_tokens_per_pos
  with a `position` label) exports only with a speculative config, which the recorded run had not.
- node_exporter: `collector/infiniband_linux.go`, `netclass_linux.go`, `meminfo.go`,
  `vmstat_linux.go`, `filesystem_common.go`, `cpu_linux.go`, `textfile.go` (tests/test_observability.py
  runs Debian's real node exporter on a staged sysfs and procfs).
- nvidia_gpu_exporter 1.14: nvidia-smi's query fields, `nvidia_smi_<field>` with dots as
  underscores (clocks_event_reasons since driver 535, clocks_throttle_reasons before).
- the guard's metrics (GUARD_METRICS, a contract: the guard writes them as a textfile).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Optional

import yaml
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import statetimeline as gstate
from grafana_foundation_sdk.builders import table as gtable
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as gmodel
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

import node_contract as contract

from .config import Observability, StackConfig, Topology, resolve_node_addresses

RULES_FILE = "twinspark-alerts.yml"
CONTAINER_RULES_DIR = f"{contract.PROMETHEUS_CONTAINER_CONFIG_DIR}/rules"
DATASOURCE_UID = "twinspark-prometheus"
DASHBOARD_FOLDER = "twinspark"
HOME_DASHBOARD = "twinspark-overview.json"
ALERTMANAGER_GROUP_WAIT = "30s"
HEARTBEAT_INTERVAL_AND_REPEAT = ("1m", "5m")  # docs/observability.md's dead man's switch counts on the 5 min

# Prometheus jobs (the `job` label).
JOB_VLLM, JOB_NODE, JOB_GPU, JOB_PROMETHEUS = "vllm", "node", "gpu", "prometheus"

# The guard (launch/serving-guard.py) reports through node-exporter's textfile collector, in
# contract.SERVING_GUARD_TEXTFILE on the head.
GUARD_METRICS = {
    "twinspark_guard_canary_success": "gauge: 1 when the last canary (a known-answer completion) passed, else 0",
    "twinspark_guard_canary_last_run_timestamp_seconds": "gauge: unix time of the last canary",
    "twinspark_guard_canary_duration_seconds": "gauge: how long the last canary took",
    "twinspark_guard_restarts_total": "counter: serving restarts the guard performed",
    "twinspark_guard_hold": "gauge: 1 while the guard holds (restart cap reached, waiting for a person)",
    "twinspark_guard_gateway_up": "gauge: 1 when the API gateway answers /health at all (a 502 too), else 0",
}

# RoCE/InfiniBand error counters (node_exporter infiniband collector); any increase is news.
ROCE_ERROR_COUNTERS = (
    "port_errors_received", "port_discards_received", "port_discards_transmitted", "link_downed",
    "link_error_recovery", "symbol_error", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
    "out_of_sequence_packets_received", "packet_sequence_errors", "local_ack_timeout_errors",
    "rx_icrc_encapsulated_errors", "out_of_buffer_drops", "req_cqes_errors", "resp_cqes_errors",
)


def roce_errors_increase(window: str, matchers: str = f'job="{JOB_NODE}", rail!=""') -> str:
    """Errors per rail port over `window`, all counters summed.

    One increase() per counter, each tagged with its name: increase() drops metric names, so
    a single `{__name__=~...}` selector would give several series the same labels (an error).
    """
    parts = [
        f'label_replace(increase(node_infiniband_{c}_total{{{matchers}}}[{window}]), "counter", "{c}", "", "")'
        for c in ROCE_ERROR_COUNTERS
    ]
    return "sum by (node, device, rail) (" + " or ".join(parts) + ")"


# nvidia-smi's clock event ("throttle") reasons that mean the GPU is slowed against its will.
THROTTLE_SELECTOR = (
    f'{{job="{JOB_GPU}", __name__=~"nvidia_smi_clocks_(event|throttle)_reasons_'
    '(hw_slowdown|hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown)"}'
)
REAL_FILESYSTEMS = f'job="{JOB_NODE}", fstype=~"ext4|xfs|btrfs|zfs", mountpoint!~"/boot.*"'
ROCE_PORT_ACTIVE = 4  # /sys/class/infiniband/<hca>/ports/1/state "4: ACTIVE"
MIN_ROCE_BYTES_PER_S_WHILE_DECODING = 1_000_000


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
    panels: tuple[str, ...] = ("overview", "spec-decode", "nodes")  # the recipe's: spec decode where it speculates
    spec_decode_advice: str = ""  # the recipe's, for the acceptance-collapse alert
    prometheus_port: int = contract.PROMETHEUS_PORT
    node_exporter_port: int = contract.NODE_EXPORTER_PORT
    gpu_exporter_port: int = contract.GPU_EXPORTER_PORT
    alertmanager_port: int = contract.ALERTMANAGER_PORT

    @property
    def head(self) -> ObservedNode:
        return next(n for n in self.nodes if n.role == "head")


def plan_from_config(cfg: StackConfig, alertmanager: bool, topology: Optional[Topology] = None) -> ObservabilityPlan:
    """The stack's facts the monitoring stack needs (alertmanager: an alert webhook is set;
    topology: None, the config's with the nodes' addresses resolved now)."""
    topology = topology or Topology(cfg, resolve_node_addresses(cfg.nodes))
    return ObservabilityPlan(
        nodes=tuple(ObservedNode(n.name, n.role, topology.ray_ip(n),
                                 tuple(ObservedRail(r.iface, r.hca) for r in n.rails)) for n in cfg.nodes),
        vllm_port=contract.METRICS_LOOPBACK_PORT,
        expected_mtu=cfg.fabric.mtu,
        expected_link_speed_mbps=cfg.fabric.link_speed_mbps,
        bootstrap_iface=cfg.fabric.bootstrap_iface,
        settings=cfg.observability,
        alertmanager=alertmanager,
        platform=cfg.serving.platform,
        panels=cfg.serving.recipe_spec.panels,
        spec_decode_advice=cfg.serving.recipe_spec.spec_decode_advice,
    )


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=120)


# --------------------------------------------------------------------------- prometheus.yml


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
            # shares the head's network namespace, so it reads them without the key.
            "job_name": JOB_VLLM,
            "static_configs": [
                {"targets": [f"127.0.0.1:{plan.vllm_port}"], "labels": {"node": head.name, "role": head.role}}
            ],
        },
        {
            "job_name": JOB_NODE,
            "static_configs": _per_node_targets(plan, plan.node_exporter_port),
            "metric_relabel_configs": _rail_relabels(plan),
        },
        {"job_name": JOB_GPU, "static_configs": _per_node_targets(plan, plan.gpu_exporter_port)},
        {
            "job_name": JOB_PROMETHEUS,
            "static_configs": [
                {"targets": [f"127.0.0.1:{plan.prometheus_port}"], "labels": {"node": head.name, "role": head.role}}
            ],
        },
    ]
    return "# prometheus.yml — rendered by twinspark (components/observability_files.py)\n" + _dump(config)


# --------------------------------------------------------------------------- alert rules


@dataclass(frozen=True)
class AlertRule:
    alert: str
    signals: tuple[str, ...]  # the queries the expression is built from: each answers on a live stack
    expr: str
    for_: str
    severity: str  # critical: serving is or will be broken; warning: look soon
    summary: str
    description: str


def _rule(alert: str, signal: str, condition: str, for_: str, severity: str, summary: str, description: str,
          also: tuple[str, ...] = ()) -> AlertRule:
    """An alert on one query compared with a threshold: `signal condition` (also: extra signals)."""
    return AlertRule(alert, (signal, *also), f"{signal} {condition}", for_, severity, summary, description)


def throughput_collapse_expr(floor: float, window: str = "5m") -> tuple[tuple[str, ...], str]:
    """Requests run, yet both decode and prefill crawl: what NCCL on TCP looks like.

    Requests running keeps an idle server quiet; the prefill side keeps a long prompt (no
    output tokens for minutes, thousands of prompt tokens a second) quiet.
    """
    vllm = f'job="{JOB_VLLM}"'
    output = f"sum(rate(vllm:generation_tokens_total{{{vllm}}}[{window}]))"
    prompt = f"sum(rate(vllm:prompt_tokens_total{{{vllm}}}[{window}]))"
    running = f"sum(avg_over_time(vllm:num_requests_running{{{vllm}}}[{window}]))"
    expr = f"({output} < {floor:g}) and on () ({prompt} < {20 * floor:g}) and on () ({running} >= 1)"
    return (output, prompt, running), expr


CANARY_LAST_RUN = "twinspark_guard_canary_last_run_timestamp_seconds"
WATCHDOG = "TwinsparkWatchdog"


def alert_groups(plan: ObservabilityPlan) -> dict[str, list[AlertRule]]:
    s = plan.settings
    vllm, node, gpu = f'job="{JOB_VLLM}"', f'job="{JOB_NODE}"', f'job="{JOB_GPU}"'
    accepted = f"sum by (node) (rate(vllm:spec_decode_num_accepted_tokens_total{{{vllm}}}[10m]))"
    drafted = f"sum by (node) (rate(vllm:spec_decode_num_draft_tokens_total{{{vllm}}}[10m]))"
    decoding = f"sum(rate(vllm:generation_tokens_total{{{vllm}}}[5m]))"
    rail_bytes = f'sum(rate(node_infiniband_port_data_transmitted_bytes_total{{{node}, rail!=""}}[5m]))'
    collapse_signals, collapse_expr = throughput_collapse_expr(s.throughput_floor_tokens_per_second)
    gpu_up, gpu_collect = f"up{{{gpu}}}", f"nvidia_smi_last_collect_success{{{gpu}}}"
    avail = f"node_filesystem_avail_bytes{{{REAL_FILESYSTEMS}}}"
    size = f"node_filesystem_size_bytes{{{REAL_FILESYSTEMS}}}"
    mem_avail, mem_total = f"node_memory_MemAvailable_bytes{{{node}}}", f"node_memory_MemTotal_bytes{{{node}}}"
    return {
        "twinspark-serving": [
            _rule("TwinsparkServingDown", f"up{{{vllm}}}", "== 0", "2m", "critical",
                  "vLLM on {{ $labels.node }} does not answer /metrics",
                  "The endpoint is down or still loading the model (a cold start takes ~8 min). "
                  f"Check {contract.LOG_DIR}/{contract.VLLM_LOG} and {contract.boot_log('head')} on the head."),
            _rule("TwinsparkVllmRestarting", f"changes(process_start_time_seconds{{{vllm}}}[1h])", ">= 2", "0m",
                  "warning", "vLLM on {{ $labels.node }} started {{ $value }} more times in the last hour",
                  "The engine is restart-looping. Repeated restarts leak unified memory on a Spark; look at "
                  "`dmesg | grep -i oom` on every node and the vLLM log for the first error."),
            _rule("TwinsparkPreemptions", f"sum by (node) (increase(vllm:num_preemptions_total{{{vllm}}}[10m]))",
                  "> 0", "5m", "warning", "vLLM is preempting requests ({{ $value }} in 10 min)",
                  "The KV cache is full, so running requests are evicted and recomputed: lower concurrency "
                  "(serving.profile) or max context."),
            AlertRule("TwinsparkThroughputCollapse", collapse_signals, collapse_expr, "10m", "critical",
                      "Requests run but the cluster makes under "
                      f"{s.throughput_floor_tokens_per_second:g} output tok/s",
                      "Decode and prefill both crawl while requests are running: the signature of NCCL's silent "
                      "fallback to TCP (about a tenth of RoCE's all-reduce bandwidth), or of a throttled GPU. "
                      "Check the RoCE panels (idle rails?), run `python -m ops bench`, then re-run NcclCheck "
                      "(pulumi up --replace the nccl-check resources)."),
            *([AlertRule("TwinsparkSpecDecodeAcceptanceCollapse", (accepted, drafted),
                         f"({accepted} / {drafted}) < {s.spec_decode_min_acceptance:g}", "15m", "warning",
                         "Speculative-decoding acceptance is {{ $value | humanizePercentage }}",
                         plan.spec_decode_advice)]
              if "spec-decode" in plan.panels else []),  # only a recipe that speculates drafts
        ],
        "twinspark-heartbeat": [
            # always firing: the webhook's receiver notices a dead head (Prometheus and
            # Alertmanager run there) by this alert's absence (docs/observability.md: a dead man's switch)
            AlertRule(WATCHDOG, ("vector(1)",), "vector(1)", "0m", "none", "twinspark's monitoring is alive",
                      "Always firing, by design: it is re-sent every 5 minutes; its absence means the head, "
                      "Prometheus or Alertmanager is down."),
        ],
        "twinspark-guard": [
            _rule("TwinsparkCanaryFailing", "twinspark_guard_canary_success", "== 0", "2m", "critical",
                  "The guard's canary fails on {{ $labels.node }}",
                  "A known-answer completion through the real endpoint gave a wrong answer or none: "
                  "/health can be 200 while the output is garbage."),
            # absent(): a guard that never wrote (or whose textfile went) has no series to be old
            AlertRule("TwinsparkCanaryStale", (CANARY_LAST_RUN,),
                      f"time() - {CANARY_LAST_RUN} > 900 or absent({CANARY_LAST_RUN})", "15m", "warning",
                      "No recent canary on the head",
                      f"The guard stopped probing, or never started: is {contract.SERVING_GUARD_UNIT} running, "
                      "and does serving answer /health?"),
            _rule("TwinsparkGatewayDown", "twinspark_guard_gateway_up", "== 0", "2m", "critical",
                  "The API gateway on {{ $labels.node }} does not answer",
                  "Nothing answers on serving.port: clients are refused even if vLLM runs. "
                  f"`docker ps -a` on the head ({contract.API_GATEWAY_CONTAINER}) and "
                  f"{contract.LOG_DIR}/{contract.API_GATEWAY_LOG}."),
            _rule("TwinsparkGuardHolding", "twinspark_guard_hold", "== 1", "0m", "critical",
                  "The guard holds: it stopped restarting serving",
                  "The restart cap was reached; a person must look before serving is restarted again."),
        ],
        "twinspark-fabric": [
            _rule("TwinsparkRailDown", f'node_network_up{{{node}, rail!=""}}', "== 0", "1m", "critical",
                  "Rail {{ $labels.rail }} ({{ $labels.device }}) on {{ $labels.node }} is down",
                  "A QSFP rail lost its link: NCCL loses that rail (or falls back to TCP). Check the cable "
                  "and `ip link` on both nodes."),
            _rule("TwinsparkRailMtuWrong", f'node_network_mtu_bytes{{{node}, rail!=""}}', f"!= {plan.expected_mtu}",
                  "5m", "critical",
                  "Rail {{ $labels.rail }} ({{ $labels.device }}) on {{ $labels.node }} has MTU {{ $value }}",
                  f"Expected MTU {plan.expected_mtu} (fabric.mtu): RoCE's active MTU drops and NCCL slows down. "
                  "Re-apply the netplan (pulumi up) and check /etc/netplan/99-qsfp.yaml."),
            _rule("TwinsparkRailSpeedLow", f'node_network_speed_bytes{{{node}, rail!=""}} * 8 / 1e6',
                  f"< {plan.expected_link_speed_mbps}", "5m", "warning",
                  "Rail {{ $labels.rail }} ({{ $labels.device }}) on {{ $labels.node }} runs at {{ $value }} Mb/s",
                  f"Expected {plan.expected_link_speed_mbps} Mb/s (fabric.linkSpeedMbps): a degraded link."),
            _rule("TwinsparkRocePortNotActive", f'node_infiniband_state_id{{{node}, rail!=""}}',
                  f"!= {ROCE_PORT_ACTIVE}", "1m", "critical",
                  "RoCE port {{ $labels.device }} on {{ $labels.node }} is not ACTIVE (state {{ $value }})",
                  "The RDMA port is down or initialising: NCCL cannot use this rail."),
            _rule("TwinsparkRoceErrors", roce_errors_increase("10m"), "> 0", "5m", "warning",
                  "RoCE error counters rise on {{ $labels.device }} ({{ $labels.node }}): {{ $value }} in 10 min",
                  "Port errors, discards, link recoveries, sequence errors or retransmission timeouts on a rail: "
                  "a bad cable or overload. See the nodes and fabric dashboard."),
            AlertRule("TwinsparkNcclNotOnRoce", (decoding, rail_bytes),
                      f"{decoding} > 1 and on () {rail_bytes} < {MIN_ROCE_BYTES_PER_S_WHILE_DECODING:g}",
                      "10m", "critical", "Tokens are generated but the RoCE rails are idle",
                      "Every token all-reduces across the nodes; with the rails idle NCCL must be on TCP "
                      f"(its socket fallback runs over {plan.bootstrap_iface}). Re-run NcclCheck (pulumi up) "
                      "and check memlock and the RoCE ports."),
        ],
        "twinspark-nodes": [
            _rule("TwinsparkNodeDown", f"up{{{node}}}", "== 0", "2m", "critical",
                  "{{ $labels.node }} does not answer on its first rail",
                  "Its node exporter is scraped over the first rail: the node is down, rebooting, or its "
                  "first rail is down."),
            AlertRule("TwinsparkGpuMetricsMissing", (gpu_up, gpu_collect),
                      f"{gpu_up} == 0 or {gpu_collect} == 0", "5m", "warning",
                      "No GPU metrics from {{ $labels.node }}",
                      "The GPU exporter is down or nvidia-smi fails in it (driver/library mismatch after an "
                      "update?)."),
            _rule("TwinsparkGpuHot", f"nvidia_smi_temperature_gpu{{{gpu}}}", f"> {s.gpu_temperature_alert_celsius:g}",
                  "5m", "warning", "GPU on {{ $labels.node }} at {{ $value }} °C",
                  "Sustained heat precedes throttling and, on Sparks, overheat shutdowns: check airflow."),
            _rule("TwinsparkGpuThrottling", f"max by (node) ({THROTTLE_SELECTOR})", "> 0", "5m", "warning",
                  "GPU on {{ $labels.node }} is throttled",
                  "nvidia-smi reports a thermal, hardware-slowdown or power-brake clock reason: decode slows "
                  "for the whole cluster (every GPU computes every token)."),
            _rule("TwinsparkDiskAlmostFull", f"{avail} / {size}", "< 0.1", "10m", "warning",
                  "{{ $labels.mountpoint }} on {{ $labels.node }} has {{ $value | humanizePercentage }} free",
                  "Weights, logs, images and metrics share the disk."),
            _rule("TwinsparkDiskFillingUp", f"predict_linear({avail}[6h], 86400)", "< 0", "30m", "warning",
                  "{{ $labels.mountpoint }} on {{ $labels.node }} fills up within a day at this rate",
                  "Something writes fast: logs, a download, core dumps?"),
            _rule("TwinsparkMemoryLow", f"{mem_avail} / {mem_total}", "< 0.05", "5m", "warning",
                  "{{ $labels.node }} has {{ $value | humanizePercentage }} of its unified memory available",
                  "The GPU and the OS share this memory: the kernel OOM killer is next."),
            _rule("TwinsparkOomKill", f"increase(node_vmstat_oom_kill{{{node}}}[10m])", "> 0", "0m", "critical",
                  "The kernel OOM killer fired on {{ $labels.node }}",
                  "One killed Ray worker kills the whole engine (recipe gotcha 13): `dmesg | grep -i oom`."),
        ],
    }


def render_alert_rules(plan: ObservabilityPlan) -> str:
    groups = [
        {
            "name": name,
            "rules": [
                {
                    "alert": r.alert,
                    "expr": r.expr,
                    "for": r.for_,
                    "labels": {"severity": r.severity},
                    "annotations": {"summary": r.summary, "description": r.description},
                }
                for r in rules
            ],
        }
        for name, rules in alert_groups(plan).items()
    ]
    return "# twinspark alert rules — rendered by twinspark (components/observability_files.py)\n" + _dump(
        {"groups": groups}
    )


def render_alertmanager_config(webhook_url: str, group_wait: str = ALERTMANAGER_GROUP_WAIT,
                               heartbeat: tuple[str, str] = HEARTBEAT_INTERVAL_AND_REPEAT) -> str:
    """Every alert to one webhook (Alertmanager's JSON POST), resolved ones too. Holds a secret.
    `heartbeat`: how often the watchdog's group is looked at and re-sent (shorter in tests)."""
    interval, repeat = heartbeat
    return "# alertmanager.yml — rendered by twinspark: alerts go to twinspark:alertWebhookUrl\n" + _dump({
        "route": {"receiver": "webhook", "group_by": ["alertname", "node"], "group_wait": group_wait,
                  "group_interval": "5m", "repeat_interval": "4h",
                  # the heartbeat, re-sent often enough that its absence is news within minutes
                  "routes": [{"receiver": "webhook", "matchers": [f'alertname="{WATCHDOG}"'], "group_wait": "0s",
                              "group_interval": interval, "repeat_interval": repeat}]},
        "receivers": [{"name": "webhook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    })


# --------------------------------------------------------------------------- Grafana provisioning


def render_grafana_datasource(plan: ObservabilityPlan) -> str:
    return _dump(
        {
            "apiVersion": 1,
            "datasources": [
                {
                    "name": "Prometheus (twinspark)",
                    "uid": DATASOURCE_UID,
                    "type": "prometheus",
                    "access": "proxy",
                    "url": f"http://127.0.0.1:{plan.prometheus_port}",
                    "isDefault": True,
                    "editable": False,
                    "jsonData": {"timeInterval": f"{plan.settings.scrape_interval_seconds}s", "httpMethod": "POST"},
                }
            ],
        }
    )


def render_grafana_dashboard_provider() -> str:
    return _dump(
        {
            "apiVersion": 1,
            "providers": [
                {
                    "name": "twinspark",
                    "folder": DASHBOARD_FOLDER,
                    "type": "file",
                    "disableDeletion": True,
                    "allowUiUpdates": False,
                    "updateIntervalSeconds": 60,
                    "options": {"path": contract.GRAFANA_CONTAINER_DASHBOARDS_DIR, "foldersFromFilesStructure": False},
                }
            ],
        }
    )


# --------------------------------------------------------------------------- dashboards

_DS = gmodel.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
_REF_IDS = "ABCDEFGH"


def _queries(panel, queries: Iterable[tuple[str, str]], instant: bool = False, table: bool = False):
    for ref, (expr, legend) in zip(_REF_IDS, queries):
        query = gprom.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(_DS)
        if instant:
            query = query.instant()
        if table:
            query = query.format(PromQueryFormat.TABLE)
        panel = panel.with_target(query)
    return panel


def _timeseries(title: str, description: str, unit: str, queries, span: int = 12, height: int = 8, **limits):
    panel = gts.Panel().title(title).description(description).unit(unit).datasource(_DS).span(span).height(height)
    if "min" in limits:
        panel = panel.min(limits["min"])
    if "max" in limits:
        panel = panel.max(limits["max"])
    return _queries(panel, queries)


def _thresholds(*steps: tuple[Optional[float], str]):
    return (
        gdash.ThresholdsConfig()
        .mode(gmodel.ThresholdsMode.ABSOLUTE)
        .steps([gmodel.Threshold(value=v, color=c) for v, c in steps])
    )


def _stat(title: str, description: str, unit: str, queries, span: int = 4, thresholds=None, mappings=None):
    panel = gstat.Panel().title(title).description(description).unit(unit).datasource(_DS).span(span).height(4)
    if thresholds:
        panel = panel.thresholds(_thresholds(*thresholds))
    if mappings:
        panel = panel.mappings(mappings)
    return _queries(panel, queries, instant=True)


def _state(title: str, description: str, queries, mapping: dict[str, tuple[str, str]], span: int = 12):
    value_map = gmodel.ValueMap(
        options={k: gmodel.ValueMappingResult(text=text, color=color) for k, (text, color) in mapping.items()}
    )
    panel = gstate.Panel().title(title).description(description).datasource(_DS).span(span).height(6)
    return _queries(panel.mappings([value_map]), queries)


UP_DOWN = {"1": ("UP", "green"), "0": ("DOWN", "red")}


def _overview(plan: ObservabilityPlan) -> gdash.Dashboard:
    vllm = f'job="{JOB_VLLM}"'
    itl = "histogram_quantile({q}, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{{%s}}[5m])))" % vllm
    ttft = "histogram_quantile({q}, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{%s}}[5m])))" % vllm
    guard = (
        gdash.Row("Guard: canary, restarts, hold (filled once the guard writes its metrics)")
        .collapsed(True)
        .with_panel(
            _state("Canary", "Last canary result (twinspark_guard_canary_success).",
                   [("twinspark_guard_canary_success", "{{node}}")], {"1": ("PASS", "green"), "0": ("FAIL", "red")})
        )
        .with_panel(
            _state("Hold", "1 while the guard holds (restart cap reached).",
                   [("twinspark_guard_hold", "{{node}}")], {"0": ("watching", "green"), "1": ("HOLD", "red")})
        )
        .with_panel(
            _timeseries("Guard restarts per hour", "Serving restarts the guard performed.", "short",
                        [("increase(twinspark_guard_restarts_total[1h])", "{{node}}")])
        )
        .with_panel(
            _timeseries("Canary duration", "How long the last canary took.", "s",
                        [("twinspark_guard_canary_duration_seconds", "{{node}}")])
        )
    )
    return (
        gdash.Dashboard("twinspark — overview")
        .uid("twinspark-overview")
        .tags(["twinspark"])
        .description("Is it serving, how fast, and how full: vLLM's own metrics from the head.")
        .refresh("30s")
        .time("now-6h", "now")
        .readonly()
        .with_row(gdash.Row("Serving"))
        .with_panel(_stat("Serving", "Prometheus reaches vLLM's /metrics on the head.", "none",
                          [(f"up{{{vllm}}}", "{{node}}")], thresholds=[(None, "red"), (1, "green")],
                          mappings=[gmodel.ValueMap(options={k: gmodel.ValueMappingResult(text=t, color=c)
                                                             for k, (t, c) in UP_DOWN.items()})]))
        .with_panel(_stat("Requests running", "vllm:num_requests_running", "none",
                          [(f"sum(vllm:num_requests_running{{{vllm}}})", "running")]))
        .with_panel(_stat("Requests waiting", "vllm:num_requests_waiting", "none",
                          [(f"sum(vllm:num_requests_waiting{{{vllm}}})", "waiting")],
                          thresholds=[(None, "green"), (1, "orange")]))
        .with_panel(_stat("Output tok/s", "Generated tokens per second over the last minute.", "none",
                          [(f"sum(rate(vllm:generation_tokens_total{{{vllm}}}[1m]))", "tok/s")]))
        .with_panel(_stat("KV cache used", "vllm:kv_cache_usage_perc.",
                          "percentunit",
                          [(f"max(vllm:kv_cache_usage_perc{{{vllm}}})", "KV")],
                          thresholds=[(None, "green"), (0.9, "orange"), (0.97, "red")]))
        .with_panel(_stat("Alerts firing", "Alert rules firing now (the list is below).", "none",
                          [('count(ALERTS{alertstate="firing"}) or vector(0)', "firing")],
                          thresholds=[(None, "green"), (1, "red")]))
        .with_panel(_timeseries("Requests running / waiting", "Scheduler queue.", "none",
                                [(f"sum(vllm:num_requests_running{{{vllm}}})", "running"),
                                 (f"sum(vllm:num_requests_waiting{{{vllm}}})", "waiting")]))
        .with_panel(_timeseries("Tokens per second", "Output (decode) and prompt (prefill) tokens per second.",
                                "none",
                                [(f"sum(rate(vllm:generation_tokens_total{{{vllm}}}[1m]))", "output"),
                                 (f"sum(rate(vllm:prompt_tokens_total{{{vllm}}}[1m]))", "prompt")]))
        .with_panel(_timeseries("Time to first token", "p50 and p95 over 5 min.", "s",
                                [(ttft.format(q="0.5"), "p50"), (ttft.format(q="0.95"), "p95")]))
        .with_panel(_timeseries("Inter-token latency", "p50 and p95 over 5 min.", "s",
                                [(itl.format(q="0.5"), "p50"), (itl.format(q="0.95"), "p95")]))
        .with_panel(_timeseries("KV cache used", "Fraction of KV-cache blocks in use.", "percentunit",
                                [(f"max(vllm:kv_cache_usage_perc{{{vllm}}})",
                                  "KV cache")], span=8, min=0, max=1))
        .with_panel(_timeseries("Preemptions", "Requests evicted for lack of KV cache, per 5 min.", "short",
                                [(f"sum(increase(vllm:num_preemptions_total{{{vllm}}}[5m]))", "preemptions")],
                                span=8))
        .with_panel(_timeseries("Prefix-cache hit rate", "Cached tokens / queried tokens over 5 min.",
                                "percentunit",
                                [(f"sum(rate(vllm:prefix_cache_hits_total{{{vllm}}}[5m])) / "
                                  f"sum(rate(vllm:prefix_cache_queries_total{{{vllm}}}[5m]))", "hit rate")],
                                span=8, min=0, max=1))
        .with_panel(_queries(
            gtable.Panel().title("Alerts firing").description("ALERTS{alertstate=\"firing\"}").datasource(_DS)
            .span(24).height(6),
            [('ALERTS{alertstate="firing"}', "")], instant=True, table=True))
        .with_row(guard)
    )


def _spec_decode(plan: ObservabilityPlan) -> gdash.Dashboard:
    vllm = f'job="{JOB_VLLM}"'
    acc, draft_tok, drafts = (
        f"vllm:spec_decode_num_accepted_tokens_total{{{vllm}}}",
        f"vllm:spec_decode_num_draft_tokens_total{{{vllm}}}",
        f"vllm:spec_decode_num_drafts_total{{{vllm}}}",
    )

    def per_pos(window: str) -> str:
        return (
            f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{vllm}}}[{window}])) "
            f"/ on () group_left () sum(rate({drafts}[{window}]))"
        )

    return (
        gdash.Dashboard("twinspark — speculative decoding")
        .uid("twinspark-spec-decode")
        .tags(["twinspark"])
        .description("How much the draft (DSpark/MTP) buys: acceptance overall and per draft position.")
        .refresh("30s")
        .time("now-6h", "now")
        .readonly()
        .with_panel(_stat("Acceptance rate (10 min)", "Accepted / drafted tokens.", "percentunit",
                          [(f"sum(rate({acc}[10m])) / sum(rate({draft_tok}[10m]))", "acceptance")], span=6,
                          thresholds=[(None, "red"), (plan.settings.spec_decode_min_acceptance, "orange"),
                                      (0.5, "green")]))
        .with_panel(_stat("Mean accepted length (10 min)",
                          "1 + accepted tokens per draft (the bonus token counts, as vLLM logs it).", "none",
                          [(f"1 + sum(rate({acc}[10m])) / sum(rate({drafts}[10m]))", "tokens per step")], span=6))
        .with_panel(_stat("Drafted tok/s", "Draft tokens proposed per second (1 min).", "none",
                          [(f"sum(rate({draft_tok}[1m]))", "drafted")], span=6))
        .with_panel(_stat("Accepted tok/s", "Draft tokens accepted per second (1 min).", "none",
                          [(f"sum(rate({acc}[1m]))", "accepted")], span=6))
        .with_panel(_timeseries("Acceptance rate", "Accepted / drafted tokens, 5 min windows.", "percentunit",
                                [(f"sum(rate({acc}[5m])) / sum(rate({draft_tok}[5m]))", "acceptance")],
                                min=0, max=1))
        .with_panel(_timeseries("Mean accepted length", "1 + accepted tokens per draft, 5 min windows.", "none",
                                [(f"1 + sum(rate({acc}[5m])) / sum(rate({drafts}[5m]))", "mean length")]))
        .with_panel(_timeseries("Acceptance per draft position",
                                "Share of drafts whose token at this position was accepted (position 0 first).",
                                "percentunit", [(per_pos("5m"), "position {{position}}")], span=24,
                                min=0, max=1))
        .with_panel(_timeseries("Drafted vs accepted tok/s", "Draft tokens proposed and accepted per second.",
                                "none",
                                [(f"sum(rate({draft_tok}[1m]))", "drafted"), (f"sum(rate({acc}[1m]))", "accepted"),
                                 (f"sum(rate(vllm:generation_tokens_total{{{vllm}}}[1m]))", "output tok/s")]))
        .with_panel(_timeseries("Drafts per second", "Speculative steps per second.", "none",
                                [(f"sum(rate({drafts}[1m]))", "drafts/s")]))
    )


def _nodes(plan: ObservabilityPlan) -> gdash.Dashboard:
    node, gpu = f'job="{JOB_NODE}", node=~"$node"', f'job="{JOB_GPU}", node=~"$node"'
    rails = f'{node}, rail!=""'
    throttle = THROTTLE_SELECTOR.replace(f'job="{JOB_GPU}"', gpu).replace(
        "hw_power_brake_slowdown)", "hw_power_brake_slowdown|sw_power_cap)"
    )
    node_variable = (
        gdash.QueryVariable("node").label("node").datasource(_DS)
        .query(f'label_values(up{{job="{JOB_NODE}"}}, node)')
        .multi(True).include_all(True).all_value(".*")
        .refresh(gmodel.VariableRefresh.ON_DASHBOARD_LOAD)
    )
    return (
        gdash.Dashboard("twinspark — nodes and fabric")
        .uid("twinspark-nodes")
        .tags(["twinspark"])
        .description("GPU (nvidia-smi via nvidia_gpu_exporter), unified memory, disks, and the RoCE rails.")
        .refresh("30s")
        .time("now-6h", "now")
        .readonly()
        .with_variable(node_variable)
        .with_row(gdash.Row("GPU"))
        .with_panel(_timeseries("GPU temperature", "nvidia-smi temperature.gpu.", "celsius",
                                [(f"nvidia_smi_temperature_gpu{{{gpu}}}", "{{node}}")], span=8))
        .with_panel(_timeseries("GPU power", "nvidia-smi power.draw.", "watt",
                                [(f"nvidia_smi_power_draw_watts{{{gpu}}}", "{{node}}")], span=8))
        .with_panel(_timeseries("GPU utilization", "nvidia-smi utilization.gpu.", "percentunit",
                                [(f"nvidia_smi_utilization_gpu_ratio{{{gpu}}}", "{{node}}")], span=8, min=0, max=1))
        .with_panel(_timeseries("GPU clocks", "Graphics and SM clocks.", "hertz",
                                [(f"nvidia_smi_clocks_current_graphics_clock_hz{{{gpu}}}", "{{node}} graphics"),
                                 (f"nvidia_smi_clocks_current_sm_clock_hz{{{gpu}}}", "{{node}} SM")]))
        .with_panel(_state("Clock event (throttle) reasons",
                           "1 while nvidia-smi reports the reason (thermal, hardware slowdown, power brake, "
                           "software power cap).",
                           [(throttle, "{{node}} {{__name__}}")], {"0": ("no", "green"), "1": ("YES", "red")}))
        .with_row(gdash.Row("Memory and disk"))
        .with_panel(_timeseries("Unified memory in use",
                                "GB10 shares one memory between CPU and GPU (nvidia-smi reports no GPU memory): "
                                "MemTotal - MemAvailable.", "bytes",
                                [(f"node_memory_MemTotal_bytes{{{node}}} - node_memory_MemAvailable_bytes{{{node}}}",
                                  "{{node}} used"),
                                 (f"node_memory_MemTotal_bytes{{{node}}}", "{{node}} total")], span=8))
        .with_panel(_timeseries("OOM kills per hour", "Kernel OOM killer events (recipe gotcha 13).", "short",
                                [(f"increase(node_vmstat_oom_kill{{{node}}}[1h])", "{{node}}")], span=8))
        .with_panel(_timeseries("Disk free", "Free share of each real filesystem.", "percentunit",
                                [(f"node_filesystem_avail_bytes{{{REAL_FILESYSTEMS}, node=~\"$node\"}} / "
                                  f"node_filesystem_size_bytes{{{REAL_FILESYSTEMS}, node=~\"$node\"}}",
                                  "{{node}} {{mountpoint}}")], span=8, min=0, max=1))
        .with_panel(_timeseries("CPU busy", "Share of CPU time not idle.", "percentunit",
                                [(f'1 - avg by (node) (rate(node_cpu_seconds_total{{{node}, mode="idle"}}[1m]))',
                                  "{{node}}")], span=24, min=0, max=1))
        .with_row(gdash.Row("Fabric: RoCE rails"))
        .with_panel(_timeseries("RoCE throughput per rail (transmit)", "RDMA port data sent, bits/s.", "bps",
                                [(f"rate(node_infiniband_port_data_transmitted_bytes_total{{{rails}}}[1m]) * 8",
                                  "{{node}} rail {{rail}} {{device}}")]))
        .with_panel(_timeseries("RoCE throughput per rail (receive)", "RDMA port data received, bits/s.", "bps",
                                [(f"rate(node_infiniband_port_data_received_bytes_total{{{rails}}}[1m]) * 8",
                                  "{{node}} rail {{rail}} {{device}}")]))
        .with_panel(_timeseries("RoCE errors per 5 min", "Sum of the RDMA error counters per port.", "short",
                                [(roce_errors_increase("5m", rails), "{{node}} rail {{rail}} {{device}}")]))
        .with_panel(_timeseries("LAN traffic (NCCL's TCP fallback would show here)",
                                f"{plan.bootstrap_iface} (fabric.bootstrapIface) bits/s.", "bps",
                                [(f'rate(node_network_transmit_bytes_total{{{node}, device="{plan.bootstrap_iface}"}}'
                                  "[1m]) * 8", "{{node}} tx"),
                                 (f'rate(node_network_receive_bytes_total{{{node}, device="{plan.bootstrap_iface}"}}'
                                  "[1m]) * 8", "{{node}} rx")]))
        .with_panel(_state("Rail link", "Netdev operstate of each rail.",
                           [(f"node_network_up{{{rails}}}", "{{node}} rail {{rail}} {{device}}")], UP_DOWN))
        .with_panel(_state("RoCE port state", "4 = ACTIVE.",
                           [(f"node_infiniband_state_id{{{rails}}}", "{{node}} rail {{rail}} {{device}}")],
                           {"4": ("ACTIVE", "green"), "1": ("DOWN", "red"), "2": ("INIT", "orange"),
                            "3": ("ARMED", "orange")}))
        .with_panel(_stat("Rail MTU", f"Expected {plan.expected_mtu} (fabric.mtu).", "none",
                          [(f"node_network_mtu_bytes{{{rails}}}", "{{node}} rail {{rail}}")], span=12,
                          thresholds=[(None, "red"), (plan.expected_mtu, "green"), (plan.expected_mtu + 1, "red")]))
        .with_panel(_stat("Rail speed (Mb/s)", f"Expected {plan.expected_link_speed_mbps} (fabric.linkSpeedMbps).",
                          "none", [(f"node_network_speed_bytes{{{rails}}} * 8 / 1e6", "{{node}} rail {{rail}}")],
                          span=12,
                          thresholds=[(None, "red"), (plan.expected_link_speed_mbps, "green")]))
    )


def _number_panels(model: gmodel.Dashboard) -> gmodel.Dashboard:
    """Stable, unique panel ids (rows and the panels inside collapsed rows too)."""
    next_id = 1
    for panel in model.panels or []:
        panel.id_val = next_id
        next_id += 1
        for inner in getattr(panel, "panels", None) or []:
            inner.id_val = next_id
            next_id += 1
    return model


DASHBOARDS = {"twinspark-overview.json": _overview, "twinspark-spec-decode.json": _spec_decode,
              "twinspark-nodes.json": _nodes}


def render_dashboards(plan: ObservabilityPlan) -> dict[str, str]:
    """file name -> dashboard JSON (Grafana's classic dashboard model, deterministic)."""
    return {
        name: json.dumps(_number_panels(build(plan).build()), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
        for name, build in DASHBOARDS.items()
        if name.removeprefix("twinspark-").removesuffix(".json") in plan.panels
    }


@dataclass(frozen=True)
class RenderedFile:
    step: str  # the managed file's step: {head}-observability-{step}
    path: str  # on the host
    content: str


PROMETHEUS_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/prometheus"
GRAFANA_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/grafana"
ALERTMANAGER_HOST_DIR = f"{contract.OBSERVABILITY_CONFIG_DIR}/alertmanager"
ALERTMANAGER_CONFIG = "alertmanager.yml"


def prometheus_files(plan: ObservabilityPlan) -> list[RenderedFile]:
    """What the Prometheus container reads (PROMETHEUS_HOST_DIR is its /etc/prometheus)."""
    return [
        RenderedFile("prometheus-config", f"{PROMETHEUS_HOST_DIR}/prometheus.yml", render_prometheus_config(plan)),
        RenderedFile("alert-rules", f"{PROMETHEUS_HOST_DIR}/rules/{RULES_FILE}", render_alert_rules(plan)),
    ]


def grafana_files(plan: ObservabilityPlan) -> list[RenderedFile]:
    """Grafana's provisioning and the dashboards it provisions."""
    files = [
        RenderedFile("grafana-datasource", f"{GRAFANA_HOST_DIR}/provisioning/datasources/twinspark.yaml",
                     render_grafana_datasource(plan)),
        RenderedFile("grafana-dashboards", f"{GRAFANA_HOST_DIR}/provisioning/dashboards/twinspark.yaml",
                     render_grafana_dashboard_provider()),
    ]
    files += [RenderedFile("dashboard-" + name.removeprefix("twinspark-").removesuffix(".json"),
                           f"{GRAFANA_HOST_DIR}/dashboards/{name}", text)
              for name, text in render_dashboards(plan).items()]
    return files
