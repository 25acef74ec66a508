"""tests/program_harness.py's ProgramForks: a run forked from tests/mock_program_forks.py is what
`python SCRIPT ARGS...` as a process of its own would be (what run_program reads of it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from program_harness import ProgramForks

SCRIPT = textwrap.dedent("""\
    import json, os, sys
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "said": os.environ.get("TWINSPARK_SAID"),
                      "stdin": sys.stdin.read(), "main": __name__, "path0": sys.path[0]}))
    if sys.argv[1] == "hash":
        print(hash("twinspark"))
        sys.exit(0)
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "sleep":
        import time; time.sleep(60)
    if sys.argv[1] == "raise":
        raise RuntimeError("the run's own failure")
    sys.exit(int(sys.argv[1]))
    """)


@pytest.fixture
def forks():
    forks = ProgramForks()
    yield forks
    forks.close()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "tests" / "script.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


def env_with(said: str) -> dict[str, str]:
    return {**os.environ, "TWINSPARK_SAID": said, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def test_a_forked_run_answers_as_a_process_of_its_own_would(forks, script, tmp_path):
    for said, status in (("first", 0), ("second", 3)):  # the second run its own environment and status
        argv = [str(script), str(status), said]
        forked = forks.run(argv, env_with(said), tmp_path)
        alone = subprocess.run([sys.executable, *argv], env=env_with(said), cwd=tmp_path, capture_output=True,
                               text=True, stdin=subprocess.DEVNULL)
        assert (forked.returncode, forked.stdout, forked.stderr) == (alone.returncode, alone.stdout, alone.stderr)
        assert forked.returncode == status and f'"said": "{said}"' in forked.stdout, forked


def test_a_run_that_raises_says_why_on_stderr_and_exits_1(forks, script, tmp_path):
    run = forks.run([str(script), "raise"], env_with("x"), tmp_path)
    assert run.returncode == 1 and "RuntimeError: the run's own failure" in run.stderr, run


def test_a_run_past_its_bound_is_killed_and_the_next_run_still_answers(forks, script, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        forks.run([str(script), "sleep"], env_with("x"), tmp_path, timeout_s=2)
    assert forks.run([str(script), "0", "again"], env_with("again"), tmp_path).returncode == 0


def test_two_runs_in_a_row_have_two_hash_seeds_as_two_processes_would(forks, script, tmp_path, monkeypatch):
    """A test comparing two runs (a second `up` changes nothing) still compares two orders of every
    set of strings, as it did with a process a run."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    env = {k: v for k, v in env_with("x").items() if k != "PYTHONHASHSEED"}
    first, second = (forks.run([str(script), "hash"], env, tmp_path) for _ in range(2))
    assert first.returncode == second.returncode == 0, (first, second)
    assert first.stdout.splitlines()[-1] != second.stdout.splitlines()[-1], (first.stdout, second.stdout)
