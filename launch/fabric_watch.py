"""fabric_watch.py — the serving guard's look at the fabric while it serves (stdlib only).

Imported by serving-guard.py (installed beside it, root-owned). Each look reads, for every rail
of this node: the link (operstate, speed, MTU: /sys/class/net), the RoCE port (ibv_devinfo, as
launch/fabric-check.sh reads it), the port's error counters (/sys/class/infiniband/<hca>/ports/1/
counters and hw_counters, the node exporter's infiniband collector's files), the HCA's PCIe link
against the card's own capability (current_link_width/speed against max_link_width/speed of the
HCA's PCI device: a ConnectX-7 in a slot or a state that trains it narrower moves ~13 Gb/s where
200 was cabled) and its AER counters (aer_dev_correctable/nonfatal/fatal); and which network NCCL
chose in vLLM's last start (NCCL_DEBUG=INFO with the INIT,NET subsystems, to NCCL_DEBUG_FILE
under the log folder: "Using network IB" or "Using network Socket").

`act_on` says which findings stop serving (the guard drains, re-qualifies, restarts or holds):
a rail down, its RoCE port not ACTIVE, a link or PCIe link below its speed, NCCL on Socket. The
rest (an MTU, rising error counters, AER events) are metrics the alert rules read.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# what the infiniband collector reads too (node_exporter collector/infiniband_linux.go); any
# increase is a damaged cable, port or transceiver
PORT_ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors", "port_xmit_discards",
                       "local_link_integrity_errors", "excessive_buffer_overrun_errors", "link_error_recovery",
                       "link_downed")
HW_ERROR_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "implied_nak_seq_err")
AER_KINDS = ("correctable", "nonfatal", "fatal")
NCCL_NETWORK = re.compile(r"NCCL INFO Using network (\w+)")


@dataclass(frozen=True)
class Rail:
    iface: str
    hca: str
    speed_mbps: int  # what the cable is rated for (fabric.linkSpeedMbps)
    mtu: int


@dataclass
class RailReading:
    rail: Rail
    operstate: str = "absent"
    speed_mbps: Optional[int] = None
    mtu: Optional[int] = None
    roce_state: Optional[str] = None  # PORT_ACTIVE, PORT_DOWN, ...; None: not inspectable
    roce_active_mtu: Optional[int] = None
    errors: Optional[int] = None  # the sum of the port's error counters; None: none readable
    pcie: dict = field(default_factory=dict)  # width, max_width, speed_gts, max_speed_gts (what is readable)
    aer: dict = field(default_factory=dict)  # correctable, nonfatal, fatal: the device's totals


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _gts(text: Optional[str]) -> Optional[float]:
    """'32.0 GT/s PCIe' -> 32.0 (sysfs's current_link_speed and max_link_speed)."""
    match = re.match(r"([\d.]+)\s*GT/s", text or "")
    return float(match[1]) if match else None


def roce_port(hca: str) -> tuple[Optional[str], Optional[int]]:
    """ibv_devinfo's state and active_mtu of the HCA's port 1 (None, None: not inspectable)."""
    try:
        info = subprocess.run(["ibv_devinfo", "-d", hca, "-i", "1"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    if info.returncode != 0:
        return "absent", None
    state = re.search(r"^\s*state:\s*(\S+)", info.stdout, re.M)
    active_mtu = re.search(r"^\s*active_mtu:\s*(\d+)", info.stdout, re.M)
    return (state[1] if state else None), (int(active_mtu[1]) if active_mtu else None)


def read_rail(rail: Rail, sys_root: Path = Path("/sys")) -> RailReading:
    reading = RailReading(rail)
    net = sys_root / "class/net" / rail.iface
    if not net.is_dir():
        return reading
    reading.operstate = _read(net / "operstate") or "unknown"
    reading.speed_mbps = _int(_read(net / "speed"))
    reading.mtu = _int(_read(net / "mtu"))
    reading.roce_state, reading.roce_active_mtu = roce_port(rail.hca)
    port = sys_root / "class/infiniband" / rail.hca / "ports/1"
    counts = [_int(_read(port / "counters" / c)) for c in PORT_ERROR_COUNTERS]
    counts += [_int(_read(port / "hw_counters" / c)) for c in HW_ERROR_COUNTERS]
    known = [c for c in counts if c is not None]
    reading.errors = sum(known) if known else None
    device = sys_root / "class/infiniband" / rail.hca / "device"
    if not device.is_dir():
        device = net / "device"
    pcie = {"width": _int(_read(device / "current_link_width")), "max_width": _int(_read(device / "max_link_width")),
            "speed_gts": _gts(_read(device / "current_link_speed")), "max_speed_gts": _gts(_read(device / "max_link_speed"))}
    reading.pcie = {k: v for k, v in pcie.items() if v is not None}
    for kind in AER_KINDS:
        total = re.search(r"^TOTAL_ERR_\w+\s+(\d+)", _read(device / f"aer_dev_{kind}") or "", re.M)
        if total:
            reading.aer[kind] = int(total[1])
    return reading


def rails_of_fabric_check(flags: list[str]) -> list[Rail]:
    """The rails of a fabric-check.sh command line (--mtu M --speed-mbps S --rail IFACE:HCA:PEERS ...):
    a worker's plan says its rails that way (launch/requalify.py `look`)."""
    value = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i] in ("--mtu", "--speed-mbps")}
    specs = [flags[i + 1] for i in range(len(flags) - 1) if flags[i] == "--rail"]
    return [Rail(spec.split(":")[0], spec.split(":")[1], int(value["--speed-mbps"]), int(value["--mtu"]))
            for spec in specs]


def reading_record(reading: RailReading) -> dict:
    """A reading as JSON (a worker's `look`, read on the head), its rail with it."""
    return {**{k: v for k, v in vars(reading).items() if k != "rail"}, "rail": vars(reading.rail)}


def reading_of(record: dict) -> RailReading:
    fields = {k: v for k, v in record.items() if k in RailReading.__dataclass_fields__ and k != "rail"}
    return RailReading(Rail(**record["rail"]), **fields)


# ---- what a reading says -------------------------------------------------------------------
DOWN = "down"  # link or RoCE port not up: NCCL loses the rail
THROTTLED = "throttled"  # link or PCIe below what the card and the cable can do
MTU = "mtu"
ERRORS = "errors"
AER = "aer"
ACTED_ON = (DOWN, THROTTLED)
UNCLEAN_BOOT = "unclean-boot"  # a node held out of serving since its unclean boot (launch/node-recorder.py)
# findings acted on at their first look: NCCL's choice is made once a start, a boot's hold waits for nobody else
AT_ONCE = ("nccl", "boot")


@dataclass(frozen=True)
class Finding:
    kind: str
    rail: str  # the interface, or "nccl"
    message: str


def judge(reading: RailReading, before: Optional[RailReading] = None) -> list[Finding]:
    """The findings of one rail's reading; `before` (the previous look) for the counters."""
    rail, iface = reading.rail, reading.rail.iface
    found: list[Finding] = []
    if reading.operstate != "up":
        found.append(Finding(DOWN, iface, f"rail {iface}: link {reading.operstate}, expected up"))
    elif reading.roce_state not in (None, "PORT_ACTIVE"):
        found.append(Finding(DOWN, iface, f"rail {iface}: RoCE {rail.hca} {reading.roce_state}, expected PORT_ACTIVE"))
    if reading.operstate == "up" and reading.speed_mbps is not None and reading.speed_mbps < rail.speed_mbps:
        found.append(Finding(THROTTLED, iface, f"rail {iface}: link at {reading.speed_mbps} Mb/s, "
                                               f"expected {rail.speed_mbps} Mb/s"))
    pcie = reading.pcie
    if pcie.get("width") and pcie.get("max_width") and pcie["width"] < pcie["max_width"]:
        found.append(Finding(THROTTLED, iface, f"rail {iface}: {rail.hca}'s PCIe link x{pcie['width']}, the card "
                                               f"does x{pcie['max_width']} (reseat it; check the slot and BIOS)"))
    if pcie.get("speed_gts") and pcie.get("max_speed_gts") and pcie["speed_gts"] < pcie["max_speed_gts"]:
        found.append(Finding(THROTTLED, iface, f"rail {iface}: {rail.hca}'s PCIe link at {pcie['speed_gts']:g} GT/s, "
                                               f"the card does {pcie['max_speed_gts']:g} GT/s"))
    if reading.operstate == "up" and reading.mtu is not None and reading.mtu != rail.mtu:
        found.append(Finding(MTU, iface, f"rail {iface}: MTU {reading.mtu}, expected {rail.mtu}"))
    if before is not None and reading.errors is not None and before.errors is not None \
            and reading.errors > before.errors:
        found.append(Finding(ERRORS, iface, f"rail {iface}: {reading.errors - before.errors} new RoCE port errors"))
    for kind in AER_KINDS:
        if before is not None and reading.aer.get(kind, 0) > before.aer.get(kind, 0):
            found.append(Finding(AER, iface, f"rail {iface}: {reading.aer[kind] - before.aer.get(kind, 0)} new "
                                             f"{kind} PCIe AER events on {rail.hca}"))
    return found


def unclean_boot(hold: Optional[str]) -> Optional[str]:
    """The node recorder's hold after an unclean boot (its words), or None; one that cannot be read
    counts as held (the checks then run, and their pass removes it)."""
    try:
        return Path(hold).read_text().strip() if hold else None
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot read {hold}: {err.strerror}"


def act_on(findings: list[Finding]) -> list[Finding]:
    """The findings that stop serving: NCCL would run without the rail or at a fraction of it."""
    return [f for f in findings if f.kind in ACTED_ON or f.rail in AT_ONCE]


# ---- NCCL's choice in vLLM's last start ----------------------------------------------------
def nccl_network(debug_dir: Path, since: float) -> tuple[Optional[str], Optional[str]]:
    """(network, file) NCCL chose in the debug files written since `since` (the serving start):
    "Socket" when any process fell back to it, "IB" when every one chose IB, (None, None) when no
    process has said yet."""
    chosen: dict[str, str] = {}
    try:
        files = [p for p in debug_dir.iterdir() if p.is_file() and p.stat().st_mtime >= since]
    except OSError:
        return None, None
    for file in files:
        try:
            found = NCCL_NETWORK.findall(file.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            chosen[str(file)] = "Socket" if "Socket" in found else found[-1]
    for name, network in chosen.items():
        if network != "IB":
            return network, name
    return ("IB", next(iter(chosen))) if chosen else (None, None)


# ---- metrics for the node exporter's textfile collector -----------------------------------
def metrics(readings: list[RailReading], network: Optional[str], peer: Optional[str] = None) -> dict[str, float]:
    """twinspark_fabric_* series (name{labels} -> value): alerts.py's fabric rules read them. `peer`:
    a worker's readings (its look), labelled peer="<worker>", which Prometheus makes their `node`
    (components/observability_files/prometheus.py, PEER_LABEL)."""
    values: dict[str, float] = {}
    for r in readings:
        label = (f'peer="{peer}",' if peer else "") + f'rail="{r.rail.iface}",device="{r.rail.hca}"'
        for key, name in (("width", "pcie_link_width"), ("max_width", "pcie_link_max_width"),
                          ("speed_gts", "pcie_link_speed_gts"), ("max_speed_gts", "pcie_link_max_speed_gts")):
            if key in r.pcie:
                values[f"twinspark_fabric_{name}{{{label}}}"] = r.pcie[key]
        for kind, total in r.aer.items():
            values[f'twinspark_fabric_aer_errors_total{{{label},kind="{kind}"}}'] = total
    for choice in ("IB", "Socket"):
        if network is not None:
            values[f'twinspark_fabric_nccl_network{{network="{choice}"}}'] = int(network == choice)
    return values

