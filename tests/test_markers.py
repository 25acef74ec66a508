"""The markers scripts/test.sh --quick selects by (tests/conftest.py): a test file that builds a
network or mount namespace, or starts a private dockerd, has its tests that do so marked `root`,
so the quick loop, run as any user, never meets one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import marker_lists

TESTS = Path(__file__).resolve().parent
NAMESPACE_USE = re.compile(r'"netns"|\bunshare\b|\bnsenter\b|private_dockerd\(|sshd_argv\(')


def marked_root_files() -> set[str]:
    listing = subprocess.run([sys.executable, "-m", "pytest", str(TESTS), "-m", "root", "--collect-only", "-q",
                              "-p", "no:cacheprovider"], cwd=TESTS.parent, capture_output=True, text=True).stdout
    return {Path(line.split("::")[0]).name for line in listing.splitlines() if "::" in line}


def test_every_file_that_builds_a_namespace_has_root_tests():
    using = {path.name for path in TESTS.rglob("test_*.py")
             if "sim_engine" not in path.parts and NAMESPACE_USE.search(path.read_text())}
    assert using, "the pattern finds nothing: it no longer matches how the tests build namespaces"
    unmarked = using - marked_root_files() - {"test_engine_docker_provider.py", "test_markers.py"}  # engine: not quick
    assert not unmarked, f"these build namespaces but no test of theirs is marked root (tests/conftest.py): {unmarked}"


def test_every_test_the_marker_lists_name_exists():
    """tests/marker_lists.py names tests by FILE::NAME: a renamed or moved test would quietly lose its
    marker (a quiet test beside the simulator, a root test in the quick loop)."""
    named = marker_lists.NEEDS_A_QUIET_MACHINE | marker_lists.NEEDS_ROOT_TESTS
    assert named
    defined = {f"{path.name}::{name}" for path in TESTS.rglob("test_*.py")
               for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}
    assert named - defined == set(), "tests/marker_lists.py names tests that do not exist"


def test_every_file_the_marker_lists_name_exists():
    """A renamed file would quietly lose its marker (a paced test yielding beside the simulator, an
    engine test in the quick loop)."""
    named = (marker_lists.NEEDS_ENGINE | marker_lists.NEEDS_ROOT_FILES | marker_lists.PACED_FILES
             | marker_lists.QUIET_FILES)
    assert named - {path.name for path in TESTS.rglob("test_*.py")} == set(), \
        "tests/marker_lists.py names files that do not exist"
