"""The program's steps one by one, as the real engine ran them (conftest.py's `fresh_up`): what
host prep applied and that a second run of it changes nothing, every line of a healthy fabric
check, the model's commit resolved once and its weights downloaded once, a model change's copy
over both rails measured against the recipe's rsync, and an interrupted copy resumed.

Every command and its stdin is the one the engine stored (`pulumi stack export --show-secrets`:
a command:remote:Command's inputs `create`, `stdin`, `connection`, its outputs `stdout` and
`stderr` of its last run), re-run over SSH as the stack's user where a test needs a second run;
nothing comes from mocks. Moved here from the shim simulator (tests/sim/test_sim.py)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import PurePosixPath

import pytest

from core import contract
import sim_model
from components import host_prep
from scenario_kit import (FIGURES, HEAD, WORKER, completion_status, copy_again, each_rail_rx_bytes, file_state, hub_commit,
                          manifest, model_dir, rails_rx_bytes, rails_throttled, readiness_s, shim_calls, step_output,
                          stored_authorization, stored_step, sync_key_admitted, wait_for, worker_matches_head)

# A model of several shards, so the copy stripes over both rails; when its figures are measured,
# big enough that the copy's rate means something beside its fixed costs, yet small enough for
# the hub (this machine) and two copies on a node: 8 shards of 160 MiB (of 32 MiB otherwise).
BIG_SHARDS, BIG_SHARD_MB = 8, 160 if FIGURES else 32
BIG_REPO = f"twinspark-sim/weights-{BIG_SHARDS * BIG_SHARD_MB}m"
BIG_BYTES = BIG_SHARDS * (BIG_SHARD_MB << 20)
# The interrupted copy throttles the head's rails to this: the stack's own 64 MiB model then
# takes about 30 s over both, so the 40 % mark is seen within a poll or two.
RESUME_THROTTLE = "8mbit"
STARTED_STEP_OPS = ("create", "create-replacement", "update")  # the op that runs a step's create


# ---- the engine's stored steps ------------------------------------------------------------------
def step_names(state: dict, part: str) -> list[str]:
    return sorted(r["urn"].rsplit("::", 1)[-1] for r in state["resources"]
                  if r["type"] == "command:remote:Command" and part in r["urn"].rsplit("::", 1)[-1])


def node_of(cluster, step: dict) -> str:
    """The node a stored step runs on: its connection's host."""
    host = step["inputs"]["connection"]["host"]
    (name,) = [name for name, node in cluster.nodes.items() if node.spec.host == host]
    return name


def rerun(cluster, step: dict) -> subprocess.CompletedProcess:
    """The step's stored create with its stored stdin, over SSH as the stack's user (as pulumi-command runs it)."""
    return cluster.ssh(node_of(cluster, step), step["inputs"]["create"], stdin=step["inputs"].get("stdin", ""))


def create_flag(step: dict, name: str) -> str:
    argv = shlex.split(step["inputs"]["create"])
    return argv[argv.index(name) + 1]


