"""scripts/engine.sh and providers had elsewhere (issue 36): `install-provider` records one, `build`
keeps it and adopts the ones a user's own Pulumi installed, `status` and `versions` say which one
runs. Each test has a cache of its own (TWINSPARK_ENGINE_CACHE) holding only the built engine's
CLI (linked), so nothing here builds: a `build` that tried would leave a stand-in's folder."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "scripts" / "engine.sh"
VERSIONS = {name: re.search(rf"^{var}=(\S+)$", ENGINE.read_text(), re.M)[1]
            for name, var in [("cli", "PULUMI_CLI_VERSION"), ("command", "COMMAND_VERSION"), ("random", "RANDOM_VERSION")]}


@pytest.fixture
def cache(tmp_path):
    built = Path(os.environ.get("TWINSPARK_ENGINE_CACHE", Path.home() / ".cache" / "twinspark-engine"))
    cli = built / f"cli-v{VERSIONS['cli']}" / "pulumi"
    if not cli.is_file():
        pytest.fail(f"the engine's CLI is not built ({cli}): scripts/engine.sh build cli")
    cache = tmp_path / "cache"
    (cache / f"cli-v{VERSIONS['cli']}").mkdir(parents=True)
    (cache / f"cli-v{VERSIONS['cli']}" / "pulumi").symlink_to(cli)
    return cache


def engine_sh(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ENGINE), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TWINSPARK_ENGINE_CACHE": str(cache), "HOME": str(cache.parent), **env})


def provider_binary(path: Path, says: str) -> Path:
    """A provider 'built elsewhere': what the engine loads is not the point here, which file is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)
    return path


def installed(cache: Path, name: str) -> Path:
    return cache / "home" / "plugins" / f"resource-{name}-v{VERSIONS[name]}" / f"pulumi-resource-{name}"


def line_of(status: subprocess.CompletedProcess, name: str) -> str:
    return next(line for line in status.stdout.splitlines() if line.startswith(f"{name} v"))


def test_an_installed_provider_survives_build_and_status_names_it(cache, tmp_path):
    real = provider_binary(tmp_path / "built-from-source" / "pulumi-resource-random", "the real random")
    added = engine_sh(cache, "install-provider", "random", VERSIONS["random"], str(real))
    assert added.returncode == 0, added.stderr
    built = engine_sh(cache, "build", "random")
    assert built.returncode == 0, built.stderr
    assert installed(cache, "random").read_bytes() == real.read_bytes()  # not replaced by the stand-in
    assert not list(cache.glob("provider-random-*")), "build built the stand-in anyway"
    status = engine_sh(cache, "status")
    assert status.returncode == 3  # the language host and the other providers are missing here
    sha = hashlib.sha256(real.read_bytes()).hexdigest()[:16]
    assert line_of(status, "random") == f"random v{VERSIONS['random']}: ready, installed from {real}, sha256 {sha}"
    assert line_of(status, "command") == f"command v{VERSIONS['command']}: missing"
    versions = engine_sh(cache, "versions")
    assert line_of(status, "random") in versions.stdout.splitlines()


def test_build_adopts_the_providers_a_users_own_pulumi_installed(cache, tmp_path):
    users = tmp_path / "users-pulumi"
    theirs = provider_binary(
        users / "plugins" / f"resource-command-v{VERSIONS['command']}" / "pulumi-resource-command", "their command")
    provider_binary(users / "plugins" / "resource-random-v4.0.0" / "pulumi-resource-random", "another version")
    built = engine_sh(cache, "build", "command", USER_PULUMI_HOME=str(users))
    assert built.returncode == 0, built.stderr
    assert f"command v{VERSIONS['command']}: installed from {theirs}" in built.stderr
    assert installed(cache, "command").read_bytes() == theirs.read_bytes()
    assert not list(cache.glob("provider-command-*"))
    status = engine_sh(cache, "status", USER_PULUMI_HOME=str(users))
    assert line_of(status, "command").startswith(f"command v{VERSIONS['command']}: ready, installed from {theirs}, sha256 ")
    assert line_of(status, "random") == f"random v{VERSIONS['random']}: missing"  # 4.0.0 is not the SDK's
    again = engine_sh(cache, "build", "command", USER_PULUMI_HOME=str(users))
    assert again.returncode == 0 and "installed from" not in again.stderr  # adopted once


