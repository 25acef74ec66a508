import subprocess
from pathlib import Path

import pytest

from program_harness import run_program, stack_config
from marker_lists import (NEEDS_A_QUIET_MACHINE, NEEDS_ENGINE, NEEDS_ROOT_FILES,
                          NEEDS_ROOT_FIXTURES, NEEDS_ROOT_TESTS, PACED_FILES, QUIET_FILES)
from ssh_fixtures import new_key, pinned


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        if "sim_engine" in path.parts:
            item.add_marker("simulator")
        if path.name in NEEDS_ENGINE:
            item.add_marker("engine")
        if path.name in PACED_FILES:
            item.add_marker("paced")
        test = f"{path.name}::{item.name.split('[')[0]}"  # FILE::NAME, as the lists above hold it
        if test in NEEDS_A_QUIET_MACHINE or path.name in QUIET_FILES:
            item.add_marker("quiet")
        if (path.name in NEEDS_ROOT_FILES or NEEDS_ROOT_FIXTURES & set(getattr(item, "fixturenames", ()))
                or test in NEEDS_ROOT_TESTS):
            item.add_marker("root")

@pytest.fixture(scope="module")
def engine_env():
    """The environment `eval "$(scripts/engine.sh env)"` gives, once the engine is ready (the
    docker provider's tests check their plugin themselves)."""
    engine = Path(__file__).resolve().parent.parent / "scripts" / "engine.sh"
    status = subprocess.run([str(engine), "status"], capture_output=True, text=True)
    ready = {line.split()[0] for line in status.stdout.splitlines() if ": ready" in line}
    if not {"cli", "langhost", "command", "random"} <= ready:
        pytest.fail("the engine is not built (scripts/engine.sh build cli langhost command random):\n"
                    + status.stdout + status.stderr)
    shown = subprocess.run(["bash", "-c", f'eval "$({engine} env)" && env -0'], capture_output=True, check=True)
    env = dict(kv.split("=", 1) for kv in shown.stdout.decode().split("\0") if "=" in kv)
    env.pop("SSH_AUTH_SOCK", None)  # only the keys a test gives: the caller's agent is not the test's
    return env


@pytest.fixture(scope="session")
def operator_home(tmp_path_factory):
    """A HOME holding the private key Pulumi.spark.yaml names (~/.ssh/id_ed25519), no passphrase."""
    home = tmp_path_factory.mktemp("operator-home")
    new_key(home / ".ssh" / "id_ed25519")
    return home


@pytest.fixture(scope="session")
def program(operator_home):
    """run(config=None, **kw): the real program under mocks, the recipe stack by default, with a
    test host key pinned on every node that has none (pin_host_keys=False: as given). No
    ssh-agent unless a test passes SSH_AUTH_SOCK in extra_env; one known_hosts directory for
    every run, as an operator's checkout has."""

    def run(config=None, extra_env=None, pin_host_keys=True, **kw):
        config = config or stack_config()
        env = {"HOME": str(operator_home), "SSH_AUTH_SOCK": "",
               "TWINSPARK_KNOWN_HOSTS_DIR": str(operator_home / "known_hosts.d"), **(extra_env or {})}
        return run_program(pinned(config) if pin_host_keys else config, extra_env=env, **kw)

    return run


@pytest.fixture(scope="session")
def recipe_run(program):
    result = program()
    assert result.error is None, result.error
    return result


@pytest.fixture
def recipe_config():
    return pinned(stack_config())
