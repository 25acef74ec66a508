"""What fabric.topology decides, in one place: every component asks this module, none re-derives it.

- the rail peers: each rail's far ends (FabricCheck pings them);
- the address Ray, vLLM (VLLM_HOST_IP, its TCP store), GLOO and NcclCheck's rendezvous know each
  node by: direct and switch, the first rail (it reaches every node); ring, the node's LAN address
  (`host` as resolve_node_addresses resolves it), because no one rail of a ring reaches every node
  (NVIDIA's connect-three-sparks and eugr/spark-vllm-docker put a ring's OOB traffic on the
  management interface). NCCL's data runs over every rail (NCCL_IB_HCA) in every topology;
- the NCCL environment a ring adds (NCCL_IB_MERGE_NICS=0, NCCL_NET_PLUGIN=none,
  NCCL_IB_SUBNET_AWARE_ROUTING=1: NVIDIA/dgx-spark-playbooks
  nvidia/multi-sparks-through-switch/assets/spark_cluster_setup/spark_cluster_setup.py and
  eugr/spark-vllm-docker autodiscover.sh set exactly these for the three-node mesh);
- the rails between two nodes (`link_rails`, `links`): direct and switch rail N of each with rail
  N of the other; ring the rails of their cable. The image crosses a worker's link to the head;
  the weight copy a worker's link to its source (`weight_copies`: the head, or on a switch of
  four a worker that already holds them); NcclCheck's pair runs cross each link.
The rules a topology's rails must follow are StackConfig's (schema.py); this module assumes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .blocks import Node, Rail
from .errors import NAMESPACE, config_error
from .schema import StackConfig

RING_NCCL_ENV = (("NCCL_IB_MERGE_NICS", "0"), ("NCCL_NET_PLUGIN", "none"), ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"))


@dataclass(frozen=True)
class CopyRail:
    """One rail of the weight copy: the receiving worker's end and its source's (the head, or a
    worker that already holds the weights), on one subnet."""

    worker_ip: str
    source_ip: str


@dataclass(frozen=True)
class WeightCopy:
    """One worker's copy of the weights: from `source` (the head or a worker that holds them),
    leaving over the source's rail addresses `ends`, once `after`'s copy from it (same rails) is done."""

    worker: str
    source: str
    ends: frozenset[str]
    after: Optional[str]


@dataclass(frozen=True)
class Link:
    """Two nodes and the rails between them: `rails[k]` is (a's end, b's end) of one subnet."""

    a: Node
    b: Node
    rails: tuple[tuple[Rail, Rail], ...]


@dataclass(frozen=True)
class NodeFabric:
    """What one node's environment file takes from the topology (launch_bundle.render_env_file)."""

    ray_ip: str  # this node's
    head_ray_ip: str
    node_ray_ips: tuple[str, ...]  # every node's, in config order
    ray_ip_origin: str  # in words, for the env file's comment
    bootstrap_iface: str  # NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME
    nccl_env: tuple[tuple[str, Optional[str]], ...]  # what the topology adds (a None value: a comment line)


