"""One serving image for every node (one base digest, built once on the head, shipped to the
workers), and the platform gate, in the real program under mocks.

The harness's fake registry serves a digest per tag (another `registry` value: the tag moved);
a run with `prior` updates the earlier run's state the way the engine does (a resource whose
compared inputs are unchanged keeps its outputs, so a step that is not re-run prints nothing new).
"""

import copy

import pytest
from program_harness import config_blocks, flag_value, runner_call, unwrap

from core import platform_gate
from components.config import parse_stack_config

TAG = "ghcr.io/anemll/dspark-vllm-gx10:0.1.1"
PINNED = "ghcr.io/anemll/dspark-vllm-gx10@sha256:" + "d" * 64
NODES = ("spark1", "spark2")
BAD_DRIVER = {"driver": "590.44.01"}


def base_args(run):
    """What the one build (on the head) starts FROM, by the node it runs on."""
    return {b.name.removesuffix("-image-build"): b.inputs["build"]["args"]["BASE_IMAGE"]
            for b in run.of_type("docker:index/image:Image")}


def image_ids(run):
    """The image every node's serving container runs."""
    return {n: run.named(f"{n}-serving-container").inputs["image"] for n in NODES}


def changed(before, after):
    """Resources the engine would touch going from `before`'s state to `after`."""
    old = {r.name: r.compared for r in before.resources}
    return {r.name for r in after.resources if old.get(r.name) != r.compared}


@pytest.fixture(scope="module")
def day_one(program):
    run = program(registry="registry-day-1")
    assert run.error is None, run.error
    return run


def test_the_head_builds_from_the_one_digest_the_tag_resolved_to(day_one):
    pin = day_one.named("image-pin-resolve")
    call = runner_call(pin)
    assert (call.script, call.args) == ("resolve-image.sh", ["--image", TAG, "--platform", "linux/arm64"])
    assert unwrap(pin.inputs["connection"])["host"] == "192.168.1.10"  # resolved on the head
    digest = pin.outputs["stdout"]
    assert set(base_args(day_one).values()) == {f"ghcr.io/anemll/dspark-vllm-gx10@{digest}"}
    out = day_one.outputs["servingImage"]["value"]
    assert out["tag"] == TAG and out["digest"] == digest
    assert out["reference"] == base_args(day_one)["spark1"]
    assert out["repin"] == f"pulumi up --replace '{pin.urn}'"


def test_a_tag_resolved_once_is_stable_across_runs_even_when_the_registry_moves(program, day_one):
    for registry in ("registry-day-1", "registry-day-2"):  # the same, then the tag moved
        again = program(registry=registry, prior=day_one)
        assert again.error is None, again.error
        assert changed(day_one, again) == set(), "a no-op `pulumi up` re-runs nothing"
        assert base_args(again) == base_args(day_one)
    # what keeps it: without the state (a fresh stack) the moved tag does give another digest
    fresh = program(registry="registry-day-2")
    assert base_args(fresh) != base_args(day_one)


def test_the_pin_outlives_a_new_head_a_new_host_key_and_the_operators_credentials(program, recipe_config, day_one):
    swapped = copy.deepcopy(recipe_config)
    swapped["twinspark:nodes"][0]["role"], swapped["twinspark:nodes"][1]["role"] = "worker", "head"
    rekeyed = copy.deepcopy(recipe_config)
    rekeyed["twinspark:nodes"][0]["hostKey"] = day_one_key = "ssh-ed25519 " + "AAAAC3NzaC1lZDI1NTE5AAAAI" + "B" * 43
    assert day_one_key != recipe_config["twinspark:nodes"][0]["hostKey"]
    for config in (swapped, rekeyed):
        run = program(config, pin_host_keys=False, registry="registry-day-2", prior=day_one)
        assert run.error is None, run.error
        assert "image-pin-resolve" not in changed(day_one, run)
        assert set(base_args(run).values()) == set(base_args(day_one).values())


