"""Issue 24: NcclCheck for N nodes. Two nodes: the one all-node run, as before. A switch of three
or more: every pair of nodes on its own first (a two-rank all_reduce over the rails they share),
a ring of three: each cable's two ends over that cable's rails; then the all-node run. The real
program under mocks (steps, order, each end's NCCL environment), and launch/nccl-pair-check.sh
run for real on loopback (the sim's torch stand-in, a `docker` that runs the container's
program here): a failing pair names both nodes, its rails and the fix."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from program_harness import ROOT, flag_value, flag_values, runner_call, unwrap
from toolbox import free_port
from test_nccl_ranks import planned
from test_topology import BASE, LAN, namespaced, ring, switch_of

from core import contract

COMMAND = "command:remote:Command"
PORT = contract.NCCL_RENDEZVOUS_PORT
TWO_HCAS = "rocep1s0f0,roceP2p1s0f0"  # the stack file's two rails, on a switch every node's
RAIL_IPS = {f"spark{i}": (f"10.0.0.{i}", f"10.0.1.{i}") for i in range(1, 5)}
SWITCH_IPS = {"spark1": "10.0.0.1", "spark2": "10.0.0.2", "spark3": "10.0.0.3"}  # Ray's: the first rail


def four_on_a_switch():  # the seed's recipe stops at three nodes; Qwen3.8-Flash-Next takes four
    return switch_of(4) | {"serving": {**BASE["serving"], "recipe": "Qwen3.8-Flash-Next"}}


def switch_pair(a, b):
    ra, rb = RAIL_IPS[a], RAIL_IPS[b]
    return {"rails": [f"{a} rocep1s0f0 {ra[0]} <-> {b} rocep1s0f0 {rb[0]}",
                      f"{a} roceP2p1s0f0 {ra[1]} <-> {b} roceP2p1s0f0 {rb[1]}"],
            "hca": (TWO_HCAS, TWO_HCAS), "master": SWITCH_IPS.get(a, "10.0.0.4")}


# Each stack's expected pair runs, round by round: (rank 0, rank 1) -> its rails in words, each
# end's NCCL_IB_HCA, the pair's rendezvous. The ring: NVIDIA's connect-three-sparks cabling
# (tests/test_topology.py RING_NODES): spark1's port 0 to spark2's port 1, and so on.
RING_PAIRS = [
    {("spark1", "spark2"): {
        "rails": ["spark1 rocep1s0f0 192.168.0.1 <-> spark2 rocep1s0f1 192.168.0.2",
                  "spark1 roceP2p1s0f0 192.168.1.1 <-> spark2 roceP2p1s0f1 192.168.1.2"],
        "hca": ("rocep1s0f0,roceP2p1s0f0", "rocep1s0f1,roceP2p1s0f1"), "master": LAN["spark1"]}},
    {("spark1", "spark3"): {
        "rails": ["spark1 rocep1s0f1 192.168.2.1 <-> spark3 rocep1s0f0 192.168.2.2",
                  "spark1 roceP2p1s0f1 192.168.3.1 <-> spark3 roceP2p1s0f0 192.168.3.2"],
        "hca": ("rocep1s0f1,roceP2p1s0f1", "rocep1s0f0,roceP2p1s0f0"), "master": LAN["spark1"]}},
    {("spark2", "spark3"): {
        "rails": ["spark2 rocep1s0f0 192.168.4.1 <-> spark3 rocep1s0f1 192.168.4.2",
                  "spark2 roceP2p1s0f0 192.168.5.1 <-> spark3 roceP2p1s0f1 192.168.5.2"],
        "hca": ("rocep1s0f0,roceP2p1s0f0", "rocep1s0f1,roceP2p1s0f1"), "master": LAN["spark2"]}},
]
STACKS = {
    "2 direct (Pulumi.spark.yaml)": (lambda: dict(BASE), []),
    "2 switch": (lambda: switch_of(2), []),
    "3 switch": (lambda: switch_of(3), [{("spark1", "spark2"): switch_pair("spark1", "spark2")},
                                        {("spark1", "spark3"): switch_pair("spark1", "spark3")},
                                        {("spark2", "spark3"): switch_pair("spark2", "spark3")}]),
    "3 ring": (ring, RING_PAIRS),
    # six pairs in three rounds of two that share no node
    "4 switch": (four_on_a_switch, [
        {("spark1", "spark2"): switch_pair("spark1", "spark2"), ("spark3", "spark4"): switch_pair("spark3", "spark4")},
        {("spark1", "spark3"): switch_pair("spark1", "spark3"), ("spark2", "spark4"): switch_pair("spark2", "spark4")},
        {("spark1", "spark4"): switch_pair("spark1", "spark4"), ("spark2", "spark3"): switch_pair("spark2", "spark3")},
    ]),
}


@pytest.fixture(scope="module", params=list(STACKS))
def stack(request, program):
    make, rounds = STACKS[request.param]
    run = program(namespaced(make()))
    assert run.error is None, run.error
    return request.param, run, rounds


def nccl_commands(run):
    return [r for r in run.of_type(COMMAND) if "-nccl-" in r.name]


def rank_args(resource):
    """A pair end's nccl-check.sh flags (what it hands the nested run)."""
    return flag_values(runner_call(resource).args, "--rank-arg")


