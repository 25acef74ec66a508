"""ops status and ops clear-hold: the endpoint, each node's probe (through a local runner standing in
for SSH), the guard, the hold, the memory check and the firewall."""

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from core import contract
from ops import status
from ops.nodes import NODE_PROBE
from ops.output import tool_console
from ops_helpers import quiet


METRICS = """# HELP vllm:spec_decode_num_drafts_total drafts
vllm:spec_decode_num_drafts_total{model_name="fake-model"} 100
vllm:spec_decode_num_draft_tokens_total{model_name="fake-model"} 700
vllm:spec_decode_num_accepted_tokens_total{model_name="fake-model"} 350
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",position="0"} 93
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",position="1"} 80
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",position="2"} 60
vllm:num_requests_running{model_name="fake-model"} 2
vllm:num_requests_waiting{model_name="fake-model"} 1
"""


def test_endpoint_status_reads_spec_decode_and_queue(endpoint):
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    ep = status.endpoint_status(target.base_url, target.api_key)
    assert ep["health"] == 200 and ep["model"] == "fake-model"
    assert ep["requests_running"] == 2 and ep["requests_waiting"] == 1
    assert ep["spec_decode"]["acceptance"] == 0.5
    assert ep["spec_decode"]["per_position"] == [0.93, 0.80, 0.60]
    assert ep["spec_decode"]["mean_accepted_length"] == 4.5
    assert status.endpoint_status(target.base_url, "wrong")["models_status"] == 401


MP_MEMBERSHIP = Path(__file__).resolve().parents[2] / "launch" / contract.MP_MEMBERSHIP_SCRIPT


def shim_bin(tmp_path, restarting="false", restart_count=0, ray_gpus=(1, 1), driver="580.173.02",
             firewall_unit="active", firewall_loaded=True):
    """docker, nvidia-smi, ibv_devinfo, systemctl, sudo and nft as a Spark would answer them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    nodes = json.dumps([{"node_id": f"n{i}", "node_ip": f"10.0.0.{i + 1}", "gpus": g} for i, g in enumerate(ray_gpus)])
    scripts = {
        "docker": f"""#!/bin/sh
case "$1 $3" in
  "inspect {{{{.Image}}}}") echo sha256:served ;;
  inspect*) echo '{{"Status":"running","Restarting":{restarting},"StartedAt":"2026-11-29T10:00:00Z",\
"ExitCode":0}}|{restart_count}' ;;
  image*) echo sha256:served ;;
  run*) cat >/dev/null; echo '{{"vllm": "0.25.2", "nccl": "2.30.7", "nccl_pip": null}}' ;;
  exec*) case "$*" in *"/twinspark/ray-membership.py alive --head 10.0.0.1 --gcs-port 6379") echo '{nodes}' ;;
    # the real rank watch, on this machine's TCP table (the container shares the host's network)
    *"/twinspark/{contract.MP_MEMBERSHIP_SCRIPT} alive "*) shift 4; exec python3 {MP_MEMBERSHIP} "$@" ;;
    *) exit 1 ;; esac ;;
esac""",
        "nvidia-smi": f"""#!/bin/sh
case "$1" in
  # temperature, power, SM clock, max SM clock, throttle reasons (power cap + hardware thermal)
  --query-gpu=temperature*) echo '71, 64.25, 2405, 3003, 0x0000000000000044' ;;
  --query-gpu=driver*) echo '{driver}, NVIDIA GB10' ;;
  *) echo '| Driver Version: {driver}   CUDA Version: 13.0 |' ;;
esac""",
        "ibv_devinfo": "#!/bin/sh\nprintf '\\tstate:\\t\\t\\tPORT_ACTIVE (4)\\n\\tactive_mtu:\\t\\t4096 (5)\\n'",
        # `systemctl is-active` prints the state and exits 0 for active only
        "systemctl": f"""#!/bin/sh