def test_the_digest_moves_when_asked_another_tag_or_a_replace(program, recipe_config, day_one):
    recipe_config["twinspark:serving"]["image"] = "ghcr.io/anemll/dspark-vllm-gx10:0.1.2"
    new_tag = program(recipe_config, registry="registry-day-2", prior=day_one)
    assert new_tag.error is None, new_tag.error
    assert {"image-pin-resolve", "spark1-image-build", "spark2-image-ship"} <= changed(day_one, new_tag)
    assert len(set(base_args(new_tag).values())) == 1 and base_args(new_tag) != base_args(day_one)
    # `pulumi up --replace <urn of image-pin-resolve>`: the step is created anew, from the registry of now
    state = copy.copy(day_one)
    state.resources = [r for r in day_one.resources if r.name != "image-pin-resolve"]
    replaced = program(registry="registry-day-2", prior=state)
    assert base_args(replaced) != base_args(day_one)
    assert base_args(replaced) == base_args(program(registry="registry-day-2"))


def test_a_reference_with_a_digest_is_used_as_it_is(program, recipe_config):
    recipe_config["twinspark:serving"]["image"] = PINNED
    run = program(recipe_config)
    assert run.error is None, run.error
    assert "image-pin-resolve" not in run.by_name
    assert set(base_args(run).values()) == {PINNED}
    assert run.outputs["servingImage"]["value"]["digest"] == "sha256:" + "d" * 64


def test_the_image_is_built_once_on_the_head_and_shipped_to_each_worker_over_the_rail(day_one):
    """One build (a build is not reproducible: two would be two images), then the same bytes."""
    from core import contract

    builds = day_one.of_type("docker:index/image:Image")
    assert [b.name for b in builds] == ["spark1-image-build"]
    build = builds[0]
    ship = day_one.named("spark2-image-ship")
    call = runner_call(ship)
    assert call.script == "ship-image.sh"
    assert unwrap(ship.inputs["connection"])["host"] == "192.168.1.10"  # run on the head
    assert flag_value(call.args, "--image") == build.inputs["imageName"]
    assert flag_value(call.args, "--id") == build.outputs["repoDigest"]
    assert flag_value(call.args, "--to") == "nvidia@10.0.0.2"  # the worker's first rail
    assert (flag_value(call.args, "--key"), flag_value(call.args, "--known-hosts")) == \
        (contract.SYNC_KEY, contract.SYNC_KNOWN_HOSTS)  # the weight copy's peer trust
    for trust in ("spark2-weights-host-key", "spark2-weights-authorize"):
        assert day_one.depends_on(ship, trust), trust
    assert ship.replace_with == [day_one.named("spark2-installation").urn]  # a reinstalled worker gets it again
    # every node's containers run that one ID; the worker's only once it has arrived
    assert set(image_ids(day_one).values()) == {build.outputs["repoDigest"]}
    for container in ("spark2-serving-container", "spark2-nccl-check"):
        assert day_one.depends_on(day_one.named(container), "spark2-image-ship"), container


def test_the_facts_steps_read_every_nodes_image_and_check_the_build_against_the_pin(day_one):
    built = day_one.named("spark1-image-build").outputs["repoDigest"]
    for node in NODES:
        call = runner_call(day_one.named(f"{node}-platform-facts"))
        assert call.script == "platform-facts.sh"
        assert call.payload.startswith("#!/usr/bin/env python3\n\"\"\"platform-facts.py")
        assert flag_value(call.args, "--node") == node
        assert flag_value(call.args, "--image") == built
    # where it was built, against the pinned base; the worker holds the head's image, not the base
    assert flag_value(runner_call(day_one.named("spark1-platform-facts")).args, "--base") == base_args(day_one)["spark1"]
    assert "--base" not in runner_call(day_one.named("spark2-platform-facts")).args
    facts = day_one.outputs["platform"]
    assert facts["secret"] is False and set(facts["value"]["facts"]) == set(NODES)
    assert facts["value"]["facts"]["spark2"]["kernel"] == "6.17.0-1029-nvidia"
    assert facts["value"]["facts"]["spark1"]["image"] == facts["value"]["facts"]["spark2"]["image"] == built
    assert facts["value"]["acknowledge"] == []  # ops status judges the live facts with the same list


@pytest.mark.parametrize("resource", ["spark1-nccl-check", "spark2-nccl-check", "spark1-serving-container",
                                      "spark2-serving-container", "spark1-serving-gateway"])
