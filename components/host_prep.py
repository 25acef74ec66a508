"""HostPrep: the per-node OS settings the recipe needs before RDMA and the model work.

Creates, per node, one idempotent remote command per managed file (launch/managed-file.sh):
- /etc/security/limits.d/99-rdma.conf        memlock unlimited, soft and hard (gotcha 1)
- /etc/systemd/system.conf.d/99-twinspark-memlock.conf  DefaultLimitMEMLOCK=infinity, re-exec'd
- /etc/netplan/99-qsfp.yaml (mode 600)       the rails only; applied outside the SSH session
- /etc/logrotate.d/twinspark                 the host log directory, rotated by size and day
- /etc/sysctl.d/99-twinspark-userns.conf     head only: unprivileged userns for codex's sandbox
Deleting the component removes each file and reverts its effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import yaml
from pulumi_command import remote

from node_contract import LOG_DIR, LOGROTATE_PATH

from .config import Node
from .remote import ManagedFile, files_hash, managed_file_commands

LIMITS_PATH = "/etc/security/limits.d/99-rdma.conf"
SYSTEMD_MEMLOCK_PATH = "/etc/systemd/system.conf.d/99-twinspark-memlock.conf"
NETPLAN_PATH = "/etc/netplan/99-qsfp.yaml"
USERNS_SYSCTL_PATH = "/etc/sysctl.d/99-twinspark-userns.conf"
USERNS_KEY = "kernel.apparmor_restrict_unprivileged_userns"
USERNS_UBUNTU_DEFAULT = f"{USERNS_KEY}=1"


@dataclass(frozen=True)
class HostPrepArgs:
    node: Node
    connection: remote.ConnectionArgs
    mtu: int


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


def render_userns_sysctl() -> str:
    return (
        "# twinspark: codex's bubblewrap sandbox needs unprivileged user namespaces (Ubuntu 24.04)\n"
        f"{USERNS_KEY} = 0\n"
    )


def managed_files(node: Node, mtu: int) -> list[ManagedFile]:
    files = [
        ManagedFile("memlock-limits", LIMITS_PATH, render_limits_conf()),
        ManagedFile("systemd-memlock", SYSTEMD_MEMLOCK_PATH, render_systemd_memlock(), action="systemd"),
        ManagedFile("netplan", NETPLAN_PATH, render_netplan(node, mtu), mode="0600", action="netplan"),
        ManagedFile("logrotate", LOGROTATE_PATH, render_logrotate()),
    ]
    if node.role == "head":
        files.append(
            ManagedFile("userns-sysctl", USERNS_SYSCTL_PATH, render_userns_sysctl(), action="sysctl",
                        sysctl_default=USERNS_UBUNTU_DEFAULT)
        )
    return files


class HostPrep(pulumi.ComponentResource):
    """Memlock limits, netplan rails, log rotation and sysctl on one node."""

    def __init__(self, name: str, args: HostPrepArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:host_prep:HostPrep", name, None, opts)
        files = managed_files(args.node, args.mtu)
        self.commands = managed_file_commands(args.node.name, "hostprep", args.connection, files, parent=self)
        # FabricCheck re-runs whenever what HostPrep puts on a node changes.
        self.content_hash = files_hash(files)
        self.register_outputs({"contentHash": self.content_hash})
