"""The rendered monitoring config run for real on loopback: Debian's Prometheus, Debian's node
exporter (two of them, one per node, each on a staged sysfs and procfs with the recipe's rails
and RoCE ports, started with the program's own flags) and Alertmanager with the rendered route
to a local webhook; vLLM is the OpenAI stand-in exporting vLLM's metric names, the GPU exporter
a stand-in serving nvidia_gpu_exporter's names (it needs nvidia-smi, which is not here).

- every target is up and the rail labels land on the real exporter's series;
- every dashboard panel's query and every alert rule's signal returns data;
- staged faults fire: spark2's rail 1 at MTU 1500 (pending), rails idle while decoding
  (pending), and a kernel OOM kill on spark2, which reaches the webhook through Alertmanager;
- the heartbeat (TwinsparkWatchdog) reaches the webhook over and over, and stops once Prometheus
  dies: the receiver's dead man's switch sees the silence (its own Prometheus and Alertmanager,
  with the heartbeat's route at seconds instead of minutes).
"""

from __future__ import annotations

import json
import shutil
import socketserver
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from observability_helpers import dashboard_targets, every_rule, promql_of, recipe_plan
from openai_standin import Behaviour, serve

from components.config import AlertEmail
from core import contract
from components.observability import node_exporter_command
from components.observability_files import (
    GUARD_METRICS,
    AlertReceivers,
    RULES_FILE,
    ObservedEngine,
    ObservedNode,
    ObservedRail,
    render_alert_rules,
    render_alertmanager_config,
    render_prometheus_config,
    WATCHDOG,
)
from toolbox import free_port, load_launch, wait_for


NODE_EXPORTER = "prometheus-node-exporter"  # Debian's name for node_exporter
ALERTMANAGER = "prometheus-alertmanager"
RAILS = (ObservedRail("enp1s0f0np0", "rocep1s0f0"), ObservedRail("enP2p1s0f0np0", "roceP2p1s0f0"))
LAN = "enP7s7"


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def stage_node(root: Path, mtu_rail1: int, head: bool) -> None:
    """A Spark as the node exporter reads it: /sys/class/net, /sys/class/infiniband, /proc."""
    for dev, mtu in ((RAILS[0].iface, 9000), (RAILS[1].iface, mtu_rail1), (LAN, 1500)):
        for key, value in {"operstate": "up", "mtu": mtu, "speed": 200000, "carrier": 1, "type": 1,
                           "address": "4c:bb:47:00:00:01"}.items():
            write(root, f"sys/class/net/{dev}/{key}", f"{value}\n")
    for rail in RAILS:
        device = f"sys/class/infiniband/{rail.hca}"
        write(root, f"{device}/board_id", "NVD0000000033\n")
        write(root, f"{device}/fw_ver", "28.45.1020\n")
        write(root, f"{device}/hca_type", "MT4129\n")
        port = f"{device}/ports/1"
        write(root, f"{port}/state", "4: ACTIVE\n")
        write(root, f"{port}/phys_state", "5: LinkUp\n")
        write(root, f"{port}/rate", "200 Gb/sec (2X NDR)\n")
        write(root, f"{port}/link_layer", "Ethernet\n")
        for counter in ("port_rcv_data", "port_xmit_data", "port_rcv_packets", "port_xmit_packets",
                        "port_rcv_errors", "port_xmit_discards", "link_downed", "link_error_recovery",
                        "symbol_error", "local_link_integrity_errors", "excessive_buffer_overrun_errors"):
            write(root, f"{port}/counters/{counter}", "1000\n" if "data" in counter else "0\n")
    write(root, "proc/meminfo", "MemTotal:       125000000 kB\nMemFree:         9000000 kB\n"
                                "MemAvailable:   20000000 kB\n")
    write(root, "proc/vmstat", "nr_free_pages 2250000\noom_kill 0\n")
    write(root, "proc/stat", "cpu  100 0 100 1000 0 0 0 0 0 0\ncpu0 100 0 100 1000 0 0 0 0 0 0\n"
                             "intr 0\nctxt 0\nbtime 1700000000\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n")
    write(root, "proc/1/mounts", "/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n")
    header = ("Inter-|   Receive                                                |  Transmit\n"
              " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo "
              "colls carrier compressed\n")
    rows = "".join(f"{dev}: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n" for dev in (*(r.iface for r in RAILS), LAN))
    write(root, "proc/net/dev", header + rows)
    (root / "rootfs").mkdir(exist_ok=True)
    (root / "textfile").mkdir(exist_ok=True)
    if head:  # the guard's own writer, after a passing round with the gateway up; the power watch's over the worker
        write_guard_textfile(root / "textfile" / "twinspark-guard.prom")
        write_power_watch_textfile(root / "textfile" / Path(contract.POWER_WATCH_TEXTFILE).name)


