"""dev/pace.py: the machine's pace line scripts/test.sh prints at a run's start and end."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from toolbox import ROOT


def test_the_pace_line_names_its_three_figures_and_leaves_nothing_where_it_wrote(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "dev" / "pace.py"), str(tmp_path / "scratch")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    figures = re.fullmatch(r"pace: python ([\d.]+) s, sha256 ([\d.]+) s, disk ([\d.]+) s \(one core each; lower is faster\)",
                           line)
    assert figures and all(float(f) > 0 for f in figures.groups()), line
    assert list((tmp_path / "scratch").iterdir()) == []  # its 256 MiB file is gone


STAT_BEFORE = """cpu  1000 50 300 4000 100 0 20 30 0 0
cpu0 500 25 150 2000 50 0 10 15 0 0
"""
# 400 jiffies later: 250 busy (user 150, nice 10, system 60, softirq 30), 100 stolen, 50 idle (40 + 10 iowait)
STAT_AFTER = """cpu  1150 60 360 4040 110 0 50 130 0 0
cpu0 575 30 180 2020 55 0 25 65 0 0
"""


def test_the_cores_shares_name_busy_stolen_and_idle_from_two_readings():
    import pace

    line = pace.cpu_shares(pace.cpu_counters(STAT_BEFORE), pace.cpu_counters(STAT_AFTER))
    assert line == "cores since the mark: 62 % busy, 25 % stolen by the host, 12 % idle", line


def test_the_cores_shares_over_a_real_mark_add_up(tmp_path):
    mark = tmp_path / "mark"
    script = [sys.executable, str(ROOT / "dev" / "pace.py")]
    assert subprocess.run([*script, "--cpu-mark", str(mark)], timeout=60).returncode == 0
    work_between = subprocess.run([*script, str(tmp_path)], capture_output=True, timeout=120)  # the pace's own work
    assert work_between.returncode == 0
    since = subprocess.run([*script, "--cpu-since", str(mark)], capture_output=True, text=True, timeout=60)
    shares = re.fullmatch(r"cores since the mark: (\d+) % busy, (\d+) % stolen by the host, (\d+) % idle\n", since.stdout)
    assert shares and 98 <= sum(map(int, shares.groups())) <= 102 and int(shares[1]) > 0, since.stdout + since.stderr


def test_a_file_that_is_not_proc_stat_is_named():
    import pace

    with pytest.raises(ValueError, match="not /proc/stat's text: its first line is 'intr 1 2 3'"):
        pace.cpu_counters("intr 1 2 3\n")
