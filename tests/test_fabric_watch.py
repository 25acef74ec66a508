"""The fabric while serving: launch/fabric_watch.py's readings on a staged sysfs, launch/requalify.py
with its two halves (the head's run, a worker's forced command behind a stand-in ssh), and the real
serving guard acting on a rail down and on NCCL's Socket (drain, stop, re-qualify, serve or hold).
The simulator does it on the nodes (tests/sim_engine/test_engine_sim_healing.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.config import ServingGuard as GuardConfig
from core import contract
from test_serving_guard import Node, wait_on_guard
from toolbox import load_launch

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
fabric_watch = load_launch("fabric_watch.py")
IFACE, HCA = "enp1s0f0np0", "rocep1s0f0"
SPEED, MTU = 200000, 9000  # fabric.linkSpeedMbps and fabric.mtu, the program's defaults
RAIL = fabric_watch.Rail(IFACE, HCA, SPEED, MTU)

FAKE_IBV_DEVINFO = """#!/usr/bin/env bash
# ibv_devinfo -d HCA -i 1: the port's state from $FAKE_ROCE_DIR/HCA (PORT_ACTIVE when absent)
hca=$2
state=$(cat "$FAKE_ROCE_DIR/$hca" 2>/dev/null || echo PORT_ACTIVE)
printf 'hca_id:\\t%s\\n\\tport:\\t1\\n\\t\\tstate:\\t\\t\\t%s (4)\\n\\t\\tactive_mtu:\\t\\t4096 (5)\\n' "$hca" "$state"
"""


def write(path: Path, text) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")


def stage_rail(root: Path, operstate="up", speed=SPEED, mtu=MTU, width=16, max_width=16, gts=32.0, max_gts=32.0,
               symbol_errors=0, aer_nonfatal=0) -> None:
    """A ConnectX-7 rail as sysfs shows it: the link, the port's counters, its PCIe device."""
    net = root / "class/net" / IFACE
    for name, value in (("operstate", operstate), ("speed", speed), ("mtu", mtu)):
        write(net / name, value)
    port = root / "class/infiniband" / HCA / "ports/1"
    write(port / "counters/symbol_error", symbol_errors)
    write(port / "counters/port_rcv_errors", 0)
    write(port / "hw_counters/out_of_sequence", 0)
    device = root / "class/infiniband" / HCA / "device"
    write(device / "current_link_width", width)
    write(device / "max_link_width", max_width)
    write(device / "current_link_speed", f"{gts:g} GT/s PCIe")
    write(device / "max_link_speed", f"{max_gts:g} GT/s PCIe")
    write(device / "aer_dev_nonfatal", f"Undefined 0\nDLP 0\nTOTAL_ERR_NONFATAL {aer_nonfatal}")


@pytest.fixture
def roce(tmp_path, monkeypatch):
    bin_dir, states = tmp_path / "roce-bin", tmp_path / "roce"
    bin_dir.mkdir()
    states.mkdir()
    (bin_dir / "ibv_devinfo").write_text(FAKE_IBV_DEVINFO)
    (bin_dir / "ibv_devinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ROCE_DIR", str(states))
    return states


def kinds(findings) -> list[str]:
    return [f.kind for f in findings]


def test_a_healthy_rail_at_the_programs_defaults_says_nothing(tmp_path, roce):
    stage_rail(tmp_path)
    first = fabric_watch.read_rail(RAIL, tmp_path)
    assert (first.operstate, first.speed_mbps, first.mtu, first.roce_state, first.roce_active_mtu, first.errors) == \
        ("up", SPEED, MTU, "PORT_ACTIVE", 4096, 0)
    assert first.pcie == {"width": 16, "max_width": 16, "speed_gts": 32.0, "max_speed_gts": 32.0}
    assert fabric_watch.judge(fabric_watch.read_rail(RAIL, tmp_path), first) == []