def write_power_watch_textfile(path: Path) -> None:
    """The power watch's own writer, the worker answering and never cycled."""
    module = load_launch("power-watch.py")
    plan = {"nodes": [{"node": "spark2", "host": "192.0.2.12", "plug_kind": "shelly", "plug_url_file": ""}],
            "miss_seconds": 180, "off_seconds": 10, "window_seconds": 3600, "interval": 5}
    watch = module.PowerWatch(plan, path.parent, textfile=str(path))
    watch.step(watch.watched[0], {"ssh": True, "exporter": True}, time.time())
    watch.write_outputs(time.time())


def write_guard_textfile(path: Path) -> None:
    import argparse
    module = load_launch("serving-guard.py")
    watch = module.fabric_watch  # the guard's own import
    rails = [watch.Rail(r.iface, r.hca, 200000, 9000) for r in RAILS]
    guard = module.Guard(argparse.Namespace(textfile=str(path), hold_file=str(path.with_name("no-hold")),
                                            drain_file=str(path.with_name("no-drain")), worker_look_interval=300),
                         None, rails=rails)
    guard.gateway_up = True
    guard.last = {"checked_at": time.time(), "ok": True, "duration_s": 1.2}
    # its fabric watch's look at a healthy head: each HCA at its PCIe link's best, no AER event, NCCL on IB
    guard.fabric["readings"] = [watch.RailReading(rail, "up", 200000, 9000, "PORT_ACTIVE", 4096, 0,
                                                  {"width": 4, "max_width": 4, "speed_gts": 32.0, "max_speed_gts": 32.0},
                                                  dict.fromkeys(watch.AER_KINDS, 0)) for rail in rails]
    guard.nccl_network = "IB"
    # and the worker's, from its last look (written here, under the worker's name)
    guard.worker_readings = {"spark2": (time.time(), guard.fabric["readings"])}
    guard.write_metrics()


def staged_node_exporter(node: ObservedNode, port: int, root: Path) -> list[str]:
    """The program's own node-exporter flags, pointed at the staged tree instead of /host."""
    argv = [NODE_EXPORTER]
    for flag in node_exporter_command(node, port):
        if flag.startswith("--path.rootfs="):
            flag = f"--path.rootfs={root / 'rootfs'}"
        elif flag.startswith("--collector.textfile.directory="):
            flag = f"--collector.textfile.directory={root / 'textfile'}"
        argv.append(flag)
    # the staged tree holds only what these collectors read; netdev from /proc/net/dev, not netlink
    return argv + [f"--path.sysfs={root / 'sys'}", f"--path.procfs={root / 'proc'}", "--collector.disable-defaults",
                   "--collector.netdev", "--no-collector.netdev.netlink", "--collector.meminfo",
                   "--collector.vmstat", "--collector.filesystem", "--collector.cpu"]


