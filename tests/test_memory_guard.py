"""Memory before load (launch/memory-check.py), the co-tenant caps (HostPrep's slice drop-ins) and
the node's memory budget they share (core/memory_budget.py), with real tools: the page cache
seen by fincore, systemd's own parser on the drop-ins, a cgroup tree laid out as the kernel's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import contract
from components import launch_bundle
from components.config import Serving, Topology, parse_stack_config, resolve_node_addresses
from components.firewall import FirewallPolicy
from components.host_prep import cotenant_slice_path, managed_files, render_cotenant_slice
from program_harness import config_blocks
from toolbox import wait_for

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
GIB_KB = 1024 * 1024


def meminfo(total_gib: float, available_gib: float, free_gib: float) -> str:
    return (f"MemTotal:       {int(total_gib * GIB_KB)} kB\nMemFree:        {int(free_gib * GIB_KB)} kB\n"
            f"MemAvailable:   {int(available_gib * GIB_KB)} kB\nCached:         1024 kB\n")


def check(tmp_path, *extra, wait=True):
    argv = [sys.executable, str(LAUNCH / "memory-check.py"), "--node", "spark2", "--model-dir", str(tmp_path / "model"),
            "--utilization", "0.85", "--status", str(tmp_path / "run" / "memory-check.json"),
            "--meminfo", str(tmp_path / "meminfo"), "--retry-seconds", "0.2", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def model(tmp_path):
    (tmp_path / "model").mkdir()
    return tmp_path / "model"


def status(tmp_path) -> dict:
    return json.loads((tmp_path / "run" / "memory-check.json").read_text())


def first_status(tmp_path) -> dict:
    """The check's status once its first round wrote it."""
    wait_for((tmp_path / "run" / "memory-check.json").exists, "the memory check's first status")
    return status(tmp_path)


def test_enough_memory_starts_at_once_and_says_the_numbers(tmp_path, model):
    (tmp_path / "meminfo").write_text(meminfo(119.7, 115.0, 60.0))
    proc = check(tmp_path)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert out.startswith("ok   spark2: vLLM needs 101.7 GiB (0.85 x 119.7 GiB), 115.0 GiB available"), out
    assert status(tmp_path)["ok"] is True and status(tmp_path)["need_gib"] == pytest.approx(101.74, abs=0.01)


def test_memory_that_should_be_free_but_is_not_holds_the_start_until_it_is(tmp_path, model):
    # the signature of a leak: 20 GiB that no process should hold
    (tmp_path / "meminfo").write_text(meminfo(119.7, 95.0, 90.0))
    proc = check(tmp_path)
    waiting = first_status(tmp_path)
    assert waiting["ok"] is False and proc.poll() is None  # still waiting, not started
    assert "not enough memory to load: vLLM needs 101.7 GiB" in waiting["message"]
    assert "95.0 GiB available" in waiting["message"] and "6.7 GiB that should be free is not" in waiting["message"]
    # no slice tree given: it cannot tell a co-tenant from a leak, and says both
    assert "What holds it is unknown" in waiting["message"] and "only a reboot frees" in waiting["message"]
    time.sleep(1.0)  # checked again every 0.2 s meanwhile, the cause unchanged
    (tmp_path / "meminfo").write_text(meminfo(119.7, 110.0, 100.0))  # the co-tenant went away
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "WAIT spark2: not enough memory" in out and "ok   spark2:" in out
    assert out.count("WAIT spark2") == 1, "checked often, said once while the cause stays the same"
    assert status(tmp_path)["ok"] is True


def test_the_model_files_page_cache_is_released(tmp_path, model):
    if shutil.which("fincore") is None:
        pytest.fail("needs fincore (util-linux)")
    shard = model / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\1" * (16 << 20))
    shard.read_bytes()  # as the copy or the last load left it: cached

    def cached_pages() -> int:
        out = subprocess.run(["fincore", "--noheadings", "--raw", "--output", "PAGES", str(shard)],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])

    assert cached_pages() > 0
    (tmp_path / "meminfo").write_text(meminfo(119.7, 115.0, 60.0))
    proc = check(tmp_path)
    proc.communicate(timeout=30)
    assert cached_pages() == 0
    assert status(tmp_path)["model_files_released"] == 1


@pytest.mark.parametrize("setting, utilization, percent", [
    ("auto", 0.85, 5), ("auto", 0.7, 12), ("auto", 0.89, 3), ("5%", 0.85, 5), ("20%", 0.5, 20), ("off", 0.95, None)])