@pytest.mark.parametrize("change, kind, said, acted", [
    ({"operstate": "down"}, "down", f"rail {IFACE}: link down, expected up", True),
    ({"speed": 100000}, "throttled", "link at 100000 Mb/s, expected 200000 Mb/s", True),
    ({"width": 4}, "throttled", f"{HCA}'s PCIe link x4, the card does x16", True),  # the ~13 Gb/s ConnectX-7
    ({"gts": 2.5}, "throttled", "PCIe link at 2.5 GT/s, the card does 32 GT/s", True),
    ({"mtu": 1500}, "mtu", "MTU 1500, expected 9000", False),
    ({"symbol_errors": 7}, "errors", "7 new RoCE port errors", False),
    ({"aer_nonfatal": 2}, "aer", f"2 new nonfatal PCIe AER events on {HCA}", False),
])
def test_each_fault_is_named_and_only_the_worst_stop_serving(tmp_path, roce, change, kind, said, acted):
    stage_rail(tmp_path)
    before = fabric_watch.read_rail(RAIL, tmp_path)
    stage_rail(tmp_path, **change)
    findings = fabric_watch.judge(fabric_watch.read_rail(RAIL, tmp_path), before)
    assert kinds(findings) == [kind] and said in findings[0].message, findings
    assert bool(fabric_watch.act_on(findings)) is acted


def test_a_roce_port_not_active_is_a_rail_down(tmp_path, roce):
    stage_rail(tmp_path)
    (roce / HCA).write_text("PORT_DOWN")
    findings = fabric_watch.judge(fabric_watch.read_rail(RAIL, tmp_path))
    assert kinds(findings) == ["down"] and "RoCE rocep1s0f0 PORT_DOWN" in findings[0].message


def test_ncclss_choice_is_read_from_the_files_of_this_start_alone(tmp_path):
    debug = tmp_path / "nccl"
    assert fabric_watch.nccl_network(debug, 0) == (None, None)  # no folder yet: nothing said
    debug.mkdir()
    old = debug / "nccl.spark1.10.log"
    old.write_text("spark1:10 NCCL INFO Using network Socket\n")
    os.utime(old, (time.time() - 600, time.time() - 600))
    since = time.time() - 60
    assert fabric_watch.nccl_network(debug, since) == (None, None), "an earlier start's file is not this start's"
    (debug / "nccl.spark1.20.log").write_text("spark1:20 NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE\n"
                                              "spark1:20 NCCL INFO Using network IB\n")
    assert fabric_watch.nccl_network(debug, since)[0] == "IB"
    (debug / "nccl.spark1.21.log").write_text("spark1:21 NCCL INFO NET/IB : No device found.\n"
                                              "spark1:21 NCCL INFO Using network Socket\n")
    assert fabric_watch.nccl_network(debug, since) == ("Socket", str(debug / "nccl.spark1.21.log"))


# ---- requalify.py: the head's run and a worker's forced command -----------------------------
FAKE_CHECK = """#!/usr/bin/env bash
# a check's stand-in: records when it ran and with what, passes unless $VERDICTS/NODE-VERB says fail (or hang)
verb=$(basename "$0" .sh); node=$(cat "$(dirname "$0")/node")
echo "$node $verb start $(date +%s.%N) $*" >> "$RECORD"
# an NCCL rank's roll call: it ends only once $RANKS ranks (default 1) have started, as a real rank
# waits for the others (a fixed sleep let one rank end before the other began on a loaded machine)
if [ "$verb" = nccl-check ]; then
  cat > /dev/null
  for _ in $(seq 150); do [ "$(grep -c " nccl-check start " "$RECORD")" -ge "${RANKS:-1}" ] && break; sleep 0.2; done
fi
echo "$node $verb end $(date +%s.%N)" >> "$RECORD"
verdict=$(cat "$VERDICTS/$node-$verb" 2>/dev/null || true)
[ "$verdict" = hang ] && sleep 600
if [ "$verdict" = fail ]; then echo "FAIL rail enp1s0f0np0: link expected up"; exit 1; fi
echo "$verb healthy"
"""
FAKE_SSH = """#!/usr/bin/env bash
# ssh as sshd runs a forced command: the client's command line arrives in SSH_ORIGINAL_COMMAND
echo "$*" >> "$SSH_RECORD"
verb="${@: -1}"
SSH_ORIGINAL_COMMAND="$verb" exec python3 "$WORKER_LIB/requalify.py" forced --plan "$WORKER_LIB/requalify/plan.json"
"""