# ---- 1. host prep ---------------------------------------------------------------------------------
def test_host_prep_applied_each_effect_once_and_a_second_run_changes_nothing(cluster, stack, fresh_up, report):
    # what the fresh up ran through the recording shims (tests/sim/shims), on each node
    calls = fresh_up.shim_calls
    for node in (HEAD, WORKER):
        assert any("systemctl daemon-reexec" in c for c in calls[node]), (node, calls[node])
        assert any("systemd-run" in c and "netplan apply" in c for c in calls[node]), (node, calls[node])
        assert any(f"systemctl enable --quiet {contract.FIREWALL_UNIT}" in c for c in calls[node]), (node, calls[node])
    assert any(f"sysctl -q -p {host_prep.USERNS_SYSCTL_PATH}" in c for c in calls[HEAD]), calls[HEAD]
    assert not any(host_prep.USERNS_SYSCTL_PATH in c for c in calls[WORKER]), calls[WORKER]  # the head's alone
    assert any(f"sysctl -q -p {host_prep.HANG_SYSCTL_PATH}" in c for c in calls[WORKER]), calls[WORKER]
    # each rail answers ARP for its own address alone (the shim applies a rail's keys in the node's netns)
    assert cluster.in_netns(WORKER, "cat", "/proc/sys/net/ipv4/conf/rail1/arp_ignore").stdout.strip() == "1"

    # each stored step run again: the idempotence a second run must show
    state = stack.export(show_secrets=True)
    steps = {name: stored_step(state, name) for name in step_names(state, "-hostprep-")}
    assert f"{HEAD}-hostprep-userns-sysctl" in steps and f"{WORKER}-hostprep-userns-sysctl" not in steps, sorted(steps)
    assert {node_of(cluster, step) for step in steps.values()} == {HEAD, WORKER}
    paths = {name: (node_of(cluster, step), create_flag(step, "--path")) for name, step in steps.items()}
    files_before = {name: file_state(cluster, *where) for name, where in paths.items()}
    assert None not in files_before.values(), files_before
    shims_before = {node: len(shim_calls(cluster, node)) for node in cluster.nodes}
    started = time.monotonic()
    second = {name: rerun(cluster, step) for name, step in steps.items()}
    report["hostprep_second_run_s"] = round(time.monotonic() - started, 2)
    report["hostprep_steps"] = len(steps)
    files_after = {name: file_state(cluster, *where) for name, where in paths.items()}
    shims_added = {node: len(shim_calls(cluster, node)) - count for node, count in shims_before.items()}
    report["hostprep_second_run_changes"] = (sum(files_after[n] != files_before[n] for n in steps)
                                             + sum(shims_added.values())
                                             + sum(not out.stdout.startswith("unchanged: ") for out in second.values()))
    for name, out in second.items():
        assert out.returncode == 0 and out.stdout == f"unchanged: {paths[name][1]}\n", (name, out.stdout, out.stderr)
    assert files_after == files_before
    assert shims_added == {node: 0 for node in cluster.nodes}, shims_added


# ---- 2. the fabric check ----------------------------------------------------------------------------
def test_the_fabric_check_the_engine_ran_passed_every_check_of_every_rail(cluster, stack, deployed):
    fabric = cluster.cfg.fabric
    state = stack.export(show_secrets=True)
    for node, sim_node in cluster.nodes.items():
        said = stored_step(state, f"{node}-fabric-check")["outputs"]["stdout"]
        # memlock too: the nodes preload memlock-granted.c (what pam_limits would grant a Spark's login)
        assert " FAIL " not in said and "fabric healthy" in said and "ok   memlock unlimited in a fresh login" in said, said
        for i, rail in enumerate(sim_node.spec.rails):
            for check in ("link up", f"speed {fabric.link_speed_mbps} Mb/s", f"MTU {fabric.mtu}",
                          f"RoCE {rail.hca} ACTIVE", "RoCE active_mtu 4096"):
                assert f"ok   rail {rail.iface}: {check}" in said, (node, rail.iface, check, said)
            for peer, peer_node in cluster.nodes.items():
                if peer != node:
                    far_end = peer_node.spec.rails[i]  # which rail of the peer this rail's cable reaches, named
                    assert (f"ok   rail {rail.iface}: {fabric.mtu - 28}-byte DF ping to {far_end.ip} "
                            f"({peer}'s {far_end.iface})") in said, (node, peer, said)


# ---- 3. the model's commit and its download ---------------------------------------------------------
def containers_created(cluster, node: str, since: float, until: float) -> list[str]:
    """The containers the node's dockerd created in that window (a `docker run --rm` leaves no other trace)."""
    out = cluster.ssh(node, f"docker events --since {int(since)} --until {int(until) + 1} --filter type=container "
                            "--filter event=create --format '{{.Actor.Attributes.image}}'").stdout
    return out.split()


