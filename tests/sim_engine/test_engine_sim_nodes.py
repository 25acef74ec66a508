"""A third Spark added to a serving pair, then a fourth, then both taken out again, through `pulumi
up` (docs/operating.md, "Three or more Sparks"): more entries under `twinspark:nodes`, a layout the
model splits over, and the engine does the rest; at four (TP 2 x PP 2, a switch of four) the
cluster heals as a pair does: the head's engine killed, a worker powered off and on (at three, PP 3:
the ring's scenario, test_engine_topology_ring.py). One cluster grown twice, not two grown once each
(issue 35: one shrink back to the pair, the third node's image and weights kept for the fourth's
layout). Runs alone (`-k third`); needs the first up
(`deployed`)."""

from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from core import contract
from cluster import sim_nodes
from components.remote import launch_file, script_text
from scenario_kit import (FIGURES, HEAD, changes, containers, firewall_mismatches, flag, heals, name_of, rails_throttled,
                          serving_answers, sshd_throttled_lines, stored_authorization, stored_step, sync_key_access,
                          sync_key_admitted, vllm_argv)
from program_harness import flag_values

THIRD = "sim3"
REPLACED = {"replace", "create-replacement", "delete-replaced"}  # the last op the engine reports for a replacement


def write_nodes(stack, nodes: list[dict]) -> None:
    """The owner's edit of Pulumi.sim.yaml: the node list, as written by hand (its secrets kept as they are)."""
    document = stack.stack_file()
    document["config"]["twinspark:nodes"] = nodes
    stack.config_file.write_text(yaml.safe_dump(document, sort_keys=False))


def retire(cluster, stack, name: str) -> None:
    """The machine goes, and with it the host key first contact recorded for it: a node added
    later under the same name is another machine (another key), as a reinstalled box would be."""
    cluster.remove_node(name)
    (Path(stack.env["TWINSPARK_KNOWN_HOSTS_DIR"]) / name).unlink(missing_ok=True)


@pytest.fixture
def grown(cluster, stack):
    """sim3 and sim4 cabled to the rails' bridges (a switch of four) and booted, as the stack's node
    list would write them; the scenario adds them to the stack, one, then the other. Afterwards
    the stack has its pair again and both machines are gone."""
    pair = stack.stack_file()["config"]["twinspark:nodes"]
    extra = sim_nodes(pair, 4)[2:]
    for spec in extra:
        cluster.add_node(spec)
    try:
        yield pair, extra
    finally:
        if len(stack.stack_file()["config"]["twinspark:nodes"]) != len(pair):  # a failed scenario's leftover
            back_to_the_pair(stack, pair)
            stack.up()
        for spec in extra:
            retire(cluster, stack, spec["name"])


def left_bare(cluster, node: str) -> None:
    """The node as before it was added: no containers, no firewall table, no managed file."""
    assert containers(cluster, node) == {}, node
    assert f"table inet {contract.FIREWALL_TABLE}" not in cluster.node_exec(node, "nft", "list", "tables").stdout
    records = cluster.node_exec(node, "bash", "-c", "ls -A /var/lib/twinspark/applied 2>/dev/null", check=False).stdout
    assert records == "", (node, records)


