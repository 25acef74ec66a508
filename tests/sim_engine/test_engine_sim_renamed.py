"""The worker renamed in the stack (same host) and renamed back, through the real engine (README
"Recovering": "A renamed node or resource is safe too"). A new name is a new resource to the
engine: it creates `sim2b-*` as the program declares them and deletes the old `sim2-*` after the
program has run, each with the command kept in its state. What the new steps installed must still
be on the node afterwards: the old deletes find the new owner and print `kept: ...`.

The cluster keys its nodes by their sim name: the node stays "sim2" to `cluster` throughout (the
host is the same). Runs alone (`-k renamed`); needs the first up (`deployed`)."""

from __future__ import annotations

from pathlib import Path

import pytest

import host_keys
import node_contract as contract
from components import host_prep
from conftest import WORKER, serving_answers
from test_engine_sim import name_of

RENAMED = "sim2b"
SECRETS_PATH = f"{contract.BUNDLE_DIR}/{contract.SECRETS_FILE}"
# one step of each kind that undoes itself on delete, on the worker (the step after the node's name)
NETPLAN_STEP, SECRETS_STEP, AUTHORIZE_STEP = "hostprep-netplan", "bundle-secrets-env", "weights-authorize"


def rename_worker(stack, name: str):
    stack.set_config("nodes[1].name", name)
    return stack.up()


def resources_named(stack, node: str) -> set[str]:
    return {name_of(r["urn"]) for r in stack.export()["resources"] if name_of(r["urn"]).startswith(f"{node}-")}


def ops_in_order(run) -> list[tuple[str, str]]:
    """(resource name, op) of every step that was not `same`, in the order the engine finished them."""
    return [(name_of(m["urn"]), m["op"]) for m in run.steps() if m["op"] != "same"]


def printed_by(run, name: str) -> str:
    """What the resource's command printed in this run: the command provider logs each line of
    its stdout as an info status message, which `pulumi up --json` carries as an ephemeral
    diagnosticEvent under the resource's URN (a delete's too)."""
    return "".join(e["diagnosticEvent"]["message"] for e in run.events
                   if "diagnosticEvent" in e and e["diagnosticEvent"].get("urn", "").endswith(f"::{name}"))


def worker_files(cluster) -> dict[str, str]:
    """What the worker's undoing steps left there: the netplan's first line (it names the node),
    whether the bundle's secrets are there, whether the head's sync key is authorized."""
    netplan = cluster.node_exec(WORKER, "head", "-n1", host_prep.NETPLAN_PATH, check=False)
    secrets = cluster.node_exec(WORKER, "test", "-s", SECRETS_PATH, check=False)
    keys = cluster.node_exec(WORKER, "cat", f"/home/{cluster.cfg.ssh.user}/.ssh/authorized_keys", check=False).stdout
    return {"netplan": netplan.stdout.strip() if netplan.returncode == 0 else "missing",
            "secrets": "present" if secrets.returncode == 0 else "missing",
            "sync key": "authorized" if f" {contract.SYNC_KEY_COMMENT}@" in keys else "missing"}


def assert_in_place(cluster, node: str) -> None:
    """The worker's files as the steps of `node` (its name in the stack) installed them."""
    files = worker_files(cluster)
    assert files["netplan"].startswith(f"# twinspark: QSFP rails of {node} "), files
    assert (files["secrets"], files["sync key"]) == ("present", "authorized"), files


def assert_renamed(cluster, stack, run, old: str, new: str, old_names: set[str], report) -> None:
    order = ops_in_order(run)
    report[f"rename_{old}_to_{new}_up_s"] = run.seconds
    report[f"rename_{old}_to_{new}_steps"] = order
    created = [i for i, (name, op) in enumerate(order) if name.startswith(f"{new}-")]
    deleted = [i for i, (name, op) in enumerate(order) if op == "delete"]
    # every resource of the node made anew under the new name, and only the old ones deleted, after
    # (a component shows its create only when it registers outputs: the state says they are all there)
    assert resources_named(stack, new) == {n.replace(f"{old}-", f"{new}-", 1) for n in old_names}
    assert resources_named(stack, old) == set(), "the old names are still in the state"
    assert created and {order[i][1] for i in created} == {"create"}, order
    assert {order[i][0] for i in deleted} == old_names, order
    assert max(created) < min(deleted), order
    # the late deletes found the new owner and left its work in place
    assert f"kept: {host_prep.NETPLAN_PATH} (now managed by {new}-{NETPLAN_STEP})" in printed_by(
        run, f"{old}-{NETPLAN_STEP}"), printed_by(run, f"{old}-{NETPLAN_STEP}")
    assert f"kept: {SECRETS_PATH} (now managed by {new}-{SECRETS_STEP})" in printed_by(
        run, f"{old}-{SECRETS_STEP}"), printed_by(run, f"{old}-{SECRETS_STEP}")
    assert f"kept: sync key authorization (now managed by {new}-{AUTHORIZE_STEP})" in printed_by(
        run, f"{old}-{AUTHORIZE_STEP}"), printed_by(run, f"{old}-{AUTHORIZE_STEP}")
    assert_in_place(cluster, new)
    assert [n["name"] for n in stack.outputs()["nodes"]] == ["sim1", new]
    # the new name's first contact: its host key record, the same key as the old name's (same host)
    records, host = Path(stack.env["TWINSPARK_KNOWN_HOSTS_DIR"]), cluster.nodes[WORKER].spec.host
    assert host_keys.recorded_key(records / new, host) == host_keys.recorded_key(records / old, host) is not None
    assert serving_answers(stack) == 200


@pytest.fixture
def renaming(cluster, stack):
    """Afterwards the worker is "sim2" in the stack again with its files in place, whatever the
    scenario got to. A rename stopped halfway leaves both names in the state: going back deletes the
    new-named steps, which by then own the files and remove them; the old steps, unchanged, do not
    run, so each of the worker's steps that undoes itself is replaced to install again."""
    finished = {"renamed back": False}
    yield finished
    if finished["renamed back"]:
        return
    if stack.stack_file()["config"]["twinspark:nodes"][1]["name"] != WORKER:
        stack.set_config("nodes[1].name", WORKER)
    stack.up()
    undoing = [r["urn"] for r in stack.export()["resources"]
               if r["type"] == "command:remote:Command" and name_of(r["urn"]).startswith(f"{WORKER}-")
               and r.get("inputs", {}).get("delete")]
    stack.up(*[arg for urn in undoing for arg in ("--replace", urn)])
    assert_in_place(cluster, WORKER)


def test_a_renamed_worker_keeps_what_its_new_steps_installed_and_serves_and_so_does_the_name_back(
        cluster, stack, deployed, renaming, report):
    assert_in_place(cluster, WORKER)
    old_names = resources_named(stack, WORKER)
    renamed = rename_worker(stack, RENAMED)
    assert_renamed(cluster, stack, renamed, WORKER, RENAMED, old_names, report)

    new_names = resources_named(stack, RENAMED)
    back = rename_worker(stack, WORKER)
    assert_renamed(cluster, stack, back, RENAMED, WORKER, new_names, report)
    renaming["renamed back"] = True
