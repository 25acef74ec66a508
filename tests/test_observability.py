"""Observability (issue 13): the config block, the rendered files checked by real Prometheus and
Alertmanager tools, the dashboards against the SDK's own types, and the program under mocks.

- prometheus.yml: `promtool check config`; alertmanager.yml: `amtool check-config`;
- the alert rules: `promtool check rules`, and `promtool test rules` unit tests: each alert the
  issue asks for fires on its staged condition (throughput down 10x among them) and stays quiet
  on a healthy series; a healthy two-node cluster raises none;
- dashboards: every panel's PromQL parses (as recording rules for promtool) and names only
  metrics the exporters export; the JSON round-trips through grafana-foundation-sdk's model;
- the program under Pulumi mocks: containers on each node's own daemon, pinned images, the
  rendered files as managed files, the Grafana password and the webhook URL only on stdin.
A real Prometheus scraping a real node exporter is in test_observability_live.py.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess

import pulumi
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as gmodel
from observability_helpers import (
    BASE,
    GPU_EXPORTER_METRICS,
    KNOWN_METRICS,
    NODE_EXPORTER_METRICS,
    VLLM_METRICS,
    dashboard_targets,
    every_rule,
    metric_names,
    promql_of,
    recipe_plan,
    run,
)
from program_harness import ROOT, flag_value, flag_values, plain_occurrences, runner_call, unwrap

from core import contract
from components.config import AlertEmail, parse_stack_config
from components.observability_files.prometheus import PEER_RELABELS
from components.observability_files import (
    GUARD_METRICS,
    AlertReceivers,
    RULES_FILE,
    grafana_files,
    plan_from_config,
    prometheus_files,
    render_alert_rules,
    render_alertmanager_config,
    render_dashboards,
    render_prometheus_config,
)

CONTAINER = "docker:index/container:Container"
NODES = ("spark1", "spark2")
RAIL_IPS = {"spark1": "10.0.0.1", "spark2": "10.0.0.2"}


# ---- config --------------------------------------------------------------------------------
def test_the_block_is_optional_and_pins_every_image():
    s = parse_stack_config(copy.deepcopy(BASE)).observability
    assert s.enabled and (s.retention_days, s.retention_size, s.grafana_port) == (30, "100GB", 3000)
    assert s.images.model_dump(by_alias=True) == {
        "prometheus": "prom/prometheus:v3.13.1", "grafana": "grafana/grafana:12.4.5",
        "alertmanager": "prom/alertmanager:v0.28.1", "nodeExporter": "prom/node-exporter:v1.12.1",
        "gpuExporter": "utkuozdemir/nvidia_gpu_exporter:1.14.0",
    }


BAD = [
    ({"retentionDays": 0}, "twinspark:observability.retentionDays", ["greater than or equal to 1"]),
    ({"retentionSize": "lots"}, "twinspark:observability.retentionSize", ["lots"]),
    ({"grafanaPort": 70000}, "twinspark:observability.grafanaPort", ["65535"]),
    ({"grafanaPort": 9090}, "twinspark:observability.grafanaPort", ["Prometheus", "9090"]),
    ({"grafanaPort": 8265}, "twinspark:observability.grafanaPort", ["Ray dashboard"]),
    ({"grafanaPort": 8000}, "twinspark:observability.grafanaPort", ["serving.port"]),
    ({"images": {"grafana": "grafana/grafana:latest"}}, "twinspark:observability.images.grafana", ["exact version"]),
    ({"images": {"prometheus": "prom/prometheus"}}, "twinspark:observability.images.prometheus", ["exact version"]),
    ({"images": {"prometheus": "prom/prometheus:v3"}}, "twinspark:observability.images.prometheus", ["exact version"]),
    ({"images": {"grafana": "grafana/grafana:12.4"}}, "twinspark:observability.images.grafana", ["exact version"]),
    ({"images": {"nodeExporter": "Prom/Node Exporter"}}, "twinspark:observability.images.nodeExporter", ["image"]),
    ({"specDecodeMinAcceptance": 1.5}, "twinspark:observability.specDecodeMinAcceptance", ["less than 1"]),
    ({"throughputFloorTokensPerSecond": 0}, "twinspark:observability.throughputFloorTokensPerSecond", ["greater"]),
    ({"grafanaPasswd": "x"}, "twinspark:observability.grafanaPasswd", ["Extra inputs"]),
]


@pytest.mark.parametrize("block, key, fragments", BAD, ids=[f"{c[1]}={list(c[0].values())[0]!r}"[:60] for c in BAD])
def test_a_bad_observability_value_names_its_key(block, key, fragments):
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config({**copy.deepcopy(BASE), "observability": block})
    message = str(err.value)
    assert f"{key}:" in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_serving_port_may_not_take_an_exporters_port_unless_observability_is_off():
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["port"] = 9100
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    assert "twinspark:serving.port: 9100 — expected a port other than the node exporter's" in str(err.value)
    parse_stack_config({**cfg, "observability": {"enabled": False}})


def test_digest_pins_and_exact_tags_are_accepted():
    images = {"grafana": "grafana/grafana:12.4.5@sha256:" + "a" * 64,
              "prometheus": "registry.local:5000/prom/prometheus@sha256:" + "b" * 64,
              "nodeExporter": "prom/node-exporter:v1.12.1-distroless"}
    cfg = parse_stack_config({**copy.deepcopy(BASE), "observability": {"images": images}})
    assert cfg.observability.images.model_dump(by_alias=True, include={"grafana", "prometheus", "node_exporter"}) == images


def test_a_webhook_that_is_no_url_stops_the_program_without_showing_it(program, recipe_config):
    recipe_config["twinspark:alertWebhookUrl"] = "hooks.example.test/s3cret-token"
    result = program(recipe_config)
    assert result.error is not None, "a bad webhook URL was accepted"
    assert "twinspark:alertWebhookUrl: the value (a secret, not shown) is not an http(s) URL" in result.error["message"]
    assert "s3cret-token" not in result.error["message"]


# ---- prometheus.yml and alertmanager.yml, checked by the real tools ---------------------------
def write_prometheus_dir(tmp_path, plan):
    (tmp_path / "rules").mkdir(exist_ok=True)
    (tmp_path / "rules" / RULES_FILE).write_text(render_alert_rules(plan))
    config = tmp_path / "prometheus.yml"
    config.write_text(render_prometheus_config(plan, rules_dir=str(tmp_path / "rules")))
    return config


@pytest.mark.parametrize("alertmanager", [False, True], ids=["alerts-in-grafana", "alerts-to-webhook"])
def test_promtool_accepts_the_rendered_config_and_rules(tmp_path, alertmanager):
    plan = recipe_plan(alertmanager=alertmanager)
    config = write_prometheus_dir(tmp_path, plan)
    proc = run(["promtool", "check", "config", str(config)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout + proc.stderr
    # not a rubber stamp: the same file with one key misspelt fails
    config.write_text(config.read_text().replace("scrape_interval:", "scrape_intervall:", 1))
    assert run(["promtool", "check", "config", str(config)]).returncode != 0
    # as written for the container (rules under /etc/prometheus/rules), the syntax holds too
    production = tmp_path / "production.yml"
    production.write_text(render_prometheus_config(plan))
    assert run(["promtool", "check", "config", "--syntax-only", str(production)]).returncode == 0


def test_amtool_accepts_the_rendered_alertmanager_config(tmp_path):
    config = tmp_path / "alertmanager.yml"
    config.write_text(render_alertmanager_config(AlertReceivers(webhook_url="https://hooks.example.test/T0KEN")))
    proc = run(["amtool", "check-config", str(config)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    route = yaml.safe_load(config.read_text())
    assert [r["webhook_configs"] for r in route["receivers"]] == [[{"url": "https://hooks.example.test/T0KEN",
                                                                   "send_resolved": True}]] * 2
    config.write_text(config.read_text().replace("receiver: alerts", "receiver: nowhere"))
    assert run(["amtool", "check-config", str(config)]).returncode != 0


def test_amtool_accepts_every_receiver_and_the_heartbeat_goes_to_the_webhook_alone(tmp_path):
    email = AlertEmail(to="owner@example.test", from_="spark@example.test", smarthost="smtp.example.test:587",
                       username="spark")
    receivers = AlertReceivers(webhook_url="https://hooks.example.test/T0KEN",
                               slack_url="https://hooks.slack.com/services/T0/B0/SL4CK", ntfy_url="https://ntfy.sh/n7fy-topic",
                               email=email, email_password="pa55word")
    config = tmp_path / "alertmanager.yml"
    config.write_text(render_alertmanager_config(receivers))
    proc = run(["amtool", "check-config", str(config)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rendered = yaml.safe_load(config.read_text())
    alerts, heartbeat = rendered["receivers"]
    assert [c["url"] for c in alerts["webhook_configs"]] == ["https://hooks.example.test/T0KEN",
                                                             "https://ntfy.sh/n7fy-topic?template=alertmanager"]
    assert alerts["slack_configs"][0]["api_url"] == "https://hooks.slack.com/services/T0/B0/SL4CK"
    assert alerts["email_configs"] == [{"to": "owner@example.test", "from": "spark@example.test",
                                        "smarthost": "smtp.example.test:587", "require_tls": True, "send_resolved": True,
                                        "auth_username": "spark", "auth_password": "pa55word"}]
    assert heartbeat == {"name": "heartbeat", "webhook_configs": [{"url": "https://hooks.example.test/T0KEN",
                                                                   "send_resolved": True}]}
    assert rendered["route"]["routes"][0]["receiver"] == "heartbeat"
    # without a webhook the heartbeat goes nowhere: no one's Slack, phone or inbox hears it every 5 min
    quiet = yaml.safe_load(render_alertmanager_config(AlertReceivers(slack_url=receivers.slack_url)))
    assert quiet["receivers"][1] == {"name": "heartbeat"}


@pytest.mark.parametrize("secrets, email, words", [
    ({}, {"to": "o@example.test", "from": "s@example.test", "smarthost": "smtp.example.test:587", "username": "spark"},
     "twinspark:alertEmailPassword: not set — expected the SMTP password of observability.alertEmail.username (spark)"),
    ({"twinspark:alertEmailPassword": "pa55word"}, None,
     "twinspark:alertEmailPassword: set, but nothing logs in with it"),
    ({"twinspark:alertNtfyUrl": "https://ntfy.sh/topic?x=1"}, None,
     "twinspark:alertNtfyUrl: the value (a secret, not shown) is not an http(s) URL"),
])
def test_an_alert_receiver_half_set_is_refused_before_anything_is_touched(program, recipe_config, secrets, email, words):
    recipe_config.update(secrets)
    if email:
        recipe_config["twinspark:observability"] = {"alertEmail": email}
    run_ = program(recipe_config)
    assert run_.error is not None and words in str(run_.error), run_.error
    assert not run_.resources
    for secret in secrets.values():
        assert secret not in str(run_.error)


def test_every_receiver_reaches_alertmanager_in_the_secret_file_alone(program, recipe_config):
    recipe_config.update({"twinspark:alertSlackWebhookUrl": "https://hooks.slack.com/services/T0/B0/SL4CK",
                          "twinspark:alertNtfyUrl": "https://ntfy.sh/n7fy-topic", "twinspark:alertEmailPassword": "pa55word"})
    recipe_config["twinspark:observability"] = {"alertEmail": {"to": "o@example.test", "from": "s@example.test",
                                                               "smarthost": "smtp.example.test:587", "username": "spark"}}
    run_ = program(recipe_config)
    assert run_.error is None, run_.error
    payload = yaml.safe_load(runner_call(run_.named("spark1-observability-alertmanager-config")).payload)
    assert {key for key in payload["receivers"][0]} == {"name", "webhook_configs", "slack_configs", "email_configs"}
    for secret in ("SL4CK", "n7fy-topic", "pa55word"):
        for r in run_.resources:
            assert not plain_occurrences(r.inputs, secret), (secret, r.name)
        for name, out in run_.outputs.items():
            assert out["secret"] or secret not in json.dumps(out["value"]), (secret, name)


def test_scrapes_go_over_the_first_rail_and_vllm_over_loopback():
    config = yaml.safe_load(render_prometheus_config(recipe_plan()))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"vllm", "node", "gpu", "prometheus"}

    def targets(job):
        return {t: sc["labels"]["node"] for sc in jobs[job]["static_configs"] for t in sc["targets"]}

    assert targets("vllm") == {f"127.0.0.1:{contract.METRICS_LOOPBACK_PORT}": "spark1"}
    assert targets("node") == {"10.0.0.1:9100": "spark1", "10.0.0.2:9100": "spark2"}
    assert targets("gpu") == {"10.0.0.1:9835": "spark1", "10.0.0.2:9835": "spark2"}
    assert targets("prometheus") == {"127.0.0.1:9090": "spark1"}
    assert config["rule_files"] == [f"/etc/prometheus/rules/{RULES_FILE}"]
    assert "alerting" not in config  # no webhook: alerts stay in Prometheus and Grafana
    relabels = jobs["node"]["metric_relabel_configs"]
    # a worker's series the head's guard writes (peer="<worker>") become the worker's, then every rail is labelled
    assert relabels[:3] == PEER_RELABELS
    rails = {(r["regex"], r["replacement"]) for r in relabels[3:]}
    assert ("spark2;(enP2p1s0f0np0|roceP2p1s0f0)", "1") in rails and len(rails) == 4
    with_webhook = yaml.safe_load(render_prometheus_config(recipe_plan(alertmanager=True)))
    assert with_webhook["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]


# ---- alert rules: promtool unit tests ----------------------------------------------------------
def expected_annotations(alert: str, labels: dict, value: str) -> dict:
    """The rule's annotation templates filled as Prometheus fills them."""
    rule = next(r for r in every_rule() if r.alert == alert)

    def fill(template):
        template = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
        return re.sub(r"\{\{ \$value( \| \w+)? \}\}", value, template)

    return {"summary": fill(rule.summary), "description": fill(rule.description)}