class StaticExporter:
    """Serves `text` at /metrics (the GPU exporter's stand-in)."""

    def __init__(self, host: str, port: int, text: str):
        owner = self
        self.text = text

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = owner.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class Webhook:
    """Records every JSON body Alertmanager POSTs, and the path (with its query) it was sent to.
    A webhook receiver, Slack's incoming webhook and an ntfy topic alike take Alertmanager's POST."""

    def __init__(self, path: str = "/hook/T0KEN"):
        owner = self
        self.received: list[tuple[float, dict]] = []  # (when, body)
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                owner.received.append((time.time(), json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                owner.paths.append(self.path)
                self.send_response(200)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def bodies(self) -> list[dict]:
        return [body for _, body in self.received]


class SmtpSink:
    """An SMTP server that takes every message (no TLS, no login), as a LAN relay would: what
    Alertmanager's email receiver sends, kept whole. Hand-written: the standard library's smtpd is
    gone from Python 3.12, and aiosmtpd would be a dependency for these 20 lines."""

    def __init__(self):
        owner = self
        self.messages: list[str] = []

        class Session(socketserver.StreamRequestHandler):
            def handle(self):
                def say(line: str) -> None:
                    self.wfile.write(f"{line}\r\n".encode())

                say("220 sink ESMTP")
                for raw in self.rfile:
                    verb = raw.decode(errors="replace").strip().split(" ", 1)[0].upper()
                    if verb in ("EHLO", "HELO"):
                        say("250 sink")
                    elif verb == "DATA":
                        say("354 end with .")
                        lines = []
                        for line in self.rfile:
                            if line.rstrip(b"\r\n") == b".":
                                break
                            lines.append(line.decode(errors="replace"))
                        owner.messages.append("".join(lines))
                        say("250 queued")
                    elif verb == "QUIT":
                        say("221 bye")
                        return
                    else:  # MAIL, RCPT, RSET, NOOP
                        say("250 ok")

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Session)
        self.server.daemon_threads = True
        self.smarthost = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


GPU_TEXT = "\n".join([  # nvidia_gpu_exporter 1.14's names for what nvidia-smi reports on GB10
    'nvidia_smi_temperature_gpu{uuid="u"} 71', 'nvidia_smi_power_draw_watts{uuid="u"} 64.25',
    'nvidia_smi_utilization_gpu_ratio{uuid="u"} 0.95', 'nvidia_smi_clocks_current_graphics_clock_hz{uuid="u"} 2.4e9',
    'nvidia_smi_clocks_current_sm_clock_hz{uuid="u"} 2.4e9', "nvidia_smi_last_collect_success 1",
    'nvidia_smi_clocks_event_reasons_hw_slowdown{uuid="u"} 0',
    'nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{uuid="u"} 0',
    'nvidia_smi_clocks_event_reasons_sw_power_cap{uuid="u"} 0',
]) + "\n"


def vllm_text(t: int) -> str:
    """vLLM's exposition (names: components/observability_files/), counters advancing with t seconds."""
    labels = 'engine="0",model_name="ds-0731"'
    lines = [f"vllm:num_requests_running{{{labels}}} 2", f"vllm:num_requests_waiting{{{labels}}} 1",
             f"vllm:kv_cache_usage_perc{{{labels}}} 0.4",
             f"vllm:generation_tokens_total{{{labels}}} {75 * t}", f"vllm:prompt_tokens_total{{{labels}}} {1700 * t}",
             f"vllm:num_preemptions_total{{{labels}}} 0", f"vllm:prefix_cache_queries_total{{{labels}}} {100 * t}",
             f"vllm:prefix_cache_hits_total{{{labels}}} {60 * t}",
             f"vllm:spec_decode_num_drafts_total{{{labels}}} {10 * t}",
             f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {70 * t}",
             f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {35 * t}",
             "process_start_time_seconds 1.7e9"]
    for pos, share in enumerate((0.93, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)):
        lines.append(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{pos}"}} '
                     f"{int(10 * t * share)}")
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
        for le, share in (("0.01", 0.1), ("0.1", 0.6), ("1.0", 0.9), ("+Inf", 1.0)):
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {int(20 * t * share)}')
        lines += [f"{name}_count{{{labels}}} {20 * t}", f"{name}_sum{{{labels}}} {t}"]
    for le, share in (("1000", 0.2), ("10000", 0.5), ("100000", 0.9), ("+Inf", 1.0)):
        lines.append(f'vllm:request_prompt_tokens_bucket{{{labels},le="{le}"}} {int(4 * t * share)}')
    lines += [f"vllm:request_prompt_tokens_count{{{labels}}} {4 * t}", f"vllm:request_prompt_tokens_sum{{{labels}}} {9000 * t}"]
    for reason, per_s in (("stop", 3), ("length", 1), ("abort", 0), ("error", 0)):
        lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {per_s * t}')
    for status, per_s in (("2xx", 4), ("4xx", 1)):
        lines.append(f'http_requests_total{{handler="/v1/chat/completions",method="POST",status="{status}"}} {per_s * t}')
    for outcome, per_s in (("tool_call", 2), ("no_tool_call", 5)):
        lines.append(f'vllm:tool_call_parser_invocations_total{{{labels},mode="streaming",outcome="{outcome}",'
                     f'request_type="chat_completions"}} {per_s * t}')
    return "\n".join(lines) + "\n"


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def alerts_named(port: int, name: str) -> list[dict]:
    return [a for a in api(port, "/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == name]


def monitoring_commands(tmp: Path, plan, alertmanager_config: str, *prometheus_flags: str) -> dict[str, list[str]]:
    """The rendered rules, prometheus.yml and alertmanager.yml written under `tmp`, and the
    commands that run Debian's Alertmanager and Prometheus on them (loopback, the plan's ports)."""
    (tmp / "alertmanager.yml").write_text(alertmanager_config)
    (tmp / "rules").mkdir()
    (tmp / "rules" / RULES_FILE).write_text(render_alert_rules(plan))
    (tmp / "prometheus.yml").write_text(render_prometheus_config(plan, rules_dir=str(tmp / "rules")))
    return {
        "alertmanager": [ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am-data'}",
                         f"--web.listen-address=127.0.0.1:{plan.alertmanager_port}", "--cluster.listen-address="],
        "prometheus": ["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                       f"--web.listen-address=127.0.0.1:{plan.prometheus_port}", *prometheus_flags],
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    for tool in ("prometheus", NODE_EXPORTER, ALERTMANAGER):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: scripts/test.sh installs it from Debian")
    tmp = tmp_path_factory.mktemp("live-prometheus")
    behaviour = Behaviour(metrics_text=vllm_text(0))
    vllm = serve(behaviour)
    webhook, slack, ntfy, smtp = Webhook(), Webhook("/services/T0/B0/X0"), Webhook("/twinspark-alerts"), SmtpSink()
    receivers = AlertReceivers(webhook_url=webhook.url, slack_url=slack.url, ntfy_url=ntfy.url,
                               email=AlertEmail(to="owner@example.test", from_="spark@example.test",
                                                smarthost=smtp.smarthost, require_tls=False))
    base = recipe_plan(alertmanager=True, scrapeIntervalSeconds=1)
    plan = replace(
        base,
        nodes=(ObservedNode("spark1", "head", "127.0.0.2", RAILS), ObservedNode("spark2", "worker", "127.0.0.3", RAILS)),
        engines=(ObservedEngine(f"127.0.0.1:{vllm.server_address[1]}", "spark1", "head"),),
        prometheus_port=free_port(), node_exporter_port=free_port(),
        gpu_exporter_port=free_port(), alertmanager_port=free_port(),
    )
    procs, logs = [], []

    def start(argv, name):
        log = open(tmp / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    for node, mtu_rail1 in zip(plan.nodes, (9000, 1500)):  # spark2's rail 1: MTU wrong
        stage_node(tmp / node.name, mtu_rail1, head=node.role == "head")
        start(staged_node_exporter(node, plan.node_exporter_port, tmp / node.name), f"node-exporter-{node.name}")
    gpus = [StaticExporter(n.rail_ip, plan.gpu_exporter_port, GPU_TEXT) for n in plan.nodes]
    # Prometheus re-sends its firing alerts every second: the heartbeat it first sent before Alertmanager
    # listened reaches it at once, not a minute later (its default resend delay)
    for name, argv in monitoring_commands(tmp, plan, render_alertmanager_config(receivers, group_wait="1s"),
                                          "--rules.alert.resend-delay=1s").items():
        start(argv, name)
    stop = threading.Event()

    def advance():  # vLLM's counters move, as under load
        t = 0
        while not stop.wait(0.5):
            t += 1
            behaviour.metrics_text = vllm_text(t)

    threading.Thread(target=advance, daemon=True).start()
    try:
        yield plan, tmp, Receivers(webhook, slack, ntfy, smtp)
    finally:
        stop.set()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
        for log in logs:
            log.close()
        vllm.shutdown()
        for server in (webhook.server, slack.server, ntfy.server, smtp.server):
            server.shutdown()
        for gpu in gpus:
            gpu.server.shutdown()


@dataclass
class Receivers:
    webhook: Webhook
    slack: Webhook
    ntfy: Webhook
    smtp: SmtpSink


def all_targets_up(port):
    targets = api(port, "/api/v1/targets")["data"]["activeTargets"]
    return len(targets) == 6 and all(t["health"] == "up" for t in targets) and targets


def test_every_target_is_up_and_rail_labels_land_on_the_real_exporters_series(live):
    plan, _, _ = live
    port = plan.prometheus_port
    targets = wait_for(lambda: all_targets_up(port), "all six targets up", 30, interval_s=0.5, ignoring=(OSError,))
    assert {(t["labels"]["job"], t["labels"]["node"], t["scrapeUrl"].split("/")[2]) for t in targets} == {
        ("vllm", "spark1", plan.engines[0].address), ("prometheus", "spark1", f"127.0.0.1:{plan.prometheus_port}"),
        ("node", "spark1", f"127.0.0.2:{plan.node_exporter_port}"), ("node", "spark2", f"127.0.0.3:{plan.node_exporter_port}"),
        ("gpu", "spark1", f"127.0.0.2:{plan.gpu_exporter_port}"), ("gpu", "spark2", f"127.0.0.3:{plan.gpu_exporter_port}")}
    mtu = api(port, "/api/v1/query", query="node_network_mtu_bytes")["data"]["result"]
    rails = {(r["metric"]["node"], r["metric"]["device"]): r["metric"].get("rail") for r in mtu}
    assert rails == {("spark1", "enp1s0f0np0"): "0", ("spark1", "enP2p1s0f0np0"): "1", ("spark1", LAN): None,
                     ("spark2", "enp1s0f0np0"): "0", ("spark2", "enP2p1s0f0np0"): "1", ("spark2", LAN): None}
    state = api(port, "/api/v1/query", query='node_infiniband_state_id{rail="1"}')["data"]["result"]
    assert {(r["metric"]["node"], r["metric"]["device"], r["value"][1]) for r in state} == {
        ("spark1", "roceP2p1s0f0", "4"), ("spark2", "roceP2p1s0f0", "4")}
    # the worker's PCIe series come from the head's exporter (the guard's textfile) under the worker's name
    width = api(port, "/api/v1/query", query="twinspark_fabric_pcie_link_width")["data"]["result"]
    assert {(r["metric"]["node"], r["metric"]["role"], r["metric"]["device"], r["metric"]["rail"],
             r["metric"]["instance"]) for r in width} == {
        (node, role, r.hca, str(i), f"127.0.0.2:{plan.node_exporter_port}")
        for node, role in (("spark1", "head"), ("spark2", "worker")) for i, r in enumerate(RAILS)}
    assert not [r for r in width if "peer" in r["metric"]]


def test_every_dashboard_query_and_alert_signal_returns_data(live):
    plan, _, _ = live
    port = plan.prometheus_port
    wait_for(lambda: all_targets_up(port), "all six targets up", 30, interval_s=0.5, ignoring=(OSError,))
    wait_for(lambda: api(port, "/api/v1/query", query="sum(rate(vllm:generation_tokens_total[5s])) > 0")
             ["data"]["result"], "a vLLM rate", 30, interval_s=0.5, ignoring=(OSError,))
    wait_for(lambda: api(port, "/api/v1/query", query='count(ALERTS{alertstate="pending"})')["data"]["result"],
             "a pending alert", 30, interval_s=0.5, ignoring=(OSError,))
    queries = [(f"{name}: {title}", expr) for name, title, expr in dashboard_targets(plan)]
    queries += [(f"rule {r.alert}", s) for r in every_rule(plan) for s in r.signals]
    assert len(queries) >= 60
    # the one query allowed to be empty: the firing alerts' table, while only pending ones exist
    allowed = {'ALERTS{alertstate="firing"}'}

    def unanswered():
        empty = []
        for where, expr in queries:
            answer = api(port, "/api/v1/query", query=promql_of(expr))
            assert answer["status"] == "success", (where, expr, answer)
            if not answer["data"]["result"] and expr not in allowed:
                empty.append((where, expr))
        return empty

    deadline = time.monotonic() + 30  # a rate needs two scrapes of its target: retry until every query has them
    while (empty := unanswered()) and time.monotonic() < deadline:
        time.sleep(1)
    assert empty == []
    per_position = api(port, "/api/v1/query", query=promql_of(next(
        e for _, t, e in dashboard_targets(plan) if t == "Acceptance per draft position")))["data"]["result"]
    assert sorted(r["metric"]["position"] for r in per_position) == [str(p) for p in range(7)]
    first = next(float(r["value"][1]) for r in per_position if r["metric"]["position"] == "0")
    assert 0.85 < first <= 0.95 + 1e-9  # a ratio of two rates: 0.9500000000000001 is 0.95
    assert set(GUARD_METRICS) <= {r["metric"]["__name__"] for r in api(
        port, "/api/v1/query", query='{__name__=~"twinspark_guard_.+"}')["data"]["result"]}


def test_staged_faults_raise_their_alerts(live):
    plan, _, _ = live
    port = plan.prometheus_port
    wrong = wait_for(lambda: alerts_named(port, "TwinsparkRailMtuWrong"), "TwinsparkRailMtuWrong pending", 30,
                     interval_s=0.5, ignoring=(OSError,))
    assert [(a["labels"]["node"], a["labels"]["rail"], a["state"]) for a in wrong] == [("spark2", "1", "pending")]
    assert wrong[0]["annotations"]["summary"] == "Rail 1 (enP2p1s0f0np0) on spark2 has MTU 1500"
    # the staged RoCE byte counters stand still while vLLM generates: NCCL would be on TCP
    idle = wait_for(lambda: alerts_named(port, "TwinsparkNcclNotOnRoce"), "TwinsparkNcclNotOnRoce pending", 30,
                    interval_s=0.5, ignoring=(OSError,))
    assert idle[0]["state"] == "pending"
    names = {a["labels"]["alertname"] for a in api(port, "/api/v1/alerts")["data"]["alerts"]}
    assert not names & {"TwinsparkRailDown", "TwinsparkServingDown", "TwinsparkNodeDown", "TwinsparkGpuHot",
                        "TwinsparkRocePortNotActive", "TwinsparkCanaryFailing", "TwinsparkOomKill"}, names


def test_a_staged_oom_kill_reaches_every_receiver_through_alertmanager_and_the_heartbeat_the_webhook_alone(live):
    """The rendered route on the real Alertmanager: the alert at the webhook, Slack (its incoming
    webhook's POST), ntfy (the topic, with ntfy's alertmanager template asked for) and by email; the
    heartbeat (always firing) only at the webhook, the dead man's switch's relay."""
    plan, tmp, receivers = live
    webhook = receivers.webhook
    port = plan.prometheus_port
    wait_for(lambda: all_targets_up(port), "all six targets up", 30, interval_s=0.5, ignoring=(OSError,))
    wait_for(lambda: api(port, "/api/v1/query", query='node_vmstat_oom_kill{node="spark2"}')["data"]["result"],
             "spark2's vmstat scraped", 30, interval_s=0.5, ignoring=(OSError,))
    (tmp / "spark2" / "proc" / "vmstat").write_text("nr_free_pages 2250000\noom_kill 1\n")

    def delivered():
        return [(body["status"], a["labels"]) for body in webhook.bodies for a in body["alerts"]
                if a["labels"]["alertname"] == "TwinsparkOomKill"]

    (status, labels), *_ = wait_for(delivered, "TwinsparkOomKill at the webhook", 60, interval_s=0.5,
                                    ignoring=(OSError,))
    assert status == "firing"
    assert (labels["node"], labels["severity"], labels["job"]) == ("spark2", "critical", "node")
    assert {body["receiver"] for body in webhook.bodies} <= {"alerts", "heartbeat"}
    slack = wait_for(lambda: [b for b in receivers.slack.bodies if "TwinsparkOomKill" in json.dumps(b)],
                     "TwinsparkOomKill at Slack", 30, interval_s=0.5)
    attachment = slack[0]["attachments"][0]
    assert attachment["title"] == "[FIRING] TwinsparkOomKill on spark2", attachment
    assert "OOM" in attachment["text"] or "oom" in attachment["text"].lower(), attachment
    ntfy = wait_for(lambda: [(path, b) for path, b in zip(receivers.ntfy.paths, receivers.ntfy.bodies)
                             if "TwinsparkOomKill" in json.dumps(b)], "TwinsparkOomKill at ntfy", 30, interval_s=0.5)
    assert ntfy[0][0] == "/twinspark-alerts?template=alertmanager", ntfy[0][0]
    mail = wait_for(lambda: [m for m in receivers.smtp.messages if "TwinsparkOomKill" in m], "the alert's email", 30,
                    interval_s=0.5)
    assert "To: owner@example.test" in mail[0] and "From: spark@example.test" in mail[0]
    heartbeats = wait_for(lambda: [b for b in webhook.bodies if any(a["labels"]["alertname"] == WATCHDOG
                                                                   for a in b["alerts"])], "the heartbeat at the webhook",
                          30, interval_s=0.5)
    assert {b["receiver"] for b in heartbeats} == {"heartbeat"}
    for person in (receivers.slack, receivers.ntfy):
        assert WATCHDOG not in json.dumps(person.bodies)
    assert not any(WATCHDOG in m for m in receivers.smtp.messages)


@pytest.fixture
def heartbeat(tmp_path):
    """The rendered rules and route on a Prometheus and an Alertmanager of their own (this test
    kills the Prometheus), the heartbeat re-sent every 2 s and Prometheus re-sending every 1 s,
    so an alert it stops sending ends 4 s later (Prometheus' 4 x resend delay)."""
    webhook = Webhook()
    plan = replace(recipe_plan(alertmanager=True, scrapeIntervalSeconds=1), prometheus_port=free_port(),
                   alertmanager_port=free_port())
    alertmanager_config = render_alertmanager_config(AlertReceivers(webhook_url=webhook.url), "1s", heartbeat=("1s", "2s"))
    commands = monitoring_commands(tmp_path, plan, alertmanager_config, "--rules.alert.resend-delay=1s")
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in commands}
    procs = {name: subprocess.Popen(argv, stdout=logs[name], stderr=subprocess.STDOUT) for name, argv in commands.items()}
    try:
        yield procs, webhook
    finally:
        for name, proc in procs.items():
            proc.kill()
            proc.wait(timeout=20)
            logs[name].close()
        webhook.server.shutdown()


def test_the_heartbeat_reaches_the_webhook_until_prometheus_dies_then_stops(heartbeat):
    procs, webhook = heartbeat

    def beats(status: str) -> list[float]:
        return [at for at, body in webhook.received for a in body["alerts"]
                if a["labels"]["alertname"] == WATCHDOG and body["status"] == status]

    firing = wait_for(lambda: len(beats("firing")) >= 3 and beats("firing"), "three heartbeats at the webhook", 60,
                      interval_s=0.5, ignoring=(OSError,))
    assert max(b - a for a, b in zip(firing, firing[1:])) < 10  # 2 s asked: re-sent, not sent once
    procs["prometheus"].kill()  # the head's Prometheus gone (a dead head takes Alertmanager too: silence at once)
    died = time.time()
    resolved = wait_for(lambda: beats("resolved"), "Alertmanager resolving the heartbeat nobody sends", 60,
                        interval_s=0.5, ignoring=(OSError,))
    print(f"heartbeat gaps {[round(b - a, 1) for a, b in zip(firing, firing[1:])]} s; "
          f"resolved {resolved[0] - died:.1f} s after Prometheus died")
    quiet_from = time.time()
    time.sleep(10)  # five heartbeat periods
    assert [at for at in beats("firing") if at > quiet_from] == [], "a heartbeat after Prometheus died"
    assert [at for at in beats("firing") if at > resolved[0]] == []