def test_cotenant_share_is_what_the_model_and_the_headroom_leave(setting, utilization, percent):
    serving = Serving(image="ghcr.io/x/vllm:1.0.0", gpu_memory_utilization=utilization, cotenant_memory_max=setting)
    assert serving.cotenant_memory_percent == percent


GIB = 1024**3
VALID_BUDGETS = [(0.85, "auto"), (0.7, "auto"), (0.89, "auto"), (0.8, "auto"), (0.85, "5%"), (0.5, "20%"),
                 (0.95, "off"), (0.9, "off")]


def drop_in_caps(serving) -> dict[str, int]:
    """MemoryMax (percent) of each co-tenant slice, from the drop-ins HostPrep would write."""
    cfg = parse_stack_config(config_blocks())
    files = managed_files(cfg.nodes[0], 9000, FirewallPolicy(()), None, serving.cotenant_memory_percent)
    caps = {}
    for name in contract.COTENANT_SLICES:
        text = next((f.content for f in files if f.path == cotenant_slice_path(name)), "")
        caps[name] = next((int(line.split("=")[1].rstrip("%")) for line in text.splitlines() if line.startswith("MemoryMax=")), 0)
    return caps


@pytest.mark.parametrize("total_gib", [121.0, 119.7])  # a Spark's unified memory, and the MemTotal it reports
@pytest.mark.parametrize("utilization, setting", VALID_BUDGETS)
def test_model_caps_and_headroom_fit_in_a_sparks_memory(total_gib, utilization, setting):
    """Issue 21 item 4: what the model takes and what the co-tenant slices may hold (the drop-ins
    as written) leave the headroom inside MemTotal, and the check waits for the same numbers."""
    serving = Serving(image="ghcr.io/x/vllm:1.0.0", gpu_memory_utilization=utilization, cotenant_memory_max=setting)
    total = total_gib * GIB
    model = utilization * total
    caps = sum(drop_in_caps(serving).values()) * total / 100
    assert model + caps <= total, f"model {model / GIB:.1f} + caps {caps / GIB:.1f} GiB > {total_gib} GiB"
    from core.memory_budget import HEADROOM_PERCENT

    headroom = HEADROOM_PERCENT * total / 100
    assert model + caps + headroom <= total + 1, (model + caps + headroom) / GIB
    # twinspark.env carries the same budget to the check, which waits for the model's share only
    env = dict(serving.memory_budget.env_entries())
    assert float(env["TWINSPARK_GPU_MEMORY_UTILIZATION"]) == utilization
    assert env["TWINSPARK_COTENANT_SLICES"].split(",") == list(contract.COTENANT_SLICES)
    assert env["TWINSPARK_COTENANT_MEMORY_PERCENT"] == ("" if setting == "off" else str(serving.cotenant_memory_percent))
    assert int(env["TWINSPARK_MEMORY_HEADROOM_PERCENT"]) == HEADROOM_PERCENT


def test_the_env_file_carries_the_budget_the_boot_script_passes_to_the_check():
    cfg = parse_stack_config(config_blocks())
    vllm = launch_bundle.VllmServe(cfg.serving, cfg.model, len(cfg.nodes))
    fabric = Topology(cfg, resolve_node_addresses(cfg.nodes)).node_fabric(cfg.nodes[1])
    args = launch_bundle.LaunchBundleArgs(cfg.nodes[1], None, vllm, fabric, "token", "label-key", "sk-key")
    rendered = launch_bundle.render_env_file(args).splitlines()
    for entry in [*cfg.serving.memory_budget.env_entries(), ("TWINSPARK_HOST_CGROUP_DIR", contract.HOST_CGROUP_DIR)]:
        assert "=".join(entry) in rendered
    boot_common = (LAUNCH / contract.BOOT_COMMON).read_text()
    for name, _ in cfg.serving.memory_budget.env_entries():
        assert f'"${name}"' in boot_common, f"memory_check does not pass {name}"


@pytest.mark.parametrize("utilization, setting, fragments", [
    (0.9, "auto", ["leaves 5% for user.slice and system.slice", "lower gpuMemoryUtilization to 0.89", "at most 2%"]),
    (0.95, "auto", ["leaves 0%", "'off'"]),
    (0.85, "12%", ["= 114% of the node's memory", "at most 5%"]),
])
def test_a_budget_over_the_nodes_memory_is_refused_with_the_numbers(utilization, setting, fragments):
    with pytest.raises(ValueError) as refused:
        Serving(image="ghcr.io/x/vllm:1.0.0", gpu_memory_utilization=utilization, cotenant_memory_max=setting)
    assert "a memory budget that adds up" in str(refused.value)
    for fragment in fragments:
        assert fragment in str(refused.value)