def test_the_commit_is_resolved_once_and_kept_and_the_weights_are_downloaded_once(cluster, stack, fresh_up, hub):
    repo = stack.stack_file()["config"]["twinspark:model"]["repo"]
    commit = hub_commit(stack, repo)
    state = stack.export(show_secrets=True)
    revision = stored_step(state, f"{HEAD}-weights-revision")
    assert revision["outputs"]["stdout"].strip().splitlines()[-1] == commit, revision["outputs"]
    again = rerun(cluster, revision)  # an update's run: the kept commit, the hub not asked
    assert again.returncode == 0, again.stderr
    assert "kept: " in again.stdout and again.stdout.strip().splitlines()[-1] == commit, again.stdout

    # the download as the fresh up ran it (a later scenario's update of the step downloads nothing)
    first = stored_step(fresh_up.state, f"{HEAD}-weights-fetch")["outputs"]["stdout"]
    assert f"downloading {repo}@{commit}" in first, first
    # the shape check on the hub's listing and the head's MemTotal before any byte of the weights
    assert first.index(f"{HEAD}: ok   memory fit: ") < first.index(f"downloading {repo}@{commit}"), first
    fetch = stored_step(state, f"{HEAD}-weights-fetch")
    since = time.time()
    again = rerun(cluster, fetch)
    assert again.returncode == 0, again.stderr
    assert "nothing to download" in again.stdout, again.stdout
    assert containers_created(cluster, HEAD, since, time.time()) == []  # no download, no shape check run


# ---- 4. a model change's copy, against the recipe's rsync --------------------------------------------
def stack_model(stack) -> dict:
    return stack.stack_file()["config"]["twinspark:model"]


def set_model(stack, model: dict) -> None:
    for key in ("repo", "dir"):
        stack.set_config(f"model.{key}", model[key])


@pytest.fixture
def big_model(cluster, stack, deployed, operator_home):
    """A second repo on the hub (8 × 160 MiB): (the stack's model, that one), as {repo, dir}.
    Afterwards the stack serves its own model again and the big copies are gone from the nodes
    and the hub, whatever the scenario did."""
    own = {key: stack_model(stack)[key] for key in ("repo", "dir")}
    big = {"repo": BIG_REPO, "dir": str(PurePosixPath(own["dir"]).parent / BIG_REPO.rsplit("/", 1)[-1])}
    published = operator_home / "hub" / BIG_REPO  # the hub fixture's root
    sim_model.publish(published, shard_count=BIG_SHARDS, shard_mb=BIG_SHARD_MB)
    try:
        yield own, big
    finally:
        try:
            if stack_model(stack)["repo"] != own["repo"]:  # a failed scenario's leftover
                set_model(stack, own)
                stack.up()
        finally:
            for node in cluster.nodes:
                cluster.node_exec(node, "rm", "-rf", big["dir"], check=False)
            shutil.rmtree(published, ignore_errors=True)


def step_seconds(run, name: str) -> int:
    """A step's wall time as the engine's events give it: its start (resourcePreEvent) to its
    outputs (resOutputsEvent); the events' timestamps are whole seconds."""
    def first(kind: str) -> dict:
        return next(e for e in run.events if kind in e and e[kind]["metadata"]["urn"].endswith(f"::{name}")
                    and e[kind]["metadata"]["op"] in STARTED_STEP_OPS)
    started, done = first("resourcePreEvent"), first("resOutputsEvent")
    assert "timestamp" in started and "timestamp" in done, "the engine's JSON events carry no timestamps"
    return done["timestamp"] - started["timestamp"]


