"""The simulator's node plans (tests/sim/cluster.py, what `scripts/sim.sh up --nodes N
[--topology ring]` and the third-node scenario boot): every N it offers gives a stack the program
accepts and the sim's model splits over, and its cables (a bridge per rail subnet) join exactly
the rails the program's topology says are cabled."""

from __future__ import annotations

import ipaddress

import pytest
import yaml
from urllib.parse import urlsplit

import cluster
import sim_model
from components.config import Node, resolve_node_addresses
from components.config.schema import shape_rules
from components.config.topology import Topology


@pytest.mark.parametrize("count, topology, tp, pp", [(2, "", 2, 1), (3, "", 1, 3), (3, "ring", 1, 3)])
def test_n_sim_nodes_get_a_layout_the_sim_model_splits_over(tmp_path, count, topology, tp, pp):
    cfg = cluster.parse_sim_config(cluster.load_sim_config(tmp_path / "id_ed25519", nodes=count, topology=topology))
    assert [n.name for n in cfg.nodes] == [f"sim{i}" for i in range(1, count + 1)]
    assert cfg.fabric.topology == (topology or "switch")
    assert (cfg.tensor_parallel_size, cfg.pipeline_parallel_size) == (tp, pp)
    lines = shape_rules().head_lines(sim_model.SIM_MODEL_CONFIG, tp, pp)
    assert not [line for line in lines if line.startswith("FAIL")], lines


def test_a_new_sim_node_does_not_take_the_pinned_host_key_of_the_node_it_is_patterned_on():
    pinned = [{"name": "sim1", "role": "head", "host": "198.18.1.11", "rails": []},
              {"name": "sim2", "role": "worker", "host": "198.18.2.12", "hostKey": "ssh-ed25519 AAAA", "rails": []}]
    third = cluster.sim_nodes(pinned, 3)[2]
    assert third["name"] == "sim3" and third["host"] == "198.18.3.13"
    assert "hostKey" not in third


def bridge_members(nodes) -> dict[str, set[tuple[str, str]]]:
    """Each bridge the sim cables these nodes with, and the (node, iface) ends on it."""
    bridges, members = cluster.rail_bridges(nodes), {}
    for node in nodes:
        for rail in node.rails:
            members.setdefault(bridges[rail.network], set()).add((node.name, rail.iface))
    return members


def ring_config(tmp_path):
    return cluster.parse_sim_config(cluster.load_sim_config(tmp_path / "id_ed25519", nodes=3, topology="ring"))


def test_the_ring_plan_is_cabled_as_three_sparks_and_the_programs_topology_reads_it(tmp_path):
    """Passed through the program's own rules (parse_stack_config, then Topology): port 0 (rails 0-1)
    to the next node's port 1 (its rails 2-3), every rail's peer on its subnet, Ray on the LAN."""
    cfg = ring_config(tmp_path)
    topology = Topology(cfg, resolve_node_addresses(cfg.nodes))
    names = [n.name for n in cfg.nodes]
    for i, node in enumerate(cfg.nodes):
        assert [(r.iface, r.hca) for r in node.rails] == [(f"rail{k}", f"simroce{k}") for k in range(4)]
        following, previous = names[(i + 1) % 3], names[(i - 1) % 3]
        assert [r.peer for r in node.rails] == [following, following, previous, previous], node.name
        for k, rail in enumerate(node.rails):
            (peer_ip,) = topology.peers_on_rail(node, k)
            assert ipaddress.ip_address(peer_ip) in rail.network and peer_ip != rail.ip, (node.name, rail)
            far_end = next(r for r in topology._node(rail.peer).rails if r.ip == peer_ip)
            assert far_end.peer == node.name and far_end.iface == f"rail{(k + 2) % 4}", (node.name, rail, far_end)
    assert len({r.network for n in cfg.nodes for r in n.rails}) == 6  # each rail of each cable its own /24
    assert topology.node_ray_ips == ("198.18.1.11", "198.18.2.12", "198.18.3.13") == tuple(n.host for n in cfg.nodes)


def test_each_ring_bridge_joins_the_two_ends_of_one_cable(tmp_path):
    cfg = ring_config(tmp_path)
    topology = Topology(cfg, resolve_node_addresses(cfg.nodes))
    members = bridge_members(cfg.nodes)
    cables = {frozenset({(node.name, rail.iface),
                         next((peer.name, r.iface) for peer in cfg.nodes for r in peer.rails
                              if r.ip == topology.peers_on_rail(node, k)[0])})
              for node in cfg.nodes for k, rail in enumerate(node.rails)}
    assert len(members) == 6 and {frozenset(m) for m in members.values()} == cables, members