def add_a_third_node(cluster, stack, pair, spec, report) -> None:
    """A third node added to the serving pair: its own creates, every NCCL rank and a new Ray
    token previewed; it serves in three pipeline stages and the pair keeps its image and weights."""
    pair_containers = {node: containers(cluster, node) for node in (HEAD, "sim2")}
    # the sim's model (64 heads, 8 KV heads, 4 layers) does not split over TP 3: 3 pipeline stages
    write_nodes(stack, pair + [spec])
    stack.set_config("serving.pipelineParallel", "3")
    preview = stack.preview()
    planned = changes(preview)
    report["third_node_preview"] = planned
    mine = {name for name in planned if name.startswith(f"{THIRD}-")}
    assert mine and all(planned[name] == "create" for name in mine), planned
    # the ranks never run alone: a new world size is a new run, and every rank goes with it
    assert planned.get("nccl-run") == "replace", planned
    for node in (HEAD, "sim2"):
        assert planned.get(f"{node}-nccl-check") == "replace", (node, planned)

    added = stack.up()
    report["third_node_added_up_s"] = added.seconds
    assert changes(added).get("ray-token") in REPLACED, changes(added)  # a new cluster
    assert serving_answers(stack) == 200
    argv = vllm_argv(cluster)
    assert flag(argv, "--pipeline-parallel-size") == "3" and flag(argv, "--tensor-parallel-size") == "1", argv
    assert contract.SERVING_CONTAINER in containers(cluster, THIRD)
    assert [n["name"] for n in stack.outputs()["nodes"]] == [HEAD, "sim2", THIRD]
    # the pair keeps its image and its copy of the weights; its serving is made again for the new layout
    pair_done = {name for name in changes(added) if name.startswith(("sim1-", "sim2-"))}
    assert not {"sim2-image-ship", "sim2-weights-sync", "sim1-image-build"} & pair_done, pair_done
    for node in (HEAD, "sim2"):
        serving = containers(cluster, node)[contract.SERVING_CONTAINER]
        assert serving[0] != pair_containers[node][contract.SERVING_CONTAINER][0], node


FOUR_NODE_RECIPE = "Qwen3.8-Flash-Next"  # DeepSeek's recipe stops at three nodes; this one is made for 2 to 4


def back_to_the_pair(stack, pair) -> None:
    """The stack as the pair's: its nodes, the default recipe and its KV dtype, no layout set."""
    from core import recipes

    write_nodes(stack, pair)
    for key in ("pipelineParallel", "tensorParallel"):
        stack.cli("config", "rm", "--path", f"twinspark:serving.{key}", check=False)
    stack.set_config("serving.recipe", recipes.DEFAULT_RECIPE)
    stack.set_config("serving.kvCacheDtype", "fp8_ds_mla")


# The fan-out against all from the head, each node's egress held to this per rail for the
# comparison only: the sim's rails are otherwise as fast as its two cores copy, where a Spark's
# switch port is what a copy from the head shares (the figures are the sim's, not a Spark's).
FAN_OUT_RAIL_RATE = "40mbit"


def source_of(cluster, state: dict, worker: str) -> str:
    """The node `worker`'s copy step ran on, as the engine kept the step's connection."""
    host = stored_step(state, f"{worker}-weights-sync")["inputs"]["connection"]["host"]
    return next(name for name, node in cluster.nodes.items() if node.spec.host == host)


def with_flags(line: str, **values) -> str:
    """The runner line with each --flag's value replaced (a list: a repeated flag's, in order)."""
    argv = shlex.split(line)
    for name, value in values.items():
        at = [i for i, a in enumerate(argv) if a == "--" + name.replace("_", "-")]
        for i, v in zip(at, value if isinstance(value, list) else [value], strict=True):
            argv[i + 1] = v
    return shlex.join(argv)


def timed_rounds(cluster, rounds: list[list[tuple[str, str]]]) -> float:
    """Run each round's (node, runner line) copies at once, the rounds one after another, as
    the engine would run the steps; the seconds the whole took."""
    stdin = script_text("sync-weights.sh") + launch_file("weights.py")
    started = time.monotonic()
    for copies in rounds:
        with ThreadPoolExecutor(len(copies)) as pool:
            runs = list(pool.map(lambda c: cluster.ssh(c[0], c[1], stdin=stdin, timeout=600), copies))
        for (node, line), run in zip(copies, runs):
            assert run.returncode == 0, (node, line, run.stdout[-2000:], run.stderr[-2000:])
    return round(time.monotonic() - started, 1)


