"""Lanes (issue 41): several models, each on its own nodes, in one stack config; the one-lane stack as before."""

import copy
import json

import pytest
from program_harness import config_blocks

from components.config import parse_stack_config
from components.config.loading import _lanes_not_yet_deployed
from test_config_errors import assert_refused

BASE = config_blocks()  # spark1 (head) and spark2, DeepSeek's recipe on both


def two_lanes(**changes):
    """BASE as two lanes, one per node: gpt-oss-120b's recipe (1 or 2 nodes) on each, two served names."""
    cfg = copy.deepcopy(BASE)
    del cfg["model"]
    del cfg["serving"]["gpuMemoryUtilization"]  # each lane's recipe's, or its own
    cfg["lanes"] = [
        {"name": "coder", "nodes": ["spark1"],
         "model": {"repo": "openai/gpt-oss-120b", "dir": "/home/nvidia/models/gpt-oss-120b", "servedName": "coder"},
         "serving": {"recipe": "gpt-oss-120b", "gpuMemoryUtilization": 0.45}},
        {"name": "fast", "nodes": ["spark2"],
         "model": {"repo": "openai/gpt-oss-20b", "dir": "/home/nvidia/models/gpt-oss-20b", "servedName": "fast"},
         "serving": {"recipe": "gpt-oss-120b", "maxModelLen": 65536}},
    ]
    for path, value in changes.items():
        lane, key = path.split(".", 1)
        target = cfg["lanes"][int(lane)]
        *parents, last = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return cfg


def test_a_stack_without_lanes_is_one_lane_of_model_and_serving_on_every_node():
    cfg = parse_stack_config(copy.deepcopy(BASE))
    [lane] = cfg.served_lanes
    assert (lane.name, [n.name for n in lane.nodes], lane.prefix) == ("default", ["spark1", "spark2"], "")
    assert lane.model is cfg.model and lane.serving is cfg.serving
    assert (lane.tensor_parallel_size, lane.pipeline_parallel_size) == (2, 1)
    # the budget every node had: the one lane's share (HostPrep's caps and twinspark.env are unchanged)
    for node in cfg.nodes:
        assert cfg.node_memory_budget(node) == cfg.serving.memory_budget
    assert _lanes_not_yet_deployed(cfg) == []


def test_two_lanes_one_per_node_take_their_recipes_values_and_the_stacks_serving():
    raw = two_lanes()
    raw["serving"]["kvCacheDtype"] = "fp8_e4m3"  # the stack's, for every lane that sets none
    cfg = parse_stack_config(raw)
    coder, fast = cfg.served_lanes
    assert [(lane.name, [n.name for n in lane.nodes], lane.tensor_parallel_size) for lane in cfg.served_lanes] == \
        [("coder", ["spark1"], 1), ("fast", ["spark2"], 1)]
    assert (coder.serving.gpu_memory_utilization, fast.serving.gpu_memory_utilization) == (0.45, 0.70)  # own, recipe's
    assert (coder.serving.max_model_len, fast.serving.max_model_len) == (1048576, 65536)  # the stack's, own
    assert coder.serving.kv_cache_dtype == fast.serving.kv_cache_dtype == "fp8_e4m3"
    assert coder.serving.port == fast.serving.port == cfg.serving.port  # the stack's, one endpoint
    assert coder.key("serving.recipe") == "lanes[0].serving.recipe"
    # another repository than the recipe's: said, with the lane's own key
    assert cfg.warnings == ["lanes[1].model.repo openai/gpt-oss-20b is not openai/gpt-oss-120b, the repository of "
                            "lanes[1].serving.recipe gpt-oss-120b: the recipe's flags, environment and parsers are "
                            "applied to openai/gpt-oss-20b as they are; choose the recipe made for it if there is one "
                            "(see Models in docs/configuration.md)"]
    assert [cfg.node_memory_budget(n).model_share for n in cfg.nodes] == [0.45, 0.70]
    assert _lanes_not_yet_deployed(cfg) == []  # one node per lane, one lane per node: deployed
    assert cfg.head_lane == coder