def nccl_deps(run, resource):
    names = {r.urn: r.name for r in run.resources}
    return {names[d] for d in resource.dependencies if "-nccl-" in names.get(d, "")}


def test_the_pair_runs_their_order_and_each_ends_environment(stack):
    name, run, rounds = stack
    nodes = ["spark1", "spark2", "spark3", "spark4"][:int(name[0])]
    expected_names = {f"{n}-nccl-check" for n in nodes}
    before: set[str] = set()
    for round_ in rounds:
        this_round = set()
        for (a, b), want in round_.items():
            for rank, (node, peer) in enumerate(((a, b), (b, a))):
                end = run.named(f"{node}-nccl-pair-{peer}")
                call = runner_call(end)
                assert call.script == "nccl-pair-check.sh"
                assert flag_value(call.args, "--pair") == f"{a}-{b}"
                assert flag_values(call.args, "--rail") == want["rails"]
                inner = rank_args(end)
                assert flag_value(inner, "--node") == node
                # the pair's own NCCL environment, as docker --env over the env file's
                env = {k: v for k, v in (e.split("=", 1) for e in flag_values(inner, "--docker-flag") if "=" in e)
                       if k.startswith("NCCL_")}
                assert env == {"NCCL_IB_HCA": want["hca"][rank], "NCCL_SOCKET_IFNAME": "enP7s7"}, (node, env)
                check = flag_values(inner, "--check-arg")
                assert (flag_value(check, "--rank"), flag_value(check, "--world-size"),
                        flag_value(check, "--nodes")) == (str(rank), "2", f"{a},{b}")
                assert flag_value(check, "--master") == f"{want['master']}:{PORT}"
                assert call.payload.startswith("{\n") and "nccl-check.sh —" in call.payload
                assert nccl_deps(run, end) == before, (end.name, nccl_deps(run, end), before)
                assert end.replace_with == [run.named("nccl-run").urn]
                this_round.add(end.name)
        expected_names |= this_round
        before = this_round
    assert {r.name for r in nccl_commands(run)} == expected_names
    for node in nodes:  # the all-node run: after the last round, every node's rank as before
        rank = run.named(f"{node}-nccl-check")
        assert nccl_deps(run, rank) == before, (rank.name, nccl_deps(run, rank))
        check = flag_values(runner_call(rank).args, "--check-arg")
        assert flag_value(check, "--nodes") == ",".join(nodes) and flag_value(check, "--world-size") == str(len(nodes))
        assert "--env" not in runner_call(rank).args  # the env file's environment, all rails
        assert rank.replace_with == [run.named("nccl-run").urn]


