"""docs/operating.md's recovery steps for the weights and the fabric ("Recovering"), as an owner runs
them: a copy damaged on the worker or on the head, a copy tool that lies, a rail gone wrong —
each followed by the `pulumi up --replace` that page names, through the real engine, onto the
deployed cluster. Serving is never restarted by a weights step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from core import contract
from scenario_kit import (HEAD, WORKER, completion_status, containers, copy_again, manifest, model_dir, ops_access,
                          rails_rx_bytes, readiness_s, run_ops, serving_answers, step_output, urn_of, wait_for,
                          worker_matches_head)

RSYNC_FAULTY = Path(__file__).resolve().parents[1] / "sim" / "faults" / "rsync-faulty"


def replace(stack, *names: str):
    """`pulumi up --replace` of those steps (by their names, as `pulumi stack --show-urns` lists them)."""
    return stack.up(*[arg for name in names for arg in ("--replace", urn_of(stack, name))])


COPY_AGAIN = ("sim2-weights-authorize", "sim2-weights-sync", "sim2-weights-revoke")


def changed(run) -> set[str]:
    return {step["urn"].rsplit("::", 1)[-1] for step in run.steps() if step.get("op") not in (None, "same")}


def shards(cluster, stack) -> list[str]:
    return sorted(f for f in manifest(cluster, stack)["files"] if f.endswith(".safetensors"))


def flip_bit(cluster, node: str, path: str, offset: int) -> None:
    """One bit, in place: same size; the file's mtime moves as with any write."""
    cluster.node_exec(node, "python3", "-c", "import sys; f = open(sys.argv[1], 'r+b'); f.seek(int(sys.argv[2])); "
                      "b = f.read(1)[0]; f.seek(int(sys.argv[2])); f.write(bytes([b ^ 1]))", path, str(offset))


def serving_containers(cluster) -> dict:
    return {node: containers(cluster, node)[contract.SERVING_CONTAINER] for node in cluster.nodes}


