"""`twinspark doctor` (issue 40, first part): its probe reads sysfs, cpuidle, swap and the pin's
manifest as a node shows them; the tool turns two nodes' facts into the recipe's likely causes,
costliest first, in a table and in --json."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
from openai_standin import Behaviour, serve
from ops_helpers import run_ops
from toolbox import LAUNCH_DIR, load_launch, stand_in_pulumi

from core import contract
from ops import doctor
from ops.nodes import DOCTOR_PROBE

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
RAILS = [{"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.1/24"},
         {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.1/24"}]
NODES = [{"name": "spark1", "role": "head", "host": "h1", "rayIp": "10.0.0.1", "rails": RAILS, "hostKey": HOST_KEY},
         {"name": "spark2", "role": "worker", "host": "h2", "rayIp": "10.0.0.2", "rails": RAILS, "hostKey": HOST_KEY}]


@pytest.fixture
def facts_probe():
    return load_launch("doctor-facts.py")


def test_the_probe_reads_pcie_cstates_swap_and_the_manifests_hashes(facts_probe, tmp_path):
    device = tmp_path / "ib" / "rocep1s0f0" / "device"
    device.mkdir(parents=True)
    for name, value in (("current_link_speed", "8.0 GT/s PCIe"), ("current_link_width", "1"),
                        ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "4")):
        (device / name).write_text(value + "\n")
    assert facts_probe.pcie_link("rocep1s0f0", str(tmp_path / "ib")) == {
        "speed_gts": 8.0, "width": 1, "max_speed_gts": 32.0, "max_width": 4}
    assert facts_probe.pcie_link("missing", str(tmp_path / "ib")) is None
    for cpu, flags in (("cpu0", ("0", "1")), ("cpu1", ("1", "1"))):
        for i, flag in enumerate(flags, 1):
            (tmp_path / "cpu" / cpu / "cpuidle" / f"state{i}").mkdir(parents=True)
            (tmp_path / "cpu" / cpu / "cpuidle" / f"state{i}" / "disable").write_text(flag)
    assert facts_probe.deep_cstates_enabled(str(tmp_path / "cpu")) is True  # cpu0's state1 may be entered
    (tmp_path / "cpu" / "cpu0" / "cpuidle" / "state1" / "disable").write_text("1")
    assert facts_probe.deep_cstates_enabled(str(tmp_path / "cpu")) is False
    assert facts_probe.deep_cstates_enabled(str(tmp_path / "none")) is None
    (tmp_path / "swaps").write_text("Filename\tType\tSize\tUsed\tPriority\n")
    assert facts_probe.swap_enabled(str(tmp_path / "swaps")) is False
    (tmp_path / "swaps").write_text("Filename\tType\n/swap.img\tfile\n")
    assert facts_probe.swap_enabled(str(tmp_path / "swaps")) is True
    files = {"model-00001.safetensors": {"size": 1, "sha256": "a" * 64},
             "dspark/drafter.safetensors": {"size": 1, "sha256": "b" * 64}}
    manifest = tmp_path / contract.WEIGHTS_MANIFEST
    manifest.write_text(json.dumps({"repo": "r", "revision": "c", "files": files}))
    (tmp_path / "dspark").mkdir()
    (tmp_path / "dspark" / "drafter.safetensors").write_bytes(b"the drafter's bytes")
    model, drafter = facts_probe.manifest_hashes(str(manifest))
    on_disk = hashlib.sha256(b"the drafter's bytes").hexdigest()
    assert drafter == hashlib.sha256(f"dspark/drafter.safetensors\t{on_disk}".encode()).hexdigest(), \
        "the drafter as its bytes are, not as the manifest says"
    assert model == hashlib.sha256("\n".join(f"{p}\t{e['sha256']}" for p, e in sorted(files.items())).encode()).hexdigest()
    (tmp_path / "dspark" / "drafter.safetensors").write_bytes(b"other bytes")
    other = hashlib.sha256(b"other bytes").hexdigest()
    assert facts_probe.manifest_hashes(str(manifest)) == (
        model, hashlib.sha256(f"dspark/drafter.safetensors\t{other}".encode()).hexdigest())
    assert facts_probe.manifest_hashes(str(tmp_path / "nothing" / contract.WEIGHTS_MANIFEST)) == (None, None)


def test_the_probe_reads_the_nccl_vllm_loaded_the_power_mode_and_the_page_cache(facts_probe, tmp_path, monkeypatch):
    # `docker exec CONTAINER sh -c ...` stood in by running the command here, on a staged folder
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text('#!/bin/sh\n[ "$1 $2" = "exec twinspark-serving" ] || exit 1\n'
                                             'shift 2\nexec "$@"\n')
    (tmp_path / "bin" / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    nccl = tmp_path / "nccl"
    nccl.mkdir()
    assert facts_probe.nccl_in_use("twinspark-serving", str(nccl)) is None
    (nccl / "nccl.spark1.100.log").write_text("spark1:100 NCCL INFO NCCL version 2.27.3+cuda12.9\n")
    (nccl / "nccl.spark1.200.log").write_text("spark1:200 NCCL INFO NCCL version 2.30.7+cuda13.3\n"
                                              "spark1:200 NCCL INFO Using network IB\n")
    (nccl / "nccl.spark1.300.log").write_text("spark1:300 NCCL INFO Using network IB\n")  # the NCCL check's: no version
    os.utime(nccl / "nccl.spark1.100.log", (1, 1))
    os.utime(nccl / "nccl.spark1.200.log", (2, 2))
    assert facts_probe.nccl_in_use("twinspark-serving", str(nccl)) == "2.30.7", "the newest start's, without +cuda"
    assert facts_probe.nccl_in_use("another", str(nccl)) is None  # no such container
    cpufreq = tmp_path / "sys/devices/system/cpu/cpu0/cpufreq"
    cpufreq.mkdir(parents=True)
    (cpufreq / "scaling_governor").write_text("powersave\n")
    (cpufreq / "scaling_driver").write_text("cppc_cpufreq\n")
    assert facts_probe.power_mode(str(tmp_path / "sys")) == {"platform_profile": None, "governor": "powersave",
                                                             "cpufreq_driver": "cppc_cpufreq"}
    (tmp_path / "sys/firmware/acpi").mkdir(parents=True)
    (tmp_path / "sys/firmware/acpi/platform_profile").write_text("low-power\n")
    assert facts_probe.power_mode(str(tmp_path / "sys"))["platform_profile"] == "low-power"
    (tmp_path / "meminfo").write_text("MemTotal: 128000000 kB\nBuffers: 1048576 kB\nCached: 12582912 kB\n")
    assert facts_probe.page_cache_gib(str(tmp_path / "meminfo")) == 13.0
    assert facts_probe.page_cache_gib(str(tmp_path / "nothing")) is None


def test_the_probe_runs_alone_and_reports_json(tmp_path):
    """As ssh feeds it: `python3 -` with the arguments; what it cannot read is null."""
    proc = subprocess.run([sys.executable, "-", "--hca", "nosuch", "--container", "twinspark-serving", "--manifest",
                           str(tmp_path / contract.WEIGHTS_MANIFEST), "--nccl-debug-dir", str(tmp_path / "nccl")],
                          input=(LAUNCH_DIR / "doctor-facts.py").read_text(),
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=True)
    facts = json.loads(proc.stdout)
    assert facts["pcie"] == {} and facts["model_sha256"] is None and isinstance(facts["kernel"], str)
    assert set(facts) == {"kernel", "driver", "nccl", "nccl_image", "power", "page_cache_gib", "pcie", "cstates_enabled",
                          "swap_enabled", "earlyoom_active", "image_digest", "model_sha256", "drafter_sha256", "bios",
                          "hca_firmware", "gid_index", "errors"}
    assert facts["nccl_image"] is None and isinstance(facts["page_cache_gib"], float)


def test_the_probe_reads_the_hcas_firmware_and_the_gid_index_serving_started_with(facts_probe, tmp_path):
    for hca, version in (("rocep1s0f0", "28.45.1020"), ("roceP2p1s0f0", "28.45.1020"), ("other", "28.39.1002")):
        (tmp_path / "ib" / hca).mkdir(parents=True)
        (tmp_path / "ib" / hca / "fw_ver").write_text(version + "\n")
    assert facts_probe.hca_firmware(["rocep1s0f0", "roceP2p1s0f0"], str(tmp_path / "ib")) == "28.45.1020"
    assert facts_probe.hca_firmware(["rocep1s0f0", "other"], str(tmp_path / "ib")) == "28.39.1002, 28.45.1020"
    assert facts_probe.hca_firmware(["nosuch"], str(tmp_path / "ib")) is None
    (tmp_path / "logs").mkdir()
    assert facts_probe.gid_index_in_use(str(tmp_path / "logs")) is None
    (tmp_path / "logs" / "boot-head.log").write_text(
        "10:00:01 boot-head spark1: NCCL_IB_GID_INDEX=3 (RoCE v2 over IPv4 on rocep1s0f0,roceP2p1s0f0)\n"
        "11:00:01 boot-head spark1: NCCL_IB_GID_INDEX=5 (RoCE v2 over IPv4 on rocep1s0f0,roceP2p1s0f0)\n")
    assert facts_probe.gid_index_in_use(str(tmp_path / "logs")) == 5, "the last start's"


def node_status(mtus, roce_mtus, throttle=(), sm=3003.0):
    return {"rails": [{"iface": r["iface"], "mtu": m, "roce_active_mtu": a} for r, m, a in zip(RAILS, mtus, roce_mtus)],
            "gpu": {"sm_clock_mhz": sm, "max_sm_clock_mhz": 3003.0, "throttle": list(throttle)}}


HEALTHY_FACTS = {"kernel": "6.17.0-1029-nvidia", "driver": "580.173.02", "nccl": "2.30.7", "nccl_image": "2.30.7",
                 "power": {"platform_profile": "performance", "governor": "schedutil", "cpufreq_driver": "cppc_cpufreq"},
                 "page_cache_gib": 3.2,
                 "pcie": {r["hca"]: {"speed_gts": 32.0, "width": 4, "max_speed_gts": 32.0, "max_width": 4} for r in RAILS},
                 "cstates_enabled": False, "swap_enabled": False, "earlyoom_active": True, "image_digest": "sha256:i",
                 "model_sha256": "m" * 64, "drafter_sha256": "d" * 64, "errors": {}}


def fake_runner(answers):
    """(node name, probe) -> the probe's JSON, as the nodes would print it."""
    def run(node, args, probe=None):
        return json.dumps(answers[node["name"], "doctor" if probe == DOCTOR_PROBE else "status"])
    return run