def test_replacing_the_run_replaces_every_pair_end_and_rank(stack):
    name, run, rounds = stack
    steps = planned(run, run, replace={"nccl-run"})
    assert {n for n, step in steps.items() if step != "same"} == {"nccl-run", *(r.name for r in nccl_commands(run))}
    keepers = unwrap(run.named("nccl-run").inputs["keepers"])
    assert ("pairs" in keepers) == bool(rounds)  # two nodes: the keepers as before


def test_a_new_link_address_reruns_every_nccl_check_together(program):
    """spark3's first rail moves (ring: its cable to spark1): the pairs' inputs change, and with
    them nccl-run, so every NCCL step is replaced in one `pulumi up`, none re-runs alone."""
    before = program(namespaced(ring()))
    moved = ring()
    moved["nodes"][0]["rails"][2]["address"] = "192.168.2.11/24"
    moved["nodes"][2]["rails"][0]["address"] = "192.168.2.12/24"
    after = program(namespaced(moved))
    assert before.error is None and after.error is None, (before.error, after.error)
    steps = planned(before, after)
    assert {r.name: steps[r.name] for r in nccl_commands(after)} == {r.name: "replace" for r in nccl_commands(after)}


# ---- nccl-pair-check.sh on loopback --------------------------------------------------------
# `docker` as nccl-check.sh calls it: `rm -f NAME` (nothing to remove), and `run ... --env-file
# FILE ... --entrypoint python3 IMAGE - ARGS`: python3 - ARGS (the check program, on stdin) with
# the env file's variables and then each --env on top (docker/cli opts ReadKVEnvStrings), the NCCL
# ones of which it records.
FAKE_DOCKER = r'''#!/usr/bin/env python3
import json, os, sys
argv = sys.argv[1:]
if argv[:2] == ["rm", "-f"]:
    sys.exit(0)
assert argv[0] == "run", argv
files, overrides, i = [], [], 1
while argv[i] != "--entrypoint":
    if argv[i] == "--env-file":
        files.append(argv[i + 1])
    if argv[i] == "--env":
        overrides.append(argv[i + 1])
    i += 1
env = dict(os.environ)
for path in files:
    env.update(l.split("=", 1) for l in open(path).read().splitlines() if l and not l.startswith("#"))
env.update(o.split("=", 1) for o in overrides)
program_args = argv[argv.index("-", i) + 1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"node": program_args[program_args.index("--node") + 1],
                          **{k: v for k, v in env.items() if k.startswith("NCCL_")}}) + "\n")
os.execvpe(sys.executable, [sys.executable, "-", *program_args], env)
'''


@pytest.fixture(scope="module")
def ring_run(program):
    run = program(namespaced(ring()))
    assert run.error is None, run.error
    return run


