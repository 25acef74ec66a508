"""Last of the engine's scenarios (files run in name order): `pulumi destroy`."""

from __future__ import annotations

import time

from core import contract
from components import host_prep
from scenario_kit import HEAD, WORKER, containers, shim_calls


def test_destroy_leaves_the_nodes_as_before_the_first_up(cluster, stack, fresh_up, report):
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
    assert any(f"sysctl -q -w {host_prep.USERNS_UBUNTU_DEFAULT}" in c for c in reverted[HEAD]), reverted[HEAD]
    assert not any(host_prep.USERNS_KEY in c for c in reverted[WORKER]), reverted[WORKER]  # never set there
    assert any(f"sysctl -q -w {host_prep.HANG_RECOVERY_DEFAULTS}" in c for c in reverted[WORKER]), reverted[WORKER]
    assert cluster.in_netns(WORKER, "cat", "/proc/sys/net/ipv4/conf/rail0/arp_ignore").stdout.strip() == "0"
    for node, calls in reverted.items():
        assert any(f"systemctl disable --quiet {contract.FIREWALL_UNIT}" in c for c in calls), (node, calls)
        # a fresh login's memlock is the machine's own again, as before the first up (limits.d file gone)
        memlock = cluster.ssh(node, "ulimit -l").stdout.strip()
        assert memlock == fresh_up.login_memlock_before[node], (node, memlock, fresh_up.login_memlock_before)