def install_half(lib: Path, node: str, plan: dict) -> None:
    """requalify.py and its checks as FabricRequalify installs them, the checks stood in for."""
    (lib / "requalify").mkdir(parents=True)
    shutil.copy(LAUNCH / contract.REQUALIFY_SCRIPT, lib)
    for name in ("fabric-check.sh", "nccl-check.sh"):
        (lib / "requalify" / name).write_text(FAKE_CHECK)
    (lib / "requalify" / "nccl-allreduce-check.py").write_text("print('the check program')\n")
    shutil.copy(LAUNCH / contract.FABRIC_WATCH_MODULE, lib / "requalify")  # a worker's `look` reads with it
    (lib / "requalify" / "node").write_text(node)
    (lib / "requalify" / "plan.json").write_text(json.dumps({"node": node, **plan}))


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A head's and a worker's halves, the worker behind a stand-in ssh."""
    head, worker = tmp_path / "head", tmp_path / "worker"
    install_half(head, "spark1", {"fabric": ["--node", "spark1", "--memlock", "skip"], "nccl": ["--node", "spark1"],
                                  "peers": [{"node": "spark2", "address": "10.0.0.2"}], "user": "twinspark",
                                  "key": "~/.ssh/twinspark_requalify", "known_hosts": "~/.ssh/known"})
    install_half(worker, "spark2", {"fabric": ["--node", "spark2", "--memlock", "skip"], "nccl": ["--node", "spark2"]})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    (tmp_path / "verdicts").mkdir()
    for name, value in (("PATH", f"{bin_dir}:{os.environ['PATH']}"), ("RECORD", tmp_path / "record"),
                        ("SSH_RECORD", tmp_path / "ssh-record"), ("VERDICTS", tmp_path / "verdicts"), ("RANKS", "2"),
                        ("WORKER_LIB", worker)):
        monkeypatch.setenv(name, str(value))
    return tmp_path


def requalify(lib: Path, mode="run", env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(lib / "requalify.py"), mode, "--plan", str(lib / "requalify/plan.json")],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)


def test_a_requalification_runs_every_fabric_check_then_the_nccl_ranks_together(pair):
    done = requalify(pair / "head")
    assert done.returncode == 0, done.stdout + done.stderr
    record = (pair / "record").read_text().splitlines()
    starts = {tuple(line.split()[:2]): line for line in record if " start " in line}
    assert starts[("spark1", "fabric-check")].endswith("--node spark1 --memlock skip")
    assert starts[("spark2", "fabric-check")].endswith("--node spark2 --memlock skip"), "the worker's own plan"
    assert record.index(starts[("spark1", "nccl-check")]) > record.index(starts[("spark2", "fabric-check")])
    # the ranks overlap: each started before the other ended (a rank alone fails its roll call)
    times = {(line.split()[0], line.split()[2]): float(line.split()[3]) for line in record if "nccl-check" in line}
    assert times[("spark1", "start")] < times[("spark2", "end")] and times[("spark2", "start")] < times[("spark1", "end")]
    ssh = (pair / "ssh-record").read_text().splitlines()
    key = os.path.expanduser("~/.ssh/twinspark_requalify")
    assert ssh[0] == (f"-i {key} -o BatchMode=yes -o IdentitiesOnly=yes -o UserKnownHostsFile="
                      f"{os.path.expanduser('~/.ssh/known')} -o StrictHostKeyChecking=yes -o ConnectTimeout=10 "
                      "twinspark@10.0.0.2 fabric")
    assert "spark2 fabric: fabric-check healthy" in done.stdout


def test_a_failing_worker_fabric_check_fails_the_requalification_by_name_and_runs_no_nccl(pair):
    (pair / "verdicts" / "spark2-fabric-check").write_text("fail")
    done = requalify(pair / "head")
    assert done.returncode == 1
    assert "FAIL spark2 fabric (exit 1): FAIL rail enp1s0f0np0: link expected up" in done.stdout
    assert "nccl-check" not in (pair / "record").read_text()


@pytest.mark.parametrize("asked", ["", "bash", "fabric; id", "nccl-rank --node spark9", "rm -rf /"])
def test_the_forced_command_runs_only_its_two_verbs(pair, asked):
    done = requalify(pair / "worker", "forced", {"SSH_ORIGINAL_COMMAND": asked})
    assert done.returncode == 2 and "this key may run only fabric, nccl-rank, look" in done.stderr
    assert not (pair / "record").exists(), "nothing ran"


# ---- the guard acting on the fabric --------------------------------------------------------
class FabricHead(Node):
    """The guard installed as on the head (serving-guard.py, fabric_watch.py, requalify.py in one
    folder, the checks under requalify/), its rails on a staged sysfs, the checks stood in for."""

    def start_watching(self, requalify_interval=2.0, worker=False, **kwargs):
        """`worker`: a worker spark2 too, its rails on a sysfs of its own, reached through a stand-in ssh."""
        lib, self.sys_root = self.tmp / "lib", self.tmp / "sys"
        plan: dict = {"fabric": ["--node", "spark1"], "nccl": ["--node", "spark1"]}
        if worker:
            self.worker_sys, worker_lib = self.tmp / "worker-sys", self.tmp / "worker"
            stage_rail(self.worker_sys)
            install_half(worker_lib, "spark2", {"fabric": ["--node", "spark2", "--mtu", str(MTU), "--speed-mbps",
                                                           str(SPEED), "--rail", f"{IFACE}:{HCA}:10.0.0.1"],
                                                "nccl": ["--node", "spark2"], "sys_root": str(self.worker_sys)})
            plan.update(peers=[{"node": "spark2", "address": "10.0.0.2"}], user="twinspark",
                        key="~/.ssh/twinspark_requalify", known_hosts="~/.ssh/known")
            ssh_bin = self.tmp / "ssh-bin"
            ssh_bin.mkdir()
            (ssh_bin / "ssh").write_text(FAKE_SSH)
            (ssh_bin / "ssh").chmod(0o755)
            self.env.update(PATH=f"{ssh_bin}:{self.env['PATH']}", WORKER_LIB=str(worker_lib),
                            SSH_RECORD=str(self.tmp / "ssh-record"))
        install_half(lib, "spark1", plan)
        for name in (contract.SERVING_GUARD_SCRIPT, contract.FABRIC_WATCH_MODULE):
            shutil.copy(LAUNCH / name, lib)
        stage_rail(self.sys_root)
        self.drain_file, self.debug_dir = self.tmp / "drain" / "draining", self.tmp / "nccl"
        self.verdicts, self.record = self.tmp / "verdicts", self.tmp / "record"
        self.verdicts.mkdir()
        (self.tmp / "roce").mkdir()
        roce_bin = self.tmp / "roce-bin"
        roce_bin.mkdir()
        (roce_bin / "ibv_devinfo").write_text(FAKE_IBV_DEVINFO)
        (roce_bin / "ibv_devinfo").chmod(0o755)
        self.env.update(PATH=f"{roce_bin}:{self.env['PATH']}", FAKE_ROCE_DIR=str(self.tmp / "roce"),
                        RECORD=str(self.record), VERDICTS=str(self.verdicts))
        self.guard_script = lib / contract.SERVING_GUARD_SCRIPT
        self.fabric_flags = ["--rail", f"{IFACE}:{HCA}", "--rail-speed-mbps", str(SPEED), "--rail-mtu", str(MTU),
                             "--nccl-debug-dir", str(self.debug_dir), "--drain-file", str(self.drain_file),
                             "--drain-seconds", "5", "--requalify-plan", str(lib / "requalify/plan.json"),
                             "--requalify-interval", str(requalify_interval), "--sys-root", str(self.sys_root),
                             "--worker-look-interval", "1"]
        return self.start(**kwargs)

    def checks_run(self) -> list[str]:
        return [" ".join(line.split()[:2]) for line in self.record.read_text().splitlines() if " start " in line] \
            if self.record.exists() else []


@pytest.fixture
def fabric_head(tmp_path):
    node = FabricHead(tmp_path)
    yield node
    node.stop()


def textfile_series(head) -> dict:
    text = head.textfile.read_text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_rail_down_drains_stops_requalifies_and_serves_again(fabric_head):
    head = fabric_head.start_watching()
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    assert head.checks_run() == [] and not head.drain_file.exists()
    stage_rail(head.sys_root, operstate="down")
    wait_on_guard(lambda: head.checks_run() == ["spark1 fabric-check", "spark1 nccl-check"], "the re-qualification",
                  head)
    stage_rail(head.sys_root)  # the flap ended: the checks passed
    wait_on_guard(lambda: head.state()["running"] and head.status["restarts_in_window"] == 1, "serving again", head)
    # the policy lowered first (a guard that dies meanwhile finds the mark and starts serving), put back
    assert head.calls() == ["update --restart=no " + contract.SERVING_CONTAINER, f"stop {contract.SERVING_CONTAINER}",
                            f"update --restart={contract.SERVING_RESTART_POLICY} {contract.SERVING_CONTAINER}",
                            f"start {contract.SERVING_CONTAINER}"]
    log = head.guard_log()
    assert f"fabric: rail {IFACE}: link down, expected up: draining, stopping serving" in log
    assert "drain ended: the gateway takes requests again" in log and not head.drain_file.exists()
    assert head.status["last_restart"]["reason"] == f"fabric re-qualified after: rail {IFACE}: link down, expected up"
    assert head.status["fabric"]["last_requalification"]["passed"] is True
    wait_on_guard(lambda: textfile_series(head)[("twinspark_guard_requalifications_total", ())] == 1,
                  "the re-qualification counted in the textfile", head)
    series = textfile_series(head)
    assert series[("twinspark_fabric_pcie_link_width", (("device", HCA), ("rail", IFACE)))] == 16
    assert series[("twinspark_guard_draining", ())] == 0


def test_checks_that_fail_hold_serving_with_their_reason_until_they_pass(fabric_head):
    head = fabric_head.start_watching()
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    (head.verdicts / "spark1-fabric-check").write_text("fail")
    stage_rail(head.sys_root, width=4)  # a ConnectX-7 trained at x4
    wait_on_guard(lambda: head.hold_file.exists(), "the fabric's hold", head)
    hold = json.loads(head.hold_file.read_text())
    assert hold["kind"] == "fabric"
    assert f"{HCA}'s PCIe link x4, the card does x16" in hold["reason"]
    assert "FAIL spark1 fabric (exit 1): FAIL rail enp1s0f0np0: link expected up" in hold["reason"]
    wait_on_guard(lambda: head.state()["policy"] == "no" and not head.state()["running"], "serving stopped, held", head)
    assert head.drain_file.exists(), "clients get the drain's 503 while held, not a 502"
    assert "nccl-check" not in " ".join(head.checks_run())
    stage_rail(head.sys_root)  # reseated
    (head.verdicts / "spark1-fabric-check").unlink()
    # the drain ends just after the container starts (serve_again), the status file at the tick's end:
    # both waited for with it
    wait_on_guard(lambda: head.state()["running"] and not head.hold_file.exists() and not head.drain_file.exists()
                  and head.status["restarts_in_window"] >= 1,
                  "served again once the checks pass, the drain ended, the restart counted", head)
    assert head.state()["policy"] == contract.SERVING_RESTART_POLICY
    assert head.status["restarts_in_window"] == 1, "the hold's release is a restart; the count is kept"
    assert head.checks_run().count("spark1 fabric-check") >= 2


def test_a_rail_mended_while_held_is_requalified_at_once_not_at_the_next_interval(fabric_head):
    """Issue 42 item 4: held for the fabric, the head's rails are read every tick; the cable back
    in re-qualifies at once (at the program's default interval, 120 s, the wait was up to that)."""
    head = fabric_head.start_watching(requalify_interval=GuardConfig().requalify_seconds)
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    (head.verdicts / "spark1-fabric-check").write_text("fail")
    stage_rail(head.sys_root, operstate="down")
    wait_on_guard(lambda: head.hold_file.exists(), "the fabric's hold", head)
    stage_rail(head.sys_root)  # plugged back
    (head.verdicts / "spark1-fabric-check").unlink()
    wait_on_guard(lambda: head.state()["running"] and not head.hold_file.exists(), "served again", head)
    assert "the head's rails read healthy again: re-qualifying now" in head.guard_log()


def test_a_guard_that_dies_mid_requalification_is_followed_by_one_that_serves_again(fabric_head):
    """systemd restarts a guard that died (here: killed while its checks hang): the serving container
    it stopped must not stay stopped — the mark it left says the policy was its to put back."""
    head = fabric_head.start_watching()
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    (head.verdicts / "spark1-fabric-check").write_text("hang")
    stage_rail(head.sys_root, operstate="down")
    wait_on_guard(lambda: head.checks_run() == ["spark1 fabric-check"] and not head.state()["running"],
                  "serving stopped, the checks running", head)
    head.proc.kill()
    head.proc.wait()
    subprocess.run(["pkill", "-f", str(head.tmp / "lib")])  # its re-qualification and the hanging check with it
    stage_rail(head.sys_root)
    (head.verdicts / "spark1-fabric-check").unlink()
    head.start()  # what systemd's Restart=always does
    wait_on_guard(lambda: head.state()["running"] and head.state()["policy"] == contract.SERVING_RESTART_POLICY,
                  "serving started by the next guard", head)


def test_a_workers_rail_down_is_seen_through_its_look_and_requalified(fabric_head):
    """On a switch the head's end stays up when a worker's goes down: the guard asks each worker for
    a look at its own rails (requalify.py peers-look, the worker's forced `look`)."""
    head = fabric_head.start_watching(worker=True)
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    wait_on_guard(lambda: "look" in (head.tmp / "ssh-record").read_text(), "the worker looked at", head)
    assert head.checks_run() == []
    # the worker's PCIe link as its look read it, in the head's textfile under the worker's name
    worker_width = ("twinspark_fabric_pcie_link_width", (("device", HCA), ("peer", "spark2"), ("rail", IFACE)))
    wait_on_guard(lambda: textfile_series(head).get(worker_width) == 16, "the worker's series", head)
    stage_rail(head.worker_sys, operstate="down")
    wait_on_guard(lambda: {"spark1 fabric-check", "spark2 fabric-check"} <= set(head.checks_run()),
                  "both nodes' fabric checks", head)
    stage_rail(head.worker_sys)  # the flap ended
    wait_on_guard(lambda: head.status["restarts_in_window"] == 1 and head.state()["running"], "serving again", head)
    assert head.status["last_restart"]["reason"] == f"fabric re-qualified after: spark2 rail {IFACE}: link down, expected up"
    assert f"fabric: spark2 rail {IFACE}: link down, expected up" in head.guard_log()


def test_a_workers_look_reports_its_rails_and_an_unreachable_one_says_why(pair):
    worker_sys = pair / "worker-sys"
    stage_rail(worker_sys, width=4)
    plan = json.loads((pair / "worker/requalify/plan.json").read_text())
    plan["fabric"] = ["--node", "spark2", "--mtu", str(MTU), "--speed-mbps", str(SPEED), "--rail", f"{IFACE}:{HCA}:10.0.0.1"]
    (pair / "worker/requalify/plan.json").write_text(json.dumps({**plan, "sys_root": str(worker_sys)}))
    done = requalify(pair / "head", "peers-look")
    looks = json.loads(done.stdout)
    [record] = looks["spark2"]["rails"]
    reading = fabric_watch.reading_of(record)
    assert reading.rail == RAIL and reading.pcie["width"] == 4
    assert [f.kind for f in fabric_watch.judge(reading)] == ["throttled"]
    (pair / "worker/requalify/plan.json").unlink()  # a worker whose plan is gone answers with an error
    assert "error" in json.loads(requalify(pair / "head", "peers-look").stdout)["spark2"]


def test_nccl_on_socket_after_a_start_is_caught_at_once_and_a_start_on_ib_is_not(fabric_head):
    head = fabric_head.start_watching()
    head.debug_dir.mkdir()
    head.set(started_at=time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(time.time() - 5)))
    (head.debug_dir / "nccl.spark1.100.log").write_text("spark1:100 NCCL INFO Using network IB\n")
    wait_on_guard(lambda: head.status["ok"] is True, "a first passing round", head)
    wait_on_guard(lambda: head.status["fabric"]["nccl_network"] == "IB", "NCCL's IB read", head)
    (head.debug_dir / "nccl.spark1.101.log").write_text("spark1:101 NCCL INFO NET/IB : No device found.\n"
                                                        "spark1:101 NCCL INFO Using network Socket\n")
    wait_on_guard(lambda: head.status["restarts_in_window"] == 1, "serving restarted after the re-qualification", head)
    assert "NCCL chose Socket, not IB" in head.status["last_restart"]["reason"]
    assert head.checks_run() == ["spark1 fabric-check", "spark1 nccl-check"]
    time.sleep(3 * 2.0)  # the restarted engine's start has no Socket file of its own: nothing more
    assert head.status["restarts_in_window"] == 1 and head.checks_run() == ["spark1 fabric-check", "spark1 nccl-check"]


