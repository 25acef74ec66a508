"""A box that stops answering (issue 40, part 4): launch/node-recorder.py telling a clean end from
an unclean one and keeping what the unclean one left; launch/power-watch.py's verdicts (silent ->
one power cycle -> held, never two in a window) and its plug requests against a plug of Shelly's
and Tasmota's HTTP shape; the config's plug and the firewall's flow for the watch. The simulator
freezes a node and cycles it through a plug stand-in (tests/sim_engine/test_engine_sim_fabric.py)."""

from __future__ import annotations

import base64
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families
from program_harness import config_blocks

from components.box_recovery import box_recovery_args, render_watch_plan
from components.config import Topology, parse_stack_config, resolve_node_addresses
from components.firewall import firewall_policy
from core import contract
from toolbox import load_launch

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
power_watch = load_launch("power-watch.py")
recorder = load_launch("node-recorder.py")
XID = "2026-12-06T10:00:00+0000 spark2 kernel: NVRM: Xid (PCI:000f:01:00): 79, pid=0, GPU has fallen off the bus."


# ---- node-recorder.py ----------------------------------------------------------------------------
class Box:
    """A node's recorder on a folder of its own: its boots (a boot id file), its kernel log."""

    def __init__(self, tmp: Path):
        self.tmp, self.dir, self.hold = tmp, tmp / "forensics", tmp / "run" / "unclean-boot"
        self.boot_id, self.kernel = tmp / "boot_id", tmp / "kernel.prev"
        (tmp / "run").mkdir()
        self.journalctl = tmp / "journalctl"
        self.journalctl.write_text(f'#!/bin/sh\n[ -f {self.kernel} ] || {{ echo "No journal boot" >&2; exit 1; }}\n'
                                   f"cat {self.kernel}\n")
        self.journalctl.chmod(0o755)
        self.new_boot()

    def new_boot(self) -> None:
        self.boot_id.write_text(os.urandom(16).hex() + "\n")

    def run(self, *verb: str, check=True) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, str(LAUNCH / "node-recorder.py"), *verb, "--dir", str(self.dir),
                               "--node", "spark2", "--hold", str(self.hold), "--journalctl", str(self.journalctl),
                               "--pstore", str(self.tmp / "pstore")],
                              capture_output=True, text=True, env={**os.environ, "TWINSPARK_BOOT_ID_FILE": str(self.boot_id)})
        assert not check or done.returncode == 0, done.stderr
        return done

    def record(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, str(LAUNCH / "node-recorder.py"), "record", "--dir", str(self.dir),
                                 "--interval", "0.2"], env={**os.environ, "TWINSPARK_BOOT_ID_FILE": str(self.boot_id)})
        deadline = time.monotonic() + 10
        while not (self.dir / "memory-last.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return proc

    def listing(self) -> dict:
        return json.loads(self.run("list").stdout)


@pytest.fixture
def box(tmp_path):
    return Box(tmp_path)


def test_a_clean_shutdown_leaves_no_report_and_no_hold(box):
    box.run("boot")
    proc = box.record()
    proc.send_signal(signal.SIGTERM)  # systemd's stop at a shutdown
    proc.wait(timeout=10)
    assert (box.dir / "clean-shutdown").read_text().strip() == box.boot_id.read_text().strip()
    box.new_boot()
    box.run("boot")
    assert box.listing() == {"pending_requalification": None, "reports": []}
    assert not box.hold.exists()


def test_an_unclean_end_is_reported_with_its_xid_and_memory_picture_and_held_until_released(box):
    box.run("boot")
    proc = box.record()
    proc.kill()  # the freeze, the power cut: no stop, no mark
    proc.wait()
    picture = json.loads((box.dir / "memory-last.json").read_text())
    box.kernel.write_text(f"an ordinary line\n{XID}\nanother\n")
    box.new_boot()
    said = box.run("boot").stdout
    listing = box.listing()
    name = listing["pending_requalification"]
    assert name and [r["name"] for r in listing["reports"]] == [name] and name in said
    assert listing["reports"][0]["xid"] == 1
    report = json.loads(box.run("show", name).stdout)
    assert report["xid_lines"] == [XID] and "Xid" in report["cause"] and "79" in report["cause"]
    assert report["memory_picture"] == picture and report["last_memory_picture_at"] == picture["at"]
    assert report["kernel_log_tail"][-1] == "another" and report["kernel_log_missing"] is None
    assert name in box.hold.read_text(), "held out of serving"
    assert oct((box.dir / "reports" / f"{name}.json").stat().st_mode & 0o777) == "0o600"
    # a clean reboot before the re-qualification: the hold comes back with the new /run
    box.hold.unlink()
    box.run("boot")
    assert box.hold.exists()
    box.run("release")
    assert not box.hold.exists() and box.listing()["pending_requalification"] is None
    assert json.loads(box.run("show", name).stdout)["requalified_at"] > 0


def test_no_journal_and_no_trace_says_so(box):
    box.run("boot")
    box.new_boot()  # the previous boot never recorded (the recorder never ran) and no journal kept
    box.run("boot")
    [report] = box.listing()["reports"]
    assert "no trace in the kernel log, pstore or the memory picture" in report["summary"]
    shown = json.loads(box.run("show", report["name"]).stdout)
    assert "Storage=persistent" in shown["kernel_log_missing"]


@pytest.mark.parametrize("available, cause", [(0.5, "memory nearly exhausted"), (40, "no trace")])
def test_memory_exhausted_at_the_last_picture_is_named(available, cause):
    picture = {"meminfo_bytes": {"MemTotal": 128 * 2**30, "MemAvailable": int(available * 2**30)}}
    assert recorder.judge([], [], picture)[0].startswith(cause)


def test_show_of_an_unknown_report_names_the_reports_without_a_traceback(box):
    done = box.run("show", "20990101T000000Z-deadbeef", check=False)
    assert done.returncode == 2 and "no report '20990101T000000Z-deadbeef'" in done.stderr
    assert "Traceback" not in done.stderr


# ---- power-watch.py: the verdicts ------------------------------------------------------------------
PLAN = {"miss_seconds": 20, "off_seconds": 0, "window_seconds": 600, "interval": 5,
        "nodes": [{"node": "spark2", "host": "192.0.2.12", "plug_kind": "shelly", "plug_url_file": "", "exporter_url": "",
                   "guard_textfile": ""}]}


@pytest.fixture
def watch(tmp_path, monkeypatch):
    url = tmp_path / "spark2.url"
    url.write_text("http://admin:s3cret-plug@192.0.2.60\n")
    plan = {**PLAN, "nodes": [{**PLAN["nodes"][0], "plug_url_file": str(url)}]}
    switched = []
    monkeypatch.setattr(power_watch, "switch_plug", lambda kind, u, on: switched.append((kind, u, on)))

    def make():
        w = power_watch.PowerWatch(plan, tmp_path, textfile=str(tmp_path / "power.prom"),
                                   status=str(tmp_path / "status.json"))
        return w, w.watched[0]

    return make, switched


SILENT, ANSWERING = {"ssh": False, "exporter": False}, {"ssh": True, "exporter": False}


def test_a_silent_node_is_cycled_once_after_the_miss_and_held_when_still_silent(watch):
    make, switched = watch
    w, node = make()
    w.step(node, SILENT, 1000.0)
    w.step(node, SILENT, 1019.0)
    assert switched == [], "not before missSeconds"
    w.step(node, SILENT, 1021.0)
    assert switched == [("shelly", "http://admin:s3cret-plug@192.0.2.60", False),
                        ("shelly", "http://admin:s3cret-plug@192.0.2.60", True)]
    assert len(node.cycles) == 1 and node.held is None
    restarted, again = make()  # a watch restarted meanwhile keeps the window (its state on disk)
    assert restarted.watched[0].cycles == node.cycles
    restarted.step(again, SILENT, time.time())
    restarted.step(again, SILENT, time.time() + 25)
    assert len(switched) == 2, "never a second cycle within the window"
    assert again.held and "no second cycle within 600 s" in again.held["reason"]
    restarted.write_outputs(time.time())
    families = {f.name: f for f in text_string_to_metric_families((w.textfile and Path(w.textfile)).read_text())}
    assert [s.value for s in families["twinspark_power_watch_held"].samples] == [1.0]
    assert [s.value for s in families["twinspark_power_cycles"].samples] == [1.0]
    assert "s3cret" not in Path(w.textfile).read_text() + Path(w.status).read_text()
    restarted.step(again, ANSWERING, time.time() + 30)
    assert again.held is None and again.missing_since is None, "it answers again: the hold ends"


def test_a_sign_of_life_resets_the_count(watch):
    make, switched = watch
    w, node = make()
    w.step(node, SILENT, 1000.0)
    w.step(node, ANSWERING, 1015.0)
    w.step(node, SILENT, 1016.0)
    w.step(node, SILENT, 1030.0)
    assert switched == []


# ---- power-watch.py: the signs of life and the plug ------------------------------------------------
def listener(banner: bytes):
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if banner:
                conn.sendall(banner)
            threading.Timer(3, conn.close).start()

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.mark.parametrize("banner, alive", [(b"SSH-2.0-OpenSSH_9.6\r\n", True), (b"", False)])
def test_the_ssh_sign_is_sshds_banner_not_the_kernels_handshake(banner, alive):
    server = listener(banner)
    try:
        assert power_watch.ssh_banner("127.0.0.1", server.getsockname()[1], timeout=1) is alive
    finally:
        server.close()


def test_the_guard_heartbeat_is_its_metrics_files_age():
    text = ('node_textfile_mtime_seconds{file="/host/textfile/twinspark-guard.prom"} 1000\n'
            'node_textfile_mtime_seconds{file="/host/textfile/other.prom"} 5000\n')
    assert power_watch.guard_fresh(text, "twinspark-guard.prom", 1100)
    assert not power_watch.guard_fresh(text, "twinspark-guard.prom", 1000 + power_watch.GUARD_FRESH_S + 1)
    assert not power_watch.guard_fresh(None, "twinspark-guard.prom", 1000)


class Plug:
    """A plug's HTTP API, as Shelly (basic auth) and Tasmota (user and password parameters) have it."""

    def __init__(self):
        self.requests = []
        plug = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                plug.requests.append((self.path, self.headers.get("Authorization")))
                url, auth = urlsplit(self.path), self.headers.get("Authorization") or ""
                query = parse_qs(url.query)
                ok = (auth == "Basic " + base64.b64encode(b"admin:s3cret").decode()
                      or query.get("password") == ["s3cret"])
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="plug"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def plug():
    p = Plug()
    yield p
    p.server.shutdown()


@pytest.mark.parametrize("kind, off_path, on_query", [
    ("shelly", "/relay/0?turn=off", "turn=on"),
    ("shelly-rpc", "/rpc/Switch.Set?id=0&on=false", "on=true"),
    ("tasmota", "/cm?cmnd=Power+Off", "cmnd=Power+On"),
])
def test_each_plug_kind_is_switched_off_and_on_with_its_credentials(plug, kind, off_path, on_query):
    url = f"http://admin:s3cret@{plug.base}"
    assert power_watch.switch_plug(kind, url, on=False) is None
    assert power_watch.switch_plug(kind, url, on=True) is None
    paths = [path for path, _ in plug.requests if not path.endswith("401")]
    assert paths[0].startswith(off_path) and on_query in paths[-1], plug.requests


def test_a_refused_plug_says_so_without_its_url(plug):
    said = power_watch.switch_plug("shelly", f"http://admin:wrong-s3cret@{plug.base}", on=False)
    assert said == "the plug answered HTTP 401"
    assert power_watch.switch_plug("shelly", "http://admin:x@127.0.0.1:9", on=False).startswith("the plug did not answer")


# ---- the config: the plug, who watches it, the flow it opens ---------------------------------------
def plugged(url="http://admin:s3cret@192.168.1.60", node=1):
    blocks = copy.deepcopy(config_blocks())  # the stack file's, shared with every other test
    blocks["nodes"][node] = {**blocks["nodes"][node], "power": {"kind": "shelly", "url": url}}
    return blocks


def test_the_next_node_watches_a_plugged_one_and_only_it_holds_the_url():
    cfg = parse_stack_config(plugged())
    topology = Topology(cfg, resolve_node_addresses(cfg.nodes))
    head, worker = cfg.nodes
    args = box_recovery_args(cfg, topology, {n.name: None for n in cfg.nodes})
    watches = {n.name: n.watched and n.watched.name for n in args.nodes}
    assert watches == {head.name: worker.name, worker.name: None}, "a pair: the head watches the plugged worker"
    plan = json.loads(render_watch_plan(args.nodes[0].watched, cfg.power_watch))
    assert plan["miss_seconds"] == 180 and plan["window_seconds"] == 3600, "the defaults"
    assert plan["nodes"][0]["exporter_url"] == f"http://{worker.rails[0].ip}:{contract.NODE_EXPORTER_PORT}/metrics"
    assert "s3cret" not in json.dumps(plan)
    admits = {a.flow: a for a in firewall_policy(worker, topology).admits}
    assert admits["power-watch"].sources == (head.rails[0].ip,) and admits["power-watch"].iface == worker.rails[0].iface
    assert "power-watch" not in {a.flow for a in firewall_policy(head, topology).admits}, "the head has no plug"


def test_a_bad_plug_url_is_refused_without_showing_it(program, recipe_config):
    recipe_config["twinspark:nodes"] = plugged("ftp://admin:s3cret@plug")["nodes"]
    run = program(recipe_config)
    assert run.error and "twinspark:nodes[1].power.url: not an http(s) URL" in run.error["message"], run.error
    assert "s3cret" not in run.error["message"] and run.resources == []


@pytest.mark.parametrize("secret", [False, True])
def test_a_plug_url_kept_in_plain_text_is_warned_about(capsys, secret):
    """`pulumi config set --secret --path 'nodes[1].power.url'` makes the engine list twinspark:nodes
    among the secret keys; without --secret the URL sits readable in the stack file."""
    from pulumi.runtime import config as runtime_config

    from components.config import load_stack_config

    values = {f"twinspark:{k}": json.dumps(v) for k, v in plugged().items()}
    config = runtime_config.CONFIG.set(values)
    secret_keys = runtime_config._SECRET_KEYS.set({"twinspark:nodes"} if secret else set())
    try:
        cfg = load_stack_config()
    finally:
        runtime_config.CONFIG.reset(config)
        runtime_config._SECRET_KEYS.reset(secret_keys)
    warnings = capsys.readouterr().err
    assert cfg.nodes[1].power is not None and "s3cret" not in warnings
    assert ("power.url is stored in plain text" in warnings) is not secret, warnings
