"""pulumi-command's triggers and updates under the real engine (tests/engine_project.py's project):
what replaces a command, what only updates it, and what a replacement's delete is told."""

from __future__ import annotations

import pytest

from engine_project import Stack


@pytest.fixture
def stack(tmp_path, engine_env):
    return Stack(tmp_path, engine_env)


def test_triggers_replace_a_command_and_create_updates_it(stack, tmp_path):
    """Triggers added replace by the provider's own diff (pulumi-command tags `triggers`
    replaceOnChanges); a changed element replaces by the SDK's replace_on_changes=["triggers[*]"]
    too. Any other change is an update, which runs `create` again when there is no `update`.
    A replacement runs the old one's `delete`, PULUMI_COMMAND_STDOUT set to its stdout."""
    log = tmp_path / "runs.log"

    def command(version: str, *triggers: str) -> dict:
        args = {"create": f"echo run >> {log}; echo {version}",
                "delete": f'echo "deleted $PULUMI_COMMAND_STDOUT" >> {log}'}
        return {"local": {"c": {**args, "triggers": list(triggers)} if triggers else args}}

    def runs() -> int:
        return log.read_text().count("run")

    stack.set(command("v1"))
    assert stack.up() == {"create": 2}
    assert stack.outputs()["c"] == "v1" and runs() == 1

    stack.set(command("v1", "a"))
    assert stack.preview_ops()["c"] == "replace"
    assert stack.up() == {"replace": 1, "same": 1}
    assert runs() == 2
    # the replaced one's delete ran, with its previous stdout in the environment
    assert log.read_text().splitlines() == ["run", "run", "deleted v1"]

    stack.set(command("v1", "b"))
    assert stack.preview_ops()["c"] == "replace"
    assert stack.up() == {"replace": 1, "same": 1}
    assert runs() == 3

    stack.set(command("v2", "b"))
    assert stack.preview_ops()["c"] == "update"
    assert stack.up() == {"update": 1, "same": 1}
    assert stack.outputs()["c"] == "v2"  # the update ran `create` again
    assert runs() == 4

    assert stack.up("--expect-no-changes") == {"same": 2}
    assert runs() == 4 and log.read_text().count("deleted") == 2
