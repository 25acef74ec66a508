"""fabric.topology: direct, switch, ring of three. What each refuses (before any resource), and
what follows from it (components/config/topology.py) as the real program renders it under mocks:
netplan, twinspark.env, FabricCheck's peers, the weight copy's rails, NcclCheck's rendezvous.
A direct stack (Pulumi.spark.yaml) renders as the code before fabric.topology did, byte for byte."""

from __future__ import annotations

import copy
import json

import pulumi
import pytest
import yaml
from direct_snapshot import SNAPSHOT, run_stack_file
from program_harness import config_blocks, flag_value, flag_values, runner_call, unwrap

from core import contract
from components import firewall
from components.config import Topology, parse_stack_config, resolve_node_addresses

BASE = config_blocks()
LAN = {"spark1": "192.168.100.11", "spark2": "192.168.100.12", "spark3": "192.168.100.13"}


def spark_rails(port0, port1):
    """A Spark's four rails: port 0's twins (enp1s0f0np0, enP2p1s0f0np0) toward one neighbour,
    port 1's (enp1s0f1np1, enP2p1s0f1np1) toward the other; (peer, [address, address]) each."""
    (peer0, (a, b)), (peer1, (c, d)) = port0, port1
    return [{"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": a, "peer": peer0},
            {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": b, "peer": peer0},
            {"iface": "enp1s0f1np1", "hca": "rocep1s0f1", "address": c, "peer": peer1},
            {"iface": "enP2p1s0f1np1", "hca": "roceP2p1s0f1", "address": d, "peer": peer1}]


# NVIDIA/dgx-spark-playbooks nvidia/connect-three-sparks/README.md: Node1 port 0 to Node2 port 1,
# Node2 port 0 to Node3 port 1, Node3 port 0 to Node1 port 1; one /24 per twin, six in all
RING_NODES = [
    {"name": "spark1", "role": "head", "host": LAN["spark1"],
     "rails": spark_rails(("spark2", ("192.168.0.1/24", "192.168.1.1/24")),
                          ("spark3", ("192.168.2.1/24", "192.168.3.1/24")))},
    {"name": "spark2", "role": "worker", "host": LAN["spark2"],
     "rails": spark_rails(("spark3", ("192.168.4.1/24", "192.168.5.1/24")),
                          ("spark1", ("192.168.0.2/24", "192.168.1.2/24")))},
    {"name": "spark3", "role": "worker", "host": LAN["spark3"],
     "rails": spark_rails(("spark1", ("192.168.2.2/24", "192.168.3.2/24")),
                          ("spark2", ("192.168.4.2/24", "192.168.5.2/24")))},
]
RING_HCAS = "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"


def ring(raw=None):
    """The stack file's config (keys without namespace, or `raw`) as a ring of three at PP 3."""
    cfg = copy.deepcopy(raw or BASE)
    cfg["nodes"] = copy.deepcopy(RING_NODES)
    cfg["fabric"]["topology"] = "ring"
    cfg["serving"]["pipelineParallel"] = 3  # the seed's 64 heads do not split over TP 3
    return cfg


def switch_of(count):
    cfg = copy.deepcopy(BASE)
    cfg["fabric"]["topology"] = "switch"
    for i in range(3, count + 1):
        cfg["nodes"].append({"name": f"spark{i}", "role": "worker", "host": f"192.168.1.{9 + i}", "rails": [
            {"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": f"10.0.0.{i}/24"},
            {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": f"10.0.1.{i}/24"}]})
    if count == 3:
        cfg["serving"]["pipelineParallel"] = 3
    return cfg


def switch_of_four():
    cfg = switch_of(4)  # DeepSeek's recipe stops at three nodes; Qwen's is made for 2 to 4
    cfg["serving"].update(recipe="Qwen3.8-Flash-Next", tensorParallel=2, pipelineParallel=2)
    cfg["serving"].pop("kvCacheDtype", None)
    return cfg


def refusal(cfg) -> str:
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    return str(err.value)


def node(cfg, i):
    return cfg["nodes"][i]


def without_node(cfg, i):
    del cfg["nodes"][i]
    return cfg


def ring_of_four():
    cfg = ring()
    extra = copy.deepcopy(node(cfg, 2))
    extra.update(name="spark4", host="192.168.100.14")
    for k, rail in enumerate(extra["rails"]):
        rail["address"] = f"192.168.{6 + k}.1/24"
    cfg["nodes"].append(extra)
    cfg["serving"]["pipelineParallel"] = 4
    return cfg


# (the config, the key the refusal names, what else it must say)
REFUSED = [
    (switch_of(3) | {"fabric": {**BASE["fabric"]}}, "twinspark:fabric.topology",
     ["direct with 3 nodes", "expected fabric.topology switch, or ring for three Sparks cabled to each other"]),
    ({**copy.deepcopy(BASE), "nodes": BASE["nodes"][:1], "fabric": {**BASE["fabric"], "topology": "switch",
                                                                    "minBusBandwidthGBps": 0},
      "serving": {**BASE["serving"], "recipe": "gpt-oss-120b"}},
     "twinspark:fabric.topology", ["switch with 1 node", "2 or more nodes", "direct"]),
    (without_node(ring(), 2), "twinspark:fabric.topology", ["ring with 2 nodes", "exactly 3 nodes", "direct"]),
    (ring_of_four(), "twinspark:fabric.topology", ["ring with 4 nodes", "switch for four or more"]),
]


def mutated(mutate, base=ring):
    cfg = base()
    mutate(cfg)
    return cfg


def rail(cfg, i, r):
    return cfg["nodes"][i]["rails"][r]


REFUSED += [
    # a peer outside a ring: it would name a cabling the subnet rule does not check
    (mutated(lambda c: rail(c, 0, 0).update(peer="spark2"), lambda: copy.deepcopy(BASE)),
     "twinspark:nodes[0].rails[0].peer", ["spark2", "no peer with fabric.topology direct"]),
    (mutated(lambda c: rail(c, 1, 2).pop("peer")), "twinspark:nodes[1].rails[2].peer",
     ["unset", "spark1 or spark3", "every rail names its peer"]),
    (mutated(lambda c: rail(c, 1, 0).update(peer="spark2")), "twinspark:nodes[1].rails[0].peer",
     ["spark2", "another node than spark2 itself"]),
    (mutated(lambda c: rail(c, 1, 0).update(peer="spark9")), "twinspark:nodes[1].rails[0].peer",
     ["spark9", "the name of another node: spark1 or spark3"]),
    # three rails toward spark3, one toward spark1
    (mutated(lambda c: rail(c, 1, 2).update(peer="spark3")), "twinspark:nodes[1].rails",
     ["1 toward spark1, 3 toward spark3", "as many rails toward each other node"]),
    # the far end of spark1's first cable twin in another subnet
    (mutated(lambda c: rail(c, 1, 2).update(address="192.168.9.2/24")), "twinspark:nodes[1].rails[2].address",
     ["192.168.9.2/24", "an address in 192.168.0.0/24, the subnet of nodes[0].rails[0]", "share one subnet"]),
    # both twins of a cable in one subnet: the routing ambiguity the playbooks warn of
    (mutated(lambda c: (rail(c, 0, 1).update(address="192.168.0.3/24"), rail(c, 1, 3).update(address="192.168.0.4/24"))),
     "twinspark:nodes[0].rails[1].address", ["a subnet that does not overlap nodes[0].rails[0]'s 192.168.0.0/24"]),
    # another link's subnet
    (mutated(lambda c: (rail(c, 1, 0).update(address="192.168.2.3/24"), rail(c, 2, 2).update(address="192.168.2.4/24"))),
     "twinspark:nodes[1].rails[0].address", ["does not overlap nodes[0].rails[2]'s 192.168.2.0/24", "another link"]),
    # what every topology refuses still holds in a ring
    (mutated(lambda c: node(c, 2).update(host="192.168.4.9")), "twinspark:nodes[1].rails[0].address",
     ["a subnet apart from the LAN, without nodes[2].host 192.168.4.9"]),
    (mutated(lambda c: rail(c, 2, 0).update(address="192.168.2.1/24")), "twinspark:nodes[2].rails[0].address",
     ["not already used by nodes[0].rails[2].address"]),
    # a switch: rail N of every node in one subnet, as direct
    (mutated(lambda c: node(c, 2)["rails"][1].update(address="10.0.5.3/24"), lambda: switch_of(3)),
     "twinspark:nodes[2].rails[1].address", ["an address in 10.0.1.0/24", "rail 1 of every node shares one subnet"]),
]


@pytest.mark.parametrize("cfg, key, fragments", REFUSED)
def test_a_cabling_the_rails_cannot_form_is_refused_naming_the_key(cfg, key, fragments):
    message = refusal(cfg)
    assert f"{key}: " in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_the_config_before_refusing_is_one_the_rules_accept():
    """The corpus's bases pass, so each refusal above is its mutation's."""
    for cfg in (ring(), switch_of(3), switch_of(4) | {"serving": {**BASE["serving"], "recipe": "Qwen3.8-Flash-Next"}},
                copy.deepcopy(BASE)):
        parse_stack_config(cfg)


def test_a_ring_node_whose_name_resolves_to_two_addresses_is_refused():
    cfg = parse_stack_config(ring())
    lan = {**{n: (a,) for n, a in LAN.items()}, "spark2": ("192.168.100.12", "192.168.100.22")}
    with pytest.raises(pulumi.RunError) as err:
        Topology(cfg, lan)
    assert "twinspark:nodes[1].host: '192.168.100.12' resolves to 192.168.100.12, 192.168.100.22" in str(err.value)
    assert "expected one address in a ring" in str(err.value)


def test_a_switch_of_three_is_todays_rail_n_rule():
    cfg = parse_stack_config(switch_of(3))
    topology = Topology(cfg, resolve_node_addresses(cfg.nodes))
    assert topology.peers_on_rail(cfg.nodes[0], 1) == ["10.0.1.2", "10.0.1.3"]
    assert topology.node_ray_ips == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    assert topology.nccl_env == ()
    assert [(r.worker_ip, r.source_ip) for r in topology.copy_rails(cfg.nodes[2])] == [
        ("10.0.0.3", "10.0.0.1"), ("10.0.1.3", "10.0.1.1")]


@pytest.mark.parametrize("count, plan", [
    (2, [("spark2", "spark1", None)]),
    # one port, one copy at a time: the second waits for the first
    (3, [("spark2", "spark1", None), ("spark3", "spark1", "spark2")]),
    # two rounds: spark2 from the head; then spark3 from the head beside spark4 from spark2
    (4, [("spark2", "spark1", None), ("spark3", "spark1", "spark2"), ("spark4", "spark2", None)]),
])
def test_on_a_switch_each_round_of_the_weight_copy_leaves_from_every_node_that_holds_them(count, plan):
    cfg = parse_stack_config(switch_of_four() if count == 4 else switch_of(count))
    topology = Topology(cfg, resolve_node_addresses(cfg.nodes))
    assert [(c.worker, c.source, c.after) for c in topology.weight_copies()] == plan
    if count == 4:  # the rails between the two workers, the source's end second
        assert [(r.worker_ip, r.source_ip) for r in topology.copy_rails(cfg.nodes[3], cfg.nodes[1])] == [
            ("10.0.0.4", "10.0.0.2"), ("10.0.1.4", "10.0.1.2")]
        assert topology.weight_relays() == {"spark4": ("spark2", topology.copy_rails(cfg.nodes[3], cfg.nodes[1]))}
        assert topology.weight_copy_queue() == {"spark3": "spark2"}


def test_in_a_ring_of_three_the_head_copies_to_both_at_once_one_over_each_cable():
    cfg = parse_stack_config(ring())
    topology = Topology(cfg, {name: (address,) for name, address in LAN.items()})
    assert [(c.worker, c.source, c.after) for c in topology.weight_copies()] == [
        ("spark2", "spark1", None), ("spark3", "spark1", None)]
    assert topology.weight_relays() == {} and topology.weight_copy_queue() == {}


def test_the_ring_firewall_admits_rays_traffic_from_the_peers_lan_addresses_only():
    """In a ring Ray, vLLM and GLOO speak over the LAN: every flow from the other nodes admits
    their resolved LAN addresses alone (no rail reaches every node, none is admitted); the LAN at
    large still gets SSH (and on the head the public ports) only."""
    cfg = parse_stack_config(ring())
    addresses = resolve_node_addresses(cfg.nodes)
    for n in cfg.nodes:
        policy = firewall.firewall_policy(n, Topology(cfg, addresses))
        others = sorted(a for name, a in LAN.items() if name != n.name)
        from_peers = [a for a in policy.admits if a.sources]
        assert from_peers and all(a.iface is None and set(a.sources) <= set(others) for a in from_peers), from_peers
        text = firewall.render_firewall(n, policy)
        assert "policy drop" in text and 'iifname "enp' not in text and 'iifname "enP' not in text, text
        if n.role == "head":
            assert f"ip saddr {{ {', '.join(others)} }} tcp dport {contract.RAY_PORT} accept" in text, text
        assert [a.sources for a in from_peers if a.flow == "nccl-bootstrap"] == [tuple(others)]


# ---- the program under mocks -------------------------------------------------------------------
def namespaced(cfg):
    return {f"twinspark:{k}": v for k, v in cfg.items()}


@pytest.fixture(scope="module")
def ring_run(program):
    run = program(namespaced(ring()))
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module")
def switch_run(program):
    run = program(namespaced(switch_of(3)))
    assert run.error is None, run.error
    return run


def env_of(run, name):
    text = runner_call(run.named(f"{name}-bundle-twinspark-env")).payload
    return text, dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_each_ring_node_gets_its_four_rails_in_its_netplan(ring_run):
    for raw in RING_NODES:
        plan = yaml.safe_load(runner_call(ring_run.named(f"{raw['name']}-hostprep-netplan")).payload)
        assert {iface: spec["addresses"] for iface, spec in plan["network"]["ethernets"].items()} == {
            r["iface"]: [r["address"]] for r in raw["rails"]}


def test_ring_env_puts_ray_vllm_and_gloo_on_the_lan_and_nccl_on_every_rail(ring_run):
    for name, lan in LAN.items():
        text, env = env_of(ring_run, name)
        assert env["TWINSPARK_NODE_IP"] == env["VLLM_HOST_IP"] == lan
        assert env["TWINSPARK_HEAD_IP"] == LAN["spark1"]
        assert env["TWINSPARK_NODE_IPS"] == ",".join(LAN.values()) and env["TWINSPARK_NODE_COUNT"] == "3"
        assert env["NCCL_IB_HCA"] == RING_HCAS
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "enP7s7"
        assert (env["NCCL_IB_MERGE_NICS"], env["NCCL_NET_PLUGIN"], env["NCCL_IB_SUBNET_AWARE_ROUTING"]) == ("0", "none", "1")
        assert "(its LAN address: no rail of a ring reaches every node)" in text


def test_ring_fabric_check_pings_each_rails_one_neighbour(ring_run):
    rails = flag_values(runner_call(ring_run.named("spark1-fabric-check")).args, "--rail")
    assert rails == ["enp1s0f0np0:rocep1s0f0:192.168.0.2", "enP2p1s0f0np0:roceP2p1s0f0:192.168.1.2",
                     "enp1s0f1np1:rocep1s0f1:192.168.2.2", "enP2p1s0f1np1:roceP2p1s0f1:192.168.3.2"]
    rails = flag_values(runner_call(ring_run.named("spark2-fabric-check")).args, "--rail")
    assert rails == ["enp1s0f0np0:rocep1s0f0:192.168.4.2", "enP2p1s0f0np0:roceP2p1s0f0:192.168.5.2",
                     "enp1s0f1np1:rocep1s0f1:192.168.0.1", "enP2p1s0f1np1:roceP2p1s0f1:192.168.1.1"]


@pytest.mark.parametrize("worker, pairs", [
    ("spark2", ["192.168.0.2=192.168.0.1", "192.168.1.2=192.168.1.1"]),  # spark2's port 1 cable to the head
    ("spark3", ["192.168.2.2=192.168.2.1", "192.168.3.2=192.168.3.1"]),  # spark3's port 0 cable to it
])
def test_ring_weight_copy_runs_over_the_workers_cable_to_the_head(ring_run, worker, pairs):
    sync = runner_call(ring_run.named(f"{worker}-weights-sync")).args
    assert flag_values(sync, "--rail") == pairs  # worker=head
    first = pairs[0].split("=")
    assert flag_value(sync, "--to") == f"nvidia@{first[0]}"
    authorized = runner_call(ring_run.named(f"{worker}-weights-authorize")).payload
    assert authorized.startswith(f'from="{first[1]}",command="python3 ')  # the head's end of that cable
    assert flag_values(runner_call(ring_run.named(f"{worker}-weights-host-key")).args, "--address") == [
        p.split("=")[0] for p in pairs]
    assert flag_value(runner_call(ring_run.named(f"{worker}-image-ship")).args, "--to") == f"nvidia@{first[0]}"
    assert f"{worker}={121 << 20}" in flag_values(  # read on the worker itself: no copy key for the check
        runner_call(ring_run.named("spark1-weights-shape-check")).args, "--memory-kb")


def test_in_a_ring_the_heads_two_copies_run_at_once_one_over_each_cable(ring_run):
    assert not ring_run.depends_on(ring_run.named("spark3-weights-sync"), "spark2-weights-sync")
    assert not ring_run.depends_on(ring_run.named("spark2-weights-sync"), "spark3-weights-sync")


def test_ring_nccl_check_meets_at_the_heads_lan_address(ring_run):
    for name in LAN:
        args = flag_values(runner_call(ring_run.named(f"{name}-nccl-check")).args, "--check-arg")
        assert flag_value(args, "--master") == f"{LAN['spark1']}:{contract.NCCL_RENDEZVOUS_PORT}"


def test_ring_outputs_and_exporters_use_the_lan_address(ring_run):
    nodes = ring_run.outputs["nodes"]["value"]
    assert [(n["name"], n["rayIp"]) for n in nodes] == list(LAN.items())
    assert [r["peer"] for r in nodes[0]["rails"]] == ["spark2", "spark2", "spark3", "spark3"]
    command = unwrap(ring_run.named("spark2-observability-node-exporter").inputs["command"])
    assert f"--web.listen-address={LAN['spark2']}:{contract.NODE_EXPORTER_PORT}" in command


def test_a_switch_of_three_renders_every_rail_toward_every_node(switch_run):
    rails = flag_values(runner_call(switch_run.named("spark3-fabric-check")).args, "--rail")
    assert rails == ["enp1s0f0np0:rocep1s0f0:10.0.0.1,10.0.0.2", "enP2p1s0f0np0:roceP2p1s0f0:10.0.1.1,10.0.1.2"]
    text, env = env_of(switch_run, "spark3")
    assert env["VLLM_HOST_IP"] == "10.0.0.3" and env["TWINSPARK_NODE_IPS"] == "10.0.0.1,10.0.0.2,10.0.0.3"
    assert "NCCL_NET_PLUGIN" not in env and "NCCL_IB_MERGE_NICS" not in env
    assert flag_values(runner_call(switch_run.named("spark3-weights-sync")).args, "--rail") == [
        "10.0.0.3=10.0.0.1", "10.0.1.3=10.0.1.1"]


def test_on_a_switch_of_four_the_fourth_worker_copies_from_the_second_once_it_holds_the_weights(program):
    run = program(namespaced(switch_of_four()))
    assert run.error is None, run.error
    host_of = {n: unwrap(run.named(f"{n}-platform-facts").inputs["connection"])["host"]
               for n in ("spark1", "spark2", "spark4")}
    relayed = run.named("spark4-weights-sync")
    assert unwrap(relayed.inputs["connection"])["host"] == host_of["spark2"]  # runs on its source
    sync = runner_call(relayed).args
    assert flag_value(sync, "--node") == "spark2" and flag_value(sync, "--peer") == "spark4"
    assert flag_value(sync, "--to") == "nvidia@10.0.0.4"
    assert flag_values(sync, "--rail") == ["10.0.0.4=10.0.0.2", "10.0.1.4=10.0.1.2"]
    # only once spark2's own copy is complete, and with spark2's way in to spark4
    for step in ("spark2-weights-sync", "spark4-weights-relay-host-key", "spark4-weights-relay-authorize",
                 "spark1-weights-shape-check"):
        assert run.depends_on(relayed, step), step
    relay_key = run.named("spark2-weights-sync-key")
    assert unwrap(relay_key.inputs["connection"])["host"] == host_of["spark2"]
    pin = run.named("spark4-weights-relay-host-key")
    assert unwrap(pin.inputs["connection"])["host"] == host_of["spark2"]
    assert flag_values(runner_call(pin).args, "--address") == ["10.0.0.4", "10.0.1.4"]
    authorized = run.named("spark4-weights-relay-authorize")
    assert unwrap(authorized.inputs["connection"])["host"] == host_of["spark4"]
    assert runner_call(authorized).payload.startswith('from="10.0.0.2",command="python3 ')
    # the head still reaches spark4 (the shape check's read, the image) and copies to spark2 and spark3
    assert runner_call(run.named("spark4-weights-authorize")).payload.startswith('from="10.0.0.1",command="python3 ')
    for worker in ("spark2", "spark3"):
        assert unwrap(run.named(f"{worker}-weights-sync").inputs["connection"])["host"] == host_of["spark1"]
        assert f"{worker}-weights-relay-authorize" not in run.by_name
    assert flag_value(runner_call(run.named("spark4-image-ship")).args, "--to") == "nvidia@10.0.0.4"
    # the head's port carries one copy at a time: spark3's waits for spark2's; spark4's, from spark2, not for spark3's
    assert run.depends_on(run.named("spark3-weights-sync"), "spark2-weights-sync")
    assert not run.depends_on(relayed, "spark3-weights-sync")


def test_a_direct_stack_renders_as_before_fabric_topology_byte_for_byte():
    """Pulumi.spark.yaml's env files, netplan, firewall, fabric/NCCL/copy arguments, exporters and
    `nodes` output as f02176e rendered them (tests/direct_snapshot.py says how it was written):
    a no-op `pulumi up` after this change restarts nothing."""
    assert parse_stack_config(copy.deepcopy(BASE)).fabric.topology == "direct"  # the stack file sets none
    assert run_stack_file() == json.loads(SNAPSHOT.read_text())