[ "$1 $2" = "is-active {contract.FIREWALL_UNIT}" ] || exit 4
echo {firewall_unit}; [ {firewall_unit} = active ]""",
        "sudo": '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"',
        # nft's own answer for a table that is not there
        "nft": f"""#!/bin/sh
[ "$*" = "list table inet {contract.FIREWALL_TABLE}" ] || exit 1
case {firewall_loaded} in
  True) echo 'table inet {contract.FIREWALL_TABLE} {{'; echo '}}' ;;
  False) echo 'Error: No such file or directory' >&2; echo "$*" >&2; exit 1 ;;
  *) echo 'netlink: Error: cache initialization failed: Operation not permitted' >&2; exit 1 ;;
esac""",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text + "\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def local_runner(bin_dir, per_node=None, run_dir=None):
    """The probes run here instead of over ssh: same script, same arguments, same stdin
    (`per_node`: another shim directory for some nodes; the node's state files, the contract's
    RUN_DIR, read from `run_dir`)."""
    def run(node, args, probe=NODE_PROBE):
        path = (per_node or {}).get(node["name"], bin_dir)
        if run_dir is not None:
            args = [a.replace(contract.RUN_DIR, str(run_dir)) for a in args]
        proc = subprocess.run([sys.executable, "-", *args], input=probe.read_text(), capture_output=True,
                              text=True, env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}"}, check=True)
        return proc.stdout
    return run


NODES = [
    {"name": "spark1", "role": "head", "host": "h1", "rayIp": "10.0.0.1",
     "rails": [{"iface": "lo", "hca": "rocep1s0f0", "address": "10.0.0.1/24"}]},
    {"name": "spark2", "role": "worker", "host": "h2", "rayIp": "10.0.0.2",
     "rails": [{"iface": "lo", "hca": "rocep1s0f0", "address": "10.0.0.2/24"}]},
]


def test_node_probe_reports_container_rails_gpu_and_ray(tmp_path):
    out = json.loads(local_runner(shim_bin(tmp_path, restart_count=3))(NODES[0], status.probe_args(NODES[0])))
    assert out["memory_check"] is None and out["guard"] is None and out["hold"] is None  # none written here
    assert out["container"] == {"name": "twinspark-serving", "present": True, "status": "running", "restarting": False,
                                "restart_count": 3, "started_at": "2026-11-29T10:00:00Z", "exit_code": 0}
    assert out["rails"][0]["operstate"] == "unknown" and out["rails"][0]["mtu"] == 65536  # lo, read from sysfs
    assert out["rails"][0]["roce_state"] == "PORT_ACTIVE" and out["rails"][0]["roce_active_mtu"] == 4096
    assert out["gpu"] == {"temperature_c": 71.0, "power_w": 64.25, "sm_clock_mhz": 2405.0, "max_sm_clock_mhz": 3003.0,
                          "throttle": ["power cap", "thermal (hardware)"]}
    assert [n["node_ip"] for n in out["ray"]["nodes"]] == ["10.0.0.1", "10.0.0.2"]


def test_status_exit_code_and_problems(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    target.nodes = NODES
    run_dir = node_state(tmp_path / "run", guard=GUARD_OK)
    healthy = status.collect(target, local_runner(shim_bin(tmp_path), run_dir=run_dir))
    for node in healthy["nodes"]:  # lo stands in for a rail: make it look like a good one
        node["rails"][0].update(operstate="up", speed_mbps=200000, mtu=9000)
    assert status.problems(healthy, 9000, 200000) == []

    sick = status.collect(target, local_runner(shim_bin(tmp_path / "sick", restarting="true", ray_gpus=(1,))))
    found = status.problems(sick, 9000, 200000)
    assert any("spark2: container twinspark-serving running (restarts: 0)" in f for f in found)
    assert any("spark1: Ray has 1 of 2 GPU nodes alive" in f for f in found)
    assert any("spark1 rail lo: MTU 65536, expected 9000" in f for f in found)
    assert status.run_status(target, local_runner(shim_bin(tmp_path / "sick2")), True, 9000, 200000, quiet()) == 1


def test_status_shows_each_nodes_platform_and_judges_it_with_the_stacks_acknowledgements(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    target.nodes = NODES
    updated = local_runner(shim_bin(tmp_path), {"spark2": shim_bin(tmp_path / "updated", driver="590.44.01")})
    report = status.collect(target, updated)
    assert [n["platform"]["facts"]["driver"] for n in report["nodes"]] == ["580.173.02", "590.44.01"]
    assert report["nodes"][0]["platform"]["facts"]["vllm"] == "0.25.2"
    found = [f for f in status.problems(report, 9000, 200000) if f.startswith("platform: ")]
    assert [f.split(" ")[1:4] for f in found] == [["nodes", "differ", "in"], ["known", "issue", "driver-590-cudagraph-deadlock"]]
    assert "spark1 has '580.173.02', spark2 has '590.44.01'" in found[0]
    # what the stack acknowledged (its `platform` output) is accepted here too
    target.outputs = {"platform": {"acknowledge": ["mismatch:driver", "driver-590-cudagraph-deadlock"]}}
    assert not [f for f in status.problems(status.collect(target, updated), 9000, 200000) if f.startswith("platform")]
    status.render(report, found, Console(width=200))
    shown = capsys.readouterr().out
    assert "590.44.01 / 13.0" in shown and "UNHEALTHY platform: nodes differ in driver" in shown


def test_status_piped_shows_whole_lines_counts_and_no_none(endpoint, tmp_path):
    """Redirected (`ops status > f`), a report keeps each line whole (no 80-column wrap), a count
    from /metrics is a whole number and an unknown fact is '-', never `None`."""
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    target.nodes = NODES
    report = status.collect(target, local_runner(shim_bin(tmp_path)))
    report["nodes"][1]["platform"]["facts"]["bios_version"] = None  # a fact the node could not read
    report["endpoint"]["requests_running"], report["endpoint"]["requests_waiting"] = 2.0, 1.0
    long_line = "spark2: " + "a problem long enough to wrap at any terminal width " * 4
    piped = io.StringIO()
    status.render(report, [long_line], tool_console(file=piped))
    text = piped.getvalue()
    assert long_line in text.splitlines()[-1], text[-600:]
    assert "None" not in text, text
    assert re.search(r"requests running / waiting\s*│\s*2 / 1\s", text), text


GUARD_OK = {"checked_at": 1764470000.0, "ok": True, "failures": [], "consecutive_failures": 0,
            "restarts_in_window": 1, "restart_limit": 3, "window_s": 1800, "hold": None}
HOLD = {"reason": "restart loop: 3 serving restarts in 30 min (limit 3). ... reboot spark1 and spark2", "since": 1.0}
MEMORY_SHORT = {"ok": False, "need_gib": 101.7, "available_gib": 95.0,
                "message": "not enough memory to load: vLLM needs 101.7 GiB (0.85 x 119.7 GiB), 95.0 GiB available"}


def node_state(run_dir, guard=None, hold=None, memory=None):
    """The files the guard and the memory check leave under the contract's RUN_DIR."""
    for path, value in ((contract.SERVING_GUARD_STATUS, guard), (contract.SERVING_HOLD, hold),
                        (contract.MEMORY_CHECK_STATUS, memory)):
        if value is not None:
            target = run_dir / Path(path).relative_to(contract.RUN_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(value))
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def test_status_shows_the_guard_the_hold_and_the_memory_check(endpoint, tmp_path):
    behaviour, target = endpoint
    target.nodes = NODES
    failing = {**GUARD_OK, "ok": False, "consecutive_failures": 2,
               "failures": ["known answer: 512 + 301 gave '<unk>', not 813"]}
    run_dir = node_state(tmp_path / "run", guard=failing, hold=HOLD, memory=MEMORY_SHORT)
    report = status.collect(target, local_runner(shim_bin(tmp_path), run_dir=run_dir))
    found = status.problems(report, 65536, None)
    assert "spark1: serving held: restart loop: 3 serving restarts in 30 min (limit 3). ... reboot spark1 and spark2" in found
    assert "spark1: canary failing (2 rounds in a row): known answer: 512 + 301 gave '<unk>', not 813" in found
    assert ("spark2: memory check before load: not enough memory to load: vLLM needs 101.7 GiB (0.85 x 119.7 GiB), "
            "95.0 GiB available") in found
    console = Console(record=True, width=400)  # wide enough that no cell wraps
    status.render(report, found, console)
    shown = console.export_text()
    assert "canary: FAILING" in shown and "restarts 1/3 in 30 min" in shown and "HELD" in shown
    assert "memory: WAITING (95.0 GiB available, 101.7 GiB needed)" in shown
    assert "throttled: power cap, thermal (hardware)" in shown
    # no verdict at all: the guard is not running
    bare = status.collect(target, local_runner(shim_bin(tmp_path / "bare"), run_dir=node_state(tmp_path / "bare-run")))
    assert any("the serving guard has written no verdict" in f for f in status.problems(bare, 65536, None))


