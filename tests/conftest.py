import copy
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from program_harness import run_program, stack_config  # noqa: E402

# Host keys the tests pin for the recipe's nodes (public keys of throwaway key pairs): the
# shipped stack file leaves them for the user to pin, and `pulumi up` refuses unpinned nodes.
TEST_HOST_KEYS = {
    "spark1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINdV4pdiqGY7pMis6v4kNDyXRxI7Rjmg01vZ9lSTzlaB",
    "spark2": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOht1g6bv1QKIUm6YMbEqPRHfV3XCh8QatW64FJSvgCp",
    "spark3": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII665kzRLz0ac7j88/Z/HQc8WYeLoS0B5bC8E/VUOf9g",
}
OTHER_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAX7YOV0hhi0nGrPlT2oyR0/e/7z/T1+RKQojDyq2pGr"


def pinned(config):
    """The stack config with a test host key pinned on every node that has none."""
    config = copy.deepcopy(config)
    for node in config["twinspark:nodes"]:
        node["hostKey"] = node.get("hostKey") or TEST_HOST_KEYS.get(node["name"], OTHER_HOST_KEY)
    return config


def new_key(path: Path, passphrase: str = "") -> Path:
    """A fresh ed25519 key pair at `path` (and path.pub)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "twinspark-test", "-f", str(path)],
                   check=True)
    return path


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
