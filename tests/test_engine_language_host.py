"""The Python language host under the real engine, held to Pulumi's own (pulumi v3.259.0,
sdk/python/cmd/pulumi-language-python/main.go): whichever runs, the stand-in scripts/engine.sh
builds or a real one installed (`scripts/engine.sh install-engine`), these pass the same.

The engine must be built first (`scripts/engine.sh build`): these tests fail, not skip, when it is not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent

# The program marks that it ran, so a test sees whether the typechecker stopped it first.
PROGRAM = """
import os
import pulumi
open(os.environ["RAN_MARK"], "w").write("ran")
pulumi.export("ran", True)
"""


def project(root: Path, venv: Path = ROOT / ".venv", **options: str) -> Path:
    folder = root / "project"
    folder.mkdir()
    extra = "".join(f"    {k}: {v}\n" for k, v in options.items())
    (folder / "Pulumi.yaml").write_text(
        "name: langhost-check\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
        f"    virtualenv: {venv}\n{extra}")
    (folder / "__main__.py").write_text(PROGRAM)
    return folder


def pulumi(folder: Path, env: dict[str, str], *args: str, **more: str) -> subprocess.CompletedProcess:
    return subprocess.run(["pulumi", *args, "--non-interactive"], cwd=folder, capture_output=True, text=True,
                          timeout=180, env={**env, "PULUMI_BACKEND_URL": f"file://{folder.parent}",
                                            "PULUMI_CONFIG_PASSPHRASE": "test",
                                            "RAN_MARK": str(folder.parent / "ran"), **more})


def fake_mypy(root: Path, exit_code: int) -> Path:
    """A folder for PYTHONPATH holding a package named mypy (a module and its dist-info, so that
    pip lists it as installed) that records its arguments and answers EXIT_CODE."""
    site = root / "fake-site"
    (site / "mypy").mkdir(parents=True)
    (site / "mypy" / "__init__.py").write_text("")
    (site / "mypy" / "__main__.py").write_text(
        "import json, os, sys\n"
        f"json.dump(sys.argv[1:], open({str(root / 'mypy-args.json')!r}, 'w'))\n"
        "print('fake-mypy: checked', os.getcwd())\n"
        f"sys.exit({exit_code})\n")
    (site / "mypy-1.0.0.dist-info").mkdir()
    (site / "mypy-1.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mypy\nVersion: 1.0.0\n")
    (site / "mypy-1.0.0.dist-info" / "RECORD").write_text("")
    return site


def test_a_typechecker_that_is_not_installed_is_named_and_the_program_never_runs(engine_env, tmp_path):
    """main.go:969-993: the typechecker must be installed in the program's environment: a fresh
    virtualenv (the project's own has mypy, for tests/test_lint.py)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    folder = project(tmp_path, venv, typechecker="mypy")
    assert pulumi(folder, engine_env, "stack", "init", "check").returncode == 0
    preview = pulumi(folder, engine_env, "preview")
    out = preview.stdout + preview.stderr
    assert preview.returncode != 0, out[-3000:]
    assert "The typechecker option is set to mypy, but mypy is not installed" in out, out[-3000:]
    assert not (tmp_path / "ran").exists()


def test_the_typechecker_checks_the_program_folder_first_and_a_failure_stops_the_run(engine_env, tmp_path):
    """main.go:1096-1146: `python -m mypy --exclude VENV PROGRAM_DIR` in the program's folder, its
    output shown in the error; the program runs only after it passes."""
    folder = project(tmp_path, typechecker="mypy")
    assert pulumi(folder, engine_env, "stack", "init", "check").returncode == 0
    failing = pulumi(folder, engine_env, "preview", PYTHONPATH=str(fake_mypy(tmp_path / "failing", 1)))
    out = failing.stdout + failing.stderr
    assert failing.returncode != 0, out[-3000:]
    assert "mypy failed" in out and f"fake-mypy: checked {folder}" in out, out[-3000:]
    assert not (tmp_path / "ran").exists()
    args = json.loads((tmp_path / "failing" / "mypy-args.json").read_text())
    venv = Path(args[args.index("--exclude") + 1])
    assert (folder / venv).resolve() == (ROOT / ".venv").resolve() and args[-1] == str(folder), args

    passing = pulumi(folder, engine_env, "preview", PYTHONPATH=str(fake_mypy(tmp_path / "passing", 0)))
    assert passing.returncode == 0, (passing.stdout + passing.stderr)[-3000:]
    assert (tmp_path / "ran").read_text() == "ran"


def test_an_unknown_typechecker_is_refused(engine_env, tmp_path):
    """main.go:249-261: mypy and pyright only."""
    folder = project(tmp_path, typechecker="pytype")
    assert pulumi(folder, engine_env, "stack", "init", "check").returncode == 0
    preview = pulumi(folder, engine_env, "preview")
    out = preview.stdout + preview.stderr
    assert preview.returncode != 0 and "unsupported typechecker option: pytype" in out, out[-3000:]


def sdk_version(package: str) -> str:
    module = __import__(package)
    return json.loads((Path(module.__file__).parent / "pulumi-plugin.json").read_text())["version"]


def test_the_packages_the_program_needs_are_the_pulumi_sdks_installed_beside_it(engine_env, tmp_path):
    """main.go:326-369 (GetRequiredPackages): each installed Pulumi SDK, named and versioned by its
    pulumi-plugin.json, so the engine loads those providers before the program runs."""
    folder = project(tmp_path)
    listed = pulumi(folder, engine_env, "plugin", "ls", "--project", "--json")
    assert listed.returncode == 0, (listed.stdout + listed.stderr)[-3000:]
    needed = {p["name"]: p["version"] for p in json.loads(listed.stdout) if p["kind"] == "resource"}
    assert needed == {name: sdk_version(f"pulumi_{name}") for name in ("command", "docker", "random")}
