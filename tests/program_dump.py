"""Every resource the program registers under mocks for Pulumi.spark.yaml (or, with `switch`, the
same two nodes as fabric.topology switch): type, name, URN, inputs, parent, dependencies, provider,
options and the outputs, sorted by URN (registration order is asynchronous). Two checkouts'
dumps are equal when a change leaves a two-node stack's resources and inputs as they were.

    git archive OLD | tar -x -C /tmp/old && cp tests/program_dump.py /tmp/old/tests/ && \
        ln -s "$PWD/.venv" /tmp/old/.venv
    for tree in /tmp/old .; do (cd $tree && PYTHONPATH=. .venv/bin/python tests/program_dump.py) > $tree.json; done
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

from program_harness import run_program, stack_config
from ssh_fixtures import new_key, pinned

# one fixed home and known_hosts directory: their paths are in the docker providers' ssh options
HOME = Path(tempfile.gettempdir()) / "twinspark-program-dump"


def dump(topology: str | None = None) -> dict:
    config = copy.deepcopy(stack_config())
    if topology:
        config["twinspark:fabric"]["topology"] = topology
    key = HOME / ".ssh" / "id_ed25519"
    if not key.exists():
        new_key(key)
    run = run_program(pinned(config), extra_env={"HOME": str(HOME), "SSH_AUTH_SOCK": "",
                                                 "TWINSPARK_KNOWN_HOSTS_DIR": str(HOME / "known_hosts.d")})
    assert run.error is None, run.error
    resources = [{"type": r.type, "name": r.name, "urn": r.urn, "inputs": r.inputs, "parent": r.parent,
                  "dependencies": sorted(r.dependencies), "provider": r.provider,
                  "deleteBeforeReplace": r.delete_before_replace, "replaceWith": r.replace_with,
                  "ignoreChanges": r.ignore_changes, "replaceOnChanges": r.replace_on_changes,
                  "aliases": r.aliases, "outputs": r.outputs} for r in run.resources]
    return {"resources": sorted(resources, key=lambda r: r["urn"]), "outputs": run.outputs}


if __name__ == "__main__":
    print(json.dumps(dump(*sys.argv[1:2]), indent=1, sort_keys=True))
