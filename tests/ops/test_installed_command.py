"""`pip install .` gives the day-2 tools as `twinspark`, which runs from anywhere (issue 39): one name
in site-packages, the version, every tool, the tools' programs for the nodes read from the installed
copy; and requirements.lock, the operator's venv, holds every pin of requirements.txt."""

import json
import re
import subprocess

import pytest
from ssh_fixtures import new_key
from toolbox import ROOT, free_port, install_twinspark, stand_in_pulumi

from ops.__main__ import TOOLS
from twinspark import __version__

OUR_TOP_LEVEL_NAMES = {"ops", "core", "components", "launch", "recipes", "known-issues.toml"}


def pins(path):
    """{name: version} of the `name==version` lines of a requirements file, names as pip compares them."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line)
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1).split("[")[0]).lower()] = match.group(2)
    return found


def test_the_lock_holds_every_requirement_at_its_pin():
    required, locked = pins(ROOT / "requirements.txt"), pins(ROOT / "requirements.lock")
    assert required, "no pins read from requirements.txt"
    differing = {name: (version, locked.get(name)) for name, version in required.items() if locked.get(name) != version}
    assert not differing, f"requirements.lock is stale (requirement: (pin, locked)): {differing}; regenerate it with " \
                          "the command in its first lines"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    venv = tmp_path_factory.mktemp("owner") / "venv"
    install_twinspark(venv)
    return venv


def twinspark(installed, cwd, *args, path="/usr/bin:/bin"):
    return subprocess.run([installed / "bin" / "twinspark", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={"PATH": path, "HOME": str(cwd)})


def test_the_installed_command_runs_from_anywhere_with_every_tool(installed, tmp_path):
    version = twinspark(installed, tmp_path, "--version")
    assert (version.returncode, version.stdout) == (0, f"twinspark {__version__}\n"), version
    shown = twinspark(installed, tmp_path, "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: twinspark "), shown
    assert all(name in shown.stdout for name in TOOLS), shown.stdout
    site_packages = next((installed / "lib").glob("python3*/site-packages"))
    ours = {p.name for p in site_packages.iterdir()} & OUR_TOP_LEVEL_NAMES
    assert not ours, f"the wheel put {ours} in site-packages beside twinspark"


def test_an_installed_tool_reads_its_node_program_from_the_installed_copy(installed, tmp_path):
    """verify-weights sends launch/weights.py to each node: read before the node (nothing listens) is tried."""
    nodes = [{"name": "spark1", "role": "head", "host": "127.0.0.1", "rayIp": "10.0.0.1", "rails": [],
              "hostKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}]
    checked = twinspark(installed, tmp_path, "verify-weights", "--nodes", json.dumps(nodes), "--ssh-user", "nvidia",
                        "--ssh-key", str(new_key(tmp_path / "id")), "--ssh-option", f"Port={free_port()}",
                        "--dir", "/home/nvidia/models/m")
    assert checked.returncode == 1 and checked.stderr == "", checked
    assert "spark1: not checked: not reached: ssh nvidia@127.0.0.1 failed" in checked.stdout, checked.stdout


def test_a_stack_is_read_in_the_project_dir_named(installed, tmp_path):
    """From anywhere, --project-dir names the project whose stack the Pulumi CLI reads (a stand-in CLI
    records how it was asked and answers as Pulumi does for a stack that is not there)."""
    asked = tmp_path / "asked.json"
    bin_dir = stand_in_pulumi(tmp_path / "bin", f"""import json, sys
json.dump(sys.argv[1:], open({str(asked)!r}, "w"))
sys.exit("error: no stack named 'nosuch' found")
""")
    shown = twinspark(installed, tmp_path, "client-setup", "--project-dir", str(ROOT), "--stack", "nosuch",
                      path=f"{bin_dir}:/usr/bin:/bin")
    assert shown.returncode == 2, shown
    assert json.loads(asked.read_text()) == ["stack", "output", "--json", "--show-secrets", "--cwd", str(ROOT), "--stack",
                                             "nosuch"]
    assert "no stack named 'nosuch' found" in shown.stderr, shown.stderr


def test_outside_a_project_the_error_names_project_dir(installed, tmp_path):
    """Run away from any checkout, Pulumi finds no project: the tool says where to run or what to pass."""
    bin_dir = stand_in_pulumi(tmp_path / "bin", f"""import sys
sys.exit("error: no Pulumi.yaml project file found (searching upwards from {tmp_path}). If you have not created a "
         "project yet, use `pulumi new` to do so: no project file found")
""")
    shown = twinspark(installed, tmp_path, "client-setup", path=f"{bin_dir}:/usr/bin:/bin")
    assert shown.returncode == 2, shown
    assert shown.stderr == (f"twinspark client-setup: {tmp_path} is not the Pulumi project (no Pulumi.yaml), so no stack "
                            "can be read: run inside your checkout, or pass --project-dir\n"), shown.stderr