def fan_out_against_from_head(cluster, state: dict, workers: list[str]) -> dict:
    """The program's weight copy plan (the steps' own command lines, from the engine's state)
    against every worker's copy from the head, into a fresh directory beside the model's, the
    same sync-weights.sh, rails and throttle for both (whole steps: ssh, daemons, copy, verify)."""
    lines = {w: stored_step(state, f"{w}-weights-sync")["inputs"]["create"] for w in workers}
    model_dir = flag(shlex.split(lines[workers[0]]), "--dir")
    bench = f"{model_dir}-fan-out-bench"
    head_rails = [r.ip for r in cluster.nodes[HEAD].spec.rails]

    def from_head(worker: str) -> str:
        rails = [f"{pair.split('=')[0]}={ip}" for pair, ip in
                 zip(flag_values(shlex.split(lines[worker]), "--rail"), head_rails)]
        return with_flags(lines[worker], dir=bench, node=HEAD, rail=rails)

    source = {w: source_of(cluster, state, w) for w in workers}
    # the engine's order on a switch: a relay after its source's copy, a source's copies one at a time
    plan, done, waiting = [], {HEAD}, list(workers)
    while waiting:
        ready = []
        for w in list(waiting):
            if source[w] in done and source[w] not in {source[r] for r in ready}:
                ready.append(w)
                waiting.remove(w)
        plan.append(ready)
        done |= set(ready)
    at = shlex.quote(bench)
    prepare = (f"rm -rf {at} && cp -a {shlex.quote(model_dir)} {at} && python3 - verify --dir {at} "
               f"--manifest {at}/{contract.WEIGHTS_MANIFEST} --record {at}/{contract.WEIGHTS_RECORD} --node {HEAD}")
    figures = {"rail_rate": FAN_OUT_RAIL_RATE, "rounds": [[f"{source[w]}->{w}" for w in ready] for ready in plan]}
    try:
        with ExitStack() as throttled:
            for node in [HEAD, *workers]:
                throttled.enter_context(rails_throttled(cluster, node, FAN_OUT_RAIL_RATE))
            # each worker admits the head's key and its relay's, bound to the bench's directory, as
            # their authorization steps admit them for the copy (`up` revoked them)
            for w in workers:
                for relay in (False, True) if source[w] != HEAD else (False,):
                    throttled.enter_context(sync_key_admitted(cluster, w, stored_authorization(state, w, relay), bench))
            for name, rounds in (("from_head_s", [[(HEAD, from_head(w)) for w in workers]]),
                                 ("fan_out_s", [[(source[w], with_flags(lines[w], dir=bench)) for w in ready]
                                                for ready in plan])):
                for node in workers:
                    cluster.ssh(node, f"rm -rf {at}")
                prepared = cluster.ssh(HEAD, prepare, stdin=launch_file("weights.py"))
                assert prepared.returncode == 0 and prepared.stdout.strip() == "", prepared.stdout + prepared.stderr
                figures[name] = timed_rounds(cluster, rounds)
    finally:
        for node in [HEAD, *workers]:
            cluster.ssh(node, f"rm -rf {at}")
    figures["fan_out_speedup"] = round(figures["from_head_s"] / figures["fan_out_s"], 2)
    return figures


