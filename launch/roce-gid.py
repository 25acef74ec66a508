#!/usr/bin/env python3
"""roce-gid.py — the RoCE v2 GID index over IPv4 of this node's HCAs, for NCCL_IB_GID_INDEX (stdlib only).

    roce-gid.py --hca rocep1s0f0,roceP2p1s0f0 [--sys-root /sys]

Run by boot-common.sh in each serving container before Ray or vLLM start. Each HCA's port 1 has
a GID table (/sys/class/infiniband/HCA/ports/1/gids/N, its type in gid_attrs/types/N, its
interface in gid_attrs/ndevs/N): RoCE v1 and v2 entries for the link-local IPv6 address and for
each IPv4 address of the port's interface (::ffff:a.b.c.d). NCCL must use RoCE v2 over the rail's
IPv4 address; which index that is depends on the addresses the port holds when the table is read
(usually 3 on a ConnectX-7 with one IPv4 address), so it is read at every start, never pinned.

Prints the index when every HCA has one and they agree (NCCL_IB_GID_INDEX is one value for all
HCAs); otherwise prints nothing and says why on stderr, and NCCL picks by itself. Exit 0 either way:
a GID table that cannot be read must not keep serving from starting (the fabric check and the
guard's NCCL check say whether NCCL reached IB).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ipv4_of(gid: str) -> Optional[str]:
    """'0000:...:ffff:0a00:0001' -> '10.0.0.1'; None for any other GID."""
    if not gid.startswith(IPV4_MAPPED):
        return None
    high, low = gid[len(IPV4_MAPPED):].split(":")
    return ".".join(str(b) for b in bytes.fromhex(high + low))


def roce_v2_ipv4(hca: str, sys_root: Path) -> tuple[Optional[int], str]:
    """(index, what it is) of the HCA's first RoCE v2 GID over an IPv4 address; (None, why) when none."""
    port = sys_root / "class/infiniband" / hca / "ports/1"
    gids = port / "gids"
    if not gids.is_dir():
        return None, f"{hca}: no GID table ({gids} unreadable)"
    for entry in sorted(gids.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        if not entry.name.isdigit():
            continue
        address = ipv4_of(_read(entry))
        kind = _read(port / "gid_attrs/types" / entry.name)
        if address and kind.lower() == "roce v2":
            netdev = _read(port / "gid_attrs/ndevs" / entry.name)
            return int(entry.name), f"{hca}: GID {entry.name} is RoCE v2 over {address}" + (f" ({netdev})" if netdev else "")
    return None, f"{hca}: no RoCE v2 GID over an IPv4 address (is the rail's address on its interface?)"


def resolve(hcas: list[str], sys_root: Path) -> tuple[Optional[int], list[str]]:
    found = [roce_v2_ipv4(hca, sys_root) for hca in hcas]
    said = [what for _, what in found]
    indexes = {index for index, _ in found}
    if None in indexes or not indexes:
        return None, said + ["NCCL_IB_GID_INDEX left unset: NCCL picks the GID itself"]
    if len(indexes) > 1:
        return None, said + ["the HCAs' indexes differ and NCCL_IB_GID_INDEX is one for all: left unset, NCCL picks"]
    return indexes.pop(), said


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hca", required=True, help="NCCL_IB_HCA: the HCAs, comma-separated")
    parser.add_argument("--sys-root", default="/sys")
    args = parser.parse_args(argv)
    if args.hca.startswith("^"):
        print(f"NCCL_IB_HCA {args.hca} excludes HCAs rather than naming them: NCCL_IB_GID_INDEX left to NCCL",
              file=sys.stderr)
        return 0
    # NCCL_IB_HCA's forms: name, name:port, =name (exact match)
    hcas = [h.lstrip("=").split(":")[0] for h in args.hca.split(",") if h]
    index, said = resolve(hcas, Path(args.sys_root))
    for line in said:
        print(line, file=sys.stderr)
    if index is not None:
        print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