def doctor_flags():
    return ["doctor", "--nodes", json.dumps(NODES), "--ssh-user", "nvidia", "--recipe", "DeepSeek-V4-Flash-0731",
            "--dir", "/home/nvidia/models/m"]


def test_planted_differences_come_out_costliest_first_with_evidence_and_fix(monkeypatch, capsys):
    worker = {**HEALTHY_FACTS, "drafter_sha256": "e" * 64,
              "pcie": {**HEALTHY_FACTS["pcie"], "roceP2p1s0f0": {"speed_gts": 8.0, "width": 1, "max_speed_gts": 32.0,
                                                                 "max_width": 4}}}
    answers = {("spark1", "status"): node_status((9000, 9000), (4096, 4096)), ("spark1", "doctor"): HEALTHY_FACTS,
               ("spark2", "status"): node_status((9000, 1500), (4096, 1024), throttle=("application clocks",), sm=2000),
               ("spark2", "doctor"): worker}
    monkeypatch.setattr(doctor, "ssh_runner", lambda *a: fake_runner(answers))
    code, err, out = run_ops(capsys, *doctor_flags(), "--json")
    assert code == 1, err
    found = json.loads(out)["findings"]
    fingerprints = json.loads(out)["fingerprints"]  # what was read, as judged
    assert fingerprints["spark2"]["drafter_sha256"] == "e" * 64 and fingerprints["spark1"]["rail_mtu"] == {
        "enp1s0f0np0": 9000, "enP2p1s0f0np0": 9000}
    assert [(f["node"], f["cause"]) for f in found] == [
        ("spark2", "pcie_link"), ("spark2", "rail_mtu"), ("spark2", "roce_active_mtu"), ("spark2", "drafter"),
        ("spark2", "gpu_clock_cap")]
    assert found[0]["evidence"] == "roceP2p1s0f0: 8 GT/s x1, capable of 32 GT/s x4" and "lspci" in found[0]["fix"]
    assert "likely causes, costliest first" in err and "not record: image_digest" in err  # a person's view, on stderr
    assert "page cache (Cached + Buffers), GiB: spark1 3.2, spark2 3.2" in err
    assert "power (ACPI platform profile / CPU governor): spark1 performance / schedutil" in err

    answers[("spark2", "status")], answers[("spark2", "doctor")] = node_status((9000, 9000), (4096, 4096)), HEALTHY_FACTS
    code, err, out = run_ops(capsys, *doctor_flags())
    assert code == 0 and "no known cause of a gap against recipe DeepSeek-V4-Flash-0731" in out, out