@pytest.mark.parametrize("not_counted, note, shown_as, problem", [
    ("busy", "busy, not wedged: 6 running, 3 waiting, 412 tokens in 5 s", "canary: busy (late, tokens flowing)", None),
    ("key refused", "the gateway refused the key (not counted): /v1/models: HTTP 401 from the gateway",
     "canary: KEY REFUSED", "spark1: the gateway refused the key (not counted): /v1/models: HTTP 401 from the gateway"),
])
def test_status_shows_a_round_the_guard_did_not_count(endpoint, tmp_path, not_counted, note, shown_as, problem):
    """A busy engine is healthy; a refused key is a problem (clients with that key are refused too)."""
    behaviour, target = endpoint
    target.nodes = NODES
    guard = {**GUARD_OK, "ok": None, "not_counted": not_counted, "note": note}
    report = status.collect(target, local_runner(shim_bin(tmp_path), run_dir=node_state(tmp_path / "run", guard=guard)))
    found = [f for f in status.problems(report, 65536, None) if "gateway" in f or "canary" in f]
    assert found == ([problem] if problem else [])
    console = Console(record=True, width=400)
    status.render(report, found, console)
    assert shown_as in console.export_text()


@pytest.mark.parametrize("unit, loaded, words", [
    ("failed", False, ["table inet twinspark is not loaded, so every port is open to the LAN",
                       "twinspark-firewall.service failed", "journalctl -u twinspark-firewall.service"]),
    ("failed", True, ["twinspark-firewall.service failed, so the next boot leaves the node open",
                      "table inet twinspark is loaded now"]),
    ("active", False, ["table inet twinspark is not loaded", "twinspark-firewall.service active"]),
    ("active", None, ["cannot tell whether table inet twinspark is loaded", "Operation not permitted"]),
])
def test_status_shows_a_firewall_that_failed_to_load(endpoint, tmp_path, unit, loaded, words):
    """Issue 19 item 6: a table that failed to load at boot (a name nft could not resolve) leaves
    the node open; ops status says so, per node, from the unit's state and the table itself."""
    behaviour, target = endpoint
    target.nodes = NODES
    broken = shim_bin(tmp_path / "broken", firewall_unit=unit, firewall_loaded=loaded)
    report = status.collect(target, local_runner(shim_bin(tmp_path), {"spark2": broken}))
    assert report["nodes"][0]["firewall"] == {"unit": "twinspark-firewall.service", "table": "inet twinspark",
                                              "unit_state": "active", "loaded": True}
    assert report["nodes"][1]["firewall"]["unit_state"] == unit and report["nodes"][1]["firewall"]["loaded"] is loaded
    found = [f for f in status.problems(report, 65536, None) if "firewall" in f]
    assert len(found) == 1 and found[0].startswith("spark2: firewall: "), found
    assert all(word in found[0] for word in words), found[0]
    console = Console(record=True, width=400)
    status.render(report, status.problems(report, 65536, None), console)
    shown = console.export_text()
    assert "table loaded" in shown and "unit active" in shown  # spark1
    assert f"table {({True: 'loaded', False: 'NOT LOADED'}).get(loaded, 'unknown')}" in shown and f"unit {unit}" in shown
    assert status.run_status(target, local_runner(shim_bin(tmp_path), {"spark2": broken}), True, 65536, 200000,
                             quiet()) == 1


