"""The three Grafana dashboards (overview, speculative decoding, nodes and fabric) as JSON, built with
grafana-foundation-sdk."""

from __future__ import annotations

import json
from typing import Iterable, Optional

from grafana_foundation_sdk.builders import common as gcommon
from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import statetimeline as gstate
from grafana_foundation_sdk.builders import table as gtable
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as gcommon_model
from grafana_foundation_sdk.models import dashboard as gmodel
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from .metrics import (JOB_GPU, JOB_NODE, JOB_VLLM, REAL_FILESYSTEMS, THROTTLE_SELECTOR, EngineSeries,
                      roce_errors_increase)
from .plan import ObservabilityPlan

DATASOURCE_UID = "twinspark-prometheus"  # the provisioned Prometheus datasource every panel queries
_DS = gmodel.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
_REF_IDS = "ABCDEFGH"
DASHBOARD_TAG = "twinspark"
TOKENS_PER_S = "suffix: tok/s"  # Grafana's custom unit: no built-in unit counts tokens


def _queries(panel, queries: Iterable[tuple[str, str]], instant: bool = False, table: bool = False):
    for ref, (expr, legend) in zip(_REF_IDS, queries):
        query = gprom.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(_DS)
        if instant:
            query = query.instant()
        if table:
            query = query.format(PromQueryFormat.TABLE)
        panel = panel.with_target(query)
    return panel


def _timeseries(title: str, description: str, unit: str, queries, span: int = 12, height: int = 8,
                line_at: Optional[float] = None, **limits):
    """`line_at`: a red threshold line drawn across the graph (an alert's value)."""
    panel = gts.Panel().title(title).description(description).unit(unit).datasource(_DS).span(span).height(height)
    if line_at is not None:
        panel = panel.thresholds(_thresholds((None, "transparent"), (line_at, "red"))).thresholds_style(
            gcommon.GraphThresholdsStyleConfig().mode(gcommon_model.GraphThresholdsStyleMode.LINE))
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


def _dashboard(title: str, uid: str, description: str) -> gdash.Dashboard:
    """What every twinspark dashboard shares: its tag, a link to the others (by that tag, keeping the time
    range), and the moments that explain a change in a graph: vLLM (re)started (a deploy, a guard
    restart, a reboot) and the guard restarting serving."""
    return (
        gdash.Dashboard(title).uid(uid).tags([DASHBOARD_TAG]).description(description)
        .refresh("30s").time("now-6h", "now").readonly()
        .link(gdash.DashboardLink("twinspark").type(gmodel.DashboardLinkType.DASHBOARDS).tags([DASHBOARD_TAG])
              .as_dropdown(False).keep_time(True).icon("external link"))
        .annotation(gdash.AnnotationQuery().name("vLLM (re)started").datasource(_DS).enable(True)
                    .icon_color("blue").expr(f'changes(process_start_time_seconds{{job="{JOB_VLLM}"}}[2m]) > 0'))
        .annotation(gdash.AnnotationQuery().name("guard restarted serving").datasource(_DS).enable(True)
                    .icon_color("red").expr("increase(twinspark_guard_restarts_total[2m]) > 0"))
    )


def _with_lane_variable(engines: EngineSeries, dashboard: gdash.Dashboard) -> gdash.Dashboard:
    """Several lanes: the `lane` variable the vLLM panels filter on (all of them at first)."""
    if not engines.by_lane:
        return dashboard
    return dashboard.with_variable(
        gdash.QueryVariable("lane").label("lane").datasource(_DS)
        .query(f'label_values(up{{job="{JOB_VLLM}"}}, lane)')
        .multi(True).include_all(True).all_value(".+")  # every lane, not the one-lane series of before the lanes
        .refresh(gmodel.VariableRefresh.ON_DASHBOARD_LOAD))