def test_a_model_change_copies_the_weights_over_both_rails(cluster, stack, big_model, report):
    """With TWINSPARK_SIM_FIGURES=1 (scenario_kit.FIGURES) the whole step is timed again and the
    recipe's rsync over ssh on the same data and link beside it (docs/operating.md's figures)."""
    own, big = big_model
    set_model(stack, big)
    rx_before = each_rail_rx_bytes(cluster)
    run = stack.up()
    grown = [after - before for after, before in zip(each_rail_rx_bytes(cluster), rx_before)]
    report["big_model_up_s"] = run.seconds
    # the bytes went over both rails, not the management link
    assert all(g > BIG_BYTES * 0.3 for g in grown), grown
    assert worker_matches_head(cluster, stack)
    said = step_output(stack, f"{WORKER}-weights-sync")
    copied = re.search(rf"copied (\d+) MB to {WORKER} in ([\d.]+) s", said)
    verified = re.search(rf"{WORKER}: hashed \d+ files as they arrived: (\d+) MB in ([\d.]+) s", said)
    assert copied and verified and "files verified" in said, said
    assert "changed files" not in said, said  # all hashed during the copy: none read again after it
    step_s = step_seconds(run, f"{WORKER}-weights-sync")
    assert step_s > 0, step_s
    report["weight_sync_MBps"] = round(int(copied[1]) / float(copied[2]), 1)  # the transfer alone
    # the worker's sha256 of each file as it arrived, over the copy's time
    report["weight_hashed_as_arrived_MBps"] = round(int(verified[1]) / float(verified[2]), 1)
    report["weight_sync_step_s"] = step_s
    report["weight_sync_step_MBps"] = round(BIG_BYTES / step_s / 1e6, 1)  # the whole step, both sides' checks
    report["weight_sync_streams"] = int(re.search(r"(\d+) streams over", said)[1])
    if FIGURES:
        measure_against_rsync(cluster, stack, big, report)
    set_model(stack, own)
    stack.up()
    outputs = stack.outputs()
    wait_for(lambda: completion_status(outputs, outputs["apiKey"]) == 200, "serving the stack's own model again",
             readiness_s(stack))


def measure_against_rsync(cluster, stack, big: dict, report) -> None:
    """The figures beside the copy: its whole step again, and the recipe's rsync on the same data and link."""
    # the whole step again, timed to the millisecond: the engine's stored command and stdin over ssh
    # (as pulumi-command runs it) onto a worker whose copy is gone — the same clock as rsync's below
    state = stack.export(show_secrets=True)
    sync, admitted = stored_step(state, f"{WORKER}-weights-sync"), stored_authorization(state, WORKER)
    cluster.node_exec(WORKER, "rm", "-rf", big["dir"])
    subprocess.run(["sync"], check=True)  # each side starts with the disk caught up (the nodes share it)
    with sync_key_admitted(cluster, WORKER, admitted):  # as its authorization step admits it for the step
        started = time.monotonic()
        again = rerun(cluster, sync)
        step_s = time.monotonic() - started
    assert again.returncode == 0 and "files verified" in again.stdout + again.stderr, again.stdout + again.stderr
    report["weight_sync_step_rerun_s"] = round(step_s, 2)
    report["weight_sync_step_rerun_MBps"] = round(BIG_BYTES / step_s / 1e6, 1)
    assert worker_matches_head(cluster, stack)

    # the recipe's method on the same data and link: plain rsync over ssh, head to worker, into a scratch dir
    worker_rail = cluster.nodes[WORKER].spec.rails[0].address.split("/")[0]
    scratch = str(PurePosixPath(big["dir"]).parent / "recipe-copy")
    recipe = (f"rsync -a -e 'ssh -i {contract.SYNC_KEY} -o BatchMode=yes -o UserKnownHostsFile={contract.SYNC_KNOWN_HOSTS}' "
              f"{big['dir']}/ {cluster.cfg.ssh.user}@{worker_rail}:{scratch}/")
    try:  # the recipe's key is a login (twinspark's forced command would refuse rsync's own)
        with sync_key_admitted(cluster, WORKER, admitted, plain=True):
            subprocess.run(["sync"], check=True)
            started = time.monotonic()
            out = cluster.ssh(HEAD, recipe, timeout=600)
            rsync_s = time.monotonic() - started
        assert out.returncode == 0, out.stderr
    finally:
        cluster.node_exec(WORKER, "rm", "-rf", scratch, check=False)
    report["rsync_over_ssh_MBps"] = round(BIG_BYTES / rsync_s / 1e6, 1)
    report["weight_step_vs_rsync_over_ssh"] = round(report["weight_sync_step_MBps"] / report["rsync_over_ssh_MBps"], 2)
    report["weight_step_rerun_vs_rsync_over_ssh"] = round(report["weight_sync_step_rerun_MBps"] /
                                                          report["rsync_over_ssh_MBps"], 2)