def test_the_guards_unit_watches_the_heads_rails_and_requalifies_with_the_plan():
    from components.serving_guard import ServingGuardArgs, guard_argv
    from components.config import ServingGuard as GuardConfig
    args = ServingGuardArgs("spark1", None, 8000, ["spark1", "spark2"], GuardConfig(),
                            rails=[(IFACE, HCA), ("enP2p1s0f0np0", "roceP2p1s0f0")], rail_speed_mbps=SPEED, rail_mtu=MTU)
    argv = guard_argv(args)
    flags = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1) if argv[i].startswith("--")}
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--rail"] == [f"{IFACE}:{HCA}", "enP2p1s0f0np0:roceP2p1s0f0"]
    assert flags["--drain-file"] == contract.DRAIN_FILE and flags["--requalify-plan"] == contract.REQUALIFY_PLAN
    assert flags["--nccl-debug-dir"] == contract.NCCL_DEBUG_DIR
    # the defaults the program runs with
    assert (flags["--drain-seconds"], flags["--requalify-interval"]) == ("30", "120")
    assert "--rail" not in guard_argv(ServingGuardArgs("spark1", None, 8000, ["spark1"], GuardConfig()))


# ---- the RoCE v2 GID over IPv4, for NCCL_IB_GID_INDEX (launch/roce-gid.py) --------------------
def stage_gids(root: Path, hca: str, iface: str, address: str, ipv4_at: int = 2) -> None:
    """A ConnectX-7 port's GID table as the kernel fills it: the link-local IPv6 GID as RoCE v1 and
    v2 first, then each IPv4 address's pair from `ipv4_at` on."""
    port = root / "class/infiniband" / hca / "ports/1"
    mapped = "0000:0000:0000:0000:0000:ffff:" + "{:02x}{:02x}:{:02x}{:02x}".format(*map(int, address.split(".")))
    entries = [("fe80:0000:0000:0000:5e45:22ff:fe10:0001", "IB/RoCE v1"), ("fe80:0000:0000:0000:5e45:22ff:fe10:0001",
                                                                           "RoCE v2")]
    entries += [("0000:0000:0000:0000:0000:0000:0000:0000", "")] * (ipv4_at - 2)  # an unused slot
    entries += [(mapped, "IB/RoCE v1"), (mapped, "RoCE v2")]
    for index, (gid, kind) in enumerate(entries):
        write(port / "gids" / str(index), gid)
        write(port / "gid_attrs/types" / str(index), kind)
        write(port / "gid_attrs/ndevs" / str(index), iface if kind else "")


