"""dev/pace.py: the machine's pace line scripts/test.sh prints at a run's start and end."""

from __future__ import annotations

import re
import subprocess
import sys

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
