"""Simulated Sparks on this machine: network namespaces, overlay roots, pid namespaces, sshd, dockerd.

    cluster = SimCluster.from_stack_file(workdir)
    cluster.up()            # nodes answer SSH as the stack's user, their dockerd too
    cluster.ssh("sim1", "uname -n")
    cluster.down()          # nothing left: processes, mounts, namespaces, links

Layout, for each node of the stack config: a netns `<prefix>-<node>`, a management veth into
the LAN (a bridge in the netns `<prefix>-lan`, the LAN switch: the nodes reach each other's
`host`, and this machine, on that bridge by one veth, holds .1 of each node's /24), one veth
per rail into the bridge of its subnet in the netns `<prefix>-fabric` (the "cable", MTU from
the stack: a switch's rail N is one bridge of every node, a ring's cable twin a bridge of
its two ends), and a PID 1
(node-root.sh -> node_init.py) in new pid/mount/uts namespaces with an overlay root whose
changes live in a tmpfs. Killing that PID 1 ends every process of the node, and the mounts
go with its mount namespace.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import yaml

import sim_images  # the sim stack's file, its registry and the registry's CA (dev/ on PYTHONPATH)
import sim_model
from components.config import Node, StackConfig, parse_stack_config, resolve_node_addresses
from components.config.topology import Topology
from components.config.schema import shape_rules
from toolbox import sh

SIM_DIR = Path(__file__).resolve().parent
SIM_STACK = sim_images.SIM_STACK
STATE_ROOT = Path("/var/lib/twinspark-sim")
# the sim's management addresses (RFC 2544's benchmark range, Pulumi.sim.yaml): each node's /24 is on the LAN
SIM_LAN = ipaddress.ip_network("198.18.0.0/15")
TOPOLOGIES = ("switch", "ring")
# Clusters side by side on one machine (the simulator's two pytest workers, docs/testing.md "CI"):
# site k has SIM_LAN's k-th /16 for its management addresses, hub ports of its own and names of its
# own (netns, links, disks); site 0 is the stack file's, and scripts/sim.sh's.
SITE_LANS = tuple(SIM_LAN.subnets(new_prefix=16))
SITES = len(SITE_LANS)
HUB_PORTS_PER_SITE = 10  # the hub stand-in takes its port and the next (its LFS redirects)


def can_raise_memlock() -> bool:
    """pam_limits can only lift memlock to unlimited with CAP_SYS_RESOURCE (bit 24); some
    sandboxes (this project's CI among them) withhold it from every process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return False


def load_sim_config(private_key: Path, path: Path = SIM_STACK, nodes: int = 0, topology: str = "",
                    site: int = 0) -> dict:
    """The sim stack as `twinspark:key -> value`, with the harness's SSH key filled in, `nodes`
    simulated nodes when asked for more than the stack's own, cabled as `topology` says (empty:
    the stack's fabric.topology; `ring` takes exactly 3 nodes), at `site` (on_site)."""
    config = dict(yaml.safe_load(path.read_text())["config"])
    config["twinspark:ssh"] = {**config["twinspark:ssh"], "privateKeyPath": str(private_key)}
    topology = topology or config["twinspark:fabric"]["topology"]
    if topology not in TOPOLOGIES:
        raise ValueError(f"--topology {topology}: expected one of {', '.join(TOPOLOGIES)} (what the sim cables)")
    if topology == "ring" and nodes != 3:
        raise ValueError(f"--topology ring with --nodes {nodes or len(config['twinspark:nodes'])}: "
                         "a ring is three Sparks, expected --nodes 3")
    if nodes:
        config["twinspark:nodes"] = sim_nodes(config["twinspark:nodes"], nodes, topology)
        config["twinspark:fabric"] = {**config["twinspark:fabric"], "topology": topology}
        # the layout with the largest TP that the sim's model splits over (3 nodes: PP 3, TP 1)
        layouts = shape_rules().workable_layouts(sim_model.SIM_MODEL_CONFIG, nodes)
        if not layouts:
            raise ValueError(f"--nodes {nodes}: no TP × PP of {nodes} nodes splits the sim's model")
        if layouts[0][1] > 1:
            config["twinspark:serving"] = {**config["twinspark:serving"], "pipelineParallel": layouts[0][1]}
    return on_site(config, site)


def site_prefix(site: int) -> str:
    """The names of a site's namespaces, links and disks begin with this."""
    return "ts" if site == 0 else f"ts{site}"


def on_site(config: dict, site: int) -> dict:
    """The config moved to `site`: each node's management address into SIM_LAN's /16 of that
    number (site 1: 198.18.N.x -> 198.19.N.x), the hub stand-in to ports of its own. Rails stay
    as they are: each site's fabric is namespaces of its own."""
    if not 0 <= site < SITES:
        raise ValueError(f"site {site}: the sim's LAN {SIM_LAN} holds sites 0 to {SITES - 1}")
    if site == 0:
        return config
    lan = SITE_LANS[site]

    def moved(host: str) -> str:
        offset = int(ipaddress.ip_address(host)) - int(SIM_LAN.network_address)
        return str(lan.network_address + offset % lan.num_addresses)

    hub = urlsplit(config["twinspark:model"]["hubEndpoint"])
    hub_endpoint = hub._replace(netloc=f"{hub.hostname}:{hub.port + site * HUB_PORTS_PER_SITE}").geturl()
    return {**config, "twinspark:nodes": [{**n, "host": moved(n["host"])} for n in config["twinspark:nodes"]],
            "twinspark:model": {**config["twinspark:model"], "hubEndpoint": hub_endpoint}}


def parse_sim_config(config: dict) -> StackConfig:
    """The blocks of a sim stack's config the sim itself reads (`twinspark:key -> value`; its
    secrets stay encrypted and unread), parsed as the program parses them."""
    blocks = ("ssh", "nodes", "fabric", "model", "serving")
    return parse_stack_config({key: v for k, v in config.items() if (key := k.split(":", 1)[1]) in blocks})


def sim_nodes(stack_nodes: list[dict], count: int, topology: str = "switch") -> list[dict]:
    """`count` nodes in the pattern of the stack's: simN, management 198.18.N.1N, and rails as
    `topology` cables them: switch, rail k at 10.0.k.N/24 (rail k of every node on one bridge,
    so any number of nodes shares it); ring, ring_rails."""
    if count < 2:
        raise ValueError(f"--nodes {count}: a cluster has a head and at least one worker (2 or more)")
    if count > 9:
        raise ValueError(f"--nodes {count}: the sim's address plan holds at most 9 nodes")
    # a new node has a host key of its own, and no plug (sim2's plug is sim2's)
    template = {k: v for k, v in stack_nodes[-1].items() if k not in ("hostKey", "power")}
    nodes = [dict(n) for n in stack_nodes[:count]]
    for i in range(len(nodes) + 1, count + 1):
        rails = [{**r, "address": f"10.0.{k}.{i}/24"} for k, r in enumerate(template["rails"])]
        nodes.append({**template, "name": f"sim{i}", "role": "worker", "host": f"198.18.{i}.1{i}", "rails": rails})
    if topology == "ring":
        nodes = [{**n, "rails": ring_rails(i, nodes)} for i, n in enumerate(nodes)]
    return nodes


def ring_rails(index: int, nodes: list[dict]) -> list[dict]:
    """Node `index`'s four rails in a ring, cabled as a Spark's (NVIDIA's connect-three-sparks):
    port 0 (rails 0-1) to the next node's port 1 (its rails 2-3). Link L is the cable from node
    L's port 0; its twin t is 10.0.{2L+t}.0/24, each end's host octet its node number (as
    NVIDIA's ip_for_3node_ring_link numbers them): six /24s for three nodes."""
    following, previous = (index + 1) % len(nodes), (index - 1) % len(nodes)
    # each rail's (link, peer): port 0 is this node's link to the following node, port 1 the previous node's link
    cables = [(index, following)] * 2 + [(previous, previous)] * 2
    return [{"iface": f"rail{k}", "hca": f"simroce{k}", "address": f"10.0.{2 * link + k % 2}.{index + 1}/24",
             "peer": nodes[peer]["name"]} for k, (link, peer) in enumerate(cables)]


def rail_mac(node: str, iface: str) -> str:
    """A rail's MAC address, fixed by the node's name and the rail, as a Spark's NIC's is by its
    hardware: a node taken out and cabled again (a reinstall) answers at the MAC its peers'
    neighbour tables still hold (a new random one goes unanswered until those entries expire)."""
    digest = hashlib.sha256(f"{node}/{iface}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))  # locally administered, unicast


def rail_bridges(nodes: list[Node], known: Optional[dict] = None) -> dict[ipaddress.IPv4Network, str]:
    """The fabric's bridges: one per distinct rail subnet, each what one cable joins (a switch's
    rail N, or a ring's cable twin), named br0, br1, ... in the order the nodes' rails first name
    them; `known` (the running fabric's) keep their names and new ones follow them."""
    bridges = dict(known or {})
    for node in nodes:
        for rail in node.rails:
            bridges.setdefault(rail.network, f"br{len(bridges)}")
    return bridges


def on_the_lan(node: Node) -> Node:
    """The node, if its host is an address on the sim's LAN (its management link's /24 in SIM_LAN)."""
    try:
        mgmt = ipaddress.ip_interface(f"{node.host}/24")
    except ValueError:
        mgmt = None
    if mgmt is None or not mgmt.network.subnet_of(SIM_LAN):
        raise ValueError(f"{node.name}: host {node.host!r} — expected an IPv4 address in the sim's LAN {SIM_LAN}")
    return node


@dataclass
class SimNode:
    spec: Node
    netns: str
    init_pid: int = 0
    launcher: Optional[subprocess.Popen] = None
    cables: dict[str, str] = field(default_factory=dict)  # rail iface -> its cable's end in the fabric netns

    @property
    def name(self) -> str:
        return self.spec.name


class SimCluster:
    def __init__(self, config: dict, workdir: Path, prefix: str = site_prefix(0), registry: str = ""):
        self.config = config
        # what each node's dockerd pulls from: the sim's registry (dev/sim_images.py) and the CA of its TLS certificate
        self.registry, self.registry_ca = registry or sim_images.REGISTRY, sim_images.REGISTRY_CA
        self.cfg: StackConfig = parse_sim_config(config)
        self.workdir = workdir
        self.prefix = prefix
        self.key = Path(config["twinspark:ssh"]["privateKeyPath"])
        for node in self.cfg.nodes:
            on_the_lan(node)
        self.nodes = {n.name: SimNode(n, f"{prefix}-{n.name}") for n in self.cfg.nodes}
        self.fabric_ns = f"{prefix}-fabric"
        self.bridges: dict[ipaddress.IPv4Network, str] = {}  # the fabric's, by rail subnet (rail_bridges)
        self.lan_ns = f"{prefix}-lan"  # the LAN switch
        self.lan_iface = f"{prefix}m-lan"[:15]  # this machine's port on it (it holds every node's gateway)
        # the stack's hub (Pulumi.sim.yaml model.hubEndpoint), as host:port: the name each node resolves
        hub = urlsplit(self.cfg.model.hub_endpoint)
        self.hub = f"{hub.hostname}:{hub.port or (443 if hub.scheme == 'https' else 80)}"

    def stack_file_text(self) -> str:
        """A Pulumi.sim.yaml for these nodes: the sim stack's salt (its secrets stay readable) and this config."""
        salt = yaml.safe_load(SIM_STACK.read_text())["encryptionsalt"]
        return yaml.safe_dump({"encryptionsalt": salt, "config": self.config}, sort_keys=False)

    @property
    def topology(self) -> Topology:
        """What the stack's fabric.topology decides (each node's Ray address, its rails' peers), as the program has it."""
        return Topology(self.cfg, resolve_node_addresses(self.cfg.nodes))

    @classmethod
    def from_stack_file(cls, workdir: Path, path: Path = SIM_STACK, nodes: int = 0, topology: str = "",
                        site: int = 0, **kw) -> "SimCluster":
        key = workdir / "id_ed25519"
        if not key.exists():
            workdir.mkdir(parents=True, exist_ok=True)
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "twinspark-sim-operator", "-f", key)
        return cls(load_sim_config(key, path, nodes, topology, site), workdir, site_prefix(site), **kw)

    def state_dir(self, node: SimNode) -> Path:
        """The node's disk (node-root.sh): kept across its reboots, wiped when it is made anew."""
        return STATE_ROOT / f"{self.prefix}-{node.name}"

    # ---- lifecycle -------------------------------------------------------------------
    def up(self) -> None:
        self.down()  # leftovers of an earlier, killed run
        sh("ip", "netns", "add", self.fabric_ns)
        self._cable([n.spec for n in self.nodes.values()])
        self._lan()
        for index, node in enumerate(self.nodes.values()):
            self._network(index, node)
            self._boot(node)
        for node in self.nodes.values():
            self._wait_for_ssh(node)
            self._wait_for_dockerd(node)
            self._install(node)

    def down(self) -> None:
        for node in self.nodes.values():
            pid = node.init_pid or self._find_init_pid(node)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if node.launcher is not None:
                try:
                    node.launcher.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    node.launcher.kill()
            node.init_pid, node.launcher = 0, None
        # a killed run's nodes this cluster does not know (one add_node() gave it): their processes
        # by namespace, their disks by name, so a later node of that name boots on a fresh disk
        for ns in self._site_netns():
            self._kill_all_in(ns)
            sh("ip", "netns", "del", ns, check=False)
        self.bridges = {}
        # this machine's LAN port, and a management link of a run from before the LAN (gone with the netns)
        for iface in [self.lan_iface] + [self._mgmt_host_iface(n) for n in self.nodes.values()]:
            if self._link_exists(iface):
                sh("ip", "link", "del", iface, check=False)
        for disk in self._site_disks():
            sh("rm", "-rf", "--one-file-system", disk, check=False)

    def _site_netns(self) -> list[str]:
        return [ns for ns in self.netns_list() if ns.startswith(f"{self.prefix}-")]

    def _site_disks(self) -> list[Path]:
        return sorted(STATE_ROOT.glob(f"{self.prefix}-*"))

    def _kill_all_in(self, netns: str) -> None:
        """SIGKILL to every process in a namespace, and a wait until they are gone (their mounts
        hold the disk)."""
        for _ in range(50):
            pids = [int(p) for p in sh("ip", "netns", "pids", netns, check=False).stdout.split()]
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def add_node(self, spec: dict) -> Node:
        """Another Spark cabled to the running cluster (a node of the stack's config, as a dict):
        its namespace, rails on the fabric's bridges, and a fresh boot; the stack does not know it
        until its config names it."""
        node = SimNode(on_the_lan(Node.model_validate(spec)), f"{self.prefix}-{spec['name']}")
        self.nodes[node.name] = node
        self._cable([node.spec])
        self._network(len(self.nodes) - 1, node)
        self._power_on(node)
        self._install(node)
        return node.spec

    def remove_node(self, name: str) -> None:
        """The node unplugged and gone: its processes, namespace, links and disk."""
        node = self.nodes.pop(name)
        self._power_off(node)
        sh("ip", "netns", "del", node.netns, check=False)  # its LAN and rail veths go with it
        if all(self.gateway(n) != self.gateway(node) for n in self.nodes.values()):
            sh("ip", "addr", "del", f"{self.gateway(node)}/24", "dev", self.lan_iface, check=False)
        sh("rm", "-rf", "--one-file-system", self.state_dir(node), check=False)

    def reboot(self, *nodes: str, clean: bool = True) -> None:
        """Reboot the nodes, then boot each again from its disk, in the order given: files and
        docker's containers stay; /run, processes and the daemon start fresh, and so do the units
        the program enabled. `clean` (as `sudo reboot`): the services the program enabled are
        stopped first (the node recorder's stop marks the clean end), then the power goes; not
        clean: the power goes at once (every process killed), as a power cut's."""
        for node in nodes:
            if clean:
                self.stop_services(node)
            self._power_off(self.nodes[node])
        for node in nodes:
            self._power_on(self.nodes[node])

    def stop_services(self, node: str) -> None:
        """What a shutdown does first: every service the program started stopped (tests/sim/shims/systemctl)."""
        self.node_exec(node, "bash", "-c", 'for f in /run/twinspark-sim/units/*.pid; do [ -e "$f" ] || continue; '
                       'systemctl stop "$(basename "$f" .pid)"; done', check=False, timeout=60)

    def freeze(self, node: str) -> list[int]:
        """The node stops answering, as a GB10 out of unified memory does: SIGSTOP to every process
        of it (its PID 1's descendants, containers included), the kernel's share (its network
        namespace still completes a TCP handshake) left as it is. Returns the stopped PIDs."""
        init = self.nodes[node].init_pid
        stopped, todo = [], [init]
        while todo:
            pid = todo.pop()
            try:
                for task in Path(f"/proc/{pid}/task").iterdir():
                    todo += [int(c) for c in (task / "children").read_text().split()]
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except (OSError, ProcessLookupError):
                continue
        return stopped

    def power_off(self, node: str) -> None:
        """The plug switched off (tests/sim/plug_standin.py): every process killed, frozen or not."""
        if self.nodes[node].init_pid:
            self._power_off(self.nodes[node])

    def power_on(self, node: str) -> None:
        """The plug switched on: the node boots from its disk."""
        if not self.nodes[node].init_pid:
            self._power_on(self.nodes[node])

    def reinstall(self, node: str) -> None:
        """The node's OS installed anew: powered off, its disk wiped, booted fresh — new SSH host
        keys, no files, images or containers of the program's, the same address and login."""
        sim_node = self.nodes[node]
        self._power_off(sim_node)
        sh("rm", "-rf", "--one-file-system", self.state_dir(sim_node))
        self._power_on(sim_node)
        self._install(sim_node)

    def _power_off(self, node: SimNode) -> None:
        if not node.init_pid:  # os.kill(0, ...) would kill this process's whole group
            raise RuntimeError(f"sim node {node.name} is not running")
        os.kill(node.init_pid, signal.SIGKILL)
        node.launcher.wait(timeout=30)
        node.init_pid, node.launcher = 0, None

    def _power_on(self, node: SimNode) -> None:
        self._boot(node)
        self._wait_for_ssh(node)
        self._wait_for_dockerd(node)

    def _install(self, node: SimNode) -> None:
        """What a Spark's installation gives that a namespace lacks: which RDMA device is on
        which rail (the roce stand-in's map)."""
        roce_map = "".join(f"{r.hca} {r.iface}\n" for r in node.spec.rails)
        self.node_exec(node.name, "bash", "-c", "mkdir -p /etc/twinspark-sim && cat > /etc/twinspark-sim/roce-map",
                       input=roce_map)

    def leftovers(self) -> dict[str, list[str]]:
        """What down() must not leave: namespaces, links, mounts, processes of this prefix."""
        marker = f"twinspark-sim-root-{self.prefix}-"  # node-root.sh's overlay roots, by disk
        procs = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() + " "
            except OSError:
                continue
            if any(self._is_init(cmd.split(), n) or ("node-root.sh" in cmd and f" {self.state_dir(n)} " in cmd)
                   for n in self.nodes.values()):
                procs.append(f"{pid}: {cmd[:120]}")
        return {
            "netns": self._site_netns(),
            "links": [iface for iface in [self.lan_iface] + [self._mgmt_host_iface(n) for n in self.nodes.values()]
                      if self._link_exists(iface)],
            "mounts": [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if marker in line],
            "processes": procs,
            "disks": [str(d) for d in self._site_disks()],
        }

    @staticmethod
    def netns_list() -> list[str]:
        return [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.strip()]

    # ---- acting on nodes ---------------------------------------------------------------
    def ssh(self, node: str, command: str, stdin: Optional[str] = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a command line as the stack's user over a real OpenSSH login, like pulumi-command."""
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10",
             f"{self.cfg.ssh.user}@{self.nodes[node].spec.host}", command],
            input=stdin or "", capture_output=True, text=True, timeout=timeout,
        )

    def node_exec(self, node: str, *argv, input: Optional[str] = None, check: bool = True, timeout: float = 120):
        """Run as root inside the node: its namespaces and its overlay root."""
        return subprocess.run(self._nsenter(node) + [str(a) for a in argv], input=input, capture_output=True,
                              text=True, check=check, timeout=timeout)

    def node_spawn(self, node: str, *argv, log: str = "/dev/null") -> subprocess.Popen:
        """Start a long-running root process inside the node, detached from the test."""
        out = open(log, "ab") if log != "/dev/null" else subprocess.DEVNULL
        return subprocess.Popen(self._nsenter(node) + [str(a) for a in argv], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def cross_cables(self, node: str) -> None:
        """The node's two rails' cables swapped at its end (rail0's plugged where rail1's was): the
        fabric's other ends stay; done again, they are as cabled."""
        first, second = (self.nodes[node].cables[rail.iface] for rail in self.nodes[node].spec.rails[:2])
        bridges = {end: self._bridge_of(end) for end in (first, second)}
        self._in_fabric("link", "set", first, "master", bridges[second])
        self._in_fabric("link", "set", second, "master", bridges[first])

    def _bridge_of(self, cable_end: str) -> str:
        link = json.loads(sh("ip", "-j", "-n", self.fabric_ns, "link", "show", cable_end).stdout)
        return link[0]["master"]

    def in_netns(self, node: str, *argv, check: bool = True):
        return sh("ip", "netns", "exec", self.nodes[node].netns, *argv, check=check)

    # ---- internals ---------------------------------------------------------------------
    def _nsenter(self, node: str) -> list[str]:
        pid = self.nodes[node].init_pid
        return ["nsenter", "-t", str(pid), "-m", "-u", "-n", "-p", "-r", "-w", "--"]

    def _in_fabric(self, *argv):
        return sh("ip", "-n", self.fabric_ns, *argv)

    def _mgmt_host_iface(self, node: SimNode) -> str:
        """The LAN switch's port of the node's management link."""
        return f"{self.prefix}m-{node.name}"[:15]

    @staticmethod
    def _link_exists(iface: str) -> bool:
        return sh("ip", "link", "show", "dev", iface, check=False).returncode == 0

    def _in_lan(self, *argv):
        return sh("ip", "-n", self.lan_ns, *argv)

    def _lan(self) -> None:
        """The LAN switch (a bridge in its own netns: no firewall of this machine's filters what it
        bridges) and this machine's port on it; no route leads on from there."""
        sh("ip", "netns", "add", self.lan_ns)
        self._in_lan("link", "add", "lan", "type", "bridge")
        self._in_lan("link", "set", "lan", "up")
        sh("ip", "link", "add", self.lan_iface, "type", "veth", "peer", "name", "uplink", "netns", self.lan_ns)
        self._in_lan("link", "set", "uplink", "master", "lan", "up")
        sh("ip", "link", "set", self.lan_iface, "up")

    def _cable(self, nodes: list[Node]) -> None:
        """The bridges these nodes' rails need that the fabric lacks (rail_bridges)."""
        bridges = rail_bridges(nodes, self.bridges)
        for network, bridge in bridges.items():
            if network not in self.bridges:
                self._in_fabric("link", "add", bridge, "mtu", self.cfg.fabric.mtu, "type", "bridge")
                self._in_fabric("link", "set", bridge, "alias", str(network))  # `ip -n ts-fabric link` says which cable
                self._in_fabric("link", "set", bridge, "up")
        self.bridges = bridges

    @staticmethod
    def gateway(node: SimNode) -> ipaddress.IPv4Address:
        """This machine's address on the node's management /24 (the .1)."""
        return next(ipaddress.ip_interface(f"{node.spec.host}/24").network.hosts())

    def _network(self, index: int, node: SimNode) -> None:
        ns, mtu = node.netns, self.cfg.fabric.mtu
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        mgmt, mgmt_iface = ipaddress.ip_interface(f"{node.spec.host}/24"), self.cfg.fabric.bootstrap_iface
        switch_port = self._mgmt_host_iface(node)
        sh("ip", "-n", ns, "link", "add", mgmt_iface, "type", "veth", "peer", "name", switch_port, "netns", self.lan_ns)
        self._in_lan("link", "set", switch_port, "master", "lan", "up")
        sh("ip", "addr", "replace", f"{self.gateway(node)}/24", "dev", self.lan_iface)  # this machine, on the node's /24
        sh("ip", "-n", ns, "addr", "add", str(mgmt), "dev", mgmt_iface)
        sh("ip", "-n", ns, "link", "set", mgmt_iface, "up")
        # the other nodes' /24s are on the same LAN (as a Spark's LAN is one subnet): on-link, no gateway
        sh("ip", "-n", ns, "route", "add", str(SIM_LAN), "dev", mgmt_iface, "scope", "link")
        for i, rail in enumerate(node.spec.rails):
            inner, outer = f"{self.prefix}r{index}x{i}a", f"{self.prefix}r{index}x{i}b"  # made here, then moved
            sh("ip", "link", "add", inner, "address", rail_mac(node.name, rail.iface), "mtu", mtu,
               "type", "veth", "peer", "name", outer, "mtu", mtu)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "netns", self.fabric_ns)
            sh("ip", "-n", ns, "link", "set", inner, "name", rail.iface)
            sh("ip", "-n", ns, "addr", "add", rail.address, "dev", rail.iface)
            sh("ip", "-n", ns, "link", "set", rail.iface, "up")
            self._in_fabric("link", "set", outer, "master", self.bridges[rail.network], "up")
            node.cables[rail.iface] = outer

    def _boot(self, node: SimNode) -> None:
        pubkey = self.key.with_suffix(".pub")
        node.launcher = subprocess.Popen(
            # nsenter, not `ip netns exec`: that one remounts /sys without the cgroup hierarchies,
            # and dockerd then refuses to start ("Devices cgroup isn't mounted")
            ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--mount", "--pid", "--uts", "--fork",
             "--propagation", "private", "bash", str(SIM_DIR / "node-root.sh"), node.name, str(SIM_DIR),
             self.cfg.ssh.user, str(pubkey), sys.executable, str(self.state_dir(node)),
             "--registry", self.registry, "--registry-address", str(self.gateway(node)),
             "--registry-ca", str(self.registry_ca), "--hub", self.hub, "--cluster", self.prefix],
            stdin=subprocess.DEVNULL, stdout=open(self.workdir / f"{node.name}-init.log", "ab"),
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not node.init_pid:
            node.init_pid = self._find_init_pid(node)
            time.sleep(0.1)
        if not node.init_pid:
            raise RuntimeError(f"sim node {node.name} did not start: {(self.workdir / f'{node.name}-init.log').read_text()}")

    def _find_init_pid(self, node: SimNode) -> int:
        if node.launcher is not None:
            try:
                children = Path(f"/proc/{node.launcher.pid}/task/{node.launcher.pid}/children").read_text().split()
                return int(children[0]) if children else 0
            except OSError:
                return 0
        for pid in filter(str.isdigit, os.listdir("/proc")):  # an earlier run's node
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if self._is_init([part.decode(errors="replace") for part in cmd], node):
                return int(pid)
        return 0

    def _is_init(self, argv: list[str], node: SimNode) -> bool:
        """Whether a command line is this cluster's node's PID 1 (node-root.sh has exec'd node_init.py
        by now; another site's nodes have the same names, not the same --cluster)."""
        return (len(argv) > 3 and argv[1].endswith("node_init.py") and argv[2:4] == ["--name", node.name]
                and "--cluster" in argv and argv[argv.index("--cluster") + 1:][:1] == [self.prefix])

    def _wait_for_login(self, node: SimNode, command: str, what: str, log, timeout: float = 60) -> None:
        """Until `command` succeeds as the login user over SSH; else the node's `log()` says why."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            probe = self.ssh(node.name, command, timeout=15)
            if probe.returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError(f"sim node {node.name}: {what} after {timeout:.0f} s\n{probe.stderr}\n{log()}")

    def _wait_for_dockerd(self, node: SimNode) -> None:
        """As the login user, the way the docker provider reaches it (`docker system dial-stdio`)."""
        self._wait_for_login(node, "docker version --format '{{.Server.Version}}'", "dockerd not answering",
                             lambda: self.node_exec(node.name, "tail", "-20", "/var/log/twinspark-sim/dockerd.log",
                                                    check=False).stdout)

    def _wait_for_ssh(self, node: SimNode) -> None:
        self._wait_for_login(node, "true", "no SSH login", lambda: (self.workdir / f"{node.name}-init.log").read_text())

def main(argv: Optional[list[str]] = None) -> int:
    """`python tests/sim/cluster.py up|down` for scripts/sim.sh: the nodes outlive this process."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="simulated Sparks on this machine")
    parser.add_argument("action", choices=("up", "down", "leftovers"))
    parser.add_argument("--workdir", type=Path, required=True, help="the operator's key and the nodes' boot logs")
    parser.add_argument("--nodes", type=int, default=0, help="how many nodes (default: the sim stack's)")
    parser.add_argument("--topology", choices=TOPOLOGIES, default="",
                        help="how the rails are cabled (default: the sim stack's fabric.topology; ring: --nodes 3)")
    parser.add_argument("--config-out", type=Path, help="write the stack's config for these nodes here (YAML)")
    args = parser.parse_args(argv)
    try:
        cluster = SimCluster.from_stack_file(args.workdir, nodes=args.nodes, topology=args.topology)
    except ValueError as e:
        print(f"cluster.py: {e}", file=sys.stderr)
        return 2
    if args.action == "up":
        cluster.up()
        if args.config_out:
            args.config_out.write_text(cluster.stack_file_text())
        print(json.dumps({n.name: n.spec.host for n in cluster.nodes.values()}))
    elif args.action == "down":
        cluster.down()
    leftovers = cluster.leftovers() if args.action != "up" else {}
    if any(leftovers.values()):
        print(json.dumps(leftovers, indent=2))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
