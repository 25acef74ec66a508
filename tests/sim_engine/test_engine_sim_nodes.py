"""A third Spark added to a serving pair, then taken out again, through `pulumi up` (docs/operating.md,
"Three or more Sparks"): one more entry under `twinspark:nodes`, a layout the model splits over,
and the engine does the rest; at three nodes (PP 3) and at four (TP 2 x PP 2, a switch of four) the
cluster heals as a pair does: the head's engine killed, a worker powered off and on. Runs alone
(`-k third` or `-k four`); needs the first up (`deployed`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

import node_contract as contract
from cluster import sim_nodes
from conftest import (HEAD, completion_status, containers, flag, readiness_s, serving_answers, serving_events,
                      serving_pid, vllm_argv, wait_for)
from test_engine_sim import changes, name_of

THIRD = "sim3"
REPLACED = {"replace", "create-replacement", "delete-replaced"}  # the last op the engine reports for a replacement


def write_nodes(stack, nodes: list[dict]) -> None:
    """The owner's edit of Pulumi.sim.yaml: the node list, as written by hand (its secrets kept as they are)."""
    document = stack.stack_file()
    document["config"]["twinspark:nodes"] = nodes
    stack.config_file.write_text(yaml.safe_dump(document, sort_keys=False))


def serves(stack) -> bool:
    outputs = stack.outputs()
    return completion_status(outputs, outputs["apiKey"]) == 200


def heals(cluster, stack, worker: str, report, prefix: str) -> None:
    """What the pair's healing scenarios do, at this size: the head's engine killed (every worker
    leaves the dead cluster and joins the next), then one worker powered off and on."""
    since = time.time()
    cluster.node_exec(HEAD, "kill", "-9", serving_pid(cluster, HEAD))
    wait_for(lambda: serving_events(cluster, worker, since, "die"), readiness_s(stack), f"{worker} leaving the dead head")
    wait_for(lambda: serves(stack), readiness_s(stack), "serving after the head's engine was killed")
    report[f"{prefix}_head_killed_to_serving_s"] = round(time.time() - since, 1)
    since = time.time()
    cluster.reboot(worker)
    wait_for(lambda: serves(stack), readiness_s(stack), f"serving after {worker} rebooted")
    report[f"{prefix}_worker_rebooted_to_serving_s"] = round(time.time() - since, 1)


def retire(cluster, stack, name: str) -> None:
    """The machine goes, and with it the host key first contact recorded for it: a node added
    later under the same name is another machine (another key), as a reinstalled box would be."""
    cluster.remove_node(name)
    (Path(stack.env["TWINSPARK_KNOWN_HOSTS_DIR"]) / name).unlink(missing_ok=True)


@pytest.fixture
def third_node(cluster, stack):
    """sim3 cabled to the rails' bridges and booted, as the stack's node list would write it; the
    scenario adds it to the stack. Afterwards the stack has its two nodes again and sim3 is gone."""
    pair = stack.stack_file()["config"]["twinspark:nodes"]
    spec = sim_nodes(pair, 3)[2]
    cluster.add_node(spec)
    try:
        yield pair, spec
    finally:
        if len(stack.stack_file()["config"]["twinspark:nodes"]) != len(pair):  # a failed scenario's leftover
            write_nodes(stack, pair)
            stack.cli("config", "rm", "--path", "twinspark:serving.pipelineParallel", check=False)
            stack.up()
        retire(cluster, stack, THIRD)


