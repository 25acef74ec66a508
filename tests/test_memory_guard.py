"""Memory before load (launch/memory-check.py) and the co-tenant caps (HostPrep's slice drop-ins),
with real tools: the page cache seen by fincore, systemd's own parser on the drop-ins."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.config import Serving
from components.host_prep import cotenant_slice_path, render_cotenant_slice

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
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (tmp_path / "run" / "memory-check.json").exists():
        time.sleep(0.1)
    waiting = status(tmp_path)
    assert waiting["ok"] is False and proc.poll() is None  # still waiting, not started
    assert "not enough memory to load: vLLM needs 101.7 GiB" in waiting["message"]
    assert "95.0 GiB available" in waiting["message"] and "6.7 GiB that should be free is not" in waiting["message"]
    assert "only a reboot frees that" in waiting["message"]
    (tmp_path / "meminfo").write_text(meminfo(119.7, 110.0, 100.0))  # the co-tenant went away
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "WAIT spark2: not enough memory" in out and "ok   spark2:" in out
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
    ("auto", 0.85, 15), ("auto", 0.95, 5), ("auto", 0.7, 30), ("12%", 0.85, 12), ("off", 0.85, None)])
def test_cotenant_share_follows_what_the_model_leaves(setting, utilization, percent):
    serving = Serving(image="ghcr.io/x/vllm:1.0.0", gpu_memory_utilization=utilization, cotenant_memory_max=setting)
    assert serving.cotenant_memory_percent == percent


@pytest.mark.parametrize("bad", ["100%", "0%", "15", "auto%", "lots"])
def test_a_bad_cotenant_setting_is_refused(bad):
    with pytest.raises(ValueError, match="expected 'auto', 'off' or a percentage"):
        Serving(image="ghcr.io/x/vllm:1.0.0", cotenant_memory_max=bad)


def test_systemd_accepts_the_slice_caps(tmp_path):
    # systemd-analyze parses the unit as systemd would and names any setting it ignores
    unit = tmp_path / "twinspark-verify.slice"
    unit.write_text("[Unit]\nDescription=verify\n" + render_cotenant_slice(15))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "MemoryMax=15%" in unit.read_text() and "MemoryHigh=13%" in unit.read_text()
    assert cotenant_slice_path("user.slice") == "/etc/systemd/system/user.slice.d/50-twinspark-cotenants.conf"