def test_a_third_then_a_fourth_node_serve_and_heal_and_taken_out_leave_nothing_on_them(
        cluster, stack, deployed, grown, report):
    """One cluster grown twice (issue 35: the third node and the four on a switch were two
    scenarios, each growing the pair and shrinking it back): the pair, three nodes at PP 3, four at
    TP 2 x PP 2, the pair again; both added nodes taken out at once, as one owner's edit. Costs
    about 314 s (ecc366b, idle box: its heal at three is the ring's; the two were 191 + 322 s)."""
    pair, extra = grown
    add_a_third_node(cluster, stack, pair, extra[0], report)
    # healing at three nodes (PP 3) is the ring's (test_engine_topology_ring.py: the same `heals`)

    write_nodes(stack, pair + extra)
    stack.cli("config", "rm", "--path", "twinspark:serving.kvCacheDtype")  # the recipe's own
    stack.set_config("serving.recipe", FOUR_NODE_RECIPE)
    stack.set_config("serving.tensorParallel", "2")
    stack.set_config("serving.pipelineParallel", "2")
    added = stack.up()
    report["four_nodes_added_up_s"] = added.seconds
    added_changes = changes(added)
    # issue 36's worst case for a stock sshd (MaxStartups 10:30:100): two fresh nodes' every step and
    # the pair's changed ones in one `up`, the command provider holding each step's login to its end
    report["four_nodes_added_up_steps"] = len(added_changes)
    report["four_nodes_sshd_throttled_lines"] = {node: sshd_throttled_lines(cluster, node) for node in cluster.nodes}
    assert serving_answers(stack) == 200
    argv = vllm_argv(cluster)
    assert flag(argv, "--tensor-parallel-size") == "2" and flag(argv, "--pipeline-parallel-size") == "2", argv
    for spec in extra:
        assert contract.SERVING_CONTAINER in containers(cluster, spec["name"]), spec["name"]
    # NcclCheck: every pair of the switch's four, in rounds of disjoint pairs, then the four together
    pair_checks = sorted(name for name in added_changes if "-nccl-pair-" in name)
    report["four_nodes_nccl_pair_checks"] = pair_checks
    assert len(pair_checks) == 12, pair_checks  # 6 pairs, each end its own step
    # the weight copy fans out: sim4's left from sim2 (its own way in), sim3's from the head after sim2's
    state = stack.export(show_secrets=True)
    assert {w: source_of(cluster, state, w) for w in ("sim2", "sim3", "sim4")} == {
        "sim2": HEAD, "sim3": HEAD, "sim4": "sim2"}
    relay_steps = {"sim4-weights-relay-host-key", "sim4-weights-relay-authorize", "sim2-weights-sync-key"}
    assert relay_steps <= set(added_changes), added_changes
    if FIGURES:  # docs/operating.md's fan-out figure: timings, not behaviour
        report["four_nodes_weight_copy"] = fan_out_against_from_head(cluster, state, ["sim2", "sim3", "sim4"])
    assert set(stack.up().summary) == {"same"}
    # issue 37: the copy keys (the head's on each worker, sim2's relay key on sim4) are gone once
    # their steps are done; what each would run, only its forced command, stays installed
    access = {w: sync_key_access(cluster, w) for w in ("sim2", "sim3", "sim4")}
    report["four_nodes_sync_keys_after_up"] = access
    assert access == {w: {"admitted": [], "forced command": True} for w in access}, access
    # every node's listening ports from the three others' LAN and rail addresses: as its flows say
    probes, mismatches = firewall_mismatches(cluster, stack)
    report["four_nodes_firewall_probes"] = probes
    assert probes and not mismatches, mismatches
    heals(cluster, stack, extra[-1]["name"], report, "four_nodes")

    back_to_the_pair(stack, pair)
    removed = stack.up()
    report["four_nodes_removed_up_s"] = removed.seconds
    done = changes(removed)
    report["four_nodes_removed_changes"] = done
    # a new token, before the added nodes' containers go (the engine deletes them last): they cannot rejoin
    assert done.get("ray-token") in REPLACED, done
    gone = {name for name, op in done.items() if name.startswith(("sim3-", "sim4-"))}
    assert gone and all(done[name] == "delete" for name in gone), done
    assert not [r["urn"] for r in stack.export()["resources"] if name_of(r["urn"]).startswith(("sim3-", "sim4-"))]
    for spec in extra:
        left_bare(cluster, spec["name"])
    assert serving_answers(stack) == 200
    assert "--pipeline-parallel-size" not in vllm_argv(cluster)