def roce_gid(root: Path, hcas: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LAUNCH / "roce-gid.py"), "--hca", hcas, "--sys-root", str(root)],
                          capture_output=True, text=True, timeout=30)


def test_the_gid_index_is_the_roce_v2_ipv4_entry_of_every_hca(tmp_path):
    stage_gids(tmp_path, "rocep1s0f0", "enp1s0f0np0", "10.0.0.1")
    stage_gids(tmp_path, "roceP2p1s0f0", "enP2p1s0f0np0", "10.0.1.1")
    done = roce_gid(tmp_path, "rocep1s0f0,roceP2p1s0f0")
    assert done.stdout == "3\n", done.stderr
    assert "rocep1s0f0: GID 3 is RoCE v2 over 10.0.0.1 (enp1s0f0np0)" in done.stderr
    assert roce_gid(tmp_path, "=rocep1s0f0:1,=roceP2p1s0f0:1").stdout == "3\n", "NCCL_IB_HCA's exact-match and port forms"


@pytest.mark.parametrize("second_at, why", [
    (4, "the HCAs' indexes differ and NCCL_IB_GID_INDEX is one for all"),
    (None, "roceP2p1s0f0: no GID table"),
])
def test_no_index_is_given_where_the_hcas_disagree_or_one_has_none(tmp_path, second_at, why):
    stage_gids(tmp_path, "rocep1s0f0", "enp1s0f0np0", "10.0.0.1")
    if second_at is not None:
        stage_gids(tmp_path, "roceP2p1s0f0", "enP2p1s0f0np0", "10.0.1.1", ipv4_at=second_at)
    done = roce_gid(tmp_path, "rocep1s0f0,roceP2p1s0f0")
    assert done.returncode == 0 and done.stdout == "", "serving starts; NCCL picks the GID itself"
    assert why in done.stderr, done.stderr
