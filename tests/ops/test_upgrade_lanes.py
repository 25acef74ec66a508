"""`ops upgrade --model`: one lane's settings of a stack with several (issue 41) — the writes there and back
at the lane's own keys, its view for the gates, its commit for the rollback, its head's guard, its baseline."""

import pytest

from ops import upgrade_plan
from ops.inputs import InputError
from ops.target import engine_head, target_from_outputs
from ops.upgrade_plan import KnownGood, Setting, plan_upgrade
from ops.upgrade_records import baseline_path
from test_lanes_config import two_lanes

SERVED = KnownGood(image_reference="ghcr.io/x/y@sha256:" + "a" * 64, image_tag="ghcr.io/x/y:1", model_revision="b" * 40,
                   launch_bundles={}, image_ids={}, lane_revisions={"coder": "b" * 40, "fast": "f" * 40})


def test_a_lane_key_is_written_at_the_lanes_own_path_and_judged_in_its_view():
    blocks = two_lanes()
    plan = plan_upgrade(blocks, [Setting("serving.maxModelLen", "16384"), Setting("serving.profile", "default")],
                        SERVED, model="fast")
    assert plan.lane == upgrade_plan.LaneChoice("fast", "fast", 1)
    assert plan.forward.sets == (("lanes[1].serving.maxModelLen", "16384"), ("lanes[1].serving.profile", "default"))
    # the lane's view: its own maxModelLen before and after; the other lane's untouched
    assert (plan.before.serving.max_model_len, plan.after.serving.max_model_len) == (65536, 16384)
    assert [c.key for c in plan.changes] == ["lanes[1].serving.maxModelLen", "lanes[1].serving.profile"]
    # back: its maxModelLen as it was, its profile (unset before: the stack's) removed again
    assert plan.backward == upgrade_plan.Writes(("lanes[1].serving.profile",), (("lanes[1].serving.maxModelLen", "65536"),))
    # by the lane's name too
    assert plan_upgrade(blocks, [Setting("serving.maxModelLen", "16384")], SERVED, model="coder").lane.index == 0


def test_a_lanes_revision_rolls_back_to_the_commit_that_lane_served():
    plan = plan_upgrade(two_lanes(), [Setting("model.revision", "9" * 40)], SERVED, model="fast")
    assert plan.forward.sets == (("lanes[1].model.revision", "9" * 40),)
    assert plan.pinned == {"lanes[1].model.revision": "f" * 40}  # the fast lane's, not the stack's modelRevision
    assert plan.backward.sets == (("lanes[1].model.revision", "f" * 40),)
    without = KnownGood(**{**SERVED.__dict__, "lane_revisions": {"coder": "b" * 40}})
    with pytest.raises(InputError, match="lanes.fast.revision"):
        plan_upgrade(two_lanes(), [Setting("model.revision", "9" * 40)], without, model="fast")


@pytest.mark.parametrize("blocks, model, settings, words", [
    (two_lanes(), "fast", [Setting("serving.image", "ghcr.io/x/y:2")],
     "--set serving.image with --model: serving.image is the stack's, one for every lane"),
    (two_lanes(), "fsat", [Setting("serving.maxModelLen", "1024")],
     "--model 'fsat': no lane serves it; the lanes serve coder (lane coder), fast (lane fast): pass one of them"),
    (None, "fast", [Setting("serving.maxModelLen", "1024")],
     "--model 'fast': this stack serves one model, not lanes: drop --model"),
    (two_lanes(), "fast", [Setting("serving.maxModelLen", "not-a-number")], "the new settings are refused"),
])
def test_bad_lane_settings_are_one_line(blocks, model, settings, words):
    from program_harness import config_blocks

    with pytest.raises(InputError) as refused:
        plan_upgrade(blocks or config_blocks(), settings, SERVED, model=model)
    assert words in str(refused.value) and "\n" not in str(refused.value), refused.value


def lanes_outputs():
    nodes = [{"name": name, "role": role, "host": host, "rayIp": ray, "rails": []}
             for name, role, host, ray in (("spark1", "head", "192.168.1.10", "10.0.0.1"),
                                           ("spark2", "worker", "192.168.1.11", "10.0.0.2"))]
    return {"endpoint": "http://192.168.1.10:8000/v1", "apiKey": "k" * 48, "model": "coder", "sshUser": "nvidia",
            "nodes": nodes, "recipe": "gpt-oss-120b",
            "lanes": {"coder": {"model": "coder", "recipe": "gpt-oss-120b", "nodes": ["spark1"], "head": "spark1",
                                "revision": "b" * 40},
                      "fast": {"model": "fast", "recipe": "gpt-oss-120b", "nodes": ["spark2"], "head": "spark2",
                               "revision": "f" * 40}}}


def test_the_gates_ask_the_lanes_model_and_read_its_heads_guard_its_baseline_its_own(tmp_path):
    target = target_from_outputs(lanes_outputs(), "test", "fast")
    assert (target.model, target.lane, target.recipe) == ("fast", "fast", "gpt-oss-120b")
    assert engine_head(target)["name"] == "spark2"  # the fast lane's guard runs on its own head
    stack_wide = target_from_outputs(lanes_outputs(), "test")
    assert (stack_wide.model, stack_wide.lane, engine_head(stack_wide)["name"]) == ("coder", None, "spark1")
    assert baseline_path(tmp_path, "spark", "fast").name == "spark-fast.json"
    assert baseline_path(tmp_path, "spark").name == "spark.json"
    assert upgrade_plan.known_good_from(lanes_outputs()).lane_revisions == {"coder": "b" * 40, "fast": "f" * 40}
