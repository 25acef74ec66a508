"""What fabric.topology decides, as the program renders it for Pulumi.spark.yaml (a direct stack):
every node's twinspark.env, netplan and firewall, the fabric, NCCL, weight-copy and image-ship
steps' arguments, the exporters' commands and the `nodes` output. tests/test_topology.py holds
the current program to the snapshot the code before fabric.topology rendered (f02176e): a
direct stack's nodes must see no change, or a no-op `pulumi up` would restart serving.

Written from a checkout of f02176e (the older code; this file and program_harness only):
    git archive f02176e | tar -x -C /tmp/old && cp tests/direct_snapshot.py /tmp/old/tests/ &&
    ln -s "$PWD/.venv" /tmp/old/.venv && (cd /tmp/old && PYTHONPATH=. .venv/bin/python tests/direct_snapshot.py) \
        > tests/direct_snapshot.json
and since then edited where the program changed on purpose: twinspark.env without RAY_DASHBOARD_PORT
(the head starts no dashboard), with RAY_prestart_worker_first_driver=0 (no idle Ray worker), with
TWINSPARK_API_GATEWAY_TEMP_DIR (the gateway's workers' own temp folder, issue 37), and each node's
firewall by flow with the weight copy's --firewall-set (issue 37: the rails and the other nodes
no longer get every port), and the copy's --revision the recipe's recorded commit (issue 37: the
stack serves its recipe's repository, whose code runs), and the sync key's authorization with its
forced command, the copy's --firewall-set now bound there (issue 37: a copy key only copies), and
twinspark.env with NCCL's INFO lines of INIT and NET to a file per process and
TWINSPARK_ROCE_GID_SCRIPT (issue 40: the guard reads NCCL's network; the GID is resolved at start),
and TWINSPARK_UNCLEAN_BOOT_HOLD (issue 40: a node waits out of serving after an unclean boot),
and the fabric check's --far-end flags (issue 40: a crossed cable is named with its far end),
and the shape check's workers' memory as each worker's own step read it (--memory-kb, no --peer/--key:
issue 41, the copy key no longer opens for a check; a one-time re-run of the check, no restart),
and the serving image's tag and ID (issue 42: the image carries the weight loaders serving.loadFormat
chooses from, loader-requirements.lock; a one-time rebuild and restart, after which choosing a loader
is a restart alone).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from program_harness import run_program, runner_call, stack_config, unwrap
from ssh_fixtures import new_key, pinned

SNAPSHOT = Path(__file__).resolve().parent / "direct_snapshot.json"
# steps whose arguments (or file) follow from the topology: their launch/ scripts are not compared
ARGS_OF = ("-fabric-check", "-nccl-check", "-weights-sync", "-weights-host-key", "-weights-shape-check",
           "-image-ship")
PAYLOAD_OF = ("-bundle-twinspark-env", "-hostprep-netplan", "-hostprep-firewall", "-weights-authorize")


def topology_surface(run) -> dict:
    surface = {}
    for r in run.resources:
        if r.type == "command:remote:Command" and r.name.endswith(ARGS_OF + PAYLOAD_OF):
            call = runner_call(r)
            surface[r.name] = call.payload if r.name.endswith(PAYLOAD_OF) else call.args
        elif r.type == "docker:index/container:Container" and "exporter" in r.name:
            surface[r.name] = unwrap(r.inputs.get("command"))
    surface["output nodes"] = run.outputs["nodes"]["value"]
    return surface


def run_stack_file(config=None) -> dict:
    with tempfile.TemporaryDirectory() as home:
        new_key(Path(home) / ".ssh" / "id_ed25519")
        run = run_program(pinned(config or stack_config()), extra_env={"HOME": home, "SSH_AUTH_SOCK": ""})
    assert run.error is None, run.error
    return topology_surface(run)


if __name__ == "__main__":
    print(json.dumps(run_stack_file(), indent=1, sort_keys=True))