def series(name, labels, values):
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


RAIL1_SPARK2 = {"job": "node", "node": "spark2", "device": "enP2p1s0f0np0", "rail": "1"}
ROCE0_SPARK1 = {"job": "node", "node": "spark1", "device": "rocep1s0f0", "port": "1", "rail": "0"}
VLLM = {"job": "vllm", "node": "spark1", "model_name": "ds-0731", "engine": "0"}


def serving(output_per_min: str, prompt_per_min: str = "0", running: str = "1"):
    """vLLM counters as promtool series: output and prompt tokens added per minute, requests running."""
    return [series("vllm:generation_tokens_total", VLLM, f"0+{output_per_min}x60"),
            series("vllm:prompt_tokens_total", VLLM, f"0+{prompt_per_min}x60"),
            series("vllm:num_requests_running", VLLM, f"{running}x60")]


GPU_SPARK2, NODE_SPARK1 = {"job": "gpu", "node": "spark2"}, {"job": "node", "node": "spark1"}


HCA0_SPARK1 = {"job": "node", "node": "spark1", "rail": "enp1s0f0np0", "device": "rocep1s0f0"}


def pcie(width: str, gts: str):
    """spark1's first HCA's PCIe link now (width, GT/s) against its x16 at 32 GT/s (the guard's textfile)."""
    return [series("twinspark_fabric_pcie_link_width", HCA0_SPARK1, f"{width}x10"),
            series("twinspark_fabric_pcie_link_max_width", HCA0_SPARK1, "16x10"),
            series("twinspark_fabric_pcie_link_speed_gts", HCA0_SPARK1, f"{gts}x10"),
            series("twinspark_fabric_pcie_link_max_speed_gts", HCA0_SPARK1, "32x10")]