def test_a_node_that_cannot_be_read_is_named_and_the_other_still_judged(monkeypatch, capsys):
    answers = {("spark1", "status"): node_status((9000, 9000), (4096, 4096)), ("spark1", "doctor"): HEALTHY_FACTS}

    def runner(node, args, probe=None):
        if node["name"] == "spark2":
            raise RuntimeError("ssh nvidia@h2 failed: Connection refused")
        return fake_runner(answers)(node, args, probe)

    monkeypatch.setattr(doctor, "ssh_runner", lambda *a: runner)
    code, _, out = run_ops(capsys, *doctor_flags(), "--json")
    report = json.loads(out)
    assert code == 1 and report["findings"] == []
    assert report["unreached"] == {"spark2": "ssh nvidia@h2 failed: Connection refused"}


def test_read_from_a_stack_the_last_ups_nccl_bandwidth_is_judged(monkeypatch, capsys, tmp_path):
    """The stack (a stand-in Pulumi CLI answering `stack output` and `stack export` as Pulumi does)
    names the nodes, the recipe and the model's directory; the head's NCCL check printed 3.1 GB/s at
    the last `up`, far below the recipe's 21.7: the costliest cause."""
    outputs = {"nodes": NODES, "sshUser": "nvidia", "recipe": "DeepSeek-V4-Flash-0731", "modelDir": "/home/nvidia/m",
               "fabric": {"mtu": 9000, "linkSpeedMbps": 200000}}
    state = {"deployment": {"resources": [
        {"urn": "urn:pulumi:spark::twinspark::command:remote:Command::spark1-nccl-check",
         "outputs": {"stdout": "spark1: all_reduce 256 MiB x 20: busbw 3.1 GB/s (algbw 3.1 GB/s), network Socket, "
                               "sum correct\n"}}]}}
    bin_dir = stand_in_pulumi(tmp_path / "bin", f"""import json, sys
print(json.dumps({outputs!r} if sys.argv[1:3] == ["stack", "output"] else {state!r}))
""")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    answers = {(n, probe): (node_status((9000, 9000), (4096, 4096)) if probe == "status" else HEALTHY_FACTS)
               for n in ("spark1", "spark2") for probe in ("status", "doctor")}
    monkeypatch.setattr(doctor, "ssh_runner", lambda *a: fake_runner(answers))
    code, err, out = run_ops(capsys, "doctor", "--project-dir", str(tmp_path), "--json")
    assert code == 1, err
    [finding] = json.loads(out)["findings"]
    assert (finding["node"], finding["cause"], finding["evidence"]) == (
        "spark1", "nccl_busbw", "busbw 3.1 GB/s, the recipe's 21.7 GB/s")


