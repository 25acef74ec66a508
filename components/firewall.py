"""The host firewall, flow by flow: who may open a connection to which port of which node, and why.

`FLOWS` is the one list: `firewall_policy` resolves it for one node (addresses from the
topology), `render_firewall` makes the node's nftables table of it, and `flows_table` the table
in docs/security.md (tests/test_node_security.py holds the doc to it). Everything else new
inbound is dropped. A flow from the other nodes names their addresses, and on a rail its
interface too, so a stranger on a rail switch or the LAN reaches none of them.

Where a range stays wide, the versions leave no narrower one: NCCL's and GLOO's bootstrap, Ray's
raylet, object manager and agents and vLLM's TCP store bind port 0 (the kernel's ephemeral
range, `contract.EPHEMERAL_PORTS`); Ray's core workers take one port each from
`RAY_WORKER_PORTS`, Ray's own default, with no bound on their number Ray documents.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional, Sequence

from core import contract

from .config import Node, Topology

# Whom a flow admits (Flow.source)
ANYWHERE = "anywhere"
RAY_PEERS = "the other nodes' Ray addresses"  # Topology.ray_ip: the first rail; a ring's LAN address
LAN_PEERS = "the other nodes' LAN addresses"  # `host`, resolved: NCCL's and GLOO's bootstrap (fabric.bootstrapIface)
HEAD_RAY = "the head's Ray address"  # Prometheus's scrapes
POWER_WATCHER = "its power watcher's Ray address"  # Topology.power_watcher: the next node in `nodes`
COPY_SOURCE = "the copy's source, on each rail of the copy, while it runs"  # a set sync-weights.sh fills
# Which nodes a flow reaches (Flow.to)
EVERY_NODE, HEAD, WORKERS, PLUGGED = "every node", "the head", "the workers", "a node with a `power` plug"
LANE_HEADS = "a worker that heads a lane"
# When a flow exists (Flow.when): a config value names it
ALWAYS, OBSERVABILITY = "always", "observability.enabled"
RAY = "serving.executor ray, a lane across nodes"  # the node's lane's executor (one lane: the stack's)
MP = "serving.executor mp, a lane across nodes"
SEVERAL_LANES = "several `lanes`"
LANES_OBSERVED = "several `lanes`, observability.enabled"


@dataclass(frozen=True)
class Flow:
    name: str
    ports: Optional[tuple[int, int]]  # low, high; None: the head's public ports (StackConfig.head_public_ports)
    to: str
    source: str
    when: str
    why: str


FLOWS = (
    Flow("ssh", (contract.SSH_PORT,) * 2, EVERY_NODE, ANYWHERE, ALWAYS,
         "SSH: the operator, Pulumi's steps, the image's and the weights' copies, the guard's re-qualification "
         "(keys, not the firewall, decide)"),
    Flow("public", None, HEAD, ANYWHERE, ALWAYS,
         "`serving.port`, the API gateway (a key on every path but /health), and with observability "
         "`observability.grafanaPort` (Grafana's login)"),
    Flow("ray-gcs", (contract.RAY_PORT,) * 2, HEAD, RAY_PEERS, RAY,
         "Ray's GCS, which every raylet joins (token authentication)"),
    Flow("ray-workers", contract.RAY_WORKER_PORTS, EVERY_NODE, RAY_PEERS, RAY,
         "Ray's core workers: the vLLM actors the head's engine calls"),
    Flow("random-ports", contract.EPHEMERAL_PORTS, EVERY_NODE, RAY_PEERS, ALWAYS,
         "random ports: Ray's raylet, object manager and agents, vLLM's TCP store and message queues"),
    Flow("nccl-bootstrap", contract.EPHEMERAL_PORTS, EVERY_NODE, LAN_PEERS, ALWAYS,
         "NCCL's and GLOO's bootstrap on `fabric.bootstrapIface` (random ports; NCCL's data is RDMA, "
         "which no firewall sees)"),
    Flow("nccl-check", (contract.NCCL_RENDEZVOUS_PORT,) * 2, EVERY_NODE, RAY_PEERS, ALWAYS,
         "NcclCheck's rendezvous (the first node of each pair), at `up` and in the guard's re-qualification"),
    Flow("mp-master", (contract.MP_MASTER_PORT,) * 2, HEAD, RAY_PEERS, MP,
         "vLLM's master port: torch.distributed's TCPStore, with NO authentication (see below)"),
    Flow("exporters", (contract.NODE_EXPORTER_PORT,) * 2, EVERY_NODE, HEAD_RAY, OBSERVABILITY,
         "the node exporter, scraped by the head's Prometheus"),
    Flow("power-watch", (contract.NODE_EXPORTER_PORT,) * 2, PLUGGED, POWER_WATCHER, OBSERVABILITY,
         "the node exporter, asked by the power watch for a sign of life (and the head's guard heartbeat)"),
    Flow("gpu-exporter", (contract.GPU_EXPORTER_PORT,) * 2, EVERY_NODE, HEAD_RAY, OBSERVABILITY,
         "the GPU exporter, scraped by the head's Prometheus"),
    Flow("weight-copy", (contract.WEIGHTS_SYNC_PORT,) * 2, WORKERS, COPY_SOURCE, ALWAYS,
         "the weight copy's rsync daemons (a secret per copy; the port shut again when the copy ends)"),
    Flow("lane-gateway", (contract.LANE_GATEWAY_PORT,) * 2, LANE_HEADS, HEAD_RAY, SEVERAL_LANES,
         "the lane's gateway, which the head's lane router hands the lane's requests to (the key checked again)"),
    Flow("lane-metrics", (contract.LANE_METRICS_PORT,) * 2, LANE_HEADS, HEAD_RAY, LANES_OBSERVED,
         "the lane's vLLM /metrics (its gateway's, no key: this port serves nothing else), scraped by the head's "
         "Prometheus"),
)


@dataclass(frozen=True)
class Admit:
    """One rule: `flow`'s ports from `sources` (empty: anywhere), arriving on `iface` (None: any)."""

    flow: str
    ports: tuple[tuple[int, int], ...]
    sources: tuple[str, ...] = ()
    iface: Optional[str] = None