@pytest.mark.parametrize("args, words", [
    (["randm", "4.21.4", "BIN"], "NAME is command, random or docker, not 'randm'"),
    (["random", "v4.21.4", "BIN"], "VERSION is like 4.21.4 (no v), not 'v4.21.4'"),
    (["random", "4.21.4", "/nonexistent/pulumi-resource-random"],
     "'/nonexistent/pulumi-resource-random' is not an executable file"),
    ([], "NAME is command, random or docker, not ''"),
])
def test_install_provider_refuses_bad_input_in_one_line_and_installs_nothing(cache, tmp_path, args, words):
    real = provider_binary(tmp_path / "pulumi-resource-random", "random")
    refused = engine_sh(cache, "install-provider", *[str(real) if a == "BIN" else a for a in args])
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and words in refused.stderr, refused.stderr
    assert not (cache / "home").exists() and not (cache / "installed").exists()


def release_folder(path: Path, cli_says: str = "") -> Path:
    """A Pulumi release's folder as a user's install has it: the CLI (here the built one behind a
    wrapper, or one that says `cli_says` as its version), the language host and its exec beside it."""
    path.mkdir(parents=True)
    built = Path(os.environ.get("TWINSPARK_ENGINE_CACHE", Path.home() / ".cache" / "twinspark-engine"))
    built_cli = built / f"cli-v{VERSIONS['cli']}" / "pulumi"
    cli = f"echo {cli_says}" if cli_says else f'exec {built_cli} "$@"'
    for part, body in [("pulumi", cli), ("pulumi-language-python", "echo the release's language host"),
                       ("pulumi-language-python-exec", "echo exec")]:
        (path / part).write_text(f"#!/bin/sh\n{body}\n")
        (path / part).chmod(0o755)
    return path


def test_an_installed_engine_is_kept_by_build_and_status_names_it(cache, tmp_path):
    release = release_folder(tmp_path / "release")
    added = engine_sh(cache, "install-engine", str(release))
    assert added.returncode == 0, added.stderr
    built = engine_sh(cache, "build", "cli", "langhost")
    assert built.returncode == 0, built.stderr
    assert not list(cache.glob("langhost-*")), "build built the stand-in language host anyway"
    assert (cache / "bin").resolve() == (cache / "engine-installed").resolve()
    assert (cache / "bin" / "pulumi-language-python").read_bytes() == (release / "pulumi-language-python").read_bytes()
    status = engine_sh(cache, "status")
    sha = hashlib.sha256((release / "pulumi-language-python").read_bytes()).hexdigest()[:16]
    assert line_of(status, "langhost") == f"langhost v{VERSIONS['cli']}: ready, installed from {release}, sha256 {sha}"
    assert line_of(status, "cli").startswith(f"cli v{VERSIONS['cli']}: ready, installed from {release}, sha256 ")
    (cache / "engine-installed" / "pulumi-language-python").write_text("#!/bin/sh\necho changed\n")
    assert line_of(engine_sh(cache, "status"), "langhost") == f"langhost v{VERSIONS['cli']}: missing"  # not the recorded one


def test_build_adopts_the_folder_of_a_users_own_pulumi_on_path_when_the_sdk_works_with_it(cache, tmp_path):
    old = release_folder(tmp_path / "old-release", cli_says="v3.100.0")
    kept = engine_sh(cache, "build", "cli", PATH=f"{old}:{os.environ['PATH']}")
    assert kept.returncode == 0, kept.stderr
    assert not (cache / "installed").exists(), "an engine older than the Python SDK was adopted"
    release = release_folder(tmp_path / "release")
    adopted = engine_sh(cache, "build", "cli", PATH=f"{release}:{os.environ['PATH']}")
    assert adopted.returncode == 0, adopted.stderr
    assert f"installed from {release}" in adopted.stderr
    assert line_of(engine_sh(cache, "status"), "cli").startswith(f"cli v{VERSIONS['cli']}: ready, installed from {release}")
    again = engine_sh(cache, "build", "cli", PATH=f"{release}:{os.environ['PATH']}")
    assert again.returncode == 0 and "installed from" not in again.stderr  # adopted once


@pytest.mark.parametrize("make, words", [
    (lambda tmp: tmp / "nowhere", "is not a folder"),
    (lambda tmp: (release_folder(tmp / "r"), (tmp / "r" / "pulumi-language-python-exec").unlink())[0],
     "has no executable pulumi-language-python-exec"),
    (lambda tmp: release_folder(tmp / "r", cli_says="v3.100.0"), "is v3.100.0, older than the Python SDK's v"),
])
def test_install_engine_refuses_bad_input_in_one_line_and_installs_nothing(cache, tmp_path, make, words):
    refused = engine_sh(cache, "install-engine", str(make(tmp_path)))
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and words in refused.stderr, refused.stderr
    assert not (cache / "installed").exists() and not (cache / "engine-installed").exists()
