"""What the observability tests share: the plan as __main__.py builds it, the metric names the
exporters really export (with their sources), and a PromQL metric-name extractor."""

from __future__ import annotations

import copy
import itertools
import json
import re
import subprocess

from program_harness import config_blocks
from vllm_recording import recorded_metrics, sample_names

from components.config import parse_stack_config
from components.observability_files import (
    FABRIC_METRICS,
    POWER_WATCH_METRICS,
    GUARD_METRICS,
    ROCE_ERROR_COUNTERS,
    alert_groups,
    plan_from_config,
    render_dashboards,
)

BASE = config_blocks()


def recipe_plan(alertmanager: bool = False, **settings):
    return plan_from_config(parse_stack_config({**copy.deepcopy(BASE), "observability": settings}), alertmanager)


def every_rule(plan=None):
    return [r for rules in alert_groups(plan or recipe_plan()).values() for r in rules]


def run(argv, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kw)


# ---- what the exporters really export: the only names dashboards and rules may use ----------
VLLM_METRICS = sample_names(recorded_metrics()) | {
    # every series real vLLM 0.24.0 exported on an H200 (docs/measurements/vllm-0.24-h200-2026-12-02/
    # metrics.txt, its process_* from prometheus_client in the one API server), and the speculative
    # decoding counters, which export only with a speculative config (the recorded run had none):
    # vllm-project/vllm vllm/v1/spec_decode/metrics.py (SpecDecodingProm)
    "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}
PROMETHEUS_METRICS = {"up", "ALERTS"}
NODE_EXPORTER_METRICS = {
    # prometheus/node_exporter collector/netclass_linux.go, netdev_common.go, infiniband_linux.go,
    # meminfo.go, vmstat_linux.go, filesystem_common.go, cpu_linux.go
    "node_network_up", "node_network_mtu_bytes", "node_network_speed_bytes", "node_network_transmit_bytes_total",
    "node_network_receive_bytes_total", "node_infiniband_state_id", "node_infiniband_physical_state_id",
    "node_infiniband_port_data_transmitted_bytes_total", "node_infiniband_port_data_received_bytes_total",
    "node_memory_MemAvailable_bytes", "node_memory_MemTotal_bytes", "node_vmstat_oom_kill",
    "node_filesystem_avail_bytes", "node_filesystem_size_bytes", "node_cpu_seconds_total",
} | {f"node_infiniband_{c}_total" for c in ROCE_ERROR_COUNTERS}
GPU_EXPORTER_METRICS = {
    # utkuozdemir/nvidia_gpu_exporter 1.14: nvidia-smi --query-gpu fields as nvidia_smi_<field>,
    # dots as underscores, units as suffixes; clocks_event_reasons since driver 535
    "nvidia_smi_temperature_gpu", "nvidia_smi_power_draw_watts", "nvidia_smi_utilization_gpu_ratio",
    "nvidia_smi_clocks_current_graphics_clock_hz", "nvidia_smi_clocks_current_sm_clock_hz",
    "nvidia_smi_last_collect_success",
} | {
    f"nvidia_smi_clocks_{kind}_reasons_{r}"
    for kind in ("event", "throttle")
    for r in ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown", "sw_power_cap")
}
KNOWN_METRICS = (VLLM_METRICS | PROMETHEUS_METRICS | NODE_EXPORTER_METRICS | GPU_EXPORTER_METRICS | set(GUARD_METRICS)
                 | set(FABRIC_METRICS) | set(POWER_WATCH_METRICS))

PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                "group_right", "inf", "nan", "atan2"}


def expand_name_regex(regex: str) -> set[str]:
    """All names a `__name__=~"a_(b|c)_d"` regex matches (literal text and flat groups only)."""
    parts = re.split(r"(\([^()]*\))", regex)
    choices = [p[1:-1].split("|") if p.startswith("(") else [p] for p in parts]
    names = {"".join(c) for c in itertools.product(*choices)}
    assert all(re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", n) for n in names), regex
    return names


def metric_names(expr: str) -> set[str]:
    names = set()
    for regex in re.findall(r'__name__=~"([^"]*)"', expr):
        names |= expand_name_regex(regex)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range windows
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b", " ", text)  # numbers
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        token, rest = match.group(0), text[match.end():].lstrip()
        if token not in PROMQL_WORDS and not rest.startswith("("):
            names.add(token)
    return names


def dashboard_targets(plan=None) -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every query in every panel, rows' panels included."""
    out = []
    for name, text in render_dashboards(plan or recipe_plan()).items():
        for panel in json.loads(text)["panels"]:
            for p in [panel, *panel.get("panels", [])]:
                out += [(name, p.get("title"), t["expr"]) for t in p.get("targets", [])]
    return out


def promql_of(expr: str) -> str:
    return expr.replace("$node", ".*").replace("$lane", ".*")  # the dashboards' variables, as "All" sends them