@pytest.mark.parametrize("count", [2, 3])
def test_a_switch_plan_gets_a_bridge_per_rail_index_and_a_node_added_finds_them(tmp_path, count):
    """A switch: today's cabling, br0 every node's rail0 and br1 every rail1; the engine sim's
    third node (add_node) finds those two and makes none."""
    cfg = cluster.parse_sim_config(cluster.load_sim_config(tmp_path / "id_ed25519", nodes=count))
    names = [n.name for n in cfg.nodes]
    assert bridge_members(cfg.nodes) == {"br0": {(n, "rail0") for n in names}, "br1": {(n, "rail1") for n in names}}
    pair = cluster.rail_bridges(cfg.nodes[:2])
    third = Node.model_validate(cluster.sim_nodes(yaml.safe_load(cluster.SIM_STACK.read_text())["config"]
                                                  ["twinspark:nodes"], 3)[2])
    assert cluster.rail_bridges([third], pair) == pair


def test_a_ring_node_added_to_a_running_fabric_gets_new_bridges_after_the_known_ones(tmp_path):
    cfg = ring_config(tmp_path)
    pair = cluster.rail_bridges(cfg.nodes[:2])
    grown = cluster.rail_bridges(cfg.nodes[2:], pair)
    assert {k: v for k, v in grown.items() if k in pair} == pair
    assert sorted(grown.values()) == [f"br{i}" for i in range(6)]


@pytest.mark.parametrize("nodes, topology, says", [
    (0, "ring", "--topology ring with --nodes 2: a ring is three Sparks, expected --nodes 3"),
    (4, "ring", "--topology ring with --nodes 4: a ring is three Sparks, expected --nodes 3"),
    (3, "mesh", "--topology mesh: expected one of switch, ring"),
])
def test_a_ring_of_other_than_three_sim_nodes_is_refused_in_one_line(tmp_path, nodes, topology, says):
    with pytest.raises(ValueError) as err:
        cluster.load_sim_config(tmp_path / "id_ed25519", nodes=nodes, topology=topology)
    assert str(err.value).startswith(says), err.value


def test_a_node_off_the_sims_lan_is_refused_before_any_namespace(tmp_path):
    spec = {"name": "sim4", "role": "worker", "host": "192.168.1.14",
            "rails": [{"iface": "rail0", "hca": "simroce0", "address": "10.0.0.4/24"}]}
    with pytest.raises(ValueError, match=r"sim4: host '192.168.1.14' — expected an IPv4 address in the sim's LAN 198.18.0.0/15"):
        cluster.on_the_lan(Node.model_validate(spec))


@pytest.mark.parametrize("count, topology", [(2, ""), (3, ""), (3, "ring")])
def test_a_second_site_is_the_same_cluster_on_a_lan_and_hub_of_its_own(tmp_path, count, topology):
    """Two clusters side by side (the simulator's two workers): site 1 has every management address
    in the LAN's other /16, host part kept, its hub on ports of its own; rails and everything else
    as site 0's (each site's fabric is namespaces of its own)."""
    key = tmp_path / "id_ed25519"
    here, there = (cluster.load_sim_config(key, nodes=count, topology=topology, site=s) for s in (0, 1))
    hosts = [[ipaddress.ip_address(n["host"]) for n in c["twinspark:nodes"]] for c in (here, there)]
    lans = cluster.SITE_LANS
    assert all(h in lans[0] for h in hosts[0]) and all(h in lans[1] for h in hosts[1]), hosts
    assert [int(h) - int(lans[1].network_address) for h in hosts[1]] == \
        [int(h) - int(lans[0].network_address) for h in hosts[0]]
    # the /24s of the two sites' nodes: this machine holds the .1 of each, so none may be shared
    assert not {ipaddress.ip_interface(f"{h}/24").network for h in hosts[0]} & \
        {ipaddress.ip_interface(f"{h}/24").network for h in hosts[1]}
    ports = [urlsplit(c["twinspark:model"]["hubEndpoint"]).port for c in (here, there)]
    assert ports[1] - ports[0] >= 2, ports  # the hub stand-in's API port and the next
    def strip(c):
        return {**c, "twinspark:nodes": [{k: v for k, v in n.items() if k != "host"} for n in c["twinspark:nodes"]],
                "twinspark:model": {k: v for k, v in c["twinspark:model"].items() if k != "hubEndpoint"}}
    assert strip(there) == strip(here)
    assert cluster.site_prefix(0) != cluster.site_prefix(1)
    cluster.parse_sim_config(there)  # the program's own rules take it


def test_a_site_past_the_sims_lan_is_refused_naming_the_sites_it_holds(tmp_path):
    with pytest.raises(ValueError, match=r"site 2: the sim's LAN 198\.18\.0\.0/15 holds sites 0 to 1"):
        cluster.load_sim_config(tmp_path / "id_ed25519", site=2)