def test_the_gate_comes_before_the_nccl_check_and_every_container(day_one, resource):
    for node in NODES:
        assert day_one.depends_on(day_one.named(resource), f"{node}-platform-facts"), resource
    assert day_one.depends_on(day_one.named("spark2-platform-facts"), "spark2-image-ship")


def refused(run):
    assert run.error is not None and run.error["kind"] == "RunError", run.error
    # nothing that needs a passed gate was asked for
    assert not {"spark1-nccl-check", "spark2-nccl-check", "spark1-serving-container", "spark2-serving-container",
                "spark1-serving-gateway"} & set(run.by_name)
    return run.error["message"]


@pytest.mark.parametrize("fact, other", [
    ("image", "sha256:" + "e" * 64),  # another build, e.g. a worker loaded another image
    ("vllm", "0.25.1"), ("torch", "2.10.0"), ("nccl", "2.30.4"), ("ray", "2.56.0"),
])
def test_a_node_on_another_build_is_refused_naming_the_node_and_the_fact(program, recipe_config, fact, other):
    message = refused(program(facts={"spark2": {fact: other}}))
    assert f"nodes differ in {fact}" in message
    assert "spark1 has '" in message and f"spark2 has '{other}'" in message
    assert "cannot be acknowledged" in message
    # and nothing lets it pass
    raw = config_blocks(recipe_config)
    raw["platform"] = {"acknowledge": [f"mismatch:{fact}"]}
    with pytest.raises(Exception) as err:
        parse_stack_config(raw)
    assert "nothing acknowledges nodes on different images" in str(err.value)


def test_a_known_bad_platform_fails_with_the_entrys_text(program):
    message = refused(program(facts={n: BAD_DRIVER for n in NODES}))
    entry = next(i for i in platform_gate.known_issues() if i.id == "driver-590-cudagraph-deadlock")
    for text in (entry.id, entry.breaks, entry.symptom, entry.fix, entry.source, "spark1: driver '590.44.01'"):
        assert text in message


def test_an_acknowledged_known_issue_passes(program, recipe_config):
    recipe_config["twinspark:platform"] = {"acknowledge": ["driver-590-cudagraph-deadlock"]}
    run = program(recipe_config, facts={n: BAD_DRIVER for n in NODES})
    assert run.error is None, run.error
    assert "spark1-serving-container" in run.by_name


def test_nodes_on_different_drivers_fail_naming_both_unless_acknowledged(program, recipe_config):
    facts = {"spark2": {"driver": "580.126.09"}}
    message = refused(program(facts=facts))
    assert "nodes differ in driver" in message
    assert "spark1 has '580.173.02', spark2 has '580.126.09'" in message and "mismatch:driver" in message
    recipe_config["twinspark:platform"] = {"acknowledge": ["mismatch:driver"]}
    assert program(recipe_config, facts=facts).error is None


def test_a_new_acknowledgement_re_runs_no_step(program, recipe_config, day_one):
    recipe_config["twinspark:platform"] = {"acknowledge": ["mismatch:kernel"]}
    run = program(recipe_config, prior=day_one)
    assert run.error is None, run.error
    assert changed(day_one, run) == set()


@pytest.mark.parametrize("acknowledge, expected", [
    (["mismatch:image"], "nothing acknowledges nodes on different images"),
    (["driver-590"], "expected a known-issue id from known-issues.toml or a node difference: one of "
                     "driver-590-cudagraph-deadlock,"),
    ("driver-590-cudagraph-deadlock", "Input should be a valid list"),
])
def test_platform_acknowledge_is_validated(recipe_config, acknowledge, expected):
    raw = config_blocks(recipe_config)
    raw["platform"] = {"acknowledge": acknowledge}
    with pytest.raises(Exception) as err:
        parse_stack_config(raw)
    assert "twinspark:platform.acknowledge" in str(err.value) and expected in str(err.value)


@pytest.mark.parametrize("image", ["ghcr.io/a/b@sha256:abc", "ghcr.io/a/b@md5:" + "0" * 64, "ghcr.io/a/b@"])
def test_serving_image_digest_form_is_validated(recipe_config, image):
    raw = config_blocks(recipe_config)
    raw["serving"]["image"] = image
    with pytest.raises(Exception) as err:
        parse_stack_config(raw)
    assert "twinspark:serving.image" in str(err.value) and "@sha256:<64 hex>" in str(err.value)
