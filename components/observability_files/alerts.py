"""The alert rules Prometheus evaluates (serving, heartbeat, guard, fabric, nodes, GPU) and their file."""

from __future__ import annotations

from dataclasses import dataclass

from core import contract

from .metrics import (JOB_GPU, JOB_NODE, JOB_VLLM, REAL_FILESYSTEMS, THROTTLE_SELECTOR, EngineSeries,
                      roce_errors_increase)
from .plan import ObservabilityPlan, yaml_text

ROCE_PORT_ACTIVE = 4  # /sys/class/infiniband/<hca>/ports/1/state "4: ACTIVE"
MIN_ROCE_BYTES_PER_S_WHILE_DECODING = 1_000_000


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


def throughput_collapse_expr(floor: float, window: str = "5m", by_lane: bool = False) -> tuple[tuple[str, ...], str]:
    """Requests run, yet both decode and prefill crawl: what NCCL on TCP looks like.

    Requests running keeps an idle server quiet; the prefill side keeps a long prompt (no
    output tokens for minutes, thousands of prompt tokens a second) quiet.
    """
    vllm, engines = f'job="{JOB_VLLM}"', EngineSeries(by_lane)  # several lanes: each lane's engine on its own
    output = engines.sum(f"rate(vllm:generation_tokens_total{{{vllm}}}[{window}])")
    prompt = engines.sum(f"rate(vllm:prompt_tokens_total{{{vllm}}}[{window}])")
    running = engines.sum(f"avg_over_time(vllm:num_requests_running{{{vllm}}}[{window}])")
    on = engines.matching
    expr = f"({output} < {floor:g}) and {on} ({prompt} < {20 * floor:g}) and {on} ({running} >= 1)"
    return (output, prompt, running), expr


CANARY_LAST_RUN = "twinspark_guard_canary_last_run_timestamp_seconds"
PCIE_WIDTH, PCIE_MAX_WIDTH = "twinspark_fabric_pcie_link_width", "twinspark_fabric_pcie_link_max_width"
PCIE_SPEED, PCIE_MAX_SPEED = "twinspark_fabric_pcie_link_speed_gts", "twinspark_fabric_pcie_link_max_speed_gts"
WATCHDOG = "TwinsparkWatchdog"


def alert_groups(plan: ObservabilityPlan) -> dict[str, list[AlertRule]]:
    s = plan.settings
    vllm, node, gpu = f'job="{JOB_VLLM}"', f'job="{JOB_NODE}"', f'job="{JOB_GPU}"'
    accepted = f"sum by (node) (rate(vllm:spec_decode_num_accepted_tokens_total{{{vllm}}}[10m]))"
    drafted = f"sum by (node) (rate(vllm:spec_decode_num_draft_tokens_total{{{vllm}}}[10m]))"
    decoding = f"sum(rate(vllm:generation_tokens_total{{{vllm}}}[5m]))"
    rail_bytes = f'sum(rate(node_infiniband_port_data_transmitted_bytes_total{{{node}, rail!=""}}[5m]))'
    collapse_signals, collapse_expr = throughput_collapse_expr(s.throughput_floor_tokens_per_second,
                                                               by_lane=bool(plan.lanes))
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
            _rule("TwinsparkNcclOnSocket", 'twinspark_fabric_nccl_network{network="Socket"}', "== 1", "0m", "critical",
                  "NCCL chose Socket, not IB, in vLLM's last start on {{ $labels.node }}",
                  "Every layer's all-reduce crosses TCP (a tenth of the rails' speed or less). The guard drains, "
                  "re-runs the fabric and NCCL checks and starts serving again; if this returns, the RDMA devices "
                  f"(/dev/infiniband, NCCL_IB_HCA) are not reaching vLLM: see {contract.SERVING_GUARD_LOG}."),
            AlertRule("TwinsparkPcieLinkDegraded", (PCIE_WIDTH, PCIE_MAX_WIDTH, PCIE_SPEED, PCIE_MAX_SPEED),
                      f"({PCIE_WIDTH} < {PCIE_MAX_WIDTH}) or ({PCIE_SPEED} < {PCIE_MAX_SPEED})", "1m", "critical",
                      "{{ $labels.device }} ({{ $labels.rail }}) on {{ $labels.node }} trains its PCIe link below "
                      "what it can do",
                      "A ConnectX-7 at a narrower or slower PCIe link moves a fraction of the cable's 200 Gb/s "
                      "(~13 Gb/s seen in the field). The guard drains and re-qualifies; reseat the card or check "
                      "the BIOS's PCIe settings if it persists."),
            _rule("TwinsparkPcieAerErrors", 'increase(twinspark_fabric_aer_errors_total{kind=~"nonfatal|fatal"}[10m])',
                  "> 0", "0m", "warning",
                  "{{ $labels.kind }} PCIe AER events on {{ $labels.device }} ({{ $labels.node }})",
                  "The HCA's PCIe link reports uncorrected errors: a failing card, riser or slot; expect link "
                  "retraining or a hang. `journalctl -k | grep -i aer` on the node."),
            _rule("TwinsparkFabricRequalified", "increase(twinspark_guard_requalifications_total[1h])", "> 0", "0m",
                  "warning", "The guard re-qualified the fabric on {{ $labels.node }} in the last hour",
                  "A rail down or throttled, or NCCL on Socket, stopped serving for a drain and a re-qualification "
                  f"(its reason in {contract.LOG_DIR}/{contract.SERVING_GUARD_LOG}); it may hold serving if the "
                  "checks failed (TwinsparkGuardHolding)."),
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
            _rule("TwinsparkNodePowerCycled", "increase(twinspark_power_cycles_total[1h])", "> 0", "0m", "critical",
                  "{{ $labels.watched }} stopped answering and was power-cycled through its plug",
                  "No SSH banner, exporter or guard heartbeat for powerWatch.missSeconds: frozen (unified memory "
                  "exhausted? a driver fault?). What the boot before left: `twinspark forensics "
                  "{{ $labels.watched }}`; it serves again once the fabric and NCCL checks pass."),
            _rule("TwinsparkPowerWatchHeld", "twinspark_power_watch_held", "== 1", "0m", "critical",
                  "{{ $labels.watched }} is still silent after its power cycle",
                  "No second cycle within powerWatch.windowSeconds: the box needs a person (power, cabling, a "
                  "boot that does not finish). The hold ends when it answers again."),
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
    return "# twinspark alert rules — rendered by twinspark (components/observability_files.py)\n" + yaml_text(
        {"groups": groups}
    )