def gpu_exporter(collected: str):
    """spark2's GPU exporter answering, nvidia-smi inside it succeeding (1) or not (0)."""
    return [series("up", GPU_SPARK2, "1x10"), series("nvidia_smi_last_collect_success", GPU_SPARK2, f"{collected}x10")]


def unified_memory(available: str):
    """spark1's MemAvailable (bytes) of a 128 GB MemTotal."""
    return [series("node_memory_MemAvailable_bytes", NODE_SPARK1, f"{available}x10"),
            series("node_memory_MemTotal_bytes", NODE_SPARK1, "128e9x10")]


# 75 tok/s is the recipe's single stream (4500 a minute); a 10x drop is 450 a minute
COLLAPSED = serving("450")
# (case, alert, input series, eval time, expected alert labels or None for quiet, $value as rendered)
ALERT_CASES = [
    ("vllm down", "TwinsparkServingDown", [series("up", {"job": "vllm", "node": "spark1"}, "0x10")], "5m",
     {"job": "vllm", "node": "spark1"}, ""),
    ("vllm down, not for 2m yet", "TwinsparkServingDown", [series("up", {"job": "vllm", "node": "spark1"}, "1 0")],
     "1m", None, ""),
    ("vllm up", "TwinsparkServingDown", [series("up", {"job": "vllm", "node": "spark1"}, "1x10")], "5m", None, ""),
    ("throughput down 10x", "TwinsparkThroughputCollapse", COLLAPSED, "30m", {}, ""),
    ("throughput down 10x, not for 10m yet", "TwinsparkThroughputCollapse",
     [series("vllm:generation_tokens_total", VLLM, "0+4500x20 90000+450x40")] + serving("0")[1:], "26m", None, ""),
    ("recipe throughput", "TwinsparkThroughputCollapse", serving("4500"), "30m", None, ""),
    ("idle server", "TwinsparkThroughputCollapse", serving("0", running="0"), "30m", None, ""),
    ("a long prefill makes no output tokens", "TwinsparkThroughputCollapse", serving("0", prompt_per_min="102000"),
     "30m", None, ""),
    ("prefill down 10x too", "TwinsparkThroughputCollapse", serving("0", prompt_per_min="10200"), "30m", {}, ""),
    ("NCCL on Socket", "TwinsparkNcclOnSocket",
     [series("twinspark_fabric_nccl_network", {**NODE_SPARK1, "network": "Socket"}, "0 1x5"),
      series("twinspark_fabric_nccl_network", {**NODE_SPARK1, "network": "IB"}, "1 0x5")], "3m",
     {**NODE_SPARK1, "network": "Socket"}, ""),
    ("NCCL on IB", "TwinsparkNcclOnSocket",
     [series("twinspark_fabric_nccl_network", {**NODE_SPARK1, "network": "Socket"}, "0x5"),
      series("twinspark_fabric_nccl_network", {**NODE_SPARK1, "network": "IB"}, "1x5")], "3m", None, ""),
    ("PCIe link at x4", "TwinsparkPcieLinkDegraded", pcie("4", "32"), "5m", HCA0_SPARK1, ""),
    ("PCIe link at 2.5 GT/s", "TwinsparkPcieLinkDegraded", pcie("16", "2.5"), "5m", HCA0_SPARK1, ""),
    ("PCIe link as the card can", "TwinsparkPcieLinkDegraded", pcie("16", "32"), "5m", None, ""),
    ("AER nonfatal events", "TwinsparkPcieAerErrors",
     [series("twinspark_fabric_aer_errors_total", {**HCA0_SPARK1, "kind": "nonfatal"}, "0 0 2x8")], "5m",
     {**HCA0_SPARK1, "kind": "nonfatal"}, ""),
    ("AER correctable only", "TwinsparkPcieAerErrors",
     [series("twinspark_fabric_aer_errors_total", {**HCA0_SPARK1, "kind": "correctable"}, "0+5x10"),
      series("twinspark_fabric_aer_errors_total", {**HCA0_SPARK1, "kind": "fatal"}, "0x10")], "5m", None, ""),
    ("a re-qualification", "TwinsparkFabricRequalified",
     [series("twinspark_guard_requalifications_total", NODE_SPARK1, "0 0 1x10")], "5m", NODE_SPARK1, ""),
    ("no re-qualification", "TwinsparkFabricRequalified",
     [series("twinspark_guard_requalifications_total", NODE_SPARK1, "0x10")], "5m", None, ""),
    ("a power cycle", "TwinsparkNodePowerCycled",
     [series("twinspark_power_cycles_total", {**NODE_SPARK1, "watched": "spark2"}, "0 0 1x10")], "5m",
     {**NODE_SPARK1, "watched": "spark2"}, ""),
    ("no power cycle", "TwinsparkNodePowerCycled",
     [series("twinspark_power_cycles_total", {**NODE_SPARK1, "watched": "spark2"}, "0x10")], "5m", None, ""),
    ("silent after its cycle", "TwinsparkPowerWatchHeld",
     [series("twinspark_power_watch_held", {**NODE_SPARK1, "watched": "spark2"}, "0 1x10")], "5m",
     {**NODE_SPARK1, "watched": "spark2"}, ""),
    ("answering after its cycle", "TwinsparkPowerWatchHeld",
     [series("twinspark_power_watch_held", {**NODE_SPARK1, "watched": "spark2"}, "0x10")], "5m", None, ""),
    ("rail down", "TwinsparkRailDown", [series("node_network_up", RAIL1_SPARK2, "1 1 0x8")], "5m", RAIL1_SPARK2, ""),
    ("rail up", "TwinsparkRailDown", [series("node_network_up", RAIL1_SPARK2, "1x10")], "5m", None, ""),
    ("LAN down is no rail", "TwinsparkRailDown",
     [series("node_network_up", {"job": "node", "node": "spark1", "device": "enP7s7"}, "0x10")], "5m", None, ""),
    ("MTU wrong", "TwinsparkRailMtuWrong", [series("node_network_mtu_bytes", RAIL1_SPARK2, "1500x10")], "10m",
     RAIL1_SPARK2, "1500"),
    ("MTU above fabric.mtu", "TwinsparkRailMtuWrong", [series("node_network_mtu_bytes", RAIL1_SPARK2, "9216x10")],
     "10m", RAIL1_SPARK2, "9216"),
    ("MTU right", "TwinsparkRailMtuWrong", [series("node_network_mtu_bytes", RAIL1_SPARK2, "9000x10")], "10m", None,
     ""),
    ("RoCE errors rising", "TwinsparkRoceErrors",
     [series("node_infiniband_port_errors_received_total", ROCE0_SPARK1, "0+3x30")], "20m",
     {"node": "spark1", "device": "rocep1s0f0", "rail": "0"}, "30"),
    ("RoCE error counters flat", "TwinsparkRoceErrors",
     [series("node_infiniband_port_errors_received_total", ROCE0_SPARK1, "5x30"),
      series("node_infiniband_link_downed_total", ROCE0_SPARK1, "1x30")], "20m", None, ""),
    ("RoCE port down", "TwinsparkRocePortNotActive", [series("node_infiniband_state_id", ROCE0_SPARK1, "1x10")],
     "5m", ROCE0_SPARK1, "1"),
    ("decoding with idle rails", "TwinsparkNcclNotOnRoce",
     [series("vllm:generation_tokens_total", VLLM, "0+600x30"),
      series("node_infiniband_port_data_transmitted_bytes_total", ROCE0_SPARK1, "0+6000x30")], "20m", {}, ""),
    ("decoding over RoCE", "TwinsparkNcclNotOnRoce",
     [series("vllm:generation_tokens_total", VLLM, "0+600x30"),
      series("node_infiniband_port_data_transmitted_bytes_total", ROCE0_SPARK1, "0+6000000000x30")], "20m", None, ""),
    ("canary failing", "TwinsparkCanaryFailing",
     [series("twinspark_guard_canary_success", {"job": "node", "node": "spark1"}, "1 0x10")], "5m",
     {"job": "node", "node": "spark1"}, ""),
    ("canary passing", "TwinsparkCanaryFailing",
     [series("twinspark_guard_canary_success", {"job": "node", "node": "spark1"}, "1x10")], "5m", None, ""),
    ("canary stale", "TwinsparkCanaryStale",
     [series("twinspark_guard_canary_last_run_timestamp_seconds", {"job": "node", "node": "spark1"}, "0x40")],
     "35m", {"job": "node", "node": "spark1"}, ""),
    ("no canary ever written", "TwinsparkCanaryStale",
     [series("twinspark_guard_hold", {"job": "node", "node": "spark1"}, "0x40")], "20m", {}, ""),
    ("canary fresh", "TwinsparkCanaryStale",
     [series("twinspark_guard_canary_last_run_timestamp_seconds", {"job": "node", "node": "spark1"}, "0+60x40")],
     "35m", None, ""),
    ("gateway down", "TwinsparkGatewayDown",
     [series("twinspark_guard_gateway_up", {"job": "node", "node": "spark1"}, "1 0x10")], "5m",
     {"job": "node", "node": "spark1"}, ""),
    ("gateway up", "TwinsparkGatewayDown",
     [series("twinspark_guard_gateway_up", {"job": "node", "node": "spark1"}, "1x10")], "5m", None, ""),
    ("guard holding", "TwinsparkGuardHolding",
     [series("twinspark_guard_hold", {"job": "node", "node": "spark1"}, "0 1x10")], "5m",
     {"job": "node", "node": "spark1"}, ""),
    ("guard watching", "TwinsparkGuardHolding",
     [series("twinspark_guard_hold", {"job": "node", "node": "spark1"}, "0x10")], "5m", None, ""),
    ("the heartbeat always fires", "TwinsparkWatchdog", [], "1m", {}, ""),
    ("node down", "TwinsparkNodeDown", [series("up", {"job": "node", "node": "spark2"}, "0x10")], "5m",
     {"job": "node", "node": "spark2"}, ""),
    ("GPU hot", "TwinsparkGpuHot",
     [series("nvidia_smi_temperature_gpu", {"job": "gpu", "node": "spark2", "uuid": "u"}, "90x10")], "10m",
     {"job": "gpu", "node": "spark2", "uuid": "u"}, "90"),
    ("GPU warm", "TwinsparkGpuHot",
     [series("nvidia_smi_temperature_gpu", {"job": "gpu", "node": "spark2", "uuid": "u"}, "70x10")], "10m", None, ""),
    ("GPU thermal slowdown", "TwinsparkGpuThrottling",
     [series("nvidia_smi_clocks_event_reasons_hw_thermal_slowdown", {"job": "gpu", "node": "spark1", "uuid": "u"},
             "1x10")], "10m", {"node": "spark1"}, ""),
    ("power cap alone is no throttle alert", "TwinsparkGpuThrottling",
     [series("nvidia_smi_clocks_event_reasons_sw_power_cap", {"job": "gpu", "node": "spark1", "uuid": "u"}, "1x10")],
     "10m", None, ""),
    ("disk almost full", "TwinsparkDiskAlmostFull",
     [series("node_filesystem_avail_bytes", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"},
             "5e9x20"),
      series("node_filesystem_size_bytes", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"},
             "100e9x20")], "15m", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"}, "5%"),
    ("disk half full", "TwinsparkDiskAlmostFull",
     [series("node_filesystem_avail_bytes", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"},
             "50e9x20"),
      series("node_filesystem_size_bytes", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"},
             "100e9x20")], "15m", None, ""),
    ("disk steady", "TwinsparkDiskFillingUp",
     [series("node_filesystem_avail_bytes", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"},
             "400e9x120")], "100m", None, ""),
    ("disk filling up", "TwinsparkDiskFillingUp",
     [series("node_filesystem_avail_bytes", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"},
             "400e9-1e9x120")], "100m", {"job": "node", "node": "spark1", "fstype": "ext4", "mountpoint": "/"}, ""),
    ("vLLM restart loop", "TwinsparkVllmRestarting",
     [series("process_start_time_seconds", {"job": "vllm", "node": "spark1"}, "100x5 500x5 900x5")], "14m",
     {"job": "vllm", "node": "spark1"}, "2"),
    ("vLLM restarted once", "TwinsparkVllmRestarting",
     [series("process_start_time_seconds", {"job": "vllm", "node": "spark1"}, "100x5 500x9")], "14m", None, ""),
    ("acceptance collapsed", "TwinsparkSpecDecodeAcceptanceCollapse",
     [series("vllm:spec_decode_num_accepted_tokens_total", VLLM, "0+60x40"),
      series("vllm:spec_decode_num_draft_tokens_total", VLLM, "0+600x40")], "30m", {"node": "spark1"}, "10%"),
    ("acceptance healthy", "TwinsparkSpecDecodeAcceptanceCollapse",
     [series("vllm:spec_decode_num_accepted_tokens_total", VLLM, "0+300x40"),
      series("vllm:spec_decode_num_draft_tokens_total", VLLM, "0+600x40")], "30m", None, ""),
    ("idle server: no drafts, no collapse", "TwinsparkSpecDecodeAcceptanceCollapse",
     [series("vllm:spec_decode_num_accepted_tokens_total", VLLM, "7x40"),
      series("vllm:spec_decode_num_draft_tokens_total", VLLM, "70x40")], "30m", None, ""),
    ("kernel OOM kill", "TwinsparkOomKill",
     [series("node_vmstat_oom_kill", {"job": "node", "node": "spark2"}, "0 0 0 1 1 1")], "4m",
     {"job": "node", "node": "spark2"}, "1"),
    ("no OOM kill since boot", "TwinsparkOomKill",
     [series("node_vmstat_oom_kill", {"job": "node", "node": "spark2"}, "3x20")], "15m", None, ""),
    ("node up", "TwinsparkNodeDown", [series("up", {"job": "node", "node": "spark2"}, "1x10")], "5m", None, ""),
    ("RoCE port active", "TwinsparkRocePortNotActive", [series("node_infiniband_state_id", ROCE0_SPARK1, "4x10")],
     "5m", None, ""),
    ("rail at half speed", "TwinsparkRailSpeedLow",
     [series("node_network_speed_bytes", RAIL1_SPARK2, "12500000000x10")], "10m", RAIL1_SPARK2, "100000"),
    ("rail at full speed", "TwinsparkRailSpeedLow",
     [series("node_network_speed_bytes", RAIL1_SPARK2, "25000000000x10")], "10m", None, ""),
    ("KV cache full: preempting", "TwinsparkPreemptions",
     [series("vllm:num_preemptions_total", VLLM, "0+2x30")], "20m", {"node": "spark1"}, "20"),
    ("no preemption", "TwinsparkPreemptions", [series("vllm:num_preemptions_total", VLLM, "4x30")], "20m", None, ""),
    ("GPU exporter down", "TwinsparkGpuMetricsMissing", [series("up", GPU_SPARK2, "0x10")], "10m", GPU_SPARK2, ""),
    ("nvidia-smi failing in the exporter", "TwinsparkGpuMetricsMissing", gpu_exporter(collected="0"), "10m",
     GPU_SPARK2, ""),
    ("GPU metrics flowing", "TwinsparkGpuMetricsMissing", gpu_exporter(collected="1"), "10m", None, ""),
    ("unified memory nearly gone", "TwinsparkMemoryLow", unified_memory(available="4e9"), "10m", NODE_SPARK1,
     "3.125%"),
    ("the model loaded, the rest free", "TwinsparkMemoryLow", unified_memory(available="18e9"), "10m", None, ""),
]


def promtool_test(tmp_path, plan, tests) -> subprocess.CompletedProcess:
    (tmp_path / RULES_FILE).write_text(render_alert_rules(plan))
    (tmp_path / "test.yml").write_text(
        yaml.safe_dump({"rule_files": [RULES_FILE], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    return run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path)


def alert_test(case) -> dict:
    _, alert, inputs, at, labels, value = case
    rule = next(r for r in every_rule() if r.alert == alert)
    expected = []
    if labels is not None:
        full = {**labels, "severity": rule.severity}
        expected = [{"exp_labels": full, "exp_annotations": expected_annotations(alert, full, value)}]
    return {"interval": "1m", "input_series": inputs,
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}]}


@pytest.mark.parametrize("case", ALERT_CASES, ids=[c[0] for c in ALERT_CASES])
def test_alert_fires_on_trouble_and_stays_quiet_when_healthy(tmp_path, case):
    proc = promtool_test(tmp_path, recipe_plan(), [alert_test(case)])
    assert proc.returncode == 0, f"{case[0]}:\n{proc.stdout}{proc.stderr}"


def test_promtool_unit_tests_can_fail(tmp_path):
    """The harness is not a rubber stamp: a staged 10x drop expected quiet fails, and so does a
    healthy series expected to fire."""
    wrong = [alert_test(("", "TwinsparkThroughputCollapse", COLLAPSED, "30m", None, "")),
             alert_test(("", "TwinsparkThroughputCollapse", serving("4500"), "30m", {}, ""))]
    for test in wrong:
        proc = promtool_test(tmp_path, recipe_plan(), [test])
        assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr, proc.stdout


def test_a_healthy_cluster_raises_no_alert_at_all(tmp_path):
    """Every series a healthy two-node cluster exports, for an hour: not one alert fires."""
    healthy = []
    for node in NODES:
        healthy += [series("up", {"job": job, "node": node}, "1x60") for job in ("node", "gpu")]
        healthy += [series("node_network_up", {"job": "node", "node": node, "device": dev, "rail": rail}, "1x60")
                    for dev, rail in (("enp1s0f0np0", "0"), ("enP2p1s0f0np0", "1"))]
        rail0 = {"job": "node", "node": node, "device": "enp1s0f0np0", "rail": "0"}
        healthy += [
            series("node_network_mtu_bytes", rail0, "9000x60"),
            series("node_network_speed_bytes", rail0, "25000000000x60"),
            series("node_infiniband_state_id", {**ROCE0_SPARK1, "node": node}, "4x60"),
            series("node_infiniband_port_data_transmitted_bytes_total", {**ROCE0_SPARK1, "node": node},
                   "0+6000000000x60"),
            series("node_infiniband_port_errors_received_total", {**ROCE0_SPARK1, "node": node}, "3x60"),
            series("nvidia_smi_temperature_gpu", {"job": "gpu", "node": node, "uuid": "u"}, "71x60"),
            series("nvidia_smi_last_collect_success", {"job": "gpu", "node": node}, "1x60"),
            series("nvidia_smi_clocks_event_reasons_hw_slowdown", {"job": "gpu", "node": node, "uuid": "u"}, "0x60"),
            series("node_memory_MemAvailable_bytes", {"job": "node", "node": node}, "20e9x60"),
            series("node_memory_MemTotal_bytes", {"job": "node", "node": node}, "128e9x60"),
            series("node_vmstat_oom_kill", {"job": "node", "node": node}, "0x60"),
            series("node_filesystem_avail_bytes", {"job": "node", "node": node, "fstype": "ext4", "mountpoint": "/"},
                   "2e12x60"),
            series("node_filesystem_size_bytes", {"job": "node", "node": node, "fstype": "ext4", "mountpoint": "/"},
                   "4e12x60"),
        ]
    healthy += serving("4500", prompt_per_min="20000") + [
        series("up", {"job": "vllm", "node": "spark1"}, "1x60"),
        series("process_start_time_seconds", {"job": "vllm", "node": "spark1"}, "100x60"),
        series("vllm:num_preemptions_total", VLLM, "0x60"),
        series("vllm:spec_decode_num_accepted_tokens_total", VLLM, "0+3000x60"),
        series("vllm:spec_decode_num_draft_tokens_total", VLLM, "0+6000x60"),
        series("twinspark_guard_canary_success", {"job": "node", "node": "spark1"}, "1x60"),
        series("twinspark_guard_canary_last_run_timestamp_seconds", {"job": "node", "node": "spark1"}, "0+60x60"),
        series("twinspark_guard_hold", {"job": "node", "node": "spark1"}, "0x60"),
        series("twinspark_guard_gateway_up", {"job": "node", "node": "spark1"}, "1x60"),
    ]
    # the heartbeat fires always, by design (its absence at the receiver is the alarm)
    test = {"interval": "1m", "input_series": healthy,
            "alert_rule_test": [{"eval_time": "59m", "alertname": r.alert, "exp_alerts": []}
                                for r in every_rule() if r.alert != "TwinsparkWatchdog"]}
    proc = promtool_test(tmp_path, recipe_plan(), [test])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_the_issue_asks_for_exists():
    alerts = {r.alert for r in every_rule()}
    asked = {  # serving down, canary failing, a rail down or its MTU wrong, RoCE errors rising, throughput
        # collapse, acceptance collapse, GPU throttling or overheating, disk filling
        "TwinsparkServingDown", "TwinsparkCanaryFailing", "TwinsparkRailDown", "TwinsparkRailMtuWrong",
        "TwinsparkRoceErrors", "TwinsparkThroughputCollapse", "TwinsparkSpecDecodeAcceptanceCollapse",
        "TwinsparkGpuThrottling", "TwinsparkGpuHot", "TwinsparkDiskAlmostFull", "TwinsparkDiskFillingUp",
        "TwinsparkCanaryStale", "TwinsparkGatewayDown", "TwinsparkGuardHolding",
    }
    assert asked <= alerts
    assert asked <= alerts


def test_every_alert_rule_has_a_case_that_fires_and_one_that_stays_quiet():
    """Issue 21: every rule fires on data and stays quiet on healthy data (the heartbeat is
    quiet only when the head is down, which is test_observability_live's)."""
    fired = {c[1] for c in ALERT_CASES if c[4] is not None}
    quiet = {c[1] for c in ALERT_CASES if c[4] is None} | {"TwinsparkWatchdog"}
    alerts = {r.alert for r in every_rule()}
    assert (sorted(alerts - fired), sorted(alerts - quiet)) == ([], [])


def test_thresholds_follow_the_config():
    plan = recipe_plan(gpuTemperatureAlertCelsius=80, specDecodeMinAcceptance=0.35, throughputFloorTokensPerSecond=5)
    exprs = {r.alert: r.expr for r in every_rule(plan)}
    assert exprs["TwinsparkGpuHot"].endswith("> 80")
    assert exprs["TwinsparkSpecDecodeAcceptanceCollapse"].endswith("< 0.35")
    assert "< 5)" in exprs["TwinsparkThroughputCollapse"] and "< 100)" in exprs["TwinsparkThroughputCollapse"]
    cfg = copy.deepcopy(BASE)
    cfg["fabric"]["mtu"] = 4200
    assert {r.alert: r.expr for r in every_rule(plan_from_config(parse_stack_config(cfg), False))}[
        "TwinsparkRailMtuWrong"].endswith("!= 4200")


# ---- PromQL: parses, and names only what the exporters export --------------------------------
def test_the_name_extractor_itself():
    assert metric_names('sum by (le) (rate(a_bucket{job="x", le=~"1|2"}[5m])) / on () group_left () b') == {
        "a_bucket", "b"}
    assert metric_names('max({__name__=~"p_(x|y)_q", j="v"}) > 1e6 and c') == {"p_x_q", "p_y_q", "c"}


def check_exprs_parse(tmp_path, exprs):
    rules = {"groups": [{"name": "exprs", "rules": [
        {"record": f"twinspark:check_{i}", "expr": promql_of(e)} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump(rules))
    return run(["promtool", "check", "rules", str(path)])


def test_every_dashboard_query_and_alert_signal_parses(tmp_path):
    exprs = [e for _, _, e in dashboard_targets()] + [s for r in every_rule() for s in r.signals]
    assert len(exprs) >= 60
    proc = check_exprs_parse(tmp_path, exprs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout
    assert check_exprs_parse(tmp_path, [exprs[0] + ")"]).returncode != 0  # bad PromQL is rejected


def test_dashboards_and_rules_name_only_known_metrics():
    used = {}
    for name, title, expr in dashboard_targets():
        for metric in metric_names(expr):
            used.setdefault(metric, f"{name}: {title}")
    for rule in every_rule():
        for metric in metric_names(rule.expr):
            used.setdefault(metric, f"rule {rule.alert}")
    unknown = {m: where for m, where in used.items() if m not in KNOWN_METRICS}
    assert not unknown, unknown
    for family in (VLLM_METRICS, NODE_EXPORTER_METRICS, GPU_EXPORTER_METRICS, set(GUARD_METRICS)):
        assert family & set(used)
    assert not metric_names("node_infiniband_port_errors_recieved_total") <= KNOWN_METRICS  # a typo is caught


# ---- dashboards ----------------------------------------------------------------------------
def test_dashboards_round_trip_through_the_sdk_model():
    """Validated with the library's own types: every key of the rendered JSON is one
    grafana-foundation-sdk's Dashboard model reads back, value for value."""
    for name, text in render_dashboards(recipe_plan()).items():
        rendered = json.loads(text)
        again = json.loads(json.dumps(gmodel.Dashboard.from_json(rendered), cls=JSONEncoder, sort_keys=True))
        assert again == rendered, name
    bogus = {**json.loads(text), "pannels": []}  # the model drops what it does not know: the check can fail
    assert json.loads(json.dumps(gmodel.Dashboard.from_json(bogus), cls=JSONEncoder)) != bogus


def test_dashboards_have_the_panels_the_issue_asks_for():
    dashboards = {name: json.loads(text) for name, text in render_dashboards(recipe_plan()).items()}
    assert set(dashboards) == {"twinspark-overview.json", "twinspark-spec-decode.json", "twinspark-nodes.json"}
    for name, model in dashboards.items():
        assert model["uid"] == name.removesuffix(".json") and model["schemaVersion"] >= 39
        panels = [p for top in model["panels"] for p in [top, *top.get("panels", [])]]
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
        for p in panels:
            if p["type"] != "row":
                assert p["datasource"] == {"type": "prometheus", "uid": "twinspark-prometheus"}, p["title"]
                assert [t["refId"] for t in p["targets"]] == list("ABCDEFGH"[: len(p["targets"])])
                assert p.get("gridPos", {}).get("w"), p["title"]

    def titles(name):
        return {p["title"] for top in dashboards[name]["panels"] for p in [top, *top.get("panels", [])]}

    assert {"Serving", "Requests running / waiting", "Tokens per second", "Time to first token",
            "Inter-token latency", "KV cache used", "Preemptions", "Prefix-cache hit rate", "Canary", "Hold",
            "Guard restarts per hour"} <= titles("twinspark-overview.json")
    assert {"Acceptance rate", "Mean accepted length", "Acceptance per draft position",
            "Drafted vs accepted tok/s"} <= titles("twinspark-spec-decode.json")
    assert {"GPU temperature", "GPU clocks", "GPU power", "Clock event (throttle) reasons", "Unified memory in use",
            "RoCE throughput per rail (transmit)", "RoCE errors per 5 min", "Rail link", "Rail MTU",
            "RoCE port state"} <= titles("twinspark-nodes.json")
    files = {f.step: f for f in grafana_files(recipe_plan())}
    datasource = yaml.safe_load(files["grafana-datasource"].content)["datasources"][0]
    assert (datasource["uid"], datasource["url"], datasource["editable"]) == (
        "twinspark-prometheus", "http://127.0.0.1:9090", False)
    provider = yaml.safe_load(files["grafana-dashboards"].content)["providers"][0]
    assert provider["options"]["path"] == "/etc/grafana/dashboards" and provider["allowUiUpdates"] is False


def test_dashboards_an_owner_reads():
    """Issue 39: units on every token rate, the guard's row open, a red line at the alert temperature
    and at the compaction fence, annotations for vLLM (re)starts and guard restarts, links between
    the dashboards, and the six recorded series no panel showed."""
    plan = recipe_plan()
    dashboards = {name: json.loads(text) for name, text in render_dashboards(plan).items()}
    panels = {name: [p for top in m["panels"] for p in [top, *top.get("panels", [])]] for name, m in dashboards.items()}
    for name, model in dashboards.items():
        assert model["links"] == [{"asDropdown": False, "icon": "external link", "includeVars": False,
                                   "keepTime": True, "tags": ["twinspark"], "targetBlank": False,
                                   "title": "twinspark", "tooltip": "", "type": "dashboards"}], name
        notes = {a["name"]: a["expr"] for a in model["annotations"]["list"]}
        assert notes == {"vLLM (re)started": 'changes(process_start_time_seconds{job="vllm"}[2m]) > 0',
                         "guard restarted serving": "increase(twinspark_guard_restarts_total[2m]) > 0"}, name
        for panel in panels[name]:
            if "tok/s" in panel["title"] or "tokens per second" in panel["title"].lower():
                assert panel["fieldConfig"]["defaults"]["unit"] == "suffix: tok/s", (name, panel["title"])
            assert not panel.get("collapsed"), (name, panel["title"])  # nothing folded away: the guard shows

    def panel(name, title):
        return next(p for p in panels[name] if p["title"] == title)

    def line_at(found):
        steps = found["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert found["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "line"}
        return [s["value"] for s in steps if s["color"] == "red"]

    assert line_at(panel("twinspark-nodes.json", "GPU temperature")) == [plan.settings.gpu_temperature_alert_celsius]
    fence = panel("twinspark-overview.json", "Prompt sizes against the compaction fence")
    assert line_at(fence) == [150000] == [plan.compaction_fence_tokens]
    shown = " ".join(t["expr"] for p in panels["twinspark-overview.json"] for t in p.get("targets", []))
    for series in ("vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                   "vllm:request_success_total", "http_requests_total", "vllm:request_prompt_tokens_bucket",
                   "vllm:tool_call_parser_invocations_total"):
        assert series in shown, series
    assert "by (finished_reason)" in shown and "by (status)" in shown
    hotter = recipe_plan(gpuTemperatureAlertCelsius=80)  # the line follows the config
    nodes = json.loads(render_dashboards(hotter)["twinspark-nodes.json"])
    assert line_at(next(p for p in nodes["panels"] if p["title"] == "GPU temperature")) == [80]


def test_dashboards_are_built_with_the_sdk_and_it_is_pinned():
    source = (ROOT / "components" / "observability_files" / "dashboards.py").read_text()
    assert "from grafana_foundation_sdk.builders import dashboard" in source
    assert re.search(r"^grafana-foundation-sdk==\d+!11\.6\.0$", (ROOT / "requirements.txt").read_text(), re.M)


# ---- the program under mocks -----------------------------------------------------------------
def inputs(run_, name):
    return unwrap(run_.named(name).inputs)


def test_containers_run_on_each_nodes_own_daemon_with_pinned_images(recipe_run):
    images = {"node-exporter": "prom/node-exporter:v1.12.1", "gpu-exporter": "utkuozdemir/nvidia_gpu_exporter:1.14.0",
              "prometheus": "prom/prometheus:v3.13.1", "grafana": "grafana/grafana:12.4.5"}
    expected = {f"{n}-observability-{c}" for n in NODES for c in ("node-exporter", "gpu-exporter")}
    expected |= {"spark1-observability-prometheus", "spark1-observability-grafana"}
    assert {r.name for r in recipe_run.of_type(CONTAINER) if "-observability-" in r.name} == expected
    for name in expected:
        node, capability = name.split("-observability-")
        container, pulled = recipe_run.named(name), recipe_run.named(f"{name}-image")
        provider = recipe_run.named(f"{node}-docker").urn
        assert container.provider.startswith(provider) and pulled.provider.startswith(provider), name
        # by the digest the head resolved the tag to, once for every node (issue 37: each node pulled the tag)
        pin = recipe_run.named(f"observability-{capability}-image-pin-resolve")
        assert flag_value(runner_call(pin).args, "--image") == images[capability]
        repository = images[capability].rsplit(":", 1)[0]
        assert pulled.inputs["name"].startswith(f"{repository}@sha256:") and pulled.inputs["platform"] == "linux/arm64"
        assert pulled.inputs["keepLocally"] is True
        assert container.inputs["image"].startswith("sha256:")  # the pulled image's id, never the tag
        assert container.inputs["name"] == f"twinspark-{capability}"
        assert container.inputs["networkMode"] == "host" and container.inputs["restart"] == "unless-stopped"
        assert container.delete_before_replace


def test_exporters_listen_on_the_first_rail_with_the_fabric_collectors(recipe_run):
    for node in NODES:
        ne = inputs(recipe_run, f"{node}-observability-node-exporter")
        assert f"--web.listen-address={RAIL_IPS[node]}:9100" in ne["command"]
        assert {"--collector.infiniband", "--collector.netclass", "--path.rootfs=/host"} <= set(ne["command"])
        assert "--collector.textfile.directory=/host/var/lib/twinspark/observability/textfile" in ne["command"]
        assert ne["pidMode"] == "host"
        assert ne["mounts"] == [{"type": "bind", "source": "/", "target": "/host", "readOnly": True,
                                 "bindOptions": {"propagation": "rslave"}}]
        gpu = inputs(recipe_run, f"{node}-observability-gpu-exporter")
        assert gpu["command"][0] == f"--web.listen-address={RAIL_IPS[node]}:9835"
        assert gpu["gpus"] == "all" and "NVIDIA_DRIVER_CAPABILITIES=utility" in gpu["envs"]


def test_the_head_gets_the_rendered_files_as_managed_files(recipe_run):
    plan = plan_from_config(parse_stack_config(copy.deepcopy(BASE)), alertmanager=False)
    for f in [*prometheus_files(plan), *grafana_files(plan)]:
        call = runner_call(recipe_run.named(f"spark1-observability-{f.step}"))
        assert call.script == "managed-file.sh" and call.args[0] == "install"
        assert flag_value(call.args, "--path") == f.path and flag_value(call.args, "--mode") == "0644"
        assert call.payload == f.content, f.step
    prom = inputs(recipe_run, "spark1-observability-prometheus")
    assert {"--web.listen-address=127.0.0.1:9090", "--storage.tsdb.retention.time=30d",
            "--storage.tsdb.retention.size=100GB", "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/prometheus"} == set(prom["command"])
    assert {m["target"]: (m["source"], m["readOnly"]) for m in prom["mounts"]} == {
        "/etc/prometheus": ("/var/lib/twinspark/observability/config/prometheus", True),
        "/prometheus": ("/var/lib/twinspark/observability/prometheus", False)}
    dirs = flag_values(runner_call(recipe_run.named("spark1-observability-dirs")).args, "--dir")
    assert {"/var/lib/twinspark/observability/prometheus:65534:65534:0750",
            "/var/lib/twinspark/observability/grafana:472:0:0750"} <= set(dirs)
    assert not any("prometheus" in d for d in flag_values(runner_call(recipe_run.named("spark2-observability-dirs")).args,
                                                            "--dir"))


def test_grafana_password_is_a_file_and_stdin_and_anonymous_access_is_off(program, recipe_config):
    secret = "grafana-pw-chosen-by-user-789"
    recipe_config["twinspark:grafanaAdminPassword"] = secret
    run_ = program(recipe_config)
    assert run_.error is None, run_.error
    env = dict(e.split("=", 1) for e in inputs(run_, "spark1-observability-grafana")["envs"])
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana-admin-password"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    password_file = run_.named("spark1-observability-grafana-password")
    call = runner_call(password_file)
    assert call.payload == secret and flag_value(call.args, "--mode") == "0640"
    assert not plain_occurrences(password_file.inputs, secret)
    admin = runner_call(run_.named("spark1-observability-grafana-admin"))
    assert admin.script == "grafana-admin-password.sh" and admin.secrets == {"GRAFANA_ADMIN_PASSWORD": secret}
    assert run_.depends_on(run_.named("spark1-observability-grafana-admin"), "spark1-observability-grafana")
    assert run_.outputs["grafanaAdminPassword"] == {"value": secret, "secret": True}


def test_a_webhook_brings_alertmanager_with_the_url_in_a_secret_file(program, recipe_config):
    url = "https://hooks.example.test/services/T0KEN"
    recipe_config["twinspark:alertWebhookUrl"] = url
    run_ = program(recipe_config)
    assert run_.error is None, run_.error
    am = inputs(run_, "spark1-observability-alertmanager")
    assert "--web.listen-address=127.0.0.1:9093" in am["command"] and am["user"] == "65534:0"
    config_file = run_.named("spark1-observability-alertmanager-config")
    call = runner_call(config_file)
    assert flag_value(call.args, "--mode") == "0640"
    assert call.payload == render_alertmanager_config(AlertReceivers(webhook_url=url))
    assert not plain_occurrences(config_file.inputs, "T0KEN") and not plain_occurrences(am, "T0KEN")
    prom_yml = runner_call(run_.named("spark1-observability-prometheus-config")).payload
    assert yaml.safe_load(prom_yml)["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:9093"]
    assert run_.depends_on(run_.named("spark1-observability-alertmanager"), "spark1-observability-alertmanager-config")


def test_alertmanagers_label_cannot_be_checked_against_a_guess_of_the_url(program, recipe_config):
    """The label follows the webhook URL (a new URL restarts Alertmanager), keyed: no plain hash
    of the config, which anyone reading labels could test guesses of the URL against."""
    from components.remote import sha256_text

    def label_and_plain_hash(url):
        recipe_config["twinspark:alertWebhookUrl"] = url
        run_ = program(recipe_config)
        assert run_.error is None, run_.error
        call = runner_call(run_.named("spark1-observability-alertmanager-config"))
        plain = sha256_text(f"{flag_value(call.args, '--path')}\0{flag_value(call.args, '--mode')}\0{call.payload}")
        label = {item["label"]: item["value"] for item in inputs(run_, "spark1-observability-alertmanager")["labels"]}
        return label[contract.OBSERVABILITY_CONFIG_LABEL], plain

    label, plain = label_and_plain_hash("https://hooks.example.test/services/T0KEN")
    assert label != plain
    other, _ = label_and_plain_hash("https://hooks.example.test/services/OTHER")
    assert other != label


def test_a_changed_threshold_replaces_only_the_monitoring_that_shows_it(program, recipe_config, recipe_run):
    """The alert rule (Prometheus) and the line drawn at it on the GPU temperature graph (Grafana's
    nodes dashboard): nothing on the serving side."""
    recipe_config["twinspark:observability"] = {"gpuTemperatureAlertCelsius": 80}
    changed = program(recipe_config)
    before = {r.name: unwrap(r.inputs) for r in recipe_run.resources}
    after = {r.name: unwrap(r.inputs) for r in changed.resources}
    assert {n for n in before if before[n] != after[n]} == {
        "spark1-observability-alert-rules", "spark1-observability-prometheus", "spark1-observability-dashboard-nodes",
        "spark1-observability-grafana"}
    for container in ("spark1-observability-prometheus", "spark1-observability-grafana"):
        was, now = before[container], after[container]
        assert {k for k in was if was[k] != now[k]} == {"labels"}, container


def test_switched_off_it_creates_none_of_it(program, recipe_config):
    recipe_config["twinspark:observability"] = {"enabled": False}
    run_ = program(recipe_config)
    assert run_.error is None, run_.error
    assert not [r.name for r in run_.resources if "observability" in r.name or "grafana" in r.name]
    assert not {"grafanaUrl", "grafanaAdminPassword", "prometheusUrl", "prometheusTunnel"} & set(run_.outputs)
    assert "spark1-serving-container" in run_.by_name


def test_three_nodes_get_exporters_and_scrape_targets(program, recipe_config):
    recipe_config["twinspark:fabric"]["topology"] = "switch"  # rail N of every node on one subnet
    recipe_config["twinspark:nodes"].append({
        "name": "spark3", "role": "worker", "host": "192.168.1.12",
        "rails": [{"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.3/24"},
                  {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.3/24"}]})
    recipe_config["twinspark:serving"]["pipelineParallel"] = 3  # the layout 3 nodes serve the seed's model at
    run_ = program(recipe_config)
    assert run_.error is None, run_.error
    assert "--web.listen-address=10.0.0.3:9100" in inputs(run_, "spark3-observability-node-exporter")["command"]
    config = yaml.safe_load(runner_call(run_.named("spark1-observability-prometheus-config")).payload)
    node_job = next(j for j in config["scrape_configs"] if j["job_name"] == "node")
    assert [sc["targets"] for sc in node_job["static_configs"]] == [["10.0.0.1:9100"], ["10.0.0.2:9100"],
                                                                    ["10.0.0.3:9100"]]
    assert "spark3-observability-prometheus" not in run_.by_name


# ---- the scripts on the nodes, run through the program's own runner line ---------------------
def runner(script: str, args: list[str], secrets: dict[str, str] = None) -> tuple[str, str]:
    """(command line, stdin) exactly as node_command sends them."""
    from components.remote import encode_secret, script_command, script_text

    secrets = secrets or {}
    return (script_command(script, args, list(secrets)),
            "".join(encode_secret(v) for v in secrets.values()) + script_text(script))


def test_dirs_script_creates_owns_and_is_idempotent(tmp_path):
    from components.observability import DIRS_SCRIPT

    spec = [f"{tmp_path}/data:0:0:0755", f"{tmp_path}/data/prometheus:65534:65534:0750"]
    line, stdin = runner(DIRS_SCRIPT, ["--node", "t"] + [a for s in spec for a in ("--dir", s)])
    first, second = (run(["bash", "-c", line], input=stdin) for _ in range(2))
    assert first.returncode == 0 and "ready:" in first.stdout, first.stdout + first.stderr
    assert second.returncode == 0 and "ready:" not in second.stdout and second.stdout.count("unchanged:") == 2
    prom = tmp_path / "data" / "prometheus"
    assert (prom.stat().st_uid, prom.stat().st_gid, oct(prom.stat().st_mode & 0o777)) == (65534, 65534, "0o750")
    bad_line, bad_stdin = runner(DIRS_SCRIPT, ["--node", "t", "--dir", "relative:0:0:0755"])
    bad = run(["bash", "-c", bad_line], input=bad_stdin)
    assert bad.returncode == 2 and "expected /PATH:UID:GID:MODE" in bad.stderr


def test_grafana_password_reaches_grafana_cli_on_stdin_only(tmp_path):
    """A stand-in Grafana answers /api/health; a stand-in `docker` records its argv and stdin."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from components.observability import PASSWORD_SCRIPT, grafana_admin_args

    class Health(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/api/health" else 404)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/argv\ncat > {tmp_path}/stdin\n')
    (bin_dir / "docker").chmod(0o755)
    password = "pw with spaces, 'quotes' and $dollars"
    args = grafana_admin_args(recipe_plan())
    args[args.index("--url") + 1] = f"http://127.0.0.1:{server.server_address[1]}"
    line, stdin = runner(PASSWORD_SCRIPT, args, {"GRAFANA_ADMIN_PASSWORD": password})
    assert password not in line
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    proc = run(["bash", "-c", line], input=stdin, env=env)
    server.shutdown()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = (tmp_path / "argv").read_text()
    assert argv.split() == ["exec", "-i", "twinspark-grafana", "grafana", "cli", "--homepath", "/usr/share/grafana",
                            "admin", "reset-admin-password", "--password-from-stdin"]
    assert (tmp_path / "stdin").read_text() == password
    assert "admin password set in twinspark-grafana" in proc.stdout
    empty_line, empty_stdin = runner(PASSWORD_SCRIPT, args, {"GRAFANA_ADMIN_PASSWORD": ""})
    empty = run(["bash", "-c", empty_line], input=empty_stdin, env=env)
    assert empty.returncode == 2 and "GRAFANA_ADMIN_PASSWORD is empty" in empty.stderr