@dataclass(frozen=True)
class Topology:
    """`lan`: every node's LAN addresses by name, as resolve_node_addresses gives them."""

    cfg: StackConfig
    lan: Mapping[str, Sequence[str]]

    def __post_init__(self) -> None:
        if not self.is_ring:
            return
        problems = [
            f"{NAMESPACE}:nodes[{i}].host: {n.host!r} resolves to {', '.join(self.lan[n.name])} on this machine — "
            "expected one address in a ring (fabric.topology ring: Ray, vLLM and NCCL's bootstrap reach the node at "
            "its LAN address), or the address itself"
            for i, n in enumerate(self.cfg.nodes) if len(self.lan[n.name]) != 1
        ]
        if problems:
            raise config_error(problems)

    @property
    def is_ring(self) -> bool:
        return self.cfg.fabric.topology == "ring"

    def rails_toward(self, node: Node, peer: Node) -> list[Rail]:
        """Ring: the node's rails of its cable to `peer`, in config order (the k-th pairs with the peer's k-th)."""
        return [r for r in node.rails if r.peer == peer.name]

    def _node(self, name: str) -> Node:
        return next(n for n in self.cfg.nodes if n.name == name)

    def peers_on_rail(self, node: Node, rail_index: int) -> list[str]:
        """The addresses rail `rail_index` of `node` reaches: every other node's rail N, or in a ring
        the one address of the peer's twin rail (same subnet)."""
        if not self.is_ring:
            return [n.rails[rail_index].ip for n in self.cfg.nodes if n.name != node.name]
        rail = node.rails[rail_index]
        assert rail.peer is not None  # in a ring every rail names its peer (the schema's rule)
        peer = self._node(rail.peer)
        k = self.rails_toward(node, peer).index(rail)
        return [self.rails_toward(peer, node)[k].ip]

    def far_ends(self, node: Node) -> list[tuple[str, str, str]]:
        """(address, node, iface) of every other node's rails: what a rail of `node` may find at the
        other end of its cable (the fabric check names a crossed cable's far end with them)."""
        return [(r.ip, n.name, r.iface) for n in self.cfg.nodes if n.name != node.name for r in n.rails]

    def ray_ip(self, node: Node) -> str:
        return self.lan[node.name][0] if self.is_ring else node.rails[0].ip

    def power_watcher(self, node: Node) -> Optional[Node]:
        """Who power-cycles `node` through its plug when it stops answering: the next node in the
        stack's list (the last node's is the first; on a pair each watches the other); None alone."""
        nodes = self.cfg.nodes
        if len(nodes) < 2:
            return None
        return nodes[(nodes.index(node) + 1) % len(nodes)]

    @property
    def head_ray_ip(self) -> str:
        """Ray's head, vLLM's master and NcclCheck's rendezvous."""
        return self.ray_ip(self.cfg.head)

    @property
    def node_ray_ips(self) -> tuple[str, ...]:
        return tuple(self.ray_ip(n) for n in self.cfg.nodes)

    @property
    def nccl_env(self) -> tuple[tuple[str, Optional[str]], ...]:
        if not self.is_ring:
            return ()  # direct and switch: the recipe's environment as it is
        return (("# fabric.topology ring: each rail reaches one neighbour (NVIDIA's and eugr's ring settings)", None),
                *RING_NCCL_ENV)

    def node_fabric(self, node: Node) -> NodeFabric:
        origin = ("its LAN address: no rail of a ring reaches every node" if self.is_ring else "the first rail")
        return NodeFabric(self.ray_ip(node), self.head_ray_ip, self.node_ray_ips, origin,
                          self.cfg.fabric.bootstrap_iface, self.nccl_env)

    def link_rails(self, node: Node, peer: Node) -> list[tuple[Rail, Rail]]:
        """(node's end, peer's end) of each rail between them: direct and switch rail N with rail N
        (a switch of nodes with unequal rails: the rails both have); ring their cable's rails."""
        if self.is_ring:
            return list(zip(self.rails_toward(node, peer), self.rails_toward(peer, node)))
        return list(zip(node.rails, peer.rails))

    @property
    def links(self) -> list[Link]:
        """Every two nodes the rails join, the head first and then the workers in config order
        (NcclCheck's rank order): on a switch every pair, in a ring of three each cable."""
        order = [self.cfg.head, *self.cfg.workers]
        return [Link(a, b, tuple(self.link_rails(a, b)))
                for i, a in enumerate(order) for b in order[i + 1:] if self.link_rails(a, b)]

    def copy_rails(self, worker: Node, source: Optional[Node] = None) -> list[CopyRail]:
        """The rails `source` (the head unless named) copies the weights to `worker` over (the head
        ships the image over its own); the first carries the copy's control connection."""
        return [CopyRail(w.ip, s.ip) for w, s in self.link_rails(worker, source or self.cfg.head)]

    def weight_copies(self) -> list[WeightCopy]:
        """The weight copy's plan, in rounds: every node that holds the weights sends them to the
        first workers still without them that it has a link to — one per round over the same
        rails (a switch port carries one copy at a time), one per cable in a ring — the head
        first, then the workers in the order they received them. Two nodes: the head to the
        worker. A ring of three: the head to both at once, one over each cable. A switch of four:
        the head to the second, then the head to the third beside the second to the fourth (two
        copies' time where all from the head would send three through the head's port)."""
        holders, waiting = [self.cfg.head], list(self.cfg.workers)
        copies: list[WeightCopy] = []
        while waiting:
            served = []
            for holder in holders:
                busy: set[str] = set()  # the holder's rail addresses this round's copies use
                for worker in list(waiting):
                    ends = {mine.ip for _, mine in self.link_rails(worker, holder)}
                    if not ends or ends & busy:
                        continue
                    earlier = [c for c in copies if c.source == holder.name and c.ends & ends]
                    copies.append(WeightCopy(worker.name, holder.name, frozenset(ends),
                                             earlier[-1].worker if earlier else None))
                    busy |= ends
                    waiting.remove(worker)
                    served.append(worker)
            if not served:  # the schema's rules cable every worker to the head: never on a valid config
                raise ValueError(f"no rail reaches {', '.join(w.name for w in waiting)} from a node with the weights")
            holders += served
        return copies

    def weight_relays(self) -> dict[str, tuple[str, list[CopyRail]]]:
        """The workers whose copy leaves from another worker (weight_copies), each with that
        worker's name and the rails between them."""
        return {c.worker: (c.source, self.copy_rails(self._node(c.worker), self._node(c.source)))
                for c in self.weight_copies() if c.source != self.cfg.head.name}

    def weight_copy_queue(self) -> dict[str, str]:
        """By worker, the worker whose copy goes first from the same source over the same rails."""
        return {c.worker: c.after for c in self.weight_copies() if c.after}
