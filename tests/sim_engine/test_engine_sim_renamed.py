"""The worker renamed in the stack (same host), through the real engine, as the
"Operating and recovering" in docs/operating.md says: the new name and `formerName`, `up`; `formerName`
removed, `up`. The former name aliases every `{node}-...` resource to its state (components/
renames.py), so the engine creates and deletes nothing: it updates (or replaces) only what names
the node in its inputs, and the second `up` finds nothing to do. Without it the docker provider
would create `sim2b-serving-container` while `sim2-serving-container` holds the fixed name
`twinspark-serving`, and docker refuses.

The cluster keys its nodes by their sim name: the node stays "sim2" to `cluster` throughout (the
host is the same). Runs alone (`-k renamed`); needs the first up (`deployed`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import host_keys
from core import contract
from components import host_prep
from scenario_kit import (WORKER, changes, name_of, serving_answers, sync_key_access)

RENAMED = "sim2b"
RAY_TOKEN_PATH = f"{contract.BUNDLE_DIR}/{contract.RAY_TOKEN_FILE}"  # the worker's bundle secret (the API key is the head's)
# what an in-place change of a resource is; a plain create or delete is a resource made anew
IN_PLACE_OPS = {"update", "replace", "create-replacement", "delete-replaced"}
# inputs that name the node: the netplan's header, the env file's TWINSPARK_NODE_NAME
NAMING_STEPS = ("hostprep-netplan", "bundle-twinspark-env")


def set_name(stack, name: str, former: str) -> None:
    stack.set_config("nodes[1].name", name)
    stack.set_config("nodes[1].formerName", former)


def forget_former_name(stack) -> None:
    stack.cli("config", "rm", "--path", "twinspark:nodes[1].formerName")


def resources_named(stack, node: str) -> set[str]:
    return {name_of(r["urn"]) for r in stack.export()["resources"] if name_of(r["urn"]).startswith(f"{node}-")}


def worker_files(cluster) -> dict[str, str]:
    """What the worker's undoing steps keep there: the netplan's first line (it names the node),
    whether the bundle's Ray token is there, whether the sync key's forced command is, and the
    sync keys admitted (none once an `up` is done: each is revoked after its steps)."""
    netplan = cluster.node_exec(WORKER, "head", "-n1", host_prep.NETPLAN_PATH, check=False)
    secrets = cluster.node_exec(WORKER, "test", "-s", RAY_TOKEN_PATH, check=False)
    access = sync_key_access(cluster, WORKER)
    return {"netplan": netplan.stdout.strip() if netplan.returncode == 0 else "missing",
            "secrets": "present" if secrets.returncode == 0 else "missing",
            "forced command": "present" if access["forced command"] else "missing",
            "sync keys": ",".join(access["admitted"]) or "none"}


def in_place(files: dict[str, str], node: str) -> bool:
    return (files["netplan"].startswith(f"# twinspark: QSFP rails of {node} ")
            and (files["secrets"], files["forced command"], files["sync keys"]) == ("present", "present", "none"))


def assert_in_place(cluster, node: str) -> None:
    """The worker's files as the steps of `node` (its name in the stack) installed them."""
    files = worker_files(cluster)
    assert in_place(files, node), files


def rename(cluster, stack, old: str, new: str, report) -> None:
    """docs/operating.md's procedure, each `up` checked: the rename changes in place, the second is a no-op."""
    old_names = resources_named(stack, old)
    set_name(stack, new, former=old)
    run = stack.up()
    ops = changes(run)
    report[f"rename_{old}_to_{new}_up_s"], report[f"rename_{old}_to_{new}_steps"] = run.seconds, ops
    # nothing made anew, nothing deleted: every resource of the node is the one in the state
    assert not {name: op for name, op in ops.items() if op in ("create", "delete")}, ops
    assert {op for name, op in ops.items() if name.startswith(f"{new}-")} <= IN_PLACE_OPS, ops
    for step in NAMING_STEPS:
        assert ops.get(f"{new}-{step}") == "update", ops
    assert resources_named(stack, new) == {n.replace(f"{old}-", f"{new}-", 1) for n in old_names}
    assert resources_named(stack, old) == set(), "the old names are still in the state"
    assert_in_place(cluster, new)
    assert [n["name"] for n in stack.outputs()["nodes"]] == ["sim1", new]
    # the new name's first contact: its host key record, the same key as the old name's (same host)
    records, host = Path(stack.env["TWINSPARK_KNOWN_HOSTS_DIR"]), cluster.nodes[WORKER].spec.host
    assert host_keys.recorded_key(records / new, host) == host_keys.recorded_key(records / old, host) is not None
    assert serving_answers(stack) == 200

    forget_former_name(stack)
    again = stack.up()
    report[f"rename_{old}_to_{new}_second_up_s"] = again.seconds
    assert changes(again) == {}, changes(again)
    assert again.steps(), "the second up reported no step at all"


@pytest.fixture
def renaming(cluster, stack, pair_needed_after):
    """Afterwards the worker is "sim2" in the stack again, without formerName, its files in place,
    whatever the scenario got to, if a later scenario of this process needs the pair (in CI the
    ring, which takes the pair down, is the next: the worker stays renamed). The way back is the
    rename itself: with formerName the new name, a resource still under either name in the state
    (an `up` stopped halfway holds both) is the worker's. Should a file be gone all the same, the
    worker's undoing steps are replaced to install it again."""
    finished = {"renamed back": False}
    yield finished
    if finished["renamed back"] or not pair_needed_after:
        return
    set_name(stack, WORKER, former=RENAMED)
    stack.up()
    forget_former_name(stack)
    stack.up()
    if not in_place(worker_files(cluster), WORKER):
        undoing = [r["urn"] for r in stack.export()["resources"]
                   if r["type"] == "command:remote:Command" and name_of(r["urn"]).startswith(f"{WORKER}-")
                   and r.get("inputs", {}).get("delete")]
        stack.up(*[arg for urn in undoing for arg in ("--replace", urn)])
    assert_in_place(cluster, WORKER)


def test_a_worker_renamed_with_its_former_name_changes_in_place_and_serves(
        cluster, stack, deployed, renaming, pair_needed_after, report):
    """The name back, the same procedure with its assertions, only where a later scenario needs
    the pair (issue 35: two `up`s less in CI, where the ring follows)."""
    assert_in_place(cluster, WORKER)
    rename(cluster, stack, WORKER, RENAMED, report)
    if pair_needed_after:
        rename(cluster, stack, RENAMED, WORKER, report)
        renaming["renamed back"] = True
