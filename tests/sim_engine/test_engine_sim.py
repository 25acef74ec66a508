"""Scenarios of `pulumi up --stack sim` through the real engine (conftest.py), asserted on the
engine's own output: its summary, its step events, its exported state. Each runs alone
(`sudo ./scripts/test.sh tests/sim_engine -k NAME`); those after the first up need it and
bring it about themselves through the `deployed` fixture."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import contract
import sim_images
from scenario_kit import (HEAD, ROOT, STACK, changes, completion, completion_status, containers, copy_again_args, flag,
                          guard_verdict, hub_commit, name_of, rails_throttled, recorder, serving_answers, sync_key_access,
                          urn_of, vllm_argv, wait_for)

INTERRUPTED_COPY_RATE = "50mbit"  # the head's egress on each rail while an up is interrupted mid-copy


def test_a_fresh_up_with_the_defaults_serves_through_the_gateway(cluster, stack, deployed, report):
    assert set(deployed.summary) == {"create"}, deployed.summary
    outputs = stack.outputs()
    key = outputs["apiKey"]
    assert len(key) == 48  # the program's generated key at its real length (no apiKey in the stack)
    answer = completion(outputs, key)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    assert completion(outputs, key[:-1]).status_code == 401
    # one serving image for the cluster: built on the head, shipped to the worker
    images = {node: cluster.ssh(node, f"docker inspect --format '{{{{.Image}}}}' {contract.SERVING_CONTAINER}").stdout.strip()
              for node in cluster.nodes}
    report["serving_image_ids"] = images
    assert len(set(images.values())) == 1 and all(images.values()), images
    # the head's raylet started no idle worker for the engine's driver (RAY_prestart_worker_first_driver)
    idle = cluster.node_exec(HEAD, "pgrep", "-af", "ray::IDLE", check=False).stdout
    assert idle.strip() == "", idle


def test_a_profile_change_previews_exactly_the_launch_script_and_the_serving_containers(stack, deployed, report):
    stack.set_config("serving.profile", "multiagent")
    try:
        preview = stack.preview()
        report["profile_change_preview_s"] = preview.seconds
        report["profile_change_preview"] = changes(preview)
        # README "Changing parameters": the launch script, the serving containers and the head's
        # wait for serving (its triggers are the containers' ids), nothing else
        assert changes(preview) == {
            "sim1-bundle-launch-vllm-sh": "update", "sim2-bundle-launch-vllm-sh": "update",
            "sim1-serving-container": "replace", "sim2-serving-container": "replace",
            "sim1-readiness-wait": "replace",
        }, preview.text
    finally:
        stack.set_config("serving.profile", "default")


def test_a_reinstalled_worker_is_refused_until_its_new_key_is_pinned_then_gets_everything_again(
        cluster, stack, deployed, report):
    held = (Path(stack.env["TWINSPARK_KNOWN_HOSTS_DIR"]) / "sim2").read_text()  # first contact's record
    cluster.reinstall("sim2")  # a new disk: new host keys, none of the program's files, images or containers
    with pytest.raises(AssertionError) as refused:
        stack.up()
    message = str(refused.value)
    report["reinstalled_worker_refused"] = message[-600:]
    # the program's one line, before anything is created (not OpenSSH's advice to edit a known_hosts file)
    assert f"sim2 ({cluster.nodes['sim2'].spec.host}): refused: its SSH host key is not the one `pulumi up` holds it to" \
        in message, message
    assert "nothing ran there" in message and "known_hosts" not in message, message
    # docs/operating.md, recovering: read the new key with ops pin-host-keys and pin it
    pins = subprocess.run([sys.executable, "-m", "ops", "pin-host-keys", "--stack-file", str(stack.config_file),
                           "--stack", "sim"], cwd=stack.project, env={**os.environ, **stack.env}, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    line = next(line for line in pins.stdout.splitlines() if "nodes[1].hostKey" in line)
    new_key = shlex.split(line)[-1]
    assert new_key not in held, "the reinstalled node still shows its old host key"
    stack.set_config("nodes[1].hostKey", new_key)
    run = stack.up()
    report["reinstalled_worker_up_s"] = run.seconds
    done = changes(run)
    report["reinstalled_worker_changes"] = done
    for step in ("sim2-installation", "sim2-serving-container", "sim2-weights-sync",
                 "sim1-nccl-check", "sim2-nccl-check", "sim1-readiness-wait"):
        assert step in done, (step, done)
    assert not [name for name in done if name.startswith("sim1-") and name not in (
        "sim1-nccl-check", "sim1-readiness-wait", "sim1-serving-container")], done
    assert serving_answers(stack) == 200


def test_a_rank_replaced_alone_fails_fast_and_the_up_that_replaces_every_rank_remakes_a_container_removed_by_hand(
        cluster, stack, deployed, report):
    """The refusal names the command that replaces every rank; that `up` also makes again a
    container removed by hand, which a refresh dropped from the state (one `up` for both: each
    costs the simulator a walk of the whole stack)."""
    run_urn = urn_of(stack, "nccl-run")
    started = time.monotonic()
    with pytest.raises(AssertionError) as alone:
        stack.up("--replace", urn_of(stack, "sim2-nccl-check"))
    report["rank_alone_refused_s"] = round(time.monotonic() - started, 1)
    message = str(alone.value)
    report["rank_alone_refusal"] = message[-600:]
    assert "the NCCL ranks run only together" in message and f"pulumi up --replace '{run_urn}'" in message, message
    cluster.ssh("sim2", "docker rm -f twinspark-node-exporter")
    refreshed = stack.refresh()
    assert changes(refreshed).get("sim2-observability-node-exporter") == "delete", changes(refreshed)
    run = stack.up("--replace", run_urn)  # the command the refusal names: every rank, together
    report["every_rank_replaced_up_s"] = run.seconds
    done = changes(run)
    assert {"sim1-nccl-check", "sim2-nccl-check"} <= set(done), done
    assert done.get("sim2-observability-node-exporter") == "create", done
    assert "twinspark-node-exporter" in containers(cluster, "sim2")
    assert serving_answers(stack) == 200


def test_an_up_interrupted_during_the_weight_copy_stops_cleanly_and_the_next_up_finishes(
        cluster, stack, deployed, report):
    model_dir = stack_model_dir(stack)
    cluster.ssh("sim2", f"rm -rf {model_dir}")  # docs/operating.md, recovering: weights deleted on a worker
    # the copy held to about 5 s (the stack's 64 MiB over two rails at 50 Mbit/s each), so the
    # signal lands while it runs, not after it finished and the engine started what follows
    with rails_throttled(cluster, HEAD, INTERRUPTED_COPY_RATE):
        run, status = stack.up_interrupted("sim2-weights-sync", *copy_again_args(stack, "sim2"))
    signal_at = next(i for i, e in enumerate(run.events) if "interrupted" in e)
    started_before = event_urns("resourcePreEvent", run.events[:signal_at])
    report["interrupted_up_s"], report["interrupted_up_exit"] = run.seconds, status
    report["interrupted_up_finished_after_the_signal"] = sorted(
        name_of(u) for u in event_urns("resOutputsEvent", run.events[signal_at:]))
    assert status != 0, run.text  # the CLI says the update was cancelled
    # after ^C the engine lets what it started finish, and starts nothing more on a node: a step
    # it walks past unchanged ("same") does nothing there, and one walked while the signal was on
    # its way was seen here after it (CI's run of a0ed168: sim2-image-ship)
    assert not event_urns("resourcePreEvent", run.events[signal_at:], changing=True), run.text
    assert event_urns("resOutputsEvent", run.events[signal_at:], changing=True) <= started_before
    done = stack.up()
    report["up_after_interrupt_s"] = done.seconds
    report["up_after_interrupt_changes"] = changes(done)
    listing = cluster.ssh("sim2", f"ls {model_dir}").stdout.split()
    assert "config.json" in listing, listing
    # the copy made anew runs its revocation again: the key the interrupted `up` admitted is gone
    assert sync_key_access(cluster, "sim2")["admitted"] == [], sync_key_access(cluster, "sim2")
    assert serving_answers(stack) == 200


def event_urns(kind: str, events: list[dict], changing: bool = False) -> set[str]:
    """The URNs of the events of `kind`; with `changing`, of steps other than "same"."""
    return {e[kind]["metadata"]["urn"] for e in events
            if kind in e and not (changing and e[kind]["metadata"]["op"] == "same")}


def stack_model_dir(stack) -> str:
    return stack.stack_file()["config"]["twinspark:model"]["dir"]


@pytest.fixture
def moved_on(cluster, stack, operator_home):
    """Between the deploy and the upgrade, the world moved: the serving image's tag names another
    image (its layers with one more label, pushed under the old tag and a new one, `next`), and
    the hub's main is a later commit (one more file). Yields (the `next` reference, the later
    commit); afterwards the tag, the hub and the stack's config are as before, and one `up`
    brings the stack back to them."""
    config = stack.stack_file()["config"]
    image, repo = config["twinspark:serving"]["image"], config["twinspark:model"]["repo"]
    path, tag = sim_images.split_reference(image)
    config_text = stack.config_file.read_text()
    notes = operator_home / "hub" / repo / "notes.md"  # the hub fixture's root
    with sim_images.push_registry() as registry:
        served, kind = registry.manifest(path, tag)
        registry.push_variant(path, tag, "twinspark.sim.variant", "moved", [tag, "next"])
        notes.write_text("a later commit of the model's repo\n")
        try:
            yield f"{image.rsplit(':', 1)[0]}:next", hub_commit(stack, repo)
        finally:
            registry.tag(path, tag, served, kind)
            notes.unlink()
            stack.config_file.write_text(config_text)
            stack.up()


def test_an_upgrade_whose_canary_fails_is_rolled_back_by_digest_and_commit_though_the_tag_and_the_branch_moved(
        cluster, stack, deployed, moved_on, report, monkeypatch):
    """`ops upgrade` as a user runs it (the real Automation API over the CLI) to the image the old
    tag now names too (`next`), the hub's later commit and --max-model-len 4242, under which the
    vLLM stand-in answers garbage: the guard's canary says so and the upgrade writes back what
    served — the image by the digest that served (the old tag would resolve to the new image), the
    model by the commit that served (unset, the revision would resolve to the later one) — deploys
    it, and the cluster serves the digest, commit and launch bundles it served before."""
    from rich.console import Console

    from ops import upgrade
    from ops.__main__ import build_parser
    from ops.upgrade import run as run_upgrade_tool

    next_image, later_commit = moved_on
    outputs, before = stack.outputs(), stack.stack_file()
    assert "revision" not in before["config"]["twinspark:model"]
    assert later_commit != outputs["modelRevision"]
    baseline = upgrade.baseline_path(stack.project, STACK)
    baseline.parent.mkdir(parents=True, exist_ok=True)
    measured = subprocess.run(
        [sys.executable, "-m", "ops", "bench", "--endpoint", outputs["endpoint"], "--api-key", outputs["apiKey"],
         "--model", outputs["model"], "--profile", "default", "--runs", "2", "--max-tokens", "8", "--concurrency", "2",
         "--long-prompt-tokens", "200", "--sweep", "1,2", "--sweep-requests", "1", "--sweep-input-tokens", "50",
         "--sweep-output-tokens", "4", "-o", str(baseline)], cwd=ROOT, capture_output=True, text=True)
    assert measured.returncode == 0, measured.stdout + measured.stderr
    for name, value in stack.env.items():  # the Automation API runs the CLI with this process's environment
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args([
        "upgrade", "--stack", STACK, "--project-dir", str(stack.project),
        "--set", f"serving.image={next_image}", "--set", f"model.revision={later_commit}",
        "--set", "serving.maxModelLen=4242", "--tolerance", "3", "--poll-seconds", "2", "--canary-timeout-min", "3",
        "--readiness-timeout-min", "3", "--ssh-key", str(cluster.key)])
    console = Console(record=True, width=200)
    started = time.monotonic()
    code = run_upgrade_tool(args, console)
    shown = console.export_text()
    report["upgrade_rollback_s"] = round(time.monotonic() - started, 1)
    report["upgrade_rollback_said"] = shown[-1500:]
    assert code == upgrade.EXIT_ROLLED_BACK, shown
    assert "canary" in shown, shown
    after = stack.outputs()
    for key in ("modelRevision", "launchBundles"):
        assert after[key] == outputs[key], key
    for key in ("reference", "digest"):  # its `tag` now says the digest the config names
        assert after["servingImage"][key] == outputs["servingImage"][key], key
    written = stack.stack_file()["config"]
    served_image = outputs["servingImage"]["reference"]
    assert "@sha256:" in served_image and written["twinspark:serving"]["image"] == served_image
    assert written["twinspark:model"]["revision"] == outputs["modelRevision"]
    for block in ("twinspark:serving", "twinspark:model"):  # and every other setting as it was
        assert {k: v for k, v in written[block].items() if k not in ("image", "revision")} == \
            {k: v for k, v in before["config"][block].items() if k not in ("image", "revision")}
    served_len = before["config"]["twinspark:serving"]["maxModelLen"]
    assert flag(vllm_argv(cluster), "--max-model-len") == str(served_len)
    assert serving_answers(stack) == 200
    # the rollback left the stack at rest: the next up changes nothing
    assert set(stack.up().summary) == {"same"}


def test_a_key_rotation_through_up_changes_nothing_but_the_key(cluster, stack, deployed, report):
    """Issue 21 item 2 for real: the gateway and the guard follow the new key; vLLM keeps serving
    (no container restarted) and the guard neither restarts it nor holds."""
    import secrets

    serving = {node: containers(cluster, node)[contract.SERVING_CONTAINER] for node in cluster.nodes}
    old_key, new_key = stack.outputs()["apiKey"], secrets.token_hex(24)  # 48 characters, as the generated one
    stack.cli("config", "set", "--secret", "twinspark:apiKey", new_key)
    try:
        rotated_at = time.time()
        run = stack.up()
        report["key_rotation_up_s"] = run.seconds
        report["key_rotation_changes"] = changes(run)
        assert {node: containers(cluster, node)[contract.SERVING_CONTAINER] for node in cluster.nodes} == serving
        outputs = stack.outputs()
        assert completion(outputs, new_key).status_code == 200 and completion(outputs, old_key).status_code == 401
        # three guard rounds after the rotation, all passing
        interval = stack.stack_file()["config"]["twinspark:serving"]["guard"]["intervalSeconds"]
        wait_for(lambda: guard_verdict(cluster).get("checked_at", 0) > rotated_at + 3 * interval,
                 "three guard rounds after the rotation", 6 * interval + 60)
        verdict = guard_verdict(cluster)
        report["key_rotation_guard_verdict"] = verdict
        assert verdict["ok"] is True and verdict["hold"] is None and verdict["consecutive_failures"] == 0, verdict
        assert {node: containers(cluster, node)[contract.SERVING_CONTAINER] for node in cluster.nodes} == serving
    finally:
        stack.cli("config", "rm", "twinspark:apiKey")  # back to the generated key
        stack.up()
    assert serving_answers(stack) == 200


def test_both_nodes_power_cycled_serve_again_without_a_manual_step_and_the_next_up_changes_nothing(
        cluster, stack, deployed, report):
    """Reboot-proof on real docker: power cut on both nodes, the worker back first (the harder
    order); restart policies, the boot scripts and the guard's unit bring serving back alone — after
    the guard has re-qualified the fabric, as both boots ended uncleanly (issue 40: each node's
    recorder holds it out of serving until the checks pass)."""
    outputs = stack.outputs()
    cut = time.monotonic()
    cluster.reboot("sim2", "sim1", clean=False)
    wait_for(lambda: completion_status(outputs, outputs["apiKey"]) == 200, "serving after both nodes rebooted", 300)
    report["power_cycle_to_serving_s"] = round(time.monotonic() - cut, 1)
    wait_for(lambda: guard_verdict(cluster).get("ok") is True, "the guard's canary after the reboot", 120)
    # the count is on disk and the reboot is one more restart: a panic loop gets held (issue 21 item 5)
    counted = json.loads(cluster.node_exec(HEAD, "cat", contract.SERVING_GUARD_RESTARTS).stdout)
    assert "the head rebooted" in [r["reason"] for r in counted["restarts"]], counted
    for node in ("sim1", "sim2"):  # each boot's report kept, each released by the re-qualification
        listing = recorder(cluster, node, "list")
        assert listing["pending_requalification"] is None and listing["reports"], (node, listing)
    # the next `up` changes and restarts nothing (the one no-op `up` of this cluster's scenarios)
    before = {node: containers(cluster, node) for node in cluster.nodes}
    run = stack.up()
    report["noop_up_s"] = run.seconds
    report["noop_up_changes"] = {k: v for k, v in run.summary.items() if k != "same"}
    assert set(run.summary) == {"same"}, run.summary
    assert {node: containers(cluster, node) for node in cluster.nodes} == before