class SpecDecoding(Behaviour):
    """The stand-in with vLLM's spec decode counters (of 7 draft positions), advancing with each request it
    answered (the stand-in's own /metrics are vLLM 0.24's without a drafter)."""

    SHARES = (0.93, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)

    @property
    def metrics_text(self) -> str:
        n, labels = len(self.requests), 'engine="0",model_name="ds-0731"'
        lines = [f"vllm:spec_decode_num_drafts_total{{{labels}}} {100 * n}",
                 f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {700 * n}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {int(100 * n * sum(self.SHARES))}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{pos}"}} {int(100 * n * share)}'
                  for pos, share in enumerate(self.SHARES)]
        return "\n".join(lines) + "\n"

    @metrics_text.setter
    def metrics_text(self, _) -> None:  # the dataclass's __init__ sets it; the property answers instead
        pass


def test_live_figures_stand_beside_the_recipes_and_a_shortfall_with_no_cause_says_so(monkeypatch, capsys):
    """--live against the OpenAI stand-in decoding at 50 tok/s (the recipe: 74.8 single stream) with a
    healthy fingerprint: the single stream is short, said with no cause to blame; spec decode's
    acceptance per draft position comes from vLLM's counters over the doctor's own requests."""
    answers = {(n, probe): (node_status((9000, 9000), (4096, 4096)) if probe == "status" else HEALTHY_FACTS)
               for n in ("spark1", "spark2") for probe in ("status", "doctor")}
    monkeypatch.setattr(doctor, "ssh_runner", lambda *a: fake_runner(answers))
    server = serve(SpecDecoding(api_key="sk-doctor", model="ds-0731", decode_tok_s=50.0, prefill_tok_s=float("inf"),
                                base_latency_s=0.0))
    try:
        code, err, out = run_ops(capsys, *doctor_flags(), "--live", "--endpoint",
                                 f"http://127.0.0.1:{server.server_address[1]}/v1", "--api-key", "sk-doctor",
                                 "--model", "ds-0731", "--json")
    finally:
        server.shutdown()
    report = json.loads(out)
    assert code == 1 and report["findings"] == [], err
    figures = {f["figure"]: f for f in report["live"]["figures"]}
    single = next(f for name, f in figures.items() if "single" in name)
    assert single["recipe"] == 74.8 and single["short"] and 0 < single["measured"] < 0.8 * 74.8, single
    spec = report["live"]["spec_decode"]
    assert spec and [round(p, 2) for p in spec["per_position"]] == list(SpecDecoding.SHARES), spec
    assert report["live"]["errors"] == []
    assert "with no known cause in the fingerprint" in err and "measured now, beside the recipe's figures" in err


def test_live_needs_the_endpoint_and_says_so(monkeypatch, capsys):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    code, err, _ = run_ops(capsys, *doctor_flags(), "--live")
    assert code == 2 and "endpoint" in err and "Traceback" not in err, err
