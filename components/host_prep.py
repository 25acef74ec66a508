"""HostPrep: the per-node OS settings the recipe needs before RDMA and the model work.

Creates, per node, one idempotent remote command per managed file (launch/managed-file.sh):
- /etc/security/limits.d/99-rdma.conf        memlock unlimited, soft and hard (gotcha 1)
- /etc/systemd/system.conf.d/99-twinspark-memlock.conf  DefaultLimitMEMLOCK=infinity, re-exec'd
- /etc/netplan/99-qsfp.yaml (mode 600)       the rails only; applied outside the SSH session
- /etc/logrotate.d/twinspark                 the host log directory, rotated by size and day
- /etc/sysctl.d/99-twinspark-hang-recovery.conf   panic on a soft/hard lockup, reboot 30 s after
- /etc/sysctl.d/99-twinspark-rails.conf       each rail answers ARP for its own address only
- /etc/systemd/system.conf.d/99-twinspark-watchdog.conf   systemd pets the hardware watchdog
- /etc/sysctl.d/99-twinspark-userns.conf     head only: unprivileged userns for codex's sandbox
- /etc/twinspark/firewall.nft               the host firewall (nftables, inet: IPv4 and IPv6),
  loaded at once (atomically) and at every boot by twinspark-firewall.service
- /etc/systemd/system/twinspark-gpu-clocks.service   with serving.gpuClockCapMhz: the clock cap,
  applied now and at every boot; removing it resets the clocks
- /etc/systemd/system/{user,system}.slice.d/50-twinspark-cotenants.conf   unless
  serving.cotenantMemoryMax is off: sessions and other services capped, so the OOM killer
  takes a co-tenant before a TP rank (the serving containers run in twinspark.slice); the
  caps are the node's memory budget's (core/memory_budget.py)
Deleting the component removes each file and reverts its effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import yaml
from pulumi_command import remote as pulumi_remote

from core import contract
from core.contract import LOG_DIR, LOGROTATE_PATH

from .config import Node
from .firewall import FirewallPolicy, render_firewall
from .remote import ManagedFile, files_hash, managed_file_commands

LIMITS_PATH = "/etc/security/limits.d/99-rdma.conf"
SYSTEMD_MEMLOCK_PATH = "/etc/systemd/system.conf.d/99-twinspark-memlock.conf"
NETPLAN_PATH = "/etc/netplan/99-qsfp.yaml"
USERNS_SYSCTL_PATH = "/etc/sysctl.d/99-twinspark-userns.conf"
USERNS_KEY = "kernel.apparmor_restrict_unprivileged_userns"
USERNS_UBUNTU_DEFAULT = f"{USERNS_KEY}=1"
HANG_SYSCTL_PATH = "/etc/sysctl.d/99-twinspark-hang-recovery.conf"
RAIL_SYSCTL_PATH = "/etc/sysctl.d/99-twinspark-rails.conf"
# per rail -> (ours, the kernel's default, restored on remove): ARP answered only for the rail's own
# address, and asked from it. Two rails of one host otherwise answer for each other (ARP flux), and
# a crossed cable would look healthy to ARP; so the fabric check can tell which far end a cable reaches.
RAIL_ARP = {"arp_ignore": (1, 0), "arp_announce": (2, 0)}
WATCHDOG_PATH = "/etc/systemd/system.conf.d/99-twinspark-watchdog.conf"
# A hard-locked Spark answers nothing until someone power-cycles it: panic on a soft or hard
# lockup and reboot 30 s later instead; docker then brings serving back on its own.
PANIC_REBOOT_SECONDS = 30
# key -> (ours, the kernel's default, restored on remove)
HANG_RECOVERY = {"kernel.softlockup_panic": (1, 0), "kernel.hardlockup_panic": (1, 0),
                 "kernel.panic": (PANIC_REBOOT_SECONDS, 0)}
HANG_RECOVERY_DEFAULTS = " ".join(f"{key}={default}" for key, (_, default) in HANG_RECOVERY.items())
WATCHDOG_SECONDS = 60
GPU_CLOCKS_UNIT = "twinspark-gpu-clocks.service"


@dataclass(frozen=True)
class HostPrepArgs:
    node: Node
    connection: pulumi_remote.ConnectionArgs
    mtu: int
    firewall: FirewallPolicy
    gpu_clock_cap_mhz: Optional[int] = None
    cotenant_memory_percent: Optional[int] = None  # each slice's, from the memory budget; None: uncapped


def render_limits_conf() -> str:
    return (
        "# twinspark: RDMA must pin memory; the default 8 MB memlock breaks NCCL (recipe gotcha 1)\n"
        "* soft memlock unlimited\n"
        "* hard memlock unlimited\n"
    )


def render_systemd_memlock() -> str:
    return (
        "# twinspark: services (dockerd and its containers) inherit an unlimited memlock\n"
        "[Manager]\n"
        "DefaultLimitMEMLOCK=infinity\n"
    )


def render_netplan(node: Node, mtu: int) -> str:
    """Only the QSFP rails: static addresses, jumbo MTU, no DHCP, optional (boot never waits)."""
    ethernets = {
        rail.iface: {
            "addresses": [rail.address],
            "mtu": mtu,
            "dhcp4": False,
            "dhcp6": False,
            "optional": True,
        }
        for rail in node.rails
    }
    body = yaml.safe_dump({"network": {"version": 2, "ethernets": ethernets}}, sort_keys=False)
    return f"# twinspark: QSFP rails of {node.name} (managed; edit the stack config instead)\n{body}"


def render_logrotate() -> str:
    # copytruncate: the boot scripts and vLLM keep their log files open (O_APPEND) for months
    return f"""# twinspark: the serving logs on the host outlive container restarts; keep them bounded
{LOG_DIR}/*.log {{
    daily
    maxsize 200M
    rotate 7
    compress
    delaycompress
    missingok
    notifempty
    copytruncate
}}
"""


def render_hang_sysctl() -> str:
    lines = "".join(f"{key} = {ours}\n" for key, (ours, _) in HANG_RECOVERY.items())
    return f"# twinspark: a lockup panics the kernel, and a panic reboots after {PANIC_REBOOT_SECONDS} s\n" + lines


def rail_sysctl_key(iface: str, name: str) -> str:
    # the slash form: an interface name may hold a dot (a VLAN's), which the dotted form would split
    return f"net/ipv4/conf/{iface}/{name}"


def render_rail_sysctl(node: Node) -> str:
    lines = "".join(f"{rail_sysctl_key(rail.iface, name)} = {ours}\n"
                    for rail in node.rails for name, (ours, _) in RAIL_ARP.items())
    return ("# twinspark: each QSFP rail answers ARP for its own address only (no ARP flux between the two\n"
            "# rails; the fabric check tells which far end a cable reaches by who answers)\n" + lines)


def rail_sysctl_defaults(node: Node) -> str:
    return " ".join(f"{rail_sysctl_key(rail.iface, name)}={default}"
                    for rail in node.rails for name, (_, default) in RAIL_ARP.items())


def render_watchdog() -> str:
    return (
        "# twinspark: systemd pets the hardware watchdog (where the platform has one; ignored where\n"
        "# not): a frozen kernel is reset by the board, a hung reboot too\n"
        "[Manager]\n"
        f"RuntimeWatchdogSec={WATCHDOG_SECONDS}s\n"
        f"RebootWatchdogSec={2 * WATCHDOG_SECONDS}s\n"
    )


def render_gpu_clocks_unit(cap_mhz: int) -> str:
    return f"""# twinspark: the GPU clock cap (serving.gpuClockCapMhz); nvidia-smi's own lock is lost at reboot
[Unit]
Description=twinspark GPU clock cap ({cap_mhz} MHz)
After=nvidia-persistenced.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/nvidia-smi -lgc 0,{cap_mhz}
ExecStop=/usr/bin/nvidia-smi -rgc

[Install]
WantedBy=multi-user.target
"""


def cotenant_slice_path(slice_name: str) -> str:
    return f"/etc/systemd/system/{slice_name}.d/50-twinspark-cotenants.conf"


def render_cotenant_slice(percent: int) -> str:
    """A slice's memory cap: throttled (reclaim) above MemoryHigh, OOM-killed inside the slice at MemoryMax."""
    return (
        "# twinspark: what this slice's processes (sessions, agents, builds, other services) may take of\n"
        "# the node's memory, from the node's budget: model (gpuMemoryUtilization) + each co-tenant\n"
        "# slice's cap + headroom <= 100%; a runaway co-tenant is killed here, inside its own slice,\n"
        "# before the kernel OOM killer reaches a TP rank (gotcha 13)\n"
        "[Slice]\n"
        f"MemoryHigh={max(1, percent * 9 // 10)}%\n"
        f"MemoryMax={percent}%\n"
    )


def render_userns_sysctl() -> str:
    return (
        "# twinspark: codex's bubblewrap sandbox needs unprivileged user namespaces (Ubuntu 24.04)\n"
        f"{USERNS_KEY} = 0\n"
    )


def render_firewall_unit() -> str:
    # nft's exit status is the unit's (a oneshot, ExecStart without '-'): a table that does not
    # load leaves the unit failed (`systemctl --failed`, the system "degraded"), never quietly done
    return f"""# twinspark: load the host firewall at boot, before any interface comes up
[Unit]
Description=twinspark host firewall (nftables table inet {contract.FIREWALL_TABLE})
DefaultDependencies=no
Wants=network-pre.target
Before=network-pre.target docker.service
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f {contract.FIREWALL_RULES_PATH}
ExecStop=/usr/sbin/nft delete table inet {contract.FIREWALL_TABLE}

[Install]
WantedBy=sysinit.target
"""


def managed_files(node: Node, mtu: int, firewall: FirewallPolicy, gpu_clock_cap_mhz: Optional[int] = None,
                  cotenant_memory_percent: Optional[int] = None) -> list[ManagedFile]:
    files = [
        ManagedFile("memlock-limits", LIMITS_PATH, render_limits_conf()),
        ManagedFile("systemd-memlock", SYSTEMD_MEMLOCK_PATH, render_systemd_memlock(), action="systemd"),
        ManagedFile("netplan", NETPLAN_PATH, render_netplan(node, mtu), mode="0600", action="netplan"),
        ManagedFile("logrotate", LOGROTATE_PATH, render_logrotate()),
        ManagedFile("hang-recovery", HANG_SYSCTL_PATH, render_hang_sysctl(), action="sysctl",
                    undo=HANG_RECOVERY_DEFAULTS),
        ManagedFile("rail-arp", RAIL_SYSCTL_PATH, render_rail_sysctl(node), action="sysctl",
                    undo=rail_sysctl_defaults(node)),
        ManagedFile("watchdog", WATCHDOG_PATH, render_watchdog(), action="systemd"),
        ManagedFile("firewall", contract.FIREWALL_RULES_PATH, render_firewall(node, firewall), mode="0600",
                    action="nftables", undo=f"inet {contract.FIREWALL_TABLE}"),
        ManagedFile("firewall-unit", f"/etc/systemd/system/{contract.FIREWALL_UNIT}", render_firewall_unit(),
                    action="unit"),
    ]
    if gpu_clock_cap_mhz is not None:
        files.append(ManagedFile("gpu-clocks", f"/etc/systemd/system/{GPU_CLOCKS_UNIT}",
                                 render_gpu_clocks_unit(gpu_clock_cap_mhz), action="service"))
    if cotenant_memory_percent is not None:
        # daemon-reexec re-reads the drop-ins and applies the limits to the running slices
        files += [ManagedFile(f"cotenants-{name.split('.')[0]}", cotenant_slice_path(name),
                              render_cotenant_slice(cotenant_memory_percent), action="systemd")
                  for name in contract.COTENANT_SLICES]
    if node.role == "head":
        files.append(
            ManagedFile("userns-sysctl", USERNS_SYSCTL_PATH, render_userns_sysctl(), action="sysctl",
                        undo=USERNS_UBUNTU_DEFAULT)
        )
    return files


class HostPrep(pulumi.ComponentResource):
    """Memlock limits, netplan rails, log rotation, sysctl and the firewall on one node."""

    def __init__(self, name: str, args: HostPrepArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:host_prep:HostPrep", name, None, opts)
        files = managed_files(args.node, args.mtu, args.firewall, args.gpu_clock_cap_mhz,
                              args.cotenant_memory_percent)
        self.commands = managed_file_commands(args.node.name, "hostprep", args.connection, files, parent=self)
        # FabricCheck re-runs whenever what HostPrep puts on a node changes.
        self.content_hash = files_hash(files)
        self.register_outputs({"contentHash": self.content_hash})