def test_a_loaded_table_whose_unit_has_not_run_since_the_deploy_is_healthy(endpoint, tmp_path):
    """`pulumi up` loads the table and enables the unit, which first runs at the next boot."""
    behaviour, target = endpoint
    target.nodes = NODES
    report = status.collect(target, local_runner(shim_bin(tmp_path, firewall_unit="inactive")))
    assert [n["firewall"]["unit_state"] for n in report["nodes"]] == ["inactive", "inactive"]
    assert not [f for f in status.problems(report, 65536, None) if "firewall" in f]


def test_clear_hold_removes_the_hold_and_waits_for_the_guard(endpoint, tmp_path):
    from ops.clear_hold import clear_hold

    behaviour, target = endpoint
    target.nodes = NODES
    verdicts = [{**GUARD_OK, "hold": HOLD}, {**GUARD_OK, "hold": None, "restarts_in_window": 0}]
    commands = []

    def shell(node, command, stdin):
        commands.append((node["name"], command))
        return json.dumps(verdicts[0] if len(commands) == 1 else verdicts[1])

    assert clear_hold(target, shell, quiet(), wait_s=10) == 0
    assert ("spark1", "sudo -n rm -f /run/twinspark/serving-hold") in commands
    assert all(name == "spark1" for name, _ in commands)
    # not held: nothing removed
    commands.clear()
    verdicts[0] = GUARD_OK
    assert clear_hold(target, shell, quiet(), wait_s=10) == 0
    assert commands == [("spark1", "cat /run/twinspark/serving-guard/status.json")]