def _overview(plan: ObservabilityPlan) -> gdash.Dashboard:
    engines = EngineSeries(bool(plan.lanes))
    vllm, total, legend = engines.selector, engines.sum, engines.legend
    itl = engines.quantile("vllm:inter_token_latency_seconds_bucket", "5m")
    ttft = engines.quantile("vllm:time_to_first_token_seconds_bucket", "5m")
    e2e = engines.quantile("vllm:e2e_request_latency_seconds_bucket", "5m")
    queued = engines.quantile("vllm:request_queue_time_seconds_bucket", "5m")
    prompt = engines.quantile("vllm:request_prompt_tokens_bucket", "15m")
    kv_used = engines.max(f"vllm:kv_cache_usage_perc{{{vllm}}}")
    return (
        _with_lane_variable(engines, _dashboard("twinspark — overview", "twinspark-overview",
                                         "Is it serving, how fast, and how full: vLLM's own metrics from the head."
                                         + (" One line a lane (the lane variable picks)." if engines.by_lane else "")))
        .with_row(gdash.Row("Serving"))
        .with_panel(_stat("Serving", "Prometheus reaches vLLM's /metrics on the head.", "none",
                          [(f"up{{{vllm}}}", legend("{{node}}"))], thresholds=[(None, "red"), (1, "green")],
                          mappings=[gmodel.ValueMap(options={k: gmodel.ValueMappingResult(text=t, color=c)
                                                             for k, (t, c) in UP_DOWN.items()})]))
        .with_panel(_stat("Requests running", "vllm:num_requests_running", "none",
                          [(total(f"vllm:num_requests_running{{{vllm}}}"), legend("running"))]))
        .with_panel(_stat("Requests waiting", "vllm:num_requests_waiting", "none",
                          [(total(f"vllm:num_requests_waiting{{{vllm}}}"), legend("waiting"))],
                          thresholds=[(None, "green"), (1, "orange")]))
        .with_panel(_stat("Output tok/s", "Generated tokens per second over the last minute.", TOKENS_PER_S,
                          [(total(f"rate(vllm:generation_tokens_total{{{vllm}}}[1m])"), legend("tok/s"))]))
        .with_panel(_stat("KV cache used", "vllm:kv_cache_usage_perc.",
                          "percentunit",
                          [(kv_used, legend("KV"))],
                          thresholds=[(None, "green"), (0.9, "orange"), (0.97, "red")]))
        .with_panel(_stat("Alerts firing", "Alert rules firing now (the list is below).", "none",
                          [('count(ALERTS{alertstate="firing"}) or vector(0)', "firing")],
                          thresholds=[(None, "green"), (1, "red")]))
        .with_panel(_timeseries("Requests running / waiting", "Scheduler queue.", "none",
                                [(total(f"vllm:num_requests_running{{{vllm}}}"), legend("running")),
                                 (total(f"vllm:num_requests_waiting{{{vllm}}}"), legend("waiting"))]))
        .with_panel(_timeseries("Tokens per second", "Output (decode) and prompt (prefill) tokens per second.",
                                TOKENS_PER_S,
                                [(total(f"rate(vllm:generation_tokens_total{{{vllm}}}[1m])"), legend("output")),
                                 (total(f"rate(vllm:prompt_tokens_total{{{vllm}}}[1m])"), legend("prompt"))]))
        .with_panel(_timeseries("Time to first token", "p50 and p95 over 5 min.", "s",
                                [(ttft.format(q="0.5"), legend("p50")), (ttft.format(q="0.95"), legend("p95"))]))
        .with_panel(_timeseries("Inter-token latency", "p50 and p95 over 5 min.", "s",
                                [(itl.format(q="0.5"), legend("p50")), (itl.format(q="0.95"), legend("p95"))]))
        .with_panel(_timeseries("KV cache used", "Fraction of KV-cache blocks in use.", "percentunit",
                                [(kv_used, legend("KV cache"))], span=8, min=0, max=1))
        .with_panel(_timeseries("Preemptions", "Requests evicted for lack of KV cache, per 5 min.", "short",
                                [(total(f"increase(vllm:num_preemptions_total{{{vllm}}}[5m])"), legend("preemptions"))],
                                span=8))
        .with_panel(_timeseries("Prefix-cache hit rate", "Cached tokens / queried tokens over 5 min.",
                                "percentunit",
                                [(f"{total(f'rate(vllm:prefix_cache_hits_total{{{vllm}}}[5m])')} / "
                                  f"{total(f'rate(vllm:prefix_cache_queries_total{{{vllm}}}[5m])')}", legend("hit rate"))],
                                span=8, min=0, max=1))
        .with_row(gdash.Row("Requests: latency, outcomes, prompt sizes"))
        .with_panel(_timeseries("End-to-end request latency", "p50 and p95 over 5 min, queue to last token.", "s",
                                [(e2e.format(q="0.5"), legend("p50")), (e2e.format(q="0.95"), legend("p95"))], span=8))
        .with_panel(_timeseries("Queue time", "p50 and p95 over 5 min a request waited for the scheduler.", "s",
                                [(queued.format(q="0.5"), legend("p50")), (queued.format(q="0.95"), legend("p95"))],
                                span=8))
        .with_panel(_timeseries("Requests finished, by reason", "Per second: stop, length (cut at max tokens), "
                                "abort (the client left), error.", "reqps",
                                [(total(f"rate(vllm:request_success_total{{{vllm}}}[5m])", by="finished_reason"),
                                  legend("{{finished_reason}}"))], span=8))
        .with_panel(_timeseries("HTTP responses, by status", "Per second, as vLLM's API server answered the gateway.",
                                "reqps",
                                [(total(f"rate(http_requests_total{{{vllm}}}[5m])", by="status"), legend("{{status}}"))],
                                span=8))
        .with_panel(_timeseries("Prompt sizes against the compaction fence",
                                f"p50, p95 and p99 prompt tokens over 15 min; the red line is the agents' "
                                f"auto-compaction fence ({plan.compaction_fence_tokens:,} tokens): prompts near it "
                                "are sessions about to compact (gotcha 12).", "short",
                                [(prompt.format(q="0.5"), legend("p50")), (prompt.format(q="0.95"), legend("p95")),
                                 (prompt.format(q="0.99"), legend("p99"))], span=8, line_at=plan.compaction_fence_tokens))
        .with_panel(_timeseries("Tool-call parser", "Per second, by outcome: a model's tool calls the parser found "
                                "(tool_call) or did not (no_tool_call).", "short",
                                [(total(f"rate(vllm:tool_call_parser_invocations_total{{{vllm}}}[5m])",
                                        by="outcome, mode"), legend("{{outcome}} ({{mode}})"))], span=8))
        .with_row(gdash.Row("Guard: canary, restarts, hold (filled once the guard writes its metrics)"))
        .with_panel(_state("Canary", "Last canary result (twinspark_guard_canary_success).",
                           [("twinspark_guard_canary_success", "{{node}}")], {"1": ("PASS", "green"), "0": ("FAIL", "red")},
                           span=6))
        .with_panel(_state("Hold", "1 while the guard holds (restart cap reached).",
                           [("twinspark_guard_hold", "{{node}}")], {"0": ("watching", "green"), "1": ("HOLD", "red")},
                           span=6))
        .with_panel(_timeseries("Guard restarts per hour", "Serving restarts the guard performed.", "short",
                                [("increase(twinspark_guard_restarts_total[1h])", "{{node}}")], span=6))
        .with_panel(_timeseries("Canary duration", "How long the last canary took.", "s",
                                [("twinspark_guard_canary_duration_seconds", "{{node}}")], span=6))
        .with_panel(_queries(
            gtable.Panel().title("Alerts firing").description("ALERTS{alertstate=\"firing\"}").datasource(_DS)
            .span(24).height(6),
            [('ALERTS{alertstate="firing"}', "")], instant=True, table=True))
    )