def test_a_third_node_added_serves_in_three_stages_and_taken_out_leaves_nothing_on_it(
        cluster, stack, deployed, third_node, report):
    pair, spec = third_node
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
    heals(cluster, stack, THIRD, report, "three_nodes")

    write_nodes(stack, pair)
    stack.cli("config", "rm", "--path", "twinspark:serving.pipelineParallel")
    removed = stack.up()
    report["third_node_removed_up_s"] = removed.seconds
    done = changes(removed)
    report["third_node_removed_changes"] = done
    # a new token, before sim3's containers go (the engine deletes them last): they cannot rejoin
    assert done.get("ray-token") in REPLACED, done
    gone = {name for name, op in done.items() if name.startswith(f"{THIRD}-")}
    assert gone and all(done[name] == "delete" for name in gone), done
    assert not [r["urn"] for r in stack.export()["resources"] if name_of(r["urn"]).startswith(f"{THIRD}-")]
    # sim3 as before it was added: no containers, no firewall table, no managed file
    assert containers(cluster, THIRD) == {}
    assert f"table inet {contract.FIREWALL_TABLE}" not in cluster.node_exec(THIRD, "nft", "list", "tables").stdout
    records = cluster.node_exec(THIRD, "bash", "-c", "ls -A /var/lib/twinspark/applied 2>/dev/null", check=False).stdout
    assert records == "", records
    assert serving_answers(stack) == 200
    assert "--pipeline-parallel-size" not in vllm_argv(cluster)


@pytest.fixture
def four_nodes(cluster, stack):
    """sim3 and sim4 cabled to the rails' bridges (a switch of four) and booted; afterwards the
    stack has its pair again and both are gone."""
    pair = stack.stack_file()["config"]["twinspark:nodes"]
    extra = sim_nodes(pair, 4)[2:]
    for spec in extra:
        cluster.add_node(spec)
    try:
        yield pair, extra
    finally:
        if len(stack.stack_file()["config"]["twinspark:nodes"]) != len(pair):
            back_to_the_pair(stack, pair)
            stack.up()
        for spec in extra:
            retire(cluster, stack, spec["name"])


FOUR_NODE_RECIPE = "Qwen3.8-Flash-Next"  # DeepSeek's recipe stops at three nodes; this one is made for 2 to 4


def back_to_the_pair(stack, pair) -> None:
    """The stack as the pair's: its nodes, the default recipe and its KV dtype, no layout set."""
    from components import recipes

    write_nodes(stack, pair)
    for key in ("pipelineParallel", "tensorParallel"):
        stack.cli("config", "rm", "--path", f"twinspark:serving.{key}", check=False)
    stack.set_config("serving.recipe", recipes.DEFAULT_RECIPE)
    stack.set_config("serving.kvCacheDtype", "fp8_ds_mla")


def test_four_nodes_on_a_switch_serve_at_tp_2_by_pp_2_heal_and_go_back_to_two(
        cluster, stack, deployed, four_nodes, report):
    pair, extra = four_nodes
    write_nodes(stack, pair + extra)
    stack.cli("config", "rm", "--path", "twinspark:serving.kvCacheDtype")  # the recipe's own
    stack.set_config("serving.recipe", FOUR_NODE_RECIPE)
    stack.set_config("serving.tensorParallel", "2")
    stack.set_config("serving.pipelineParallel", "2")
    added = stack.up()
    report["four_nodes_added_up_s"] = added.seconds
    assert serving_answers(stack) == 200
    argv = vllm_argv(cluster)
    assert flag(argv, "--tensor-parallel-size") == "2" and flag(argv, "--pipeline-parallel-size") == "2", argv
    for spec in extra:
        assert contract.SERVING_CONTAINER in containers(cluster, spec["name"]), spec["name"]
    # NcclCheck: every pair of the switch's four, in rounds of disjoint pairs, then the four together
    pair_checks = sorted(name for name in changes(added) if "-nccl-pair-" in name)
    report["four_nodes_nccl_pair_checks"] = pair_checks
    assert len(pair_checks) == 12, pair_checks  # 6 pairs, each end its own step
    assert set(stack.up().summary) == {"same"}
    heals(cluster, stack, extra[-1]["name"], report, "four_nodes")

    back_to_the_pair(stack, pair)
    removed = stack.up()
    report["four_nodes_removed_up_s"] = removed.seconds
    gone = {name for name, op in changes(removed).items() if name.startswith(("sim3-", "sim4-"))}
    assert gone and all(changes(removed)[name] == "delete" for name in gone), changes(removed)
    assert serving_answers(stack) == 200
