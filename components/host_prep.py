"""HostPrep: the per-node OS settings the recipe needs before RDMA and the model work.

Creates, per node, one idempotent remote command per managed file:
- /etc/security/limits.d/99-rdma.conf        memlock unlimited, soft and hard (gotcha 1)
- /etc/systemd/system.conf.d/99-twinspark-memlock.conf  DefaultLimitMEMLOCK=infinity, re-exec'd
- /etc/netplan/99-qsfp.yaml (mode 600)       the rails only; applied outside the SSH session
- /etc/sysctl.d/99-twinspark-userns.conf     head only: unprivileged userns for codex's sandbox
Deleting the component removes each file and reverts its effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import yaml
from pulumi_command import remote

from .config import Fabric, Node, StackConfig
from .remote import connection, install_file_command, remove_file_command, sha256_text

LIMITS_PATH = "/etc/security/limits.d/99-rdma.conf"
SYSTEMD_MEMLOCK_PATH = "/etc/systemd/system.conf.d/99-twinspark-memlock.conf"
NETPLAN_PATH = "/etc/netplan/99-qsfp.yaml"
USERNS_SYSCTL_PATH = "/etc/sysctl.d/99-twinspark-userns.conf"
USERNS_KEY = "kernel.apparmor_restrict_unprivileged_userns"

# `netplan apply` runs as its own systemd unit: if it bounces links, the apply still
# completes even when our SSH session is the one that drops.
NETPLAN_APPLY = (
    "sudo -n netplan generate && "
    "sudo -n systemd-run --quiet --collect --wait --service-type=oneshot "
    "--unit=twinspark-netplan-apply netplan apply"
)


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


def render_netplan(node: Node, fabric: Fabric) -> str:
    """Only the QSFP rails: static addresses, jumbo MTU, no DHCP, optional (boot never waits)."""
    ethernets = {
        rail.iface: {
            "addresses": [rail.address],
            "mtu": fabric.mtu,
            "dhcp4": False,
            "dhcp6": False,
            "optional": True,
        }
        for rail in node.rails
    }
    body = yaml.safe_dump({"network": {"version": 2, "ethernets": ethernets}}, sort_keys=False)
    return f"# twinspark: QSFP rails of {node.name} (managed; edit the stack config instead)\n{body}"


def render_userns_sysctl() -> str:
    return (
        "# twinspark: codex's bubblewrap sandbox needs unprivileged user namespaces (Ubuntu 24.04)\n"
        f"{USERNS_KEY} = 0\n"
    )


@dataclass(frozen=True)
class ManagedFile:
    step: str
    path: str
    content: str
    mode: str = "0644"
    apply: Optional[str] = None
    revert: Optional[str] = None


def managed_files(cfg: StackConfig, node: Node) -> list[ManagedFile]:
    files = [
        ManagedFile("memlock-limits", LIMITS_PATH, render_limits_conf()),
        ManagedFile(
            "systemd-memlock",
            SYSTEMD_MEMLOCK_PATH,
            render_systemd_memlock(),
            apply="sudo -n systemctl daemon-reexec",
            revert="sudo -n systemctl daemon-reexec",
        ),
        ManagedFile(
            "netplan",
            NETPLAN_PATH,
            render_netplan(node, cfg.fabric),
            mode="0600",
            apply=NETPLAN_APPLY,
            revert=NETPLAN_APPLY,
        ),
    ]
    if node.role == "head":
        files.append(
            ManagedFile(
                "userns-sysctl",
                USERNS_SYSCTL_PATH,
                render_userns_sysctl(),
                apply=f"sudo -n sysctl -q -p {USERNS_SYSCTL_PATH}",
                revert=f"sudo -n sysctl -q -w {USERNS_KEY}=1",  # Ubuntu 24.04's default
            )
        )
    return files


class HostPrep(pulumi.ComponentResource):
    """Memlock limits, netplan rails and sysctl on one node."""

    def __init__(self, name: str, cfg: StackConfig, node: Node, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:host_prep:HostPrep", name, None, opts)
        conn = connection(cfg.ssh, node)
        self.files = managed_files(cfg, node)
        self.commands = [
            remote.Command(
                f"{name}-{f.step}",
                connection=conn,
                create=install_file_command(node.name, f"hostprep/{f.step}", f.path, f.mode, f.apply),
                delete=remove_file_command(node.name, f"hostprep/{f.step}", f.path, f.revert),
                stdin=f.content,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for f in self.files
        ]
        # FabricCheck re-runs whenever what HostPrep puts on a node changes.
        self.content_hash = sha256_text(*(f.path + f.content for f in self.files))
        self.register_outputs({"contentHash": self.content_hash})
