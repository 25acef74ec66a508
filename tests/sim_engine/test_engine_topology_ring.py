"""Three Sparks in a ring (fabric.topology ring, PP 3: NVIDIA's connect-three-sparks cabling),
on the real engine, after the pair's scenarios (files run in name order: this one follows
test_engine_teardown.py, because the ring is three other machines on the sim's addresses and the
pair's nodes go first): a fresh `pulumi up` serves, the head's engine killed and a worker rebooted
heal, and `pulumi destroy` leaves the nodes bare."""

from __future__ import annotations

import pytest

from core import contract
from cluster import SimCluster
from scenario_kit import (HEAD, SITE, containers, engine_stack, firewall_mismatches, flag, heals, serving_answers,
                          stored_step, timed_cluster, vllm_argv)

WORKERS = ("sim2", "sim3")


@pytest.fixture(scope="module")
def ring(cluster, registry, operator_home, engine_env, report):
    """The pair's nodes taken down, three nodes booted and cabled as a ring, and a stack of their own."""
    cluster.down()
    nodes = SimCluster.from_stack_file(operator_home / ".cache" / "twinspark-sim", registry=registry,
                                       nodes=3, topology="ring", site=SITE)
    timed_cluster(nodes)
    try:
        nodes.up()
        yield nodes, engine_stack(engine_env, operator_home, nodes.stack_file_text(), name="ring-")
    finally:
        nodes.down()
        report["ring_leftovers_after_teardown"] = nodes.leftovers()


def test_a_ring_of_three_serves_at_pp_3_heals_and_destroys_to_nothing(ring, report):
    nodes, stack = ring
    up = stack.up()
    report["ring_fresh_up_to_serving_s"] = up.seconds
    assert serving_answers(stack) == 200
    argv = vllm_argv(nodes)
    assert flag(argv, "--pipeline-parallel-size") == "3" and flag(argv, "--tensor-parallel-size") == "1", argv
    # every node's two cables: four rails, a /24 per twin (the sim's ring_rails)
    for name in nodes.nodes:
        assert len(nodes.nodes[name].spec.rails) == 4, name
        assert contract.SERVING_CONTAINER in containers(nodes, name), name
    # the head is every worker's neighbour: both copies from it, each over its own cable
    state = stack.export(show_secrets=True)
    head_host = nodes.nodes[HEAD].spec.host
    for worker in WORKERS:
        step = stored_step(state, f"{worker}-weights-sync")
        assert step["inputs"]["connection"]["host"] == head_host, worker
    assert set(stack.up().summary) == {"same"}
    probes, mismatches = firewall_mismatches(nodes, stack)  # Ray's flows from the LAN addresses here
    report["ring_firewall_probes"] = probes
    assert probes and not mismatches, mismatches
    heals(nodes, stack, WORKERS[-1], report, "ring")
    destroyed = stack.destroy()
    report["ring_destroy_s"] = destroyed.seconds
    assert set(destroyed.summary) == {"delete"}, destroyed.summary
    for name in nodes.nodes:
        assert containers(nodes, name) == {}, name
