"""The repository's static checks: ruff (pyproject.toml) over its Python, shellcheck over its shell
files outside launch/ (tests/test_node_artifacts.py checks launch/'s, each as its step sends it)
and mypy (pyproject.toml) over the program, the day-2 tools and the node payloads. Each is shown to
fail once on a file that breaks its rule."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from program_harness import ROOT
from toolbox import sh

BIN = Path(sys.executable).parent  # the .venv's: ruff and mypy come from requirements-dev.txt
# shell files whose text is a record of a past run (docs/measurements/), kept as they ran
RECORDS = ("docs/measurements/",)


def tracked_shell_files() -> list[str]:
    """Every tracked file that is a shell script (a .sh name or a bash/sh shebang), launch/'s and
    the records' aside."""
    files = sh("git", "ls-files", cwd=ROOT).stdout.split()
    shell = []
    for name in files:
        if name.startswith(("launch/", *RECORDS)) or not (ROOT / name).is_file():
            continue
        with open(ROOT / name, "rb") as f:
            first = f.readline(200).decode(errors="replace")
        if name.endswith(".sh") or re.match(r"#!.*\b(bash|sh)\b", first):
            shell.append(name)
    return sorted(shell)


def test_ruff_finds_nothing():
    proc = sh(BIN / "ruff", "check", "--no-cache", "--output-format", "concise", ".", check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_names_what_breaks_a_rule(tmp_path):
    (tmp_path / "broken.py").write_text("import os\n\n\ndef f(items=[]):\n    return [l for l in items]\n")
    proc = sh(BIN / "ruff", "check", "--no-cache", "--config", ROOT / "pyproject.toml", "--output-format", "concise",
              tmp_path, check=False, cwd=ROOT)
    assert proc.returncode == 1
    assert {"F401", "B006", "E741"} <= set(re.findall(r"\b([A-Z]+\d+)\b", proc.stdout)), proc.stdout


@pytest.mark.parametrize("name", tracked_shell_files())
def test_shell_files_pass_shellcheck(name):
    proc = sh("shellcheck", "-x", name, check=False, cwd=ROOT)  # from the root: scripts/ source ". scripts/setup.sh"
    assert proc.returncode == 0, f"{name}:\n{proc.stdout}{proc.stderr}"


def test_shell_files_are_found_and_shellcheck_sees_a_finding(tmp_path):
    assert {"scripts/test.sh", "scripts/engine.sh", ".ci/run", "tests/docker_run_standin"} <= set(tracked_shell_files())
    (tmp_path / "broken.sh").write_text("#!/usr/bin/env bash\nfor i in $(seq 3); do echo hi; done\ncd $1\n")
    proc = sh("shellcheck", "-x", "broken.sh", check=False, cwd=tmp_path)
    assert proc.returncode == 1 and "SC2034" in proc.stdout and "SC2086" in proc.stdout, proc.stdout


# mypy with an empty cache is ~31 CPU-s; at nice 19 beside the simulator it took 305 s (the rehearsal
# of b3e60e7, past sh's 300): a hang guard, not a pace
MYPY_HANG_GUARD_S = 1800


def test_mypy_finds_nothing():
    """pyproject.toml names what it checks: the program, the day-2 tools, the node payloads."""
    proc = sh(BIN / "mypy", "--python-executable", sys.executable, check=False, cwd=ROOT, timeout=MYPY_HANG_GUARD_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"no issues found in \d{2,} source files", proc.stdout), proc.stdout


def test_mypy_names_a_type_error(tmp_path):
    (tmp_path / "broken.py").write_text("def half(n: int) -> str:\n    return n // 2\n")
    proc = sh(BIN / "mypy", "--config-file", ROOT / "pyproject.toml", "--python-executable", sys.executable,
              "--cache-dir", tmp_path / "cache", tmp_path / "broken.py", check=False, cwd=ROOT, timeout=MYPY_HANG_GUARD_S)
    assert proc.returncode == 1 and "[return-value]" in proc.stdout, proc.stdout