# ---- weights ----------------------------------------------------------------------------------
def test_a_damaged_worker_copy_is_repaired_by_replacing_its_sync_and_only_the_damage_crosses(
        cluster, stack, deployed, report):
    d, (truncated, flipped, missing, *_) = model_dir(stack), shards(cluster, stack)
    size = manifest(cluster, stack)["files"][flipped]["size"]
    cluster.node_exec(WORKER, "truncate", "-s", "3M", f"{d}/{truncated}")
    cluster.node_exec(WORKER, "rm", f"{d}/{missing}")
    flip_bit(cluster, WORKER, f"{d}/{flipped}", size // 2)
    serving, rx_before = serving_containers(cluster), rails_rx_bytes(cluster)
    run = copy_again(stack)
    crossed = rails_rx_bytes(cluster) - rx_before
    report["damaged_worker_copy_repair_up_s"] = run.seconds
    report["damaged_worker_copy_bytes_crossed"] = crossed
    said = step_output(stack, "sim2-weights-sync")
    assert f"sim2: damaged, sending again: {flipped}: sha256 " in said, said
    assert "copying 3 files" in said, said
    assert crossed < 3 * size * 1.2, (crossed, size)  # the three files, not the model
    assert worker_matches_head(cluster, stack)
    assert changed(run) == set(COPY_AGAIN), changed(run)  # the copy, its key admitted and revoked: nothing else
    assert serving_containers(cluster) == serving and serving_answers(stack) == 200


def test_a_bit_flipped_on_the_head_is_refused_before_it_spreads_and_a_replaced_fetch_repairs_it(
        cluster, stack, deployed, report):
    d, (_, needed, *_) = model_dir(stack), shards(cluster, stack)
    cluster.node_exec(WORKER, "rm", "-f", f"{d}/{needed}")  # the worker needs it
    flip_bit(cluster, HEAD, f"{d}/{needed}", 4096)
    rx_before = rails_rx_bytes(cluster)
    with pytest.raises(AssertionError) as refused:
        copy_again(stack)
    message = str(refused.value)
    report["head_bit_flip_refusal"] = message[-400:]
    assert "sim2-weights-sync" in message and f"FAIL sim1: {needed}: sha256 " in message, message
    assert "nothing sent to sim2" in message and ("--replace of the sim1-weights-fetch step and of sim2's weights-authorize, "
                                                  "weights-sync and weights-revoke steps") in message, message
    assert rails_rx_bytes(cluster) - rx_before < 1_000_000
    # the recovery step: the fetch replaced finds the file changed since its download and gets it anew,
    # the copy after it sends it on
    run = copy_again(stack, WORKER, "sim1-weights-fetch")
    report["head_bit_flip_repair_up_s"] = run.seconds
    fetched = step_output(stack, "sim1-weights-fetch")
    assert f"FAIL sim1: {needed}: sha256 " in fetched and "match the hub" in fetched, fetched
    assert worker_matches_head(cluster, stack)
    assert serving_answers(stack) == 200


def rot_below_the_filesystem(cluster, node: str, model_dir_: str, name: str) -> None:
    """A bit flipped and the node's record made to agree with the file's stat again: what a disk
    does when a bit rots under the filesystem (no size, mtime, ctime or inode moves)."""
    flip_bit(cluster, node, f"{model_dir_}/{name}", 8192)
    cluster.node_exec(node, "python3", "-c", "import json, os, sys; d, name, rec = sys.argv[1:]; p = f'{d}/{rec}'; "
                      "r = json.load(open(p)); st = os.stat(f'{d}/{name}'); r['files'][name].update(size=st.st_size, "
                      "mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino); json.dump(r, open(p, 'w'))",
                      model_dir_, name, contract.WEIGHTS_RECORD)


def test_a_bit_rotten_below_the_filesystem_is_named_by_verify_weights_and_the_replace_it_prints_repairs_it(
        cluster, stack, deployed, operator_home, report):
    d, (_, rotten, *_) = model_dir(stack), shards(cluster, stack)
    rot_below_the_filesystem(cluster, WORKER, d, rotten)
    serving, access = serving_containers(cluster), ops_access(cluster, stack.outputs(), operator_home)
    assert changed(stack.up()) == set()  # no plain `up` reads a file whose stat did not move
    started = time.monotonic()
    found = run_ops("verify-weights", *access)
    report["verify_weights_full_s"] = round(time.monotonic() - started, 2)
    assert found.returncode == 1, found.stdout + found.stderr
    assert f"{HEAD}: intact: hashed " in found.stdout and f"{WORKER}: 1 damaged: hashed " in found.stdout, found.stdout
    assert f"  {WORKER}: {rotten}: sha256 " in found.stdout, found.stdout
    assert ("--replace '<urn of sim2-weights-authorize: pulumi stack --show-urns>' --replace '<urn of sim2-weights-sync: "
            "pulumi stack --show-urns>' --replace '<urn of sim2-weights-revoke: pulumi stack --show-urns>'") in found.stdout, \
        found.stdout
    run = copy_again(stack)
    report["rotten_worker_file_repair_up_s"] = run.seconds
    assert f"sim2: damaged, sending again: {rotten}: sha256 " in step_output(stack, "sim2-weights-sync")
    assert worker_matches_head(cluster, stack)
    again = run_ops("verify-weights", *access)
    assert again.returncode == 0 and f"{WORKER}: intact" in again.stdout, again.stdout + again.stderr
    assert serving_containers(cluster) == serving and serving_answers(stack) == 200


def test_a_copy_tool_that_lies_is_caught_by_the_workers_verification(cluster, stack, deployed):
    """Both lies at once, one shard each (one failing `up` names both; a stand-in rsync on the head)."""
    d, (_, _, missing, truncated, *_) = model_dir(stack), shards(cluster, stack)
    cluster.node_exec(WORKER, "rm", "-f", f"{d}/{missing}", f"{d}/{truncated}")  # something to copy
    cluster.node_exec(HEAD, "bash", "-c", f"mkdir -p /etc/twinspark-sim && printf 'missing {missing}\\ntruncated "
                      f"{truncated}\\n' > /etc/twinspark-sim/rsync-fault && install -m 755 {RSYNC_FAULTY} /usr/local/bin/rsync")
    try:
        with pytest.raises(AssertionError) as caught:
            copy_again(stack)
    finally:
        cluster.node_exec(HEAD, "rm", "-f", "/usr/local/bin/rsync")
    said = str(caught.value)
    assert f"FAIL sim2: {missing}: missing" in said, said
    assert f"FAIL sim2: {truncated}: 1048576 bytes, expected " in said, said
    assert "verification failed for sim2 (nvidia@10.0.0.2:" in said, said
    copy_again(stack)  # a clean copy repairs it
    assert worker_matches_head(cluster, stack)


# ---- the fabric, re-checked after a cabling change ---------------------------------------------
# (a rail down: test_engine_sim_fabric.py, where the guard's re-qualification runs the same check)
def rail1_mtu(mtu: int):
    return lambda cluster: cluster.in_netns(WORKER, "ip", "link", "set", "rail1", "mtu", str(mtu))


@pytest.mark.parametrize("break_it, mend_it, checked, says", [
    (rail1_mtu(1500), rail1_mtu(9000), "sim2-fabric-check",
     ["fabric-check sim2: FAIL rail rail1: MTU expected 9000, measured 1500",
      "fabric-check sim2: FAIL rail rail1: 8972-byte don't-fragment ping to 10.0.1.1 expected answered, measured no "
      "reply; its cable reaches sim1's rail1 (it answers), which the full-size ping does not: an MTU below 9000"]),
    # the worker's two cables swapped at its end: each of the head's rails reaches the other rail
    (lambda cluster: cluster.cross_cables(WORKER), lambda cluster: cluster.cross_cables(WORKER), "sim1-fabric-check",
     [f"fabric-check sim1: FAIL rail rail{mine}: 8972-byte don't-fragment ping to 10.0.{mine}.2 expected answered, "
      f"measured no reply; its cable reaches sim2's rail{other} (10.0.{other}.2 answered ARP on rail{mine}), not "
      f"sim2's rail{mine}: crossed cables: plug it into sim2's rail{mine}" for mine, other in ((0, 1), (1, 0))]),
], ids=["mtu-1500", "crossed-cables"])
def test_a_replaced_fabric_check_names_the_broken_rail_and_passes_once_mended(
        cluster, stack, deployed, break_it, mend_it, checked, says, report, request):
    """A rail Ray's traffic uses (rail0) that goes silent (crossed cables) takes the TP group down
    with it; once mended, serving comes back by itself. The re-check alone never restarts serving."""
    outputs = stack.outputs()
    break_it(cluster)
    try:
        with pytest.raises(AssertionError) as failed:
            replace(stack, checked)
    finally:
        mend_it(cluster)
    said = [line for line in str(failed.value).splitlines() if " FAIL " in line]
    report[f"fabric_{request.node.callspec.id}_said"] = said
    assert checked in str(failed.value), failed.value
    for line in says:
        assert any(line in each for each in said), "\n".join(said)  # every FAIL line, whole, when one is missing
    mended = time.monotonic()
    wait_for(lambda: completion_status(outputs, outputs["apiKey"]) == 200, "serving once the rail is mended",
             readiness_s(stack))
    report[f"fabric_{request.node.callspec.id}_mended_to_serving_s"] = round(time.monotonic() - mended, 1)
    replace(stack, checked)
    said = step_output(stack, checked)
    assert "fabric healthy" in said, said  # memlock too: the nodes preload memlock-granted.c
    peer = "sim2" if checked.startswith("sim1") else "sim1"
    assert f"ok   rail rail0: 8972-byte DF ping to 10.0.0.{peer[-1]} ({peer}'s rail0)" in said, said
