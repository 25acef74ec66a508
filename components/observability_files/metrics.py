"""What the alert rules and the dashboards query: the Prometheus jobs, the guard's metrics and the
selectors both use.

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
- the guard's metrics (GUARD_METRICS and its fabric watch's FABRIC_METRICS, a contract: the guard
  writes them as a textfile), and the power watch's (POWER_WATCH_METRICS, likewise).
"""

from __future__ import annotations

from dataclasses import dataclass

# Prometheus jobs (the `job` label).
JOB_VLLM, JOB_NODE, JOB_GPU, JOB_PROMETHEUS = "vllm", "node", "gpu", "prometheus"


@dataclass(frozen=True)
class EngineSeries:
    """vLLM's series as the panels pick and add them up and the alerts add them up: one lane, all of them (the
    files as before lanes); several, each lane on its own (the dashboards' `lane` variable picks which)."""

    by_lane: bool

    @property
    def selector(self) -> str:
        """The dashboards' (the lane variable picks); an alert matches every lane: f'job="{JOB_VLLM}"'."""
        return f'job="{JOB_VLLM}", lane=~"$lane"' if self.by_lane else f'job="{JOB_VLLM}"'

    def sum(self, expr: str, by: str = "") -> str:
        """sum [by (by[, lane])] (expr)"""
        return self._aggregate("sum", expr, by)

    def max(self, expr: str) -> str:
        """max [by (lane)] (expr)"""
        return self._aggregate("max", expr, "")

    def _aggregate(self, op: str, expr: str, by: str) -> str:
        labels = ", ".join(label for label in (by, "lane" if self.by_lane else "") if label)
        return f"{op} by ({labels}) ({expr})" if labels else f"{op}({expr})"

    def quantile(self, bucket: str, window: str) -> str:
        """A histogram's quantile over `window`, its {q} formatted later (the selector's braces kept)."""
        added = self.sum(f"rate({bucket}{{{self.selector}}}[{window}])", by="le")
        return "histogram_quantile({q}, %s)" % added.replace("{", "{{").replace("}", "}}")

    def legend(self, name: str) -> str:
        return f"{{{{lane}}}} {name}" if self.by_lane else name

    @property
    def matching(self) -> str:
        """How two sums are matched in a binary operation: lane with lane."""
        return "on (lane)" if self.by_lane else "on ()"


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

# The guard's fabric watch (launch/fabric_watch.py), in the same textfile, on the head: its rails'
# HCAs and NCCL's choice in vLLM's last start (with --rail; a guard without rails writes none).
FABRIC_METRICS = {
    "twinspark_guard_requalifications_total": "counter: fabric re-qualifications the guard ran (a drain each)",
    "twinspark_guard_draining": "gauge: 1 while the gateway drains for a re-qualification or a fabric hold",
    "twinspark_fabric_pcie_link_width": "gauge: the HCA's PCIe link width now (lanes), by node, rail and device "
                                        "(a worker's from the guard's looks)",
    "twinspark_fabric_pcie_link_max_width": "gauge: the width the HCA can train at",
    "twinspark_fabric_pcie_link_speed_gts": "gauge: the HCA's PCIe link speed now (GT/s)",
    "twinspark_fabric_pcie_link_max_speed_gts": "gauge: the speed the HCA can train at",
    # by `kind`, not `severity`: the alert rules' own label would overwrite it
    "twinspark_fabric_aer_errors_total": "counter: the HCA's PCIe AER events, by kind (correctable, nonfatal, fatal)",
    "twinspark_fabric_nccl_network": "gauge: 1 for the network NCCL chose in vLLM's last start (IB or Socket)",
}

# The power watch (launch/power-watch.py), in contract.POWER_WATCH_TEXTFILE on the node that watches
# another: by `watched`, not `node` (the scrape's own label names the watcher).
POWER_WATCH_METRICS = {
    "twinspark_power_watch_sign": "gauge: 1 while a watched node shows that sign of life (ssh, exporter, guard)",
    "twinspark_power_watch_silent_seconds": "gauge: how long a watched node has shown no sign of life",
    "twinspark_power_cycles_total": "counter: power cycles of a watched node through its plug",
    "twinspark_power_watch_held": "gauge: 1 while a watched node stays silent after its power cycle (no second one)",
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
