"""The simulator driven by the real engine: `pulumi up --stack sim` of the unmodified program
onto simulated Sparks that run real sshd and dockerd (tests/sim/cluster.py),
pulling from the sim's registry (dev/sim_images.py), through the Pulumi CLI, its language
host and its providers as scripts/engine.sh built them; what is asserted is the engine's own
JSON (`pulumi preview --json`, the events of `pulumi up --json`, `pulumi stack export`).

One cluster per session, as scripts/sim.sh makes it; CI runs two sessions side by side (pytest-xdist,
two workers: `-n 2 --dist loadscope`), each its own cluster at its own site (tests/sim/cluster.py
`on_site`), the files split between them by FILES_OF_CLUSTER_B (ClusterScheduling), the sim's
registry served once by the controller. The CLI runs with HOME set to a temp
folder (the operator's key lies where Pulumi.sim.yaml names it, ~/.cache/twinspark-sim), a
file backend in it, in a checkout of its own: links to this repository's files beside a copy
of Pulumi.sim.yaml and a .twinspark/ of its own, so a scenario's `config set` (or `ops
upgrade`'s, through the Automation API) never writes the repository's.

The helpers the scenarios import are scenario_kit.py's; here, the fixtures and pytest's hooks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

import sim_images
import sim_model
from cluster import SIM_STACK, SimCluster, on_site
from hub_standin import HubStandin
from scenario_kit import (ROOT, SITE, XDIST_WORKER, EngineRun, EngineStack, FreshUp, engine_environment, engine_stack,
                          shim_calls, timed_cluster)
from timeline import (TIMELINE, merge_reports, merge_timelines, merge_worker_files, scenario_of, worker_file,
                      worker_files)

REPORT = ROOT / "build" / "sim-engine-report.json"
TIMELINE_FILE = ROOT / "build" / "sim-engine-timeline.json"  # where the time went (timeline.py)
# The files the second cluster runs when two run side by side (the rest are the first's), in file
# order within each: the halves' seconds about equal (docs/testing.md "CI"); the ring, which takes
# its cluster's pair down, last of its half.
FILES_OF_CLUSTER_B = ("test_engine_sim_healing.py", "test_engine_sim_mp.py", "test_engine_sim_nodes.py",
                      "test_engine_sim_renamed.py", "test_engine_topology_ring.py")
REGISTRY_SERVED = "TWINSPARK_SIM_REGISTRY_SERVED"  # set by the controller of two workers: they share its registry


def is_controller_of_workers(config) -> bool:
    """This process runs no test but hands the simulator's files to workers by cluster (loadscope:
    a run of other tests in several processes, --quick's loadfile, leaves the sim's registry alone)."""
    return not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadscope"


def pytest_xdist_make_scheduler(config, log):
    """A simulator test's scope is its cluster: each worker runs one cluster's files, in file order.
    (Not xdist_group: pytest-xdist 3.8 writes the group into `item._nodeid`, which pytest 9 no
    longer reads, so the groups never reach its scheduler: every test went anywhere.)"""
    if not is_controller_of_workers(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ClusterScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "cluster-b" if nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in FILES_OF_CLUSTER_B else "cluster-a"

    return ClusterScheduling(config, log)


REGISTRY_SERVER: list = []


@pytest.hookimpl(tryfirst=True)  # before xdist starts the workers, which inherit the environment
def pytest_sessionstart(session):
    if is_controller_of_workers(session.config):
        for stale in worker_files(REPORT) + worker_files(TIMELINE_FILE):  # a killed run's
            stale.unlink()
        REGISTRY_SERVER.append(serve_the_sims_images())
        os.environ[REGISTRY_SERVED] = sim_images.REGISTRY


def serve_the_sims_images() -> subprocess.Popen:
    """The sim's images, built where their inputs changed, served until the server is stopped."""
    with TIMELINE.span("images", "sim_images.py build"):
        subprocess.run([sys.executable, str(ROOT / "dev" / "sim_images.py"), "build"], check=True)
    return sim_images.serve_registry()


@pytest.fixture(scope="session")
def report():
    figures: dict = {}
    yield figures
    REPORT.parent.mkdir(exist_ok=True)
    worker_file(REPORT, XDIST_WORKER).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="session")