def _spec_decode(plan: ObservabilityPlan) -> gdash.Dashboard:
    engines = EngineSeries(bool(plan.lanes))
    vllm, total, legend = engines.selector, engines.sum, engines.legend
    acc, draft_tok, drafts = (
        f"vllm:spec_decode_num_accepted_tokens_total{{{vllm}}}",
        f"vllm:spec_decode_num_draft_tokens_total{{{vllm}}}",
        f"vllm:spec_decode_num_drafts_total{{{vllm}}}",
    )

    def rate(series: str, window: str) -> str:
        return total(f"rate({series}[{window}])")

    def per_pos(window: str) -> str:
        return (f"{total(f'rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{vllm}}}[{window}])', by='position')} "
                f"/ {engines.matching} group_left () {rate(drafts, window)}")

    return (
        _with_lane_variable(engines, _dashboard("twinspark — speculative decoding", "twinspark-spec-decode",
                                         "How much the draft (DSpark/MTP) buys: acceptance overall and per draft "
                                         "position."))
        .with_panel(_stat("Acceptance rate (10 min)", "Accepted / drafted tokens.", "percentunit",
                          [(f"{rate(acc, '10m')} / {rate(draft_tok, '10m')}", legend("acceptance"))], span=6,
                          thresholds=[(None, "red"), (plan.settings.spec_decode_min_acceptance, "orange"),
                                      (0.5, "green")]))
        .with_panel(_stat("Mean accepted length (10 min)",
                          "1 + accepted tokens per draft (the bonus token counts, as vLLM logs it).", "suffix: tokens",
                          [(f"1 + {rate(acc, '10m')} / {rate(drafts, '10m')}", legend("tokens per step"))], span=6))
        .with_panel(_stat("Drafted tok/s", "Draft tokens proposed per second (1 min).", TOKENS_PER_S,
                          [(rate(draft_tok, "1m"), legend("drafted"))], span=6))
        .with_panel(_stat("Accepted tok/s", "Draft tokens accepted per second (1 min).", TOKENS_PER_S,
                          [(rate(acc, "1m"), legend("accepted"))], span=6))
        .with_panel(_timeseries("Acceptance rate", "Accepted / drafted tokens, 5 min windows.", "percentunit",
                                [(f"{rate(acc, '5m')} / {rate(draft_tok, '5m')}", legend("acceptance"))],
                                min=0, max=1))
        .with_panel(_timeseries("Mean accepted length", "1 + accepted tokens per draft, 5 min windows.", "suffix: tokens",
                                [(f"1 + {rate(acc, '5m')} / {rate(drafts, '5m')}", legend("mean length"))]))
        .with_panel(_timeseries("Acceptance per draft position",
                                "Share of drafts whose token at this position was accepted (position 0 first).",
                                "percentunit", [(per_pos("5m"), legend("position {{position}}"))], span=24,
                                min=0, max=1))
        .with_panel(_timeseries("Drafted vs accepted tok/s", "Draft tokens proposed and accepted per second.",
                                TOKENS_PER_S,
                                [(rate(draft_tok, "1m"), legend("drafted")), (rate(acc, "1m"), legend("accepted")),
                                 (rate(f"vllm:generation_tokens_total{{{vllm}}}", "1m"), legend("output tok/s"))]))
        .with_panel(_timeseries("Drafts per second", "Speculative steps per second.", "suffix: /s",
                                [(rate(drafts, "1m"), legend("drafts/s"))]))
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
        _dashboard("twinspark — nodes and fabric", "twinspark-nodes",
                   "GPU (nvidia-smi via nvidia_gpu_exporter), unified memory, disks, and the RoCE rails.")
        .with_variable(node_variable)
        .with_row(gdash.Row("GPU"))
        .with_panel(_timeseries("GPU temperature", f"nvidia-smi temperature.gpu; the red line is TwinsparkGpuHot's "
                                f"{plan.settings.gpu_temperature_alert_celsius:g} °C "
                                "(observability.gpuTemperatureAlertCelsius).", "celsius",
                                [(f"nvidia_smi_temperature_gpu{{{gpu}}}", "{{node}}")], span=8,
                                line_at=plan.settings.gpu_temperature_alert_celsius))
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
        .with_panel(_timeseries("OOM kills per hour", "Kernel OOM killer events (gotcha 13).", "short",
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