def test_two_lanes_on_one_node_fit_together_or_are_refused_naming_the_node_and_both_shares():
    raw = two_lanes(**{"1.nodes": ["spark1", "spark2"], "1.serving.gpuMemoryUtilization": 0.40})
    cfg = parse_stack_config(raw)
    spark1 = cfg.nodes[0]
    assert [lane.name for lane in cfg.lanes_on(spark1)] == ["coder", "fast"]
    budget = cfg.node_memory_budget(spark1)
    assert (budget.model_share, budget.cotenant_percent) == (0.85, 5)  # auto: half of what 0.85 + 5% leave
    assert [p.split(" — ")[0] for p in _lanes_not_yet_deployed(cfg)] == [
        "twinspark:lanes[1].nodes: 2 nodes", "twinspark:lanes: spark1 serves coder, fast"]
    assert_refused(two_lanes(**{"1.nodes": ["spark1", "spark2"]}), "twinspark:lanes[1].serving.gpuMemoryUtilization",
                   ["spark1 holds lane coder 0.45 + lane fast 0.7", "shares that fit spark1 together",
                    "over 100% of the node's memory"])


@pytest.mark.parametrize("change, key, fragments", [
    ({"0.nodes": ["spark3"]}, "twinspark:lanes[0].nodes[0]", ["spark3", "the name of a node: spark1 or spark2"]),
    ({"0.nodes": ["spark1", "spark1"]}, "twinspark:lanes[0].nodes[1]", ["each node once"]),
    ({"1.model.servedName": "coder"}, "twinspark:lanes[1].model.servedName",
     ["coder", "a name other than lanes[0]'s", "requests go to the lane"]),
    ({"1.name": "coder"}, "twinspark:lanes[1].name", ["lanes[0].name"]),
    ({"1.model.dir": "/home/nvidia/models/gpt-oss-120b"}, "twinspark:lanes[1].model.dir",
     ["a directory other than lanes[0].model.dir: it holds openai/gpt-oss-120b"]),
    ({"1.name": "Fast Lane"}, "twinspark:lanes[1].name", ["1 to 16 lowercase letters"]),
    ({"1.nodes": ["spark1"]}, "twinspark:lanes", ["no lane on spark2", "every node in some lane's nodes"]),
    ({"1.serving.port": 9000}, "twinspark:lanes[1].serving.port",
     ["9000", "a lane key (recipe, profile", "serving.port is the stack's"]),
    ({"1.serving.recipe": "DeepSeek-V4-Flash-0731"}, "twinspark:lanes[1].nodes",
     ["1 nodes", "2 to 3 nodes, what serving.recipe DeepSeek-V4-Flash-0731 supports"]),
    ({"1.serving.tensorParallel": 2}, "twinspark:lanes[1].serving.tensorParallel",
     ["tensorParallel 2 × pipelineParallel 1 = 2 ranks on 1 nodes"]),
    ({"1.serving.profile": "multiagent"}, "twinspark:lanes[1].serving.profile", ["one of recipe gpt-oss-120b's"]),
])
def test_a_lane_that_cannot_be_served_is_refused_by_its_own_key(change, key, fragments):
    assert_refused(two_lanes(**change), key, fragments)


def test_model_beside_lanes_and_neither_are_refused():
    raw = two_lanes()
    raw["model"] = copy.deepcopy(BASE["model"])
    assert_refused(raw, "twinspark:model", ["no `model` beside `lanes`", "lanes[N].model"])
    raw = copy.deepcopy(BASE)
    del raw["model"]
    assert_refused(raw, "twinspark:model", ["missing", "or `lanes`"])


