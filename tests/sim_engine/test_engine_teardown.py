"""The pair's last scenarios (its files run in name order, this one last): the head and the worker
swap roles, then `pulumi destroy` from there. The swap is one way only: the way back would assert
the same steps mirrored, and the destroy after it needs no particular head, so it asserts by the
roles it finds (issue 35: an `up` and a serving restart less)."""

from __future__ import annotations

import time

from core import contract
from components import host_prep
from scenario_kit import containers, name_of, serving_answers, shim_calls


def node_roles(stack) -> dict[str, str]:
    return {n["name"]: n["role"] for n in stack.outputs()["nodes"]}


def test_head_and_worker_swap_roles(cluster, stack, deployed, report):
    head, worker = "sim2", "sim1"
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
