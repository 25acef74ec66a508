"""Fixtures for the twin-node simulator: the cluster, the program's commands for it, the report."""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import SimCluster  # noqa: E402
from program_harness import ROOT, run_program  # noqa: E402

REPORT = ROOT / "build" / "sim-report.json"
# Pulumi.sim.yaml's twinspark:hfToken, decrypted: the program runs here under mocks, which
# cannot decrypt the stack file's secrets as the engine does
SIM_HF_TOKEN = "hf_simTokenNeverPrinted0123456789"


@pytest.fixture(scope="session")
def report():
    figures: dict = {}
    yield figures
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def sim(tmp_path_factory, report):
    if os.geteuid() != 0:
        pytest.fail("the simulator needs root (namespaces, mounts): run scripts/test.sh as root")
    cluster = SimCluster.from_stack_file(tmp_path_factory.mktemp("sim"))
    # the shim's "containers" are the node's own python, without the torch stand-in the NCCL
    # check's ranks need: its ranks run in the engine simulator (tests/sim_engine)
    cluster.config["twinspark:fabric"] = {**cluster.config["twinspark:fabric"], "minBusBandwidthGBps": 0}
    cluster.config["twinspark:hfToken"] = SIM_HF_TOKEN
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()
        report["leftovers_after_teardown"] = cluster.leftovers()


@pytest.fixture(scope="session")
def sim_run(sim):
    """The real program under mocks with the sim stack: the exact commands it would run."""
    run = run_program(sim.config, keyscan=None)  # the real ssh-keyscan: the sim's nodes answer it
    assert run.error is None, run.error
    sim.program = run  # the sim's dockerd starts containers from the program's own inputs
    return run
