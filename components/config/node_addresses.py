"""The nodes' IPv4 addresses, resolved on the operator's machine when `pulumi up` runs: the host
firewall admits the other nodes by address.
"""

from __future__ import annotations

import ipaddress
import socket

from .blocks import Node
from .errors import NAMESPACE, config_error


def _ipv4_addresses(host: str) -> list[str]:
    # AF_INET: each sockaddr is (address, port)
    return [str(info[4][0]) for info in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)]


def resolve_node_addresses(nodes: list[Node], resolve=_ipv4_addresses) -> dict[str, tuple[str, ...]]:
    """Every node's IPv4 addresses, by name: its `host`, a name resolved here and now.

    The host firewall admits the other nodes by address and loads at boot, before the network,
    where no name resolves: a table holding a name would not load at all (no firewall). So the
    firewall gets addresses, resolved when `pulumi up` runs. Names stay allowed: Spark owners
    reach their nodes as spark-1.local, and `pulumi up` must resolve them for SSH anyway. A
    name that does not resolve here, resolves to loopback, or shares an address with another
    node stops the program before any resource; a node whose address changes needs a
    `pulumi up` (until then the firewall drops its LAN traffic, it does not open).
    """
    problems, found = [], {}
    owner: dict[str, int] = {}  # address: the first node it belongs to
    for i, node in enumerate(nodes):
        key = f"{NAMESPACE}:nodes[{i}].host"
        loopback = []
        try:
            addresses = [str(ipaddress.IPv4Address(node.host))]  # an address (HostName: one spelling)
        except ValueError:
            try:
                addresses = sorted(set(resolve(node.host)), key=ipaddress.IPv4Address)
            except OSError as err:  # socket.gaierror
                problems.append(f"{key}: {node.host!r} does not resolve on this machine ({err.strerror or err}) — "
                                "expected a name this machine resolves to the node's LAN address, or the address "
                                "itself (the host firewall admits the nodes by the addresses their names have when "
                                "`pulumi up` runs)")
                continue
            loopback = [a for a in addresses if ipaddress.IPv4Address(a).is_loopback]
        shared = next((a for a in addresses if a in owner), None)
        if loopback or not addresses:
            problems.append(f"{key}: {node.host!r} resolves to {', '.join(loopback) or 'no IPv4 address'} on this "
                            "machine — expected a name that resolves to the node's LAN address (this machine's "
                            "/etc/hosts may map its own name to loopback), or the address itself")
        elif shared:
            j = owner[shared]
            problems.append(f"{key}: {node.host!r} resolves to {shared}, as nodes[{j}].host {nodes[j].host!r} does — "
                            "expected a machine of its own for each node")
        owner.update((a, i) for a in addresses)
        found[node.name] = tuple(addresses)
    if problems:
        raise config_error(problems)
    return found