def test_a_lanes_view_is_a_one_lane_stack_headed_where_its_gateway_runs():
    cfg = parse_stack_config(two_lanes())
    coder, fast = (cfg.lane_view(lane) for lane in cfg.served_lanes)
    assert [(n.name, n.role) for n in coder.nodes] == [("spark1", "head")]
    assert [(n.name, n.role) for n in fast.nodes] == [("spark2", "head")]  # the stack's worker heads its lane
    assert (fast.model.served_name, fast.tensor_parallel_size, fast.serving.max_model_len) == ("fast", 1, 65536)
    assert coder.serving.port == fast.serving.port == 8101 != cfg.serving.port  # behind the head's front
    assert not fast.several_lanes and cfg.several_lanes
    one = parse_stack_config(copy.deepcopy(BASE))
    assert one.lane_view(one.only_lane) is one  # one lane: the stack itself, every resource as before


# ---- monitoring by lane ---------------------------------------------------------------------------
def test_prometheus_scrapes_each_lanes_engine_and_the_dashboards_and_alerts_keep_lanes_apart(tmp_path):
    import dataclasses

    import yaml
    from observability_helpers import dashboard_targets, every_rule
    from test_observability import check_exprs_parse

    from components.observability_files import plan_from_config, render_dashboards, render_prometheus_config

    plan = plan_from_config(parse_stack_config(two_lanes()), alertmanager=False)
    assert plan.panels == ("overview", "nodes")  # neither lane's recipe speculates: its dashboard drawn all the same
    plan = dataclasses.replace(plan, panels=("overview", "spec-decode", "nodes"))
    vllm_job = yaml.safe_load(render_prometheus_config(plan))["scrape_configs"][0]
    assert vllm_job["job_name"] == "vllm" and vllm_job["static_configs"] == [  # the worker's over its rail
        {"targets": ["127.0.0.1:8103"], "labels": {"node": "spark1", "role": "head", "lane": "coder"}},
        {"targets": ["10.0.0.2:8103"], "labels": {"node": "spark2", "role": "worker", "lane": "fast"}}]
    engine_queries = [(title, expr) for _, title, expr in dashboard_targets(plan) if 'job="vllm"' in expr]
    assert len(engine_queries) >= 25
    # every engine query picks the lanes the variable names and adds up each lane apart
    assert [q for q in engine_queries if 'lane=~"$lane"' not in q[1] or "sum(" in q[1] or "max(" in q[1]] == []
    overview = json.loads(render_dashboards(plan)["twinspark-overview.json"])
    assert [(v["name"], v["query"], v["allValue"]) for v in overview["templating"]["list"]] == [
        ("lane", 'label_values(up{job="vllm"}, lane)', ".+")]  # All: every lane, not a series without one
    legends = [t["legendFormat"] for p in overview["panels"] for t in p.get("targets", []) if 'job="vllm"' in t["expr"]]
    assert legends and all(legend.startswith("{{lane}}") for legend in legends), legends
    # one lane's engine crawling is not hidden by another's tokens
    [collapse] = [r for r in every_rule(plan) if r.alert == "TwinsparkThroughputCollapse"]
    assert collapse.expr.count("sum by (lane)") == 3 and collapse.expr.count("on (lane)") == 2, collapse.expr
    exprs = [e for _, e in engine_queries] + list(collapse.signals) + [collapse.expr]
    proc = check_exprs_parse(tmp_path, exprs)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- the program: two lanes, one per node -----------------------------------------------------
def lanes_stack_config():
    from program_harness import stack_config

    config = stack_config()
    blocks = two_lanes()
    del config["twinspark:model"]
    config["twinspark:serving"] = blocks["serving"]
    config["twinspark:lanes"] = blocks["lanes"]
    return config


