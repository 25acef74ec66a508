"""The doctor's judgement (issue 40): a cluster's fingerprint against the one its recipe was measured
on, and the likely causes of a gap, ranked by what each has cost owners where it was measured, each
with its evidence and its fix. Pure: the facts come from the nodes (the doctor's probe) and the
recipe's `baseline.fingerprint`; nothing here reaches a node.

A fact the baseline does not record is `None` there ("unknown"): a difference from it is not
judged, and the report says the baseline does not know it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class Cause:
    """A known reason a pair runs slower than its recipe: what it costs where it was measured."""

    title: str
    cost: float  # the share of throughput it cost where measured (0.40: 40 %); ranks the findings
    measured: str  # where and how much, in words
    fix: str


# The field's figures (docs/gotchas.md, issue 40's sources): what each difference has cost.
CAUSES: dict[str, Cause] = {
    "nccl_busbw": Cause(
        "NCCL's all_reduce runs far below the recipe's bus bandwidth", 0.85,
        "a development NCCL build: 3 vs 23.7 GB/s busbw; NCCL on TCP: ~2 GB/s (seed §1), decode collapses",
        "check that NCCL runs on the RoCE rails (NCCL_IB_HCA, the log's `NET/IB`), the image's NCCL release build, "
        "then `pulumi up --replace` the NCCL check to measure again"),
    "pcie_link": Cause(
        "a ConnectX-7 trains its PCIe link below its capability", 0.80,
        "a throttled ConnectX-7 at ~13 Gb/s instead of ~109 Gb/s per rail (owners' reports)",
        "reseat the QSFP cable with both boxes off (plug it in before power-on), update the firmware, check "
        "`lspci -vv` LnkSta against LnkCap"),
    "roce_active_mtu": Cause(
        "a rail's RoCE active MTU is below the recipe's", 0.40,
        "RoCE active_mtu 1024 instead of 4096: prefill -40% (owners' reports)",
        "set the netdev MTU to 9000 on both ends (fabric.mtu) so RoCE negotiates 4096; `ibv_devinfo` shows active_mtu"),
    "drafter": Cause(
        "the drafter (speculative model) differs from the recipe's bytes", 0.36,
        "a drafter with different bytes: 28-31 vs 46.9 tok/s single stream (owners' reports)",
        "serve the drafter the recipe names at its revision (`twinspark verify-weights` shows the hashes)"),
    "rail_mtu": Cause(
        "a rail's MTU is below the recipe's", 0.40,
        "MTU 1500 makes RoCE negotiate 1024: prefill -40% (owners' reports, seed §1: 1024 -> 4096 at 9000)",
        "fabric.mtu: 9000 and `pulumi up` (the fabric check measures it end to end)"),
    "gpu_clock_cap": Cause(
        "the GPU's clock is capped below its maximum", 0.15,
        "decode scales with the SM clock: a cap costs its share of the maximum",
        "remove the cap: `sudo nvidia-smi -rgc` (and whatever sets it at boot)"),
    "cstates": Cause(
        "CPU idle states (C-states) are on where the recipe had them off", 0.06,
        "+5 to +6.6 % tok/s with C-states off (owners' reports)",
        "disable deep C-states (cpuidle's `disable` files, or the kernel's `processor.max_cstate=1`)"),
    "model": Cause(
        "the model's weights differ from the recipe's", 0.05,
        "other weights, other figures: the recipe's figures hold for its revision only",
        "serve the recipe's revision (model.revision), or judge against a baseline of your own (`twinspark bench -o`)"),
    "software": Cause(
        "the software differs from the recipe's (driver, kernel, NCCL, image)", 0.02,
        "each difference's cost is unmeasured: they rank below every measured cause",
        "move to the recipe's versions where they differ (README Prerequisites; serving.image)"),
    "power_mode": Cause(
        "the platform or the CPUs run in a power-saving mode", 0.03,
        "unmeasured on a Spark: a power-saving profile or governor holds the clocks down; it ranks just above "
        "the unmeasured software differences",
        "`echo performance | sudo tee /sys/firmware/acpi/platform_profile` (or balanced), and the CPU governor "
        "`schedutil` or `performance` (cpupower frequency-set -g)"),
    "memory_pressure": Cause(
        "swap is on or earlyoom is off: memory pressure is not stopped before it reaches the engine", 0.01,
        "stability, not speed: a swapping node stalls the whole TP group (gotcha 13)",
        "`pulumi up` sets both (host prep); something changed them after"),
}

SOFTWARE_FACTS = ("driver", "kernel", "nccl", "nccl_image", "image_digest", "bios", "hca_firmware")
# ACPI platform profiles that trade speed for power (the kernel's sysfs-platform_profile)
POWER_SAVING_PROFILES = ("low-power", "quiet", "cool")
# cpufreq drivers whose `powersave` governor still scales with load (their own P-state logic)
DYNAMIC_POWERSAVE_DRIVERS = ("intel_pstate", "amd-pstate", "amd-pstate-epp")


@dataclass(frozen=True)
class Fingerprint:
    """What a node (or the recipe's baseline) was measured on; None: not known."""

    driver: Optional[str] = None
    kernel: Optional[str] = None
    nccl: Optional[str] = None  # the host's package
    nccl_image: Optional[str] = None  # the NCCL the serving processes loaded (the recipe's one `nccl`)
    image_digest: Optional[str] = None
    bios: Optional[str] = None  # the board's BIOS version
    hca_firmware: Optional[str] = None  # the ConnectX firmware versions of the rails' HCAs
    gid_index: Optional[int] = None  # NCCL_IB_GID_INDEX the last serving start resolved (a fact, not judged)
    model_sha256: Optional[str] = None  # the pinned weights' manifest
    drafter_sha256: Optional[str] = None
    gpu_clock_mhz: Optional[float] = None  # the SM clock cap in force
    gpu_clock_max_mhz: Optional[float] = None  # what the GPU can run at
    cstates_enabled: Optional[bool] = None
    rail_mtu: Mapping[str, int] = field(default_factory=dict)  # rail iface -> netdev MTU
    roce_active_mtu: Mapping[str, int] = field(default_factory=dict)  # rail iface -> RoCE active MTU
    pcie: Mapping[str, tuple[float, int, float, int]] = field(default_factory=dict)  # hca -> (GT/s, width, max GT/s, max width)
    nccl_busbw_gbps: Optional[float] = None
    swap_enabled: Optional[bool] = None
    earlyoom_active: Optional[bool] = None
    platform_profile: Optional[str] = None  # ACPI's (performance, balanced, low-power, ...)
    cpu_governor: Optional[str] = None
    cpufreq_driver: Optional[str] = None
    page_cache_gib: Optional[float] = None  # a fact shown, not judged (it is reclaimed when the engine asks)


@dataclass(frozen=True)
class Finding:
    key: str  # a CAUSES key
    node: str
    evidence: str

    @property
    def cause(self) -> Cause:
        return CAUSES[self.key]


def _below(observed: Mapping[str, int], expected: Optional[int]) -> list[str]:
    return [f"{rail} {value}" for rail, value in sorted(observed.items()) if expected is not None and value < expected]


def node_findings(node: str, seen: Fingerprint, baseline: Fingerprint, expected_mtu: Optional[int],
                  expected_roce_mtu: Optional[int], head: Optional[str] = None,
                  from_head: frozenset[str] = frozenset()) -> list[Finding]:
    """One node's differences that explain a slower pair; a fact either side does not know is not judged.
    `from_head`: the facts of `baseline` that are the head's (`head`), the recipe recording none."""
    found: list[Finding] = []

    def add(key: str, evidence: str) -> None:
        found.append(Finding(key, node, evidence))

    def whose(name: str) -> str:
        return f"the head {head}'s (the recipe records none)" if name in from_head else "the recipe's"

    if seen.nccl_busbw_gbps is not None and baseline.nccl_busbw_gbps and seen.nccl_busbw_gbps < 0.5 * baseline.nccl_busbw_gbps:
        add("nccl_busbw", f"busbw {seen.nccl_busbw_gbps:g} GB/s, the recipe's {baseline.nccl_busbw_gbps:g} GB/s")
    for hca, (speed, width, max_speed, max_width) in sorted(seen.pcie.items()):
        if speed < max_speed or width < max_width:
            add("pcie_link", f"{hca}: {speed:g} GT/s x{width}, capable of {max_speed:g} GT/s x{max_width}")
    low_roce = _below(seen.roce_active_mtu, expected_roce_mtu)
    if low_roce:
        add("roce_active_mtu", f"RoCE active MTU {', '.join(low_roce)}; the recipe's {expected_roce_mtu}")
    low_mtu = _below(seen.rail_mtu, expected_mtu)
    if low_mtu:
        add("rail_mtu", f"MTU {', '.join(low_mtu)}; the recipe's {expected_mtu}")
    if baseline.drafter_sha256 and seen.drafter_sha256 and seen.drafter_sha256 != baseline.drafter_sha256:
        add("drafter", f"drafter sha256 {seen.drafter_sha256[:12]}, {whose('drafter_sha256')} {baseline.drafter_sha256[:12]}")
    if seen.gpu_clock_mhz is not None and seen.gpu_clock_max_mhz and seen.gpu_clock_mhz < 0.97 * seen.gpu_clock_max_mhz:
        add("gpu_clock_cap", f"SM clock capped at {seen.gpu_clock_mhz:g} MHz of {seen.gpu_clock_max_mhz:g} MHz")
    if baseline.cstates_enabled is False and seen.cstates_enabled:
        add("cstates", "deep C-states enabled; the recipe ran with them off")
    if baseline.model_sha256 and seen.model_sha256 and seen.model_sha256 != baseline.model_sha256:
        add("model", f"weights manifest {seen.model_sha256[:12]}, {whose('model_sha256')} {baseline.model_sha256[:12]}")
    differing = [f"{name} {getattr(seen, name)} ({whose(name)} {getattr(baseline, name)})" for name in SOFTWARE_FACTS
                 if getattr(baseline, name) and getattr(seen, name) and getattr(seen, name) != getattr(baseline, name)]
    if differing:
        add("software", "; ".join(differing))
    saving = [f"platform profile {seen.platform_profile}"] if seen.platform_profile in POWER_SAVING_PROFILES else []
    if seen.cpu_governor == "powersave" and seen.cpufreq_driver not in DYNAMIC_POWERSAVE_DRIVERS:
        saving.append(f"CPU governor powersave ({seen.cpufreq_driver or 'unknown driver'})")
    if saving:
        add("power_mode", ", ".join(saving))
    if seen.swap_enabled or seen.earlyoom_active is False:
        add("memory_pressure", ", ".join(part for part, on in (("swap on", seen.swap_enabled),
                                                                ("earlyoom off", seen.earlyoom_active is False)) if on))
    return found


CROSS_NODE_FACTS = ("model_sha256", "drafter_sha256", *SOFTWARE_FACTS)


def with_head_for_unknown(baseline: Fingerprint, head: Fingerprint) -> Fingerprint:
    """The baseline, its unknown hashes and versions taken from the head: where the recipe does not
    record one, the nodes must at least agree with each other (TP ranks on different bytes disagree)."""
    return replace(baseline, **{name: getattr(head, name) for name in CROSS_NODE_FACTS if getattr(baseline, name) is None})


def diagnose(nodes: Mapping[str, Fingerprint], baseline: Fingerprint, head: str, expected_mtu: Optional[int] = None,
             expected_roce_mtu: Optional[int] = None) -> list[Finding]:
    """Every node's findings, the costliest cause first (then by node, for a stable report). `head`: the
    node whose hashes and versions the others must match where the baseline records none."""
    reference = with_head_for_unknown(baseline, nodes[head])
    from_head = frozenset(name for name in CROSS_NODE_FACTS if getattr(baseline, name) is None)
    found = [f for node, seen in sorted(nodes.items())
             for f in (node_findings(node, seen, baseline, expected_mtu, expected_roce_mtu) if node == head else
                       node_findings(node, seen, reference, expected_mtu, expected_roce_mtu, head, from_head))]
    return sorted(found, key=lambda f: (-f.cause.cost, f.node, f.key))


def unknown_in_baseline(baseline: Fingerprint) -> list[str]:
    """The facts the recipe's baseline does not record: differences there go unjudged."""
    empty: tuple[Any, ...] = (None, {}, ())
    return [name for name in Fingerprint.__dataclass_fields__ if getattr(baseline, name) in empty]
