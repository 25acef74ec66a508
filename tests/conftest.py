import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from program_harness import run_program, stack_config  # noqa: E402
from ssh_fixtures import new_key, pinned  # noqa: E402

# What a test needs beyond a checkout and its .venv, as markers (`scripts/test.sh --quick` runs the
# tests with none of them, as any user): `engine`, the Pulumi engine scripts/engine.sh builds;
# `simulator`, the simulated Sparks; `root`, network namespaces, mounts, nft or a system daemon
# (dockerd, sshd on port 22). By file, or by a fixture that sets such a machine up.
# The root lists are what failed when the rest ran as an unprivileged user (docs/testing.md, "A
# fast loop"); tests/test_markers.py holds every file that makes a namespace to them.
NEEDS_ENGINE = {"test_engine_providers.py", "test_engine_docker_provider.py", "test_engine_installed_plugins.py"}
NEEDS_ROOT_FILES = {"test_node_security.py", "test_sim_images.py", "test_node_access.py", "test_pin_host_keys.py"}
NEEDS_ROOT_FIXTURES = {"private_node", "pair"}  # a mount namespace; two network namespaces cabled
# `quiet`: a test whose figures are the machine's own pace: scripts/test.sh runs it with the engine's
# tests only, never beside the engine's Go build nor the simulator (the bench gate's noise test saw
# an unchanged server regress beside the one and missed a 4x slower decode beside the other:
# docs/testing.md, "CI").
NEEDS_A_QUIET_MACHINE = {
    # the bench gate at a Spark's pace: a 4x slower decode passed as noise beside the simulator
    "test_bench_gate_half_1.py::test_five_runs_of_an_unchanged_server_never_disagree_and_three_4x_slower_decodes_always_do",
    "test_bench_gate_half_2.py::test_five_more_runs_of_an_unchanged_server_never_disagree_and_two_4x_slower_decodes_always_do",
    # the worker's message names the grace's 6.0 s: beside the simulator it said 6.1
    "test_ray_membership.py::test_the_grace_is_what_the_readme_says_measured_from_the_head_going_silent",
}
NEEDS_ROOT_TESTS = {  # FILE::NAME (without parameters)
    "test_weights.py::test_copy_speed_against_rsync_over_ssh_on_the_same_data_and_link",  # network namespaces
    "test_nccl_ranks.py::test_the_head_checks_a_worker_against_its_pinned_key_even_after_a_reinstall",  # sshd as root
    "test_observability.py::test_dirs_script_creates_owns_and_is_idempotent",  # chown to the services' users
    "test_ssh_access.py::test_docker_ssh_options_hold_a_real_ssh_to_the_pinned_key",  # sshd in a network namespace
}


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        if "sim_engine" in path.parts:
            item.add_marker("simulator")
        if path.name in NEEDS_ENGINE:
            item.add_marker("engine")
        test = f"{path.name}::{item.name.split('[')[0]}"  # FILE::NAME, as the lists above hold it
        if test in NEEDS_A_QUIET_MACHINE:
            item.add_marker("quiet")
        if (path.name in NEEDS_ROOT_FILES or NEEDS_ROOT_FIXTURES & set(getattr(item, "fixturenames", ()))
                or test in NEEDS_ROOT_TESTS):
            item.add_marker("root")

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
