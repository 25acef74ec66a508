"""The pair's last scenarios (its files run in name order, this one last; in CI its cluster's
last): the second recipe served as two lanes, the head and the worker swapping roles as that
`up` goes back to one lane, then `pulumi destroy` from there. Neither change is undone by an
`up` of its own (issue 35: two `up`s and serving restarts less): the lanes' way back is the
swap's `up`, the swap is one way only (the way back would assert the same steps mirrored), and
the destroy after it asserts by the roles it finds."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import yaml

from core import contract
from components import host_prep
from scenario_kit import (HEAD, WORKER, changes, completion, containers, flag, name_of, prometheus, scrape_s, serving_answers,
                          serving_events, serving_pid, shim_calls, vllm_argv, wait_for)


@pytest.fixture(scope="module")
def one_lane_config(stack) -> str:
    """The stack file as the pair's other scenarios leave it (one lane across both nodes), read
    before the lanes scenario changes it: the swap's `up` goes back to it."""
    return stack.config_file.read_text()


def test_a_profile_change_then_a_second_recipe_in_two_lanes_restart_vllm_with_their_flags_and_serve(
        cluster, stack, deployed, one_lane_config, report):
    """Two changes a user makes, each its own `up` and restart: the default recipe's `multiagent`
    profile, then another recipe (gpt-oss-120b, at its only profile, `default`) served as two lanes
    (issue 41), one on each node behind the one endpoint: a request to each model answered by that
    lane's engine, an unknown model refused with vLLM's 404. It leaves the two lanes: the role swap
    after it goes back to one lane (each change once returned alone: docs/testing.md, "Moves")."""
    from core import recipes

    second = recipes.recipe_named("gpt-oss-120b")
    assert flag(vllm_argv(cluster), "--max-num-seqs") == "6"  # the default profile
    stack.set_config("serving.profile", "multiagent")
    run = stack.up()
    report["profile_change_up_s"] = run.seconds
    order = [(name_of(m["urn"]), m["op"]) for m in run.steps() if m["op"] != "same"]
    report["profile_change_up_steps"] = order
    # README "Changing parameters": the head stops, the workers are replaced, the head starts
    # last (each container deleted before its replacement: one name per node)
    containers_order = [(name, op) for name, op in order
                        if name.endswith("-serving-container") and op != "replace"]
    assert containers_order == [
        ("sim1-serving-container", "delete-replaced"), ("sim2-serving-container", "delete-replaced"),
        ("sim2-serving-container", "create-replacement"), ("sim1-serving-container", "create-replacement"),
    ], order
    assert flag(vllm_argv(cluster), "--max-num-seqs") == "8"
    outputs = stack.outputs()
    assert completion(outputs, outputs["apiKey"]).status_code == 200

    write_lanes(stack, second.name, {"coder": HEAD, "fast": WORKER})
    run = stack.up()
    report["second_recipe_lanes_up_s"] = run.seconds
    report["second_recipe_lanes_changes"] = changes(run)
    for node, model in ((HEAD, "sim-coder"), (WORKER, "sim-fast")):
        argv = json.loads(cluster.node_exec(node, "cat", f"{contract.LOG_DIR}/vllm-argv.json").stdout)["argv"]
        assert flag(argv, "--served-model-name") == model and flag(argv, "--tensor-parallel-size") == "1", argv
        assert flag(argv, "--tool-call-parser") == second.vllm.tool_call_parser
        assert flag(argv, "--reasoning-parser") == second.vllm.reasoning_parser
        assert "--speculative-config" not in argv and "deepseek_v4" not in " ".join(argv)
    assert changes(run).get("sim1-observability-dashboard-spec-decode") == "delete"  # it does not speculate
    outputs = stack.outputs()
    assert outputs["recipe"] == second.name and sorted(outputs["lanes"]) == ["coder", "fast"]
    key = {"Authorization": f"Bearer {outputs['apiKey']}"}
    for model in ("sim-coder", "sim-fast"):  # each lane's own engine answers, through the one endpoint
        answer = httpx.post(f"{outputs['endpoint']}/chat/completions", headers=key, timeout=30,
                            json={"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        assert (answer.status_code, answer.json().get("model")) == (200, model), answer.text
    unknown = httpx.post(f"{outputs['endpoint']}/chat/completions", headers=key, timeout=30,
                         json={"model": "no-such-model", "max_tokens": 8,
                               "messages": [{"role": "user", "content": "hi"}]})
    assert (unknown.status_code, unknown.json()["error"]["type"]) == (404, "NotFoundError"), unknown.text
    listed = httpx.get(f"{outputs['endpoint']}/models", headers=key, timeout=30).json()
    assert [m["id"] for m in listed["data"]] == ["sim-coder", "sim-fast"], listed
    assert httpx.get(f"{outputs['endpoint']}/models", timeout=30).status_code == 401  # the front checks the key

    # one lane swapped while the other serves (issue 41 part 3): a stream to each lane, then the fast
    # lane's maxModelLen changed by `up`: the coder lane's stream runs to its end untouched, the fast
    # lane's ends before its engine is replaced (its gateway drained first), and only its containers go
    for node in (HEAD, WORKER):
        paced_engine(cluster, node, seqs=4, tok_s=25)
    wait_for(lambda: all(lane_answers(outputs, m) for m in ("sim-coder", "sim-fast")), "both lanes paced", 120)
    streams: dict[str, tuple[bool, float]] = {}
    # 20 s a stream, longer than the `up` takes to reach the containers (fetch and shape check first:
    # ~10 s): without the drain the fast lane's stream was cut (with 8 s streams it was not, drain or none)
    threads = [threading.Thread(target=lambda m=m: streams.__setitem__(m, stream_lane(outputs, m, 500)))
               for m in ("sim-coder", "sim-fast")]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # both streams under way
    data = stack.stack_file()
    # and its weights read by another loader (issue 42 item 1): the image carries instanttensor; and a KV tier
    # on its node's disk (issue 42 item 3), which its engine's restart below reads back
    data["config"]["twinspark:lanes"][1]["serving"] = {"maxModelLen": 16384, "loadFormat": "instanttensor",
                                                         "kvTier": {"memoryGiB": 1, "diskGiB": 1}}
    stack.config_file.write_text(yaml.safe_dump(data, sort_keys=False))
    run = stack.up()
    for thread in threads:
        thread.join(timeout=120)
    swapped = changes(run)
    report["lane_swap_up_s"] = run.seconds
    report["lane_swap_changes"] = swapped
    assert streams["sim-coder"][0] and streams["sim-fast"][0], streams  # both read to their [DONE]
    assert "replace" in swapped.get(f"{WORKER}-serving-container", ""), swapped
    assert not [name for name in swapped if name.startswith(f"{HEAD}-")], swapped  # the other lane untouched
    # the lanes output names the lane the change touched, as `pulumi preview`'s outputs diff shows it
    after = stack.outputs()["lanes"]
    assert [lane for lane in after if after[lane] != outputs["lanes"][lane]] == ["fast"], (outputs["lanes"], after)
    assert after["fast"]["serving"]["maxModelLen"] == 16384 and after["fast"]["serving"]["loadFormat"] == "instanttensor"
    started = container_started_at(cluster, WORKER, contract.SERVING_CONTAINER)
    assert started > streams["sim-fast"][1], (started, streams)  # swapped only once its stream had ended
    report["lane_swap_after_stream_s"] = round(started - streams["sim-fast"][1], 1)
    argv = json.loads(cluster.node_exec(WORKER, "cat", f"{contract.LOG_DIR}/vllm-argv.json").stdout)["argv"]
    assert flag(argv, "--max-model-len") == "16384" and flag(argv, "--load-format") == "instanttensor"
    log = cluster.node_exec(WORKER, "cat", f"{contract.LOG_DIR}/{contract.VLLM_LOG}").stdout
    assert "loading weights with --load-format instanttensor (instanttensor from /" in log, log[-2000:]
    assert json.loads(flag(argv, "--kv-transfer-config"))["kv_connector_extra_config"]["secondary_tiers"] == [
        {"type": "fs", "root_dir": f"{contract.KV_TIER_DIR}/fast", "n_read_threads": 16, "n_write_threads": 16}]
    assert "PYTHONHASHSEED set" in log, log[-2000:]
    wait_for(lambda: lane_answers(outputs, "sim-fast"), "the swapped lane serving", 60)
    context = "".join(f"turn {i}: the tool said the build is green at step {i}. " for i in range(40))  # 2 k chars
    assert cached_tokens(outputs, "sim-fast", context) == 0  # computed, and kept on sim2's disk
    # each lane's engine scraped by the head's Prometheus, labelled by lane: the worker's over its rail,
    # through the firewall's lane-metrics flow (issue 41 part 4)
    wait_for(lambda: engines_up(cluster) == [("coder", "sim1", "1"), ("fast", "sim2", "1")],
             "Prometheus scraping each lane's engine", 4 * scrape_s(stack) + 30,
             why=lambda: json.dumps([(t["scrapeUrl"], t["health"], t["lastError"]) for t in
                                     prometheus(cluster, "/api/v1/targets").get("activeTargets", [])]))

    # a lane's engine killed: that lane's restarts (its own container, its own guard), the other's does not
    since = time.time()
    cluster.node_exec(WORKER, "kill", "-9", serving_pid(cluster, WORKER))
    wait_for(lambda: serving_events(cluster, WORKER, since, "start"), "the fast lane's engine started again", 60)
    wait_for(lambda: lane_answers(outputs, "sim-fast"), "the fast lane serving again", 90)
    report["lane_killed_to_serving_s"] = round(time.time() - since, 1)
    assert serving_events(cluster, HEAD, since, "die") == [] and lane_answers(outputs, "sim-coder")
    # the restarted engine reads the long context back from the KV tier instead of prefilling it again
    tier = cluster.node_exec(WORKER, "stat", "-c", "%a %U", contract.KV_TIER_DIR, f"{contract.KV_TIER_DIR}/fast")
    assert tier.stdout.split("\n")[:2] == ["700 root", "700 root"], tier.stdout
    assert cached_tokens(outputs, "sim-fast", context) >= len(context) // 4 - 4, "the tier's blocks not read back"
    log = cluster.node_exec(WORKER, "cat", f"{contract.LOG_DIR}/{contract.VLLM_LOG}").stdout
    assert "KV tier: blocks read back from" in log, log[-2000:]


def engines_up(cluster) -> list[tuple[str, str, str]]:
    """(lane, node, up) of every lane's engine the head's Prometheus scrapes (the one-lane gateway's series,
    from before the lanes, stays in its lookback for 5 min: it has no lane)."""
    return sorted((r["metric"]["lane"], r["metric"]["node"], r["value"][1])
                  for r in prometheus(cluster, "/api/v1/query", 'up{job="vllm", lane!=""}')["result"])


def cached_tokens(outputs: dict, model: str, prompt: str) -> int:
    """The prompt tokens of `prompt` the lane's engine did not compute (usage.prompt_tokens_details.cached_tokens)."""
    answer = httpx.post(f"{outputs['endpoint']}/completions", timeout=30,
                        headers={"Authorization": f"Bearer {outputs['apiKey']}"},
                        json={"model": model, "prompt": prompt, "max_tokens": 2})
    assert answer.status_code == 200, answer.text
    return (answer.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def paced_engine(cluster, node: str, seqs: int, tok_s: int) -> None:
    """The node's vLLM stand-in restarted to decode at most `seqs` requests at `tok_s` tokens a second each."""
    knobs = "/run/twinspark-sim"  # the stand-in's (tests/sim/bin/vllm), inside the container
    done = cluster.ssh(node, f"docker exec {contract.SERVING_CONTAINER} sh -c 'mkdir -p {knobs} && "
                             f"echo {seqs} {tok_s} > {knobs}/vllm-load' && docker restart {contract.SERVING_CONTAINER}")
    assert done.returncode == 0, done.stderr


def lane_answers(outputs: dict, model: str) -> bool:
    try:
        return httpx.post(f"{outputs['endpoint']}/chat/completions", timeout=30,
                          headers={"Authorization": f"Bearer {outputs['apiKey']}"},
                          json={"model": model, "max_tokens": 2,
                                "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    except httpx.HTTPError:
        return False


def stream_lane(outputs: dict, model: str, tokens: int) -> tuple[bool, float]:
    """One streamed completion to `model` through the endpoint: read to its [DONE]?, and when it ended."""
    body = ""
    try:
        with httpx.stream("POST", f"{outputs['endpoint']}/completions", timeout=180,
                          headers={"Authorization": f"Bearer {outputs['apiKey']}"},
                          json={"model": model, "prompt": "a long story", "max_tokens": tokens,
                                "stream": True}) as answer:
            for text in answer.iter_text():
                body += text
    except httpx.HTTPError:
        pass
    return body.rstrip().endswith("[DONE]"), time.time()


def container_started_at(cluster, node: str, container: str) -> float:
    """When the node's container last started (docker's clock: this machine's, as the nodes are namespaces)."""
    from datetime import datetime

    stamp = cluster.ssh(node, f"docker inspect -f '{{{{.State.StartedAt}}}}' {container}").stdout.strip()
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float("0." + (fraction or "0"))


def write_lanes(stack, recipe: str, placement: dict[str, str]) -> None:
    """The stack file's `model` made one lane per node (`placement`: lane -> node), each serving the same
    weights under the name sim-<lane>, with `recipe` at its default profile and its own KV dtype."""
    data = stack.stack_file()
    config = data["config"]
    model = config.pop("twinspark:model")
    serving = config["twinspark:serving"]
    serving.pop("kvCacheDtype", None)  # the recipe's own
    serving.update(recipe=recipe, profile="default")
    config["twinspark:lanes"] = [{"name": lane, "nodes": [node], "model": {**model, "servedName": f"sim-{lane}"}}
                                 for lane, node in placement.items()]
    stack.config_file.write_text(yaml.safe_dump(data, sort_keys=False))


def node_roles(stack) -> dict[str, str]:
    return {n["name"]: n["role"] for n in stack.outputs()["nodes"]}


def test_head_and_worker_swap_roles_as_the_lanes_go_back_to_one(cluster, stack, deployed, one_lane_config, report):
    """One `up` from the lanes scenario's two lanes (or the one lane, run alone) to the default one
    lane across both nodes with the head and the worker swapped."""
    head, worker = "sim2", "sim1"
    stack.config_file.write_text(one_lane_config)
    stack.set_config("nodes[0].role", "worker")
    stack.set_config("nodes[1].role", "head")
    run = stack.up()
    report["role_swap_up_s"] = run.seconds
    steps = [(name_of(m["urn"]), m["op"]) for m in run.steps() if m["op"] != "same"]
    report["role_swap_steps"] = steps
    # each node's container is replaced in place (one docker name a node): the old one, holding
    # the GPU (and on the old head the port), is gone before the new one starts; the new head
    # starts after the new worker; the old head's gateway goes after both
    for node in (head, worker):
        name = f"{node}-serving-container"
        assert steps.index((name, "delete-replaced")) < steps.index((name, "create-replacement")), steps
    assert (steps.index((f"{worker}-serving-container", "create-replacement"))
            < steps.index((f"{head}-serving-container", "create-replacement"))
            < steps.index((f"{worker}-serving-gateway", "delete"))), steps
    assert node_roles(stack) == {head: "head", worker: "worker"}
    assert serving_answers(stack) == 200, head
    assert cluster.nodes[head].spec.host in stack.outputs()["endpoint"]
    argv = vllm_argv(cluster, head)  # the default recipe at its default profile, over both nodes again
    assert flag(argv, "--max-num-seqs") == "6" and flag(argv, "--tensor-parallel-size") == "2", argv


def test_destroy_leaves_the_nodes_as_before_the_first_up(cluster, stack, fresh_up, report):
    roles = node_roles(stack)  # the swap before it, or the stack's own when this runs alone
    (head,) = [node for node, role in roles.items() if role == "head"]
    (worker,) = [node for node, role in roles.items() if role == "worker"]
    started = time.time()
    run = stack.destroy()
    report["destroy_s"] = run.seconds
    assert set(run.summary) == {"delete"}, run.summary
    for node in cluster.nodes:
        assert containers(cluster, node) == {}, node
        tables = cluster.node_exec(node, "nft", "list", "tables").stdout
        assert f"table inet {contract.FIREWALL_TABLE}" not in tables, (node, tables)
        records = cluster.node_exec(node, "bash", "-c", "ls -A /var/lib/twinspark/applied 2>/dev/null", check=False).stdout
        assert records == "", (node, records)  # every managed file's owner record is gone with its file
    # host prep's deletes reverted what its creates applied (the recording shims: tests/sim/shims)
    reverted = {node: shim_calls(cluster, node, since=started) for node in cluster.nodes}
    assert any(f"sysctl -q -w {host_prep.USERNS_UBUNTU_DEFAULT}" in c for c in reverted[head]), reverted[head]
    # not set there now (a former head's was reverted when it became the worker)
    assert not any(host_prep.USERNS_KEY in c for c in reverted[worker]), reverted[worker]
    assert any(f"sysctl -q -w {host_prep.HANG_RECOVERY_DEFAULTS}" in c for c in reverted[worker]), reverted[worker]
    assert cluster.in_netns(worker, "cat", "/proc/sys/net/ipv4/conf/rail0/arp_ignore").stdout.strip() == "0"
    for node, calls in reverted.items():
        assert any(f"systemctl disable --quiet {contract.FIREWALL_UNIT}" in c for c in calls), (node, calls)
        # a fresh login's memlock is the machine's own again, as before the first up (limits.d file gone)
        memlock = cluster.ssh(node, "ulimit -l").stdout.strip()
        assert memlock == fresh_up.login_memlock_before[node], (node, memlock, fresh_up.login_memlock_before)