@dataclass(frozen=True)
class FirewallPolicy:
    """Who may open a connection to this node; everything else new inbound is dropped."""

    admits: tuple[Admit, ...]
    weight_copy: bool = False  # the weight copy's set and its rule (a node that receives a copy)


def _applies(flow: Flow, node: Node, topology: Topology) -> bool:
    cfg = topology.cfg
    if flow.to == HEAD and node.role != "head" or flow.to == WORKERS and node.role == "head":
        return False
    if flow.to == PLUGGED and (node.power is None or topology.power_watcher(node) is None):
        return False
    if flow.to == LANE_HEADS and (node.role == "head" or all(cfg.lane_head(lane) != node for lane in cfg.lanes_on(node))):
        return False
    executors = {lane.serving.executor for lane in cfg.lanes_on(node) if lane.world_size > 1}
    return {ALWAYS: True, RAY: "ray" in executors, MP: "mp" in executors, OBSERVABILITY: cfg.observability.enabled,
            SEVERAL_LANES: cfg.several_lanes, LANES_OBSERVED: cfg.several_lanes and cfg.observability.enabled}[flow.when]


def _sources(flow: Flow, node: Node, topology: Topology) -> tuple[Optional[str], tuple[str, ...]]:
    """(interface, addresses) the flow admits on `node`; (None, ()) for ANYWHERE, else an empty
    tuple of addresses where no one is to be admitted (no other node; the head's own scrapes,
    which arrive on loopback)."""
    others = [m for m in topology.cfg.nodes if m.name != node.name]
    if flow.source == ANYWHERE:
        return None, ()
    if flow.source == LAN_PEERS:
        return None, tuple(a for m in others for a in topology.lan[m.name])
    if flow.source == HEAD_RAY:
        return _ray_iface(node, topology), (() if node.role == "head" else (topology.head_ray_ip,))
    if flow.source == POWER_WATCHER:
        watcher = topology.power_watcher(node)
        return _ray_iface(node, topology), (topology.ray_ip(watcher),) if watcher else ()
    assert flow.source == RAY_PEERS, flow.source
    return _ray_iface(node, topology), tuple(topology.ray_ip(m) for m in others)