def cgroup(root: Path, name: str, current_gib: float, file_gib: float = 0.0, v1: bool = False) -> None:
    """A slice as the kernel shows it: usage and its page cache (reclaimable)."""
    d = root / "memory" / name if v1 else root / name
    d.mkdir(parents=True)
    if v1:
        (d / "memory.usage_in_bytes").write_text(f"{int(current_gib * GIB)}\n")
        (d / "memory.stat").write_text(f"total_active_file {int(file_gib * GIB / 2)}\ntotal_inactive_file "
                                       f"{int(file_gib * GIB / 2)}\ntotal_rss 1\n")
    else:
        (d / "memory.current").write_text(f"{int(current_gib * GIB)}\n")
        (d / "memory.stat").write_text(f"anon 1\nfile {int(file_gib * GIB)}\nactive_file {int(file_gib * GIB / 2)}\n"
                                       f"inactive_file {int(file_gib * GIB / 2)}\nslab_reclaimable 0\n")


def check_with_slices(tmp_path, cotenant_percent: str):
    """One round of the check with the budget's flags as boot-common.sh passes them."""
    proc = check(tmp_path, "--cotenant-slices", ",".join(contract.COTENANT_SLICES), "--cotenant-percent",
                 cotenant_percent, "--headroom-percent", "5", "--container-slice", contract.CONTAINER_SLICE,
                 "--cgroup-root", str(tmp_path / "cgroup"))
    first = first_status(tmp_path)
    proc.kill()
    proc.communicate()
    return first


@pytest.mark.parametrize("v1", [False, True], ids=["cgroup-v2", "cgroup-v1"])
def test_a_cotenant_holding_the_memory_is_named_not_a_leak(tmp_path, model, v1):
    """Issue 21 item 4: an agent in user.slice (caps off) holds 30 GiB, 1 GiB of it page cache:
    the check names user.slice and does not send anyone to reboot."""
    (tmp_path / "meminfo").write_text(meminfo(121.0, 90.0, 85.0))
    root = tmp_path / "cgroup"
    cgroup(root, "user.slice", 31.0, file_gib=1.0, v1=v1)
    cgroup(root, "system.slice", 4.0, file_gib=2.0, v1=v1)
    cgroup(root, "twinspark.slice", 0.1, v1=v1)
    waiting = check_with_slices(tmp_path, "")
    assert waiting["ok"] is False and waiting["cause"] == "user.slice", waiting
    assert "user.slice 30.0 GiB (uncapped)" in waiting["message"] and "system.slice 2.0 GiB" in waiting["message"]
    assert "user.slice holds it: a co-tenant there" in waiting["message"], waiting["message"]
    assert "only a reboot frees" not in waiting["message"] and "leak" not in waiting["message"]
    assert waiting["held_gib"] == {"user.slice": 30.0, "system.slice": 2.0, "twinspark.slice": 0.1}


def test_memory_no_slice_holds_is_called_a_leak_only_then(tmp_path, model):
    """The slices inside their caps (5% = 6.05 GiB), 20 GiB gone outside them: a leak."""
    (tmp_path / "meminfo").write_text(meminfo(121.0, 90.0, 85.0))
    root = tmp_path / "cgroup"
    cgroup(root, "user.slice", 6.0, file_gib=1.0)
    cgroup(root, "system.slice", 5.0, file_gib=1.0)
    cgroup(root, "twinspark.slice", 0.1)
    waiting = check_with_slices(tmp_path, "5")
    assert waiting["cause"] == "outside", waiting
    assert "user.slice 5.0 GiB (cap 6.1 GiB)" in waiting["message"]
    assert "No slice's processes hold it" in waiting["message"] and "only a reboot frees" in waiting["message"]


@pytest.mark.parametrize("bad", ["100%", "0%", "15", "auto%", "lots"])
def test_a_bad_cotenant_setting_is_refused(bad):
    with pytest.raises(ValueError, match="expected 'auto', 'off' or a percentage"):
        Serving(image="ghcr.io/x/vllm:1.0.0", cotenant_memory_max=bad)


def test_systemd_accepts_the_slice_caps(tmp_path):
    # systemd-analyze parses the unit as systemd would and names any setting it ignores
    unit = tmp_path / "twinspark-verify.slice"
    percent = Serving(image="ghcr.io/x/vllm:1.0.0").cotenant_memory_percent  # the default budget's
    unit.write_text("[Unit]\nDescription=verify\n" + render_cotenant_slice(percent))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "MemoryMax=5%" in unit.read_text() and "MemoryHigh=4%" in unit.read_text()
    assert cotenant_slice_path("user.slice") == "/etc/systemd/system/user.slice.d/50-twinspark-cotenants.conf"
