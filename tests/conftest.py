import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from program_harness import run_program, stack_config  # noqa: E402

@pytest.fixture(scope="session")
def operator_home(tmp_path_factory):
    """A HOME holding the private key Pulumi.spark.yaml names (~/.ssh/id_ed25519)."""
    home = tmp_path_factory.mktemp("operator-home")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key\n")
    return home


@pytest.fixture(scope="session")
def program(operator_home):
    """run(config=None, **kw): the real program under mocks; the recipe stack by default."""

    def run(config=None, **kw):
        return run_program(config or stack_config(), extra_env={"HOME": str(operator_home)}, **kw)

    return run


@pytest.fixture(scope="session")
def recipe_run(program):
    result = program()
    assert result.error is None, result.error
    return result


@pytest.fixture
def recipe_config():
    return copy.deepcopy(stack_config())