def engine_env() -> dict[str, str]:
    status = subprocess.run([str(ROOT / "scripts" / "engine.sh"), "status"], capture_output=True, text=True)
    if status.returncode != 0:
        pytest.fail(f"the engine is not built (run scripts/engine.sh build):\n{status.stdout}{status.stderr}")
    return engine_environment()


@pytest.fixture(scope="session")
def registry() -> str:
    """The sim's images, served while the session lasts (or by the controller of two workers)."""
    if served := os.environ.get(REGISTRY_SERVED):
        yield served
        return
    server = serve_the_sims_images()
    yield sim_images.REGISTRY
    stop(server)


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture(scope="session")
def operator_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("operator")


@pytest.fixture(scope="session")
def hub(operator_home):
    """The hub stand-in on the port of the stack's model.hubEndpoint, for every node at its
    gateway (tests/sim/cluster.py names it there), with the sim's model published."""
    config = on_site(yaml.safe_load(SIM_STACK.read_text())["config"], SITE)
    endpoint = urlsplit(config["twinspark:model"]["hubEndpoint"])
    root = operator_home / "hub"
    sim_model.publish(root / config["twinspark:model"]["repo"])
    # over https with a certificate of the sim's CA, which the serving base trusts (SSL_CERT_FILE)
    with HubStandin(root, listen=("0.0.0.0", endpoint.port), tls=sim_images.sim_certificate(endpoint.hostname)) as server:
        yield server


@pytest.fixture(scope="session")
def cluster(operator_home, registry, hub, report):
    if os.geteuid() != 0:
        pytest.fail("the simulator needs root (namespaces, mounts): run scripts/test.sh as root")
    sim = SimCluster.from_stack_file(operator_home / ".cache" / "twinspark-sim", registry=registry, site=SITE)
    timed_cluster(sim)
    try:
        sim.up()
        yield sim
    finally:
        sim.down()
        report["leftovers_after_teardown"] = sim.leftovers()


NEXT_SCENARIO = pytest.StashKey[object]()  # the scenario this process runs after this one (None: none)
# Its fixture takes the pair's nodes down: nothing after it needs the pair as the scenarios found it
TAKES_THE_PAIR_DOWN = "test_engine_topology_ring.py"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[NEXT_SCENARIO] = nextitem


@pytest.fixture
def pair_needed_after(request) -> bool:
    """Whether a later scenario of this process uses the pair as the scenarios found it: a scenario
    that changes it puts it back only then (the last before the ring or the session's end leaves it)."""
    after = request.node.stash.get(NEXT_SCENARIO, None)
    return after is not None and after.path.name != TAKES_THE_PAIR_DOWN


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    TIMELINE.phase = f"{item.nodeid}::setup"
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    TIMELINE.phase = f"{item.nodeid}::call"
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    TIMELINE.phase = f"{item.nodeid}::teardown"
    yield


SCENARIO_SECONDS: dict[str, dict[str, float]] = {}  # pytest's own: scenario -> {setup, call, teardown}


def pytest_runtest_logreport(report):
    SCENARIO_SECONDS.setdefault(scenario_of(report.nodeid), {})[report.when] = round(report.duration, 2)


def pytest_sessionfinish(session):
    if SCENARIO_SECONDS:
        TIMELINE.write(worker_file(TIMELINE_FILE, XDIST_WORKER), SCENARIO_SECONDS)
    if is_controller_of_workers(session.config):
        for server in REGISTRY_SERVER:
            stop(server)
        merge_worker_files(REPORT, merge_reports)
        merge_worker_files(TIMELINE_FILE, merge_timelines)


@pytest.fixture(scope="session")
def stack(engine_env, cluster, operator_home) -> EngineStack:
    return engine_stack(engine_env, operator_home, cluster.stack_file_text())


@pytest.fixture(scope="session")
def fresh_up(cluster, stack, report) -> FreshUp:
    memlock = {node: cluster.ssh(node, "ulimit -l").stdout.strip() for node in cluster.nodes}
    run = stack.up()
    report["fresh_up_to_serving_s"] = run.seconds
    report["fresh_up_changes"] = run.summary
    return FreshUp(run, memlock, {node: shim_calls(cluster, node) for node in cluster.nodes},
                   stack.export(show_secrets=True))


@pytest.fixture(scope="session")
def deployed(fresh_up) -> EngineRun:
    """The first `pulumi up` of the unmodified program with the stack's defaults."""
    return fresh_up.run
