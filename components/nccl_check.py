"""NcclCheck: cross-node NCCL all-reduce over the rails, before any model loads (recipe §1).

Creates one remote command per node (`{node}-nccl-check`) running launch/nccl-check.sh: its
rank of launch/nccl-allreduce-check.py in a throwaway container of that node's serving
image, with the serving containers' docker options and the bundle's environment
(NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...). The head is rank 0 and hosts the rendezvous on its
first rail. `pulumi up` stops when the bus bandwidth is under fabric.minBusBandwidthGBps or
NCCL fell back to sockets. A floor of 0 switches the check off: the component then creates
nothing.

The ranks run together or not at all: `nccl-run` (a random id) keeps every rank's
connection, image and environment and the check itself, and every rank is replaced with it.
A rank replaced alone (`pulumi up --replace` of that rank) finds no peer at the roll call
and fails within a few minutes, naming `pulumi up --replace` of `nccl-run`.

With three nodes or more, each link is checked on its own first (`{node}-nccl-pair-{peer}`, one
command per end, launch/nccl-pair-check.sh): a two-rank all_reduce over the rails the pair
shares (NCCL_IB_HCA: this end's HCAs of the link, over the env file's), so a bad cable or port
is named with both nodes, its rails and the fix rather than found as a slow all-node run. Pairs
that share no node run at once, in rounds; the all-node run waits for the last round, and every
pair rank is replaced with `nccl-run` too. Two nodes: the all-node run is the pair, and nothing
else is made (a two-node stack's resources are as before). NVIDIA's playbooks check only the
whole cluster (dgx-spark-playbooks nvidia/multi-sparks-through-switch/assets/spark_cluster_setup/
spark_cluster_setup.py run_nccl_test: one `mpirun -np <nodes>` of nccl-tests' all_gather_perf,
16 GiB, all four HCAs, NCCL_SOCKET_IFNAME on the LAN interface; a warning under 21.875 GB/s,
10 on a ring; connect-three-sparks and the switch README run that same script), which says
that something is slow but not which link.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_random as random
from pulumi_command import remote as pulumi_remote

from core import contract

from .config import Topology
from .remote import NodeHandle, NodeScript, compared_connection, launch_file, node_command, script_text, sha256_text

SCRIPT = "nccl-check.sh"
PAIR_SCRIPT = "nccl-pair-check.sh"
CHECK_PROGRAM = "nccl-allreduce-check.py"
TIMEOUT_S = 1200


@dataclass(frozen=True)
class NcclRank(NodeHandle):
    image_id: pulumi.Input[str]
    env_hash: pulumi.Input[str]  # the node's twinspark.env, which the check runs with


@dataclass(frozen=True)
class NcclPair:
    """One link's own run: two ranks, the first (rank 0, earlier in the ranks' order) hosting it."""

    nodes: tuple[str, str]
    master_ip: str  # Topology.ray_ip of the first: its first rail (ring: its LAN address)
    nccl_env: tuple[dict[str, str], dict[str, str]]  # each end's, over its env file's
    rails: tuple[str, ...]  # each rail of the link, both ends in words
    fix: str


@dataclass(frozen=True)
class NcclCheckArgs:
    ranks: Sequence[NcclRank]  # rank 0 (the head) first
    master_ip: str  # Topology.head_ray_ip: the head's first rail (ring: its LAN address)
    min_bus_bandwidth_gbps: float  # 0 switches the check off
    pairs: Sequence[NcclPair] = ()  # nccl_pairs: none for two nodes
    join_timeout_s: Optional[int] = None  # fabric.ncclJoinTimeoutSeconds; None: the check's own (180 s)


def nccl_pairs(topology: Topology) -> list[NcclPair]:
    """Every link of three nodes or more (Topology.links), each end with NCCL_IB_HCA of its own
    rails of the link and NCCL_SOCKET_IFNAME the bootstrap interface (fabric.bootstrapIface, as
    the all-node run's: NVIDIA's test bootstraps on the LAN interface in every topology)."""
    if len(topology.cfg.nodes) <= 2:
        return []  # the all-node run is the pair
    pairs = []
    for link in topology.links:
        a, b = link.a.name, link.b.name
        ends = ({"NCCL_IB_HCA": ",".join(ra.hca for ra, _ in link.rails)},
                {"NCCL_IB_HCA": ",".join(rb.hca for _, rb in link.rails)})
        for env in ends:
            env["NCCL_SOCKET_IFNAME"] = topology.cfg.fabric.bootstrap_iface
        cabling = (f"the cable between {a} and {b}: reseat or replace it" if topology.is_ring
                   else f"{a}'s and {b}'s cables to the switch and their switch ports: reseat or replace them")
        pairs.append(NcclPair(
            nodes=(a, b), master_ip=topology.ray_ip(link.a), nccl_env=ends,
            rails=tuple(f"{a} {ra.hca} {ra.ip} <-> {b} {rb.hca} {rb.ip}" for ra, rb in link.rails),
            fix=f"{cabling} until `python -m ops status` shows these rails up (link, "
                "speed, RoCE ACTIVE) on both nodes"))
    return pairs


def pair_rounds(pairs: Sequence[NcclPair]) -> list[list[NcclPair]]:
    """The pairs in rounds of pairs that share no node (each node runs one NCCL container at a
    time): four nodes on a switch, six pairs in three rounds; a ring of three, three rounds."""
    rounds: list[list[NcclPair]] = []
    for pair in pairs:
        free = next((r for r in rounds if not {n for p in r for n in p.nodes} & set(pair.nodes)), None)
        if free is None:
            rounds.append(free := [])
        free.append(pair)
    return rounds


def check_args(nodes: Sequence[str], rank: int, master_ip: str, min_bus_bandwidth_gbps: float,
               rerun_all: str, join_timeout_s: Optional[int] = None) -> list[str]:
    return [
        "--node", nodes[rank],
        "--rank", str(rank),
        "--world-size", str(len(nodes)),
        "--nodes", ",".join(nodes),
        "--master", f"{master_ip}:{contract.NCCL_RENDEZVOUS_PORT}",
        "--min-busbw-gbps", f"{min_bus_bandwidth_gbps:g}",
        "--require-network", "IB",
        "--rerun-all", rerun_all,
    ] + (["--join-timeout-s", str(join_timeout_s)] if join_timeout_s is not None else [])


def nccl_check_flags(node_name: str, image_id: str, check: Sequence[str],
                     env: Optional[dict[str, str]] = None) -> list[str]:
    """nccl-check.sh's flags; `env` goes to docker's --env, which wins over the env file
    (docker/cli opts ReadKVEnvStrings: the --env values come after the file's)."""
    flags = ["--node", node_name, "--image", image_id,
             "--env-file", f"{contract.BUNDLE_DIR}/{contract.ENV_FILE}",
             "--container", contract.NCCL_CHECK_CONTAINER, "--timeout-s", str(TIMEOUT_S)]
    flags += [a for flag in contract.docker_run_flags() for a in ("--docker-flag", flag)]
    flags += [a for k, v in (env or {}).items() for a in ("--docker-flag", "--env", "--docker-flag", f"{k}={v}")]
    flags += [a for arg in check for a in ("--check-arg", arg)]
    return flags


def rank_script_args(args: NcclCheckArgs, rank: int, image_id: str, rerun_all: str) -> list[str]:
    nodes = [r.name for r in args.ranks]
    return nccl_check_flags(nodes[rank], image_id,
                            check_args(nodes, rank, args.master_ip, args.min_bus_bandwidth_gbps, rerun_all,
                                       args.join_timeout_s))


# what a failing NCCL rank of the serving guard's re-qualification tells the owner to run again
GUARD_RERUN = "the serving guard's next re-qualification (twinspark status shows its hold)"


def guard_rank_flags(args: NcclCheckArgs, name: str) -> pulumi.Input[Sequence[str]]:
    """`name`'s rank of the all-node run as the serving guard's re-qualification runs it (the
    flags `up` runs it with); none when the check is off."""
    if args.min_bus_bandwidth_gbps <= 0:
        return []
    rank = [r.name for r in args.ranks].index(name)
    return pulumi.Output.from_input(args.ranks[rank].image_id).apply(
        lambda image: rank_script_args(args, rank, image, GUARD_RERUN))


def pair_script_args(args: NcclCheckArgs, pair: NcclPair, rank: int, image_id: str, rerun_all: str) -> list[str]:
    """nccl-pair-check.sh's flags for the pair's rank `rank`: its link in words, then nccl-check.sh's."""
    node = pair.nodes[rank]
    check = check_args(pair.nodes, rank, pair.master_ip, args.min_bus_bandwidth_gbps, rerun_all, args.join_timeout_s)
    flags = ["--node", node, "--pair", "-".join(pair.nodes), *(a for r in pair.rails for a in ("--rail", r)),
             "--fix", pair.fix, "--rerun-all", rerun_all]
    return flags + [a for f in nccl_check_flags(node, image_id, check, pair.nccl_env[rank]) for a in ("--rank-arg", f)]


def run_keepers(args: NcclCheckArgs) -> dict[str, pulumi.Input[str]]:
    """What makes another NCCL run: the check itself, each rank's connection (its identity, host
    key, port), image and environment, and each pair's link: every input of a rank that differs
    between nodes."""
    keepers: dict[str, pulumi.Input[str]] = {"check": sha256_text(script_text(SCRIPT), launch_file(CHECK_PROGRAM))}
    if args.pairs:  # (two nodes: none, and the keepers as before) the pair script and every link
        keepers["pairs"] = sha256_text(script_text(PAIR_SCRIPT), json.dumps([asdict(p) for p in args.pairs]))
    for r in args.ranks:
        keepers[f"{r.name}.connection"] = compared_connection(r.connection)
        keepers[f"{r.name}.image"] = r.image_id
        keepers[f"{r.name}.env"] = r.env_hash
    return keepers


class NcclCheck(pulumi.ComponentResource):
    def __init__(self, name: str, args: NcclCheckArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:nccl_check:NcclCheck", name, None, opts)
        self.commands: list[pulumi_remote.Command] = []
        self.run: Optional[random.RandomId] = None
        if args.min_bus_bandwidth_gbps <= 0:
            self.register_outputs({})
            return
        # Why an anchor: a rank re-runs alone whenever only its own inputs change (pulumi-command
        # runs create again on an update; a new host key is one), and ranks cannot name each other
        # in replace_with (a resource can name only those registered before it). Every rank names
        # this one instead, and the engine replaces every rank in the run that replaces it
        # (pulumi/pulumi pkg/resource/deploy/step_generator.go, diff: ReplaceWith). Nothing can
        # make `--replace` of one rank reach the others: that rank fails fast at the roll call.
        self.run = random.RandomId(f"{name}-run", byte_length=8, keepers=run_keepers(args),
                                   opts=pulumi.ResourceOptions(parent=self))
        rerun_all = self.run.urn.apply(lambda urn: f"pulumi up --replace '{urn}'")
        rank_of = {r.name: r for r in args.ranks}
        before: list[pulumi_remote.Command] = []  # the round before: this one waits for all of it
        for round_ in pair_rounds(args.pairs):
            ran = []
            for pair in round_:
                for rank, name in enumerate(pair.nodes):
                    node = rank_of[name]
                    # mypy cannot type a lambda whose defaults bind the loop's pair and rank
                    script_args = pulumi.Output.all(node.image_id, rerun_all).apply(
                        lambda v, p=pair, r=rank: pair_script_args(args, p, r, v[0], v[1]))  # type: ignore[misc]
                    ran.append(node_command(
                        f"{name}-nccl-pair-{pair.nodes[1 - rank]}", node.connection,
                        NodeScript(PAIR_SCRIPT, script_args, payload=script_text(SCRIPT) + launch_file(CHECK_PROGRAM)),
                        parent=self, depends_on=before, replace_with=[self.run]))
            self.commands += ran
            before = ran
        for rank, node in enumerate(args.ranks):
            # mypy cannot type a lambda whose default binds the loop's rank
            script_args = pulumi.Output.all(node.image_id, rerun_all).apply(
                lambda v, r=rank: rank_script_args(args, r, v[0], v[1]))  # type: ignore[misc]
            self.commands.append(
                node_command(
                    f"{node.name}-nccl-check", node.connection,
                    NodeScript(SCRIPT, script_args, payload=launch_file(CHECK_PROGRAM)),
                    parent=self, depends_on=before, replace_with=[self.run],
                )
            )
        self.register_outputs({})
