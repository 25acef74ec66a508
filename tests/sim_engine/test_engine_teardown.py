"""Last of the engine's scenarios (files run in name order): `pulumi destroy`."""

from __future__ import annotations

import node_contract as contract
from conftest import containers


def test_destroy_leaves_the_nodes_as_before_the_first_up(cluster, stack, deployed, report):
    run = stack.destroy()
    report["destroy_s"] = run.seconds
    assert set(run.summary) == {"delete"}, run.summary
    for node in cluster.nodes:
        assert containers(cluster, node) == {}, node
        tables = cluster.node_exec(node, "nft", "list", "tables").stdout
        assert f"table inet {contract.FIREWALL_TABLE}" not in tables, (node, tables)
        records = cluster.node_exec(node, "bash", "-c", "ls -A /var/lib/twinspark/applied 2>/dev/null", check=False).stdout
        assert records == "", (node, records)  # every managed file's owner record is gone with its file