def test_status_survives_an_unreachable_node(endpoint):
    behaviour, target = endpoint
    target.nodes = NODES

    def unreachable(node, args):
        raise RuntimeError(f"ssh nvidia@{node['host']} failed: Connection timed out")

    report = status.collect(target, unreachable)
    assert [n["error"] for n in report["nodes"]] == ["ssh nvidia@h1 failed: Connection timed out",
                                                    "ssh nvidia@h2 failed: Connection timed out"]
    assert len(status.problems(report, 9000, 200000)) == 2


def test_status_with_mp_reads_the_node_ranks_joined_to_rank_0_in_place_of_ray(endpoint, tmp_path, monkeypatch):
    """serving.executor mp (the `executor` output): rank 0 listening on the master port, each worker
    rank by its connection to it — real sockets on loopback, read by the real mp-membership.py."""
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(contract, "MP_MASTER_PORT", port)
    target.nodes = [{**NODES[0], "rayIp": "127.0.0.1"}, {**NODES[1], "rayIp": "127.0.0.2"}]
    target.outputs = {"executor": "mp"}
    runner = local_runner(shim_bin(tmp_path))
    with socket.create_server(("127.0.0.1", port)) as store:
        alone = status.collect(target, runner)
        assert "ray" not in alone["nodes"][0] and "ranks" not in alone["nodes"][1]
        assert alone["nodes"][0]["ranks"] == {"nodes": [{"node_ip": "127.0.0.1", "gpus": 1}]}
        assert "spark1: 1 of 2 node ranks joined rank 0" in status.problems(alone, 9000, 200000)
        with socket.socket() as rank1:
            rank1.bind(("127.0.0.2", 0))
            rank1.connect(("127.0.0.1", port))
            accepted, _ = store.accept()
            joined = status.collect(target, runner)
            accepted.close()
    assert [n["node_ip"] for n in joined["nodes"][0]["ranks"]["nodes"]] == ["127.0.0.1", "127.0.0.2"]
    assert not [p for p in status.problems(joined, 9000, 200000) if "node ranks" in p or "Ray" in p]