# ---- 5. an interrupted copy resumes ------------------------------------------------------------------
def shard_bytes(cluster, node: str, directory: str, shards: list[str]) -> int:
    """The bytes of those shards the node holds now (a missing one: 0)."""
    out = cluster.node_exec(node, "bash", "-c", 'cd "$0" && stat -c %s -- "$@" 2>/dev/null', directory, *shards,
                            check=False).stdout
    return sum(int(size) for size in out.split())


def sync_running_on_head(cluster) -> bool:
    """A run of the worker's copy script still alive on the head (its argv names the peer)."""
    return cluster.node_exec(HEAD, "pgrep", "-f", "--", f"--peer {WORKER} --dir", check=False).returncode == 0


@pytest.fixture
def worker_copy_restored(stack, cluster, deployed):
    """Afterwards the worker's copy matches the head's again, whatever the scenario left."""
    yield
    if not worker_matches_head(cluster, stack):
        copy_again(stack)


def test_an_interrupted_copy_resumes_through_a_replaced_sync_and_sends_only_what_was_missing(
        cluster, stack, worker_copy_restored, report, tmp_path):
    # the stack's own model: the big one of the scenario before is deleted once measured
    d = model_dir(stack)
    sizes = {f: e["size"] for f, e in manifest(cluster, stack)["files"].items() if f.endswith(".safetensors")}
    total = sum(sizes.values())
    cluster.node_exec(WORKER, "bash", "-c", 'cd "$0" && rm -f -- "$@"', d, *sizes)
    state = stack.export(show_secrets=True)
    sync = stored_step(state, f"{WORKER}-weights-sync")
    # the step's own command, run here: the worker admits the key as its authorization step would
    with sync_key_admitted(cluster, WORKER, stored_authorization(state, WORKER)), \
            rails_throttled(cluster, HEAD, RESUME_THROTTLE):  # the head's egress: the copy's direction
        with open(tmp_path / "said", "w") as said:
            copy = subprocess.Popen(
                ["ssh", "-i", str(cluster.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                 "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                 f"{cluster.cfg.ssh.user}@{cluster.nodes[node_of(cluster, sync)].spec.host}", sync["inputs"]["create"]],
                stdin=subprocess.PIPE, stdout=said, stderr=subprocess.STDOUT, text=True)
        copy.stdin.write(sync["inputs"].get("stdin", ""))  # the copy's secret on a pipe, never in a file
        copy.stdin.close()
        try:
            wait_for(lambda: shard_bytes(cluster, WORKER, d, list(sizes)) >= 0.4 * total,
                     f"40 % of the shards on {WORKER} (what the copy said: {tmp_path / 'said'})", 300)
        finally:  # the interruption: the run's SSH session and its rsync streams on the head
            copy.kill()
            copy.wait()
            cluster.node_exec(HEAD, "pkill", "-KILL", "-u", cluster.cfg.ssh.user, "-x", "rsync", check=False)
            wait_for(lambda: not sync_running_on_head(cluster), "the interrupted copy's end on the head", 60)
    there = shard_bytes(cluster, WORKER, d, list(sizes))
    assert there < total, "the copy finished before it could be interrupted"
    missing = total - there
    rx_before = rails_rx_bytes(cluster)
    run = copy_again(stack)  # docs/operating.md, recovering: the copy replaced, its key's window around it
    crossed = rails_rx_bytes(cluster) - rx_before
    report["resume_up_s"] = run.seconds
    report["resume_bytes"] = {"model": total, "there_after_interrupt": there, "missing": missing, "crossed": crossed}
    said = step_output(stack, f"{WORKER}-weights-sync")
    assert "files verified" in said, said
    # what was there stayed: what crossed is what was missing, and not what was already there
    # (the rails also carry Ray's traffic and the copy's control connection meanwhile)
    assert crossed < missing + 0.2 * there, report["resume_bytes"]
    assert worker_matches_head(cluster, stack)