def run_pair(run, tmp_path, a, b, edit=lambda check: None, ends=(0, 1)):
    """Both ends of pair (a, b) (or only `ends`), at once, as recorded, each with its node's env
    file; the rendezvous on loopback. -> {node: CompletedProcess-like (returncode, stdout)}."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(tmp_path / "docker.log"),
           "PYTHONPATH": str(ROOT / "tests/sim/images/torch-standin")}
    port = free_port()
    procs = {}
    for rank in ends:
        node, peer = (a, b) if rank == 0 else (b, a)
        call = runner_call(run.named(f"{node}-nccl-pair-{peer}"))
        env_file = tmp_path / f"{node}.env"
        env_file.write_text(runner_call(run.named(f"{node}-bundle-twinspark-env")).payload)
        inner = flag_values(call.args, "--rank-arg")
        inner[inner.index("--env-file") + 1] = str(env_file)
        inner[inner.index("--master") + 2] = f"127.0.0.1:{port}"  # --check-arg --master --check-arg VALUE
        # a rank alone waits out the roll call (3 s); a pair's second rank may start late on a loaded box
        # (beside the simulator it missed 3 s: the rehearsal of c8259d0), so a pair waits up to 30
        inner += ["--check-arg", "--join-timeout-s", "--check-arg", "3" if len(ends) == 1 else "30"]
        edit(inner)
        outer = [a for i, a in enumerate(call.args) if a != "--rank-arg" and (i == 0 or call.args[i - 1] != "--rank-arg")]
        argv = ["bash", str(ROOT / "launch" / call.script), *outer, *(x for f in inner for x in ("--rank-arg", f))]
        procs[node] = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, env=env)
        procs[node].stdin.write(call.payload)
        procs[node].stdin.close()
    outcome = {node: (p.wait(timeout=60), p.stdout.read()) for node, p in procs.items()}
    log = tmp_path / "docker.log"
    recorded = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return outcome, recorded


def test_a_failing_pair_names_both_nodes_its_rails_and_the_fix(ring_run, tmp_path):
    """The ring's spark1-spark3 cable, where NCCL finds no RDMA (the stand-in, without
    /dev/infiniband, says Socket): both ends fail, each naming the pair, the cable's two rails
    end to end and what to do, after the check program's own reason."""
    outcome, recorded = run_pair(ring_run, tmp_path, "spark1", "spark3")
    rerun = f"pulumi up --replace '{ring_run.named('nccl-run').urn}'"
    for node in ("spark1", "spark3"):
        code, out = outcome[node]
        assert code == 1, out
        said = [line.split(" ", 1)[1] for line in out.strip().splitlines()]  # without the time
        assert any(line.startswith(f"nccl-check {node}: FAIL NCCL network expected IB, measured Socket")
                   for line in said), out
        assert said[-2:] == [
            f"nccl-pair-check {node}: FAIL pair spark1-spark3 over "
            "spark1 rocep1s0f1 192.168.2.1 <-> spark3 rocep1s0f0 192.168.2.2, "
            "spark1 roceP2p1s0f1 192.168.3.1 <-> spark3 roceP2p1s0f0 192.168.3.2: fix the cable between spark1 and "
            "spark3: reseat or replace it until `python -m ops status` shows these rails up (link, speed, RoCE "
            f"ACTIVE) on both nodes; then {rerun} (every NCCL check runs again, the pairs before the all-node run)",
            f"nccl-pair-check {node}: step nccl-pair-check failed (exit 1)"], out
    # each end ran with its own end of the cable, over the env file's four HCAs
    assert sorted((r["node"], r["NCCL_IB_HCA"], r["NCCL_SOCKET_IFNAME"]) for r in recorded) == [
        ("spark1", "rocep1s0f1,roceP2p1s0f1", "enP7s7"), ("spark3", "rocep1s0f0,roceP2p1s0f0", "enP7s7")]
    assert all(r["NCCL_IB_MERGE_NICS"] == "0" for r in recorded)  # the rest of the env file stays


def test_a_pair_that_measures_well_passes_quietly(ring_run, tmp_path):
    def any_network(inner):
        inner[inner.index("--require-network") + 2] = "any"

    outcome, _ = run_pair(ring_run, tmp_path, "spark2", "spark3", edit=any_network)
    for code, out in outcome.values():
        assert code == 0, out
        assert "FAIL" not in out and "all_reduce 1024 MiB" in out, out


def test_a_pair_end_alone_fails_at_the_roll_call_without_blaming_the_cable(ring_run, tmp_path):
    outcome, _ = run_pair(ring_run, tmp_path, "spark1", "spark2", ends=(1,))
    code, out = outcome["spark2"]
    assert code == 1 and "FAIL rank 1 of 2: spark1 (rank 0) did not answer" in out, out
    assert "FAIL pair" not in out and "the NCCL ranks run only together: pulumi up --replace" in out, out
