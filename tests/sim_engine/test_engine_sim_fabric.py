"""The fabric, on the pair the real engine deployed (issue 40, parts 2 and 3). While serving: the head's
guard (launch/serving-guard.py with launch/fabric_watch.py) watches its rails, the worker's (a look
over its re-qualification key every 5 min) and NCCL's choice in each engine start; the head's rail
that goes down mid-serving is alerted by the head's Prometheus, drained at
the gateway, re-qualified (launch/requalify.py: both nodes' fabric checks, the worker's over the
head's forced-command key, then both NCCL ranks) and held while the checks fail; mended, serving
comes back by the guard's next re-qualification, no person involved; and an engine start whose NCCL
fell back to Socket (the vLLM stand-in's nccl-socket-starts knob: no usable RDMA device at that
start) is caught at once and re-qualified into a start on IB.

It replaces the up-time fabric check's rail-down case of test_engine_sim_weights.py (the same
fabric-check.sh, its FAIL line naming the rail, is read here from the guard's hold). ~60 s.

Before anything loads: a rail whose configured HCA is not the one its interface belongs to (iproute2's
`rdma link show`; on the sim's nodes a shim reading the harness's HCA-to-rail map) is refused by the
fabric check with the right pairing, and nothing after the check runs. ~35 s.

And `twinspark doctor` (issue 40, part 1) on the deployed pair: the worker's rail1 at MTU 1500 (RoCE
then negotiates 1024), its drafter's file of other bytes and its GPU clock capped (an nvidia-smi of a
GB10 under `nvidia-smi -lgc`, tests/sim/faults/nvidia-smi-capped) are named for that node and in the
order of what each cost owners, none before they were planted. ~15 s."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest
import sim_model

from core import contract
from cluster import SITE_LANS
from plug_standin import PlugStandin
from scenario_kit import HEAD, SITE, WORKER, changes, completion_status, guard_verdict, ops_access, prometheus, \
    readiness_s, recorder, run_ops, scrape_s, serves, serving_settings, wait_for, with_an_empty_restart_count
from test_engine_sim_healing import set_knob

# the head's NCCL's second rail (rail0 carries Ray, whose loss would end the engine by itself); a worker's
# rail down, seen through its `look` over the head's key (every 5 min), is tests/test_fabric_watch.py's
DOWN_RAIL, DOWN_ON = "rail1", HEAD
GUARD_LOG = f"{contract.LOG_DIR}/{contract.SERVING_GUARD_LOG}"
CAPPED_NVIDIA_SMI = Path(__file__).resolve().parents[1] / "sim" / "faults" / "nvidia-smi-capped"


def hold_of(cluster) -> dict:
    out = cluster.node_exec(HEAD, "cat", contract.SERVING_HOLD, check=False).stdout
    return json.loads(out) if out.strip() else {}


def draining(cluster) -> bool:
    return cluster.node_exec(HEAD, "test", "-f", contract.DRAIN_FILE, check=False).returncode == 0


def alert_state(cluster, name: str) -> str:
    """pending or firing, or '' (the head's Prometheus: its rule's `for` decides which)."""
    states = [a["state"] for a in prometheus(cluster, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name]
    return "firing" if "firing" in states else "pending" if "pending" in states else ""


def log_time(line: str) -> float:
    stamp = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z", line)
    return time.mktime(time.strptime(stamp[1], "%Y-%m-%dT%H:%M:%S")) - time.timezone if stamp else 0.0


def guard_lines(cluster, says: str) -> list[str]:
    log = cluster.node_exec(HEAD, "tail", "-n", "400", GUARD_LOG, check=False).stdout
    return [line for line in log.splitlines() if says in line]


def gateway_503(outputs) -> bool:
    return completion_status(outputs, outputs["apiKey"]) == 503


def test_a_rail_down_mid_serving_is_alerted_drained_held_requalified_and_nccl_on_socket_is_caught(
        cluster, stack, deployed, report):
    outputs = stack.outputs()
    with_an_empty_restart_count(cluster, stack)
    set_knob(cluster, "nccl-socket-starts", "1")  # the engine's next start: NCCL finds no RDMA device
    requalify_s = serving_settings(stack)["guard"]["requalifySeconds"]
    down_at = time.time()
    cluster.in_netns(DOWN_ON, "ip", "link", "set", DOWN_RAIL, "down")
    try:
        wait_for(lambda: draining(cluster), "the gateway drained", 60, interval_s=0.5)
        report["fabric_rail_down_to_drain_s"] = round(time.time() - down_at, 1)
        hold = wait_for(lambda: hold_of(cluster).get("kind") == "fabric" and hold_of(cluster), "the fabric's hold", 120)
        report["fabric_rail_down_to_hold_s"] = round(time.time() - down_at, 1)
        report["fabric_hold_reason"] = hold["reason"]
        assert hold["reason"].startswith(f"fabric: rail {DOWN_RAIL}: link down, expected up"), hold
        # the checks' own words (fabric-check.sh, as `up` runs it): the head's names its link, the
        # worker's (over the head's key) misses the head's rail address
        assert "FAIL sim1 fabric (exit 1): " in hold["reason"] and f"FAIL {WORKER} fabric (exit 1): " in hold["reason"]
        assert f"FAIL rail {DOWN_RAIL}: link expected up, measured down" in hold["reason"], hold
        # and the worker's own rails were read the way a rail of its alone is caught (its forced `look`)
        assert WORKER in guard_verdict(cluster)["fabric"].get("workers_looked_at", {}), guard_verdict(cluster)
        assert gateway_503(outputs), "a client meets the drain's 503, not a dead socket"
        assert guard_verdict(cluster)["hold"]["kind"] == "fabric"
        state = wait_for(lambda: alert_state(cluster, "TwinsparkRailDown"), "TwinsparkRailDown in Prometheus",
                         3 * scrape_s(stack) + 30)
        report["fabric_rail_down_alert_state"] = state
    finally:
        cluster.in_netns(DOWN_ON, "ip", "link", "set", DOWN_RAIL, "up")
    mended_at = time.time()
    # the guard's next re-qualification passes (both fabric checks, both NCCL ranks) and serving
    # starts; that start's NCCL is on Socket (the knob), caught and re-qualified into one on IB
    wait_for(lambda: guard_verdict(cluster).get("restarts_in_window") == 2, "the Socket start caught and re-qualified",
             requalify_s + 2 * readiness_s(stack))
    verdict = guard_verdict(cluster)
    assert verdict["hold"] is None and "NCCL chose Socket, not IB" in verdict["last_restart"]["reason"], verdict
    assert verdict["fabric"]["last_requalification"]["passed"] is True
    wait_for(lambda: completion_status(outputs, outputs["apiKey"]) == 200, "serving on IB", readiness_s(stack))
    report["fabric_mended_to_serving_s"] = round(time.time() - mended_at, 1)
    assert not draining(cluster)
    wait_for(lambda: guard_verdict(cluster).get("fabric", {}).get("nccl_network") == "IB", "NCCL on IB again", 30)
    released = guard_lines(cluster, "fabric re-qualified after the hold")
    caught = guard_lines(cluster, "fabric: NCCL chose Socket, not IB")
    assert released and caught, "the hold's release and the Socket start, in the guard's log"
    report["fabric_hold_release_to_socket_caught_s"] = log_time(caught[-1]) - log_time(released[-1])
    requalified = guard_lines(cluster, "requalify: sim2 nccl-rank:")
    assert requalified, "the worker's NCCL rank ran through the head's re-qualification key"


def test_a_rail_paired_with_the_wrong_hca_is_refused_with_the_right_pairing_before_anything_loads(cluster, stack,
                                                                                                 deployed):
    outputs = stack.outputs()
    # sim2's HCAs swapped between its rails (the config refuses one HCA on two rails itself): rail0 is
    # simroce0's port, rail1 simroce1's
    for rail, hca in ((0, "simroce1"), (1, "simroce0")):
        stack.set_config(f"nodes[1].rails[{rail}].hca", hca)
    try:
        with pytest.raises(AssertionError) as refused:
            stack.up()
    finally:
        for rail, hca in ((0, "simroce0"), (1, "simroce1")):
            stack.set_config(f"nodes[1].rails[{rail}].hca", hca)
    said = str(refused.value)
    for rail, wrong, right in ((0, 1, 0), (1, 0, 1)):
        assert f"fabric-check sim2: FAIL rail rail{rail}: HCA expected simroce{wrong}, measured simroce{right}: " \
               f"rail{rail} is simroce{right}'s port (rdma link show); set hca: simroce{right} on this node's rail " \
               f"with iface: rail{rail}" in said, said
    assert completion_status(outputs, outputs["apiKey"]) == 200, "serving untouched"
    mended = changes(stack.up())
    assert set(mended.values()) <= {"same", "update", "replace"}, mended
    assert {name for name, op in mended.items() if op != "same"} <= {"sim2-fabric-check"}, mended


def doctor(cluster, outputs, operator_home, *flags: str) -> dict:
    proc = run_ops("doctor", "--json", *flags, *ops_access(cluster, outputs, operator_home))
    assert proc.returncode in (0, 1) and proc.stdout, proc.stderr  # 1: causes found
    said = json.loads(proc.stdout)
    assert said["unreached"] == {}, said
    return said


def test_the_doctor_names_planted_differences_costliest_first(cluster, stack, deployed, operator_home, report):
    outputs = stack.outputs()
    planted = {"rail_mtu", "roce_active_mtu", "drafter", "gpu_clock_cap"}
    drafter = f"{outputs['modelDir']}/{sim_model.DRAFTER_FILE}"
    before = doctor(cluster, outputs, operator_home)
    assert not [f for f in before["findings"] if f["node"] == WORKER and f["cause"] in planted], before["findings"]
    cluster.in_netns(WORKER, "ip", "link", "set", "rail1", "mtu", "1500")
    cluster.node_exec(WORKER, "install", "-m", "755", str(CAPPED_NVIDIA_SMI), "/usr/local/bin/nvidia-smi")
    # another drafter's bytes under the same name (the manifest, the head's copy, says otherwise)
    cluster.node_exec(WORKER, "bash", "-c", f"cp -p {drafter} /tmp/drafter.kept && head -c 1M /dev/urandom > {drafter}")
    try:
        after = doctor(cluster, outputs, operator_home, "--live")  # and the endpoint measured, through the gateway
    finally:
        cluster.in_netns(WORKER, "ip", "link", "set", "rail1", "mtu", "9000")
        cluster.node_exec(WORKER, "rm", "-f", "/usr/local/bin/nvidia-smi")
        cluster.node_exec(WORKER, "mv", "/tmp/drafter.kept", drafter)
    found = [(f["cause"], f["evidence"]) for f in after["findings"] if f["node"] == WORKER and f["cause"] in planted]
    report["doctor_planted_findings"] = [f"{f['rank']}. {f['node']} {f['cause']}: {f['evidence']}"
                                         for f in after["findings"]]
    # costliest first: MTU 1500 and the RoCE MTU it brings (prefill -40 %; alike, by name), the drafter
    # (a third of the decode), the clock cap
    assert [cause for cause, _ in found] == ["rail_mtu", "roce_active_mtu", "drafter", "gpu_clock_cap"], after["findings"]
    assert found[0][1] == "MTU rail1 1500; the recipe's 9000"
    assert found[1][1] == "RoCE active MTU rail1 1024; the recipe's 4096"
    assert found[2][1].startswith("drafter sha256 ") and "the head sim1's (the recipe records none)" in found[2][1]
    assert found[3][1] == "SM clock capped at 1200 MHz of 3003 MHz"
    assert not [f for f in after["findings"] if f["node"] == HEAD and f["cause"] in planted]
    # the NCCL the engine's processes loaded, from their INFO lines: the head's stand-in writes them; the
    # worker has them only where a rank of the stand-in ran there (an mp scenario before: a Spark's ranks always do)
    fingerprints = after["fingerprints"]
    assert fingerprints[HEAD]["nccl_image"] == "2.30.7", fingerprints
    assert fingerprints[WORKER]["nccl_image"] in (None, "2.30.7"), fingerprints
    assert all(fp["page_cache_gib"] >= 0 for fp in fingerprints.values()), fingerprints
    live = after["live"]  # the stand-in's figures (no pacing, no drafter), beside the recipe's three
    assert live["errors"] == [] and len(live["figures"]) == 3 and live["single_stream_tok_s"] > 0, live
    report["doctor_live_figures"] = live["figures"]


# ---- a box that stops answering (issue 40, part 4) ------------------------------------------------
XID_LINE = ("2026-12-06T10:00:00+0000 sim2 kernel: NVRM: Xid (PCI:000f:01:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus.")


def watch_lines(cluster, says: str) -> list[str]:
    log = cluster.node_exec(HEAD, "cat", f"{contract.LOG_DIR}/{contract.POWER_WATCH_LOG}", check=False).stdout
    return [line for line in log.splitlines() if says in line]


def test_a_frozen_worker_is_power_cycled_through_its_plug_explained_and_serves_only_once_requalified(
        cluster, stack, deployed, operator_home, report):
    """sim2 frozen (every process SIGSTOPped, as a GB10 out of unified memory): sim1's power watch
    finds no SSH banner, exporter or answer for powerWatch.missSeconds and switches sim2's plug (the
    stand-in) off and on; sim2 boots, its recorder finds the unclean end and keeps the report (the
    Xid line of its last kernel log, its last memory picture), and sim2 waits out of serving until
    the head's guard has re-qualified the fabric and released it. ~90 s."""
    outputs = stack.outputs()
    with_an_empty_restart_count(cluster, stack)
    timings = stack.stack_file()["config"]["twinspark:powerWatch"]
    cluster.node_exec(WORKER, "bash", "-c", f"echo {shlex.quote(XID_LINE)} >> /var/log/twinspark-sim/kernel.log")
    with PlugStandin(cluster, SITE_LANS[SITE]) as plug:
        frozen_at = time.time()
        cluster.freeze(WORKER)
        wait_for(lambda: [e for e in plug.events if e[1:] == (WORKER, "off")], "the watch's power cycle",
                 timings["missSeconds"] + 60)
        off_at = next(t for t, node, turn in plug.events if (node, turn) == (WORKER, "off"))
        wait_for(plug.booted.is_set, f"{WORKER} booted by its plug", 120)
        assert [turn for _, node, turn in plug.events if node == WORKER] == ["off", "on"], plug.events
        booted_at = time.time()
        listing = recorder(cluster, WORKER, "list")
        assert listing["pending_requalification"], listing
        name = listing["pending_requalification"]
        held = cluster.node_exec(WORKER, "cat", contract.UNCLEAN_BOOT_HOLD, check=False).stdout
        assert name in held, "held out of serving at boot, before docker started its container"
        wait_for(lambda: serves(outputs), "serving again once re-qualified", readiness_s(stack) + 120)
        served_at = time.time()
    said = recorder(cluster, WORKER, "show", name)
    assert "Xid" in said["cause"] and "79" in said["cause"] and said["xid_lines"] == [XID_LINE], said
    assert said["memory_picture"]["meminfo_bytes"]["MemTotal"] > 0
    assert said["last_memory_picture_at"] <= frozen_at + 1, "the picture is from before the freeze"
    assert recorder(cluster, WORKER, "list")["pending_requalification"] is None
    assert recorder(cluster, WORKER, "show", name)["requalified_at"] > booted_at
    assert [line for line in guard_lines(cluster, "fabric: sim2: unclean boot") if "re-qualifying" in line], \
        guard_lines(cluster, "fabric:")
    assert watch_lines(cluster, "sim2: power-cycled"), watch_lines(cluster, "sim2")
    # the tools list it, the status names it
    proc = run_ops("forensics", "--json", WORKER, *ops_access(cluster, outputs, operator_home))
    assert proc.returncode == 0 and name in proc.stdout and "Xid" in proc.stdout, proc.stdout + proc.stderr
    report["frozen_to_plug_off_s"] = round(off_at - frozen_at, 1)
    report["plug_off_to_ssh_s"] = round(booted_at - off_at, 1)
    report["plug_booted_to_serving_s"] = round(served_at - booted_at, 1)