def _ray_iface(node: Node, topology: Topology) -> Optional[str]:
    """Where Ray's addresses arrive: the first rail (direct, switch); a ring's LAN port, named by address only."""
    return None if topology.is_ring else node.rails[0].iface


def firewall_policy(node: Node, topology: Topology) -> FirewallPolicy:
    """FLOWS as they apply to `node`, with the addresses of the topology (resolved names)."""
    admits = []
    for flow in FLOWS:
        if flow.source == COPY_SOURCE or not _applies(flow, node, topology):
            continue
        ports = (tuple((p, p) for p in topology.cfg.head_public_ports) if flow.ports is None else (flow.ports,))
        iface, sources = _sources(flow, node, topology)
        if sources or flow.source == ANYWHERE:
            admits.append(Admit(flow.name, ports, sources, iface))
    weight_copy = any(f.source == COPY_SOURCE and _applies(f, node, topology) for f in FLOWS)
    return FirewallPolicy(tuple(admits), weight_copy)


def nft_set(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _port_match(ports: Sequence[tuple[int, int]]) -> str:
    return "tcp dport " + nft_set(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ports)


def _rule(admit: Admit) -> list[str]:
    iface = f'iifname "{admit.iface}" ' if admit.iface else ""
    if not admit.sources:
        return [f"{iface}{_port_match(admit.ports)} accept  # {admit.flow}"]
    peers = []
    for host in admit.sources:
        try:
            peers.append(ipaddress.ip_address(host))
        except ValueError:
            # nft would resolve a name when the table loads, and at boot none resolves: no table at all
            raise ValueError(f"the firewall admits peers by address, not by name: {host!r} (resolve_node_addresses "
                             "gives the addresses)") from None
    rules = []
    for family, version in (("ip", 4), ("ip6", 6)):
        hosts = sorted({str(p) for p in peers if p.version == version}, key=ipaddress.ip_address)
        if hosts:
            rules.append(f"{iface}{family} saddr {nft_set(hosts)} {_port_match(admit.ports)} accept  # {admit.flow}")
    return rules


def render_firewall(node: Node, policy: FirewallPolicy) -> str:
    """The node's own nftables table: a drop here is final whatever Docker's tables accept.

    Loaded with `nft -f`; the first two lines make a reload replace the table atomically
    (and work when it does not exist yet), so applying twice changes nothing and an SSH
    session in progress is never cut: established traffic and port 22 come first. A reload
    empties the weight copy's set: HostPrep runs before any copy.
    """
    table = f"inet {contract.FIREWALL_TABLE}"
    rules = [
        'iifname "lo" accept',
        "ct state established,related accept",
        "ct state invalid drop",
        "meta l4proto { icmp, ipv6-icmp } accept  # ping (FabricCheck); IPv6 neighbour discovery",
        "udp dport { 68, 546 } accept  # DHCP and DHCPv6 replies on the LAN",
    ]
    for admit in policy.admits:
        rules += _rule(admit)
    sets = ""
    if policy.weight_copy:
        rules.append(f"ip saddr . ip daddr @{contract.WEIGHT_COPY_SET} tcp dport {contract.WEIGHTS_SYNC_PORT} "
                     "accept  # weight-copy")
        # each pair times out by itself (sync-weights.sh adds it with its daemons' lifetime): a killed copy's goes too
        sets = (f"    set {contract.WEIGHT_COPY_SET} {{\n        type ipv4_addr . ipv4_addr\n        flags timeout\n"
                "    }\n")
    body = "".join(f"        {r}\n" for r in rules)
    return f"""# twinspark host firewall of {node.name} (managed; edit the stack config instead)
table {table}
delete table {table}
table {table} {{
{sets}    chain input {{
        type filter hook input priority filter; policy drop;
{body}    }}
}}
"""


def flows_table() -> str:
    """docs/security.md's table of flows: what render_firewall opens, in words."""
    rows = ["| flow | port(s) | on | from | when | why |", "|---|---|---|---|---|---|"]
    for f in FLOWS:
        ports = ("the head's public ports" if f.ports is None
                 else str(f.ports[0]) if f.ports[0] == f.ports[1] else f"{f.ports[0]}–{f.ports[1]}")
        rows.append(f"| `{f.name}` | {ports} | {f.to} | {f.source} | {f.when} | {f.why} |")
    return "\n".join(rows) + "\n"