def test_two_lanes_deploy_an_engine_and_gateway_on_each_node_behind_the_heads_router(program):
    from program_harness import runner_call

    run = program(lanes_stack_config())
    assert run.error is None, run.error
    for node, lane, model in (("spark1", "coder", "coder"), ("spark2", "fast", "fast")):
        # each node heads its own lane: vLLM, its gateway on the lane port, its guard, its own weights
        container = run.named(f"{node}-serving-container").inputs
        assert container["entrypoints"] == ["/bin/bash", "/twinspark/boot-head.sh"], node
        gateway = run.named(f"{node}-lane-gateway").inputs
        assert gateway["name"] == "twinspark-lane-gateway" and f"{node}-guard" in run.by_name
        conf = runner_call(run.named(f"{node}-bundle-api-gateway-conf")).payload
        assert "listen 8101;" in conf and "unix:/run/twinspark-vllm/vllm.sock" in conf
        # its /metrics apart from the one-lane gateway's 8100, which still runs while a stack takes on lanes
        assert "listen 127.0.0.1:8103;" in conf and "8100" not in conf
        wait = runner_call(run.named(f"{node}-readiness-wait")).args
        assert "http://127.0.0.1:8101" in wait and model in wait, wait
        assert "twinspark-lane-gateway" in wait and "twinspark-api-gateway" not in wait  # a timeout names its state
        # the head's lane keeps the stack's names (its weights are not fetched again when a lane is added)
        assert run.named("weights" if lane == "coder" else f"{lane}-weights").type == \
            "twinspark:model_weights:ModelWeights"
        launch = runner_call(run.named(f"{node}-bundle-launch-vllm-sh")).payload
        assert f"--served-model-name {model}" in launch and "--tensor-parallel-size 1" in launch
    assert not run.of_type("twinspark:nccl_check:NcclCheck"), "no fabric between single-node lanes to check"
    for node in ("spark1", "spark2"):  # each lane swapped with a drain: its containers wait for it, readiness after
        drain = runner_call(run.named(f"{node}-lane-drain")).args
        assert drain[:1] == ["drain"] and "http://127.0.0.1:8103/metrics" in drain and "--deadline-s" in drain
        assert run.depends_on(run.named(f"{node}-serving-container"), f"{node}-lane-drain")
        assert run.depends_on(run.named(f"{node}-lane-gateway"), f"{node}-lane-drain")
        assert run.depends_on(run.named(f"{node}-readiness-wait"), f"{node}-lane-open")
        assert "this lane is draining" in runner_call(run.named(f"{node}-bundle-api-gateway-conf")).payload
    # the stack head's engine placed after the other lane's (ServingCluster says why: one lane -> two, the engine
    # would delete the head's old container twice), but never replaced with it: each lane swaps alone
    head_engine, other_engine = run.named("spark1-serving-container"), run.named("spark2-serving-container")
    assert run.depends_on(head_engine, "spark2-serving-container")
    assert not run.depends_on(other_engine, "spark1-serving-container")
    assert other_engine.urn not in head_engine.replace_with
    # every node's containers under the one `serving` component, as with one lane: a node that changes lanes
    # replaces its container in place (a second parent would create one beside it, of the same docker name)
    assert {run.named(f"{node}-serving-container").parent for node in ("spark1", "spark2")} == \
        {run.named("serving").urn}
    # each lane head builds its own image and downloads its own weights: nothing is shipped or copied between lanes
    names = [r.name for r in run.resources]
    assert {"spark1-weights-fetch", "spark2-weights-fetch"} <= set(names)
    assert not [n for n in names if n.endswith(("-image-ship", "-weights-sync", "-weights-sync-key"))], names
    router = run.named("spark1-lane-router").inputs
    assert router["entrypoints"][-4:] == ["--lane", "coder=127.0.0.1:8101", "--lane", "fast=10.0.0.2:8101"]
    assert router["user"] == "nobody"
    # the stack's gateway (the one-lane gateway's resource and container, replaced in place) fronts the router
    front = run.named("spark1-serving-gateway")
    assert front.inputs["entrypoints"] == ["/bin/bash", "/twinspark/api-gateway.sh", "api-front.conf"]
    assert front.inputs["name"] == "twinspark-api-gateway" and not [
        v for v in front.inputs.get("volumes", []) if v["hostPath"] in ("/run/twinspark-vllm", "/run/twinspark-drain")]
    assert run.depends_on(front, "fast-readiness") and run.depends_on(front, "spark1-lane-router")
    assert "spark2-serving-gateway" not in run.by_name
    front_conf = runner_call(run.named("spark1-bundle-api-front-conf")).payload
    assert "listen 8000;" in front_conf and "server 127.0.0.1:8102;" in front_conf and "/metrics" not in front_conf
    # the worker's lane gateway is open to the head's rail address alone; the head's is on loopback
    walls = {node: runner_call(run.named(f"{node}-hostprep-firewall")).payload for node in ("spark1", "spark2")}
    assert 'iifname "enp1s0f0np0" ip saddr 10.0.0.1 tcp dport 8101 accept  # lane-gateway' in walls["spark2"]
    assert "lane-gateway" not in walls["spark1"]
    assert "ray-gcs" not in walls["spark1"] and "ray-workers" not in walls["spark2"]  # no lane spans the nodes
    # the worker's lane engine /metrics: on its rail address too, for the head's Prometheus alone
    assert 'iifname "enp1s0f0np0" ip saddr 10.0.0.1 tcp dport 8103 accept  # lane-metrics' in walls["spark2"]
    assert "lane-metrics" not in walls["spark1"]
    worker_conf = runner_call(run.named("spark2-bundle-api-gateway-conf")).payload
    assert "listen 127.0.0.1:8103;\n        listen 10.0.0.2:8103;" in worker_conf
    assert "listen 10." not in runner_call(run.named("spark1-bundle-api-gateway-conf")).payload
    lanes = run.outputs["lanes"]["value"]
    revisions = {lane: lanes[lane].pop("revision") for lane in lanes}  # each resolved on its own hub repository
    assert all(len(r) == 40 for r in revisions.values()) and len(set(revisions.values())) == 2, revisions
    # each lane's lane keys as served: what `pulumi preview`'s outputs diff shows a change to one lane by
    served = {lane: lanes[lane].pop("serving") for lane in lanes}
    assert {lane: (s["maxModelLen"], s["gpuMemoryUtilization"], s["profile"]) for lane, s in served.items()} == {
        "coder": (1048576, 0.45, "default"), "fast": (65536, 0.7, "default")}, served
    assert set(served["fast"]) == {"recipe", "profile", "maxModelLen", "gpuMemoryUtilization", "kvCacheDtype", "loadFormat",
                                   "kvTier", "extraArgs", "tensorParallel", "pipelineParallel", "executor"}
    assert served["fast"]["kvTier"] is None  # off unless set
    assert lanes == {"coder": {"model": "coder", "recipe": "gpt-oss-120b", "nodes": ["spark1"], "head": "spark1"},
                     "fast": {"model": "fast", "recipe": "gpt-oss-120b", "nodes": ["spark2"], "head": "spark2"}}
    assert run.outputs["model"]["value"] == "coder" and run.outputs["endpoint"]["value"].endswith(":8000/v1")
    # the clients are told every lane's model with its own window and fence, the head's lane first (their default)
    catalog = json.loads(run.outputs["codexModelCatalog"]["value"])["models"]
    assert [(m["slug"], m["priority"], m["context_window"], m["auto_compact_token_limit"]) for m in catalog] == \
        [("coder", 1, 1048576, 110000), ("fast", 2, 65536, 58982)]  # the recipe's fence, or 90 % of the window
    codex = run.outputs["codexConfig"]["value"]
    assert 'model = "coder"' in codex and "codex -p twinspark -m fast" in codex
    assert "model_auto_compact_token_limit" not in codex  # it would hold the fast model to the coder's fence
    claude = run.outputs["claudeCodeEnv"]["value"]
    assert "ANTHROPIC_DEFAULT_SONNET_MODEL=coder" in claude and "ANTHROPIC_DEFAULT_HAIKU_MODEL=fast" in claude
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS=120000" in claude  # the main model's
