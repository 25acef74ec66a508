"""A node's memory budget: the shares of MemTotal that the model, the co-tenants and everything
else may hold, such that they add up. The one place for these numbers: the stack config refuses a
budget over 100%, HostPrep writes the co-tenant caps into the slices' drop-ins, and the memory
check before load reads the same numbers from twinspark.env (rendered from `env_entries`).

    model (gpuMemoryUtilization) + KV tier (serving.kvTier.memoryGiB) + each co-tenant slice's cap
        + headroom <= 100% of MemTotal

The memory check then waits for the model's share and the KV tier's bytes only: co-tenants inside their caps and the
rest inside the headroom leave at least that much available, so whatever holds more is named
as the cause (launch/memory-check.py).

A leaf module: no Pulumi, nothing of the project but the on-node contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from core.contract import CONTAINER_SLICE, COTENANT_SLICES
from core.kv_tier import GIB
from core.kv_tier import memory_share as kv_tier_share

# What no budgeted part accounts for: the kernel (page tables, slab), systemd and the serving
# containers' own processes beside the model's share (Ray's raylet and GCS, each rank's Python,
# torch.compile's workers). An estimate (~6 GiB of a Spark's 121 GiB), not measured on a Spark.
HEADROOM_PERCENT = 5
# `auto` caps no slice tighter: below ~3.6 GiB, dockerd, journald and the monitoring containers
# (system.slice) or a desktop session (user.slice) would be OOM-killed in ordinary use.
MIN_AUTO_COTENANT_PERCENT = 3

BASIS = 10_000  # the arithmetic in basis points: 0.85 + 0.05 + 0.10 is not 1.0 in floats


@dataclass(frozen=True)
class MemoryBudget:
    model_share: float  # gpuMemoryUtilization: what vLLM takes of MemTotal
    cotenant_percent: Optional[int]  # MemoryMax of each of COTENANT_SLICES; None: uncapped
    headroom_percent: int = HEADROOM_PERCENT
    kv_tier_gib: int = 0  # serving.kvTier.memoryGiB of the node's lanes: their CPU tiers (/dev/shm)

    @property
    def caps(self) -> dict[str, Optional[int]]:
        return {name: self.cotenant_percent for name in COTENANT_SLICES}

    @property
    def total_percent(self) -> float:
        return (_bp(self.model_share) + _bp(kv_tier_share(self.kv_tier_gib)) +
                100 * (self.headroom_percent + sum(filter(None, self.caps.values())))) / 100

    def env_entries(self) -> list[tuple[str, str]]:
        """twinspark.env: what the memory check before load reads."""
        return [("TWINSPARK_GPU_MEMORY_UTILIZATION", f"{self.model_share:g}"),
                *([("TWINSPARK_KV_TIER_MEMORY_BYTES", str(self.kv_tier_gib * GIB))] if self.kv_tier_gib else []),
                ("TWINSPARK_COTENANT_SLICES", ",".join(COTENANT_SLICES)),
                ("TWINSPARK_COTENANT_MEMORY_PERCENT", "" if self.cotenant_percent is None else str(self.cotenant_percent)),
                ("TWINSPARK_MEMORY_HEADROOM_PERCENT", str(self.headroom_percent)),
                ("TWINSPARK_CONTAINER_SLICE", CONTAINER_SLICE)]


class BudgetError(ValueError):
    pass


def _bp(share: float) -> int:
    return round(share * BASIS)


def memory_budget(utilization: float, cotenant_memory_max: str, kv_tier_gib: int = 0) -> MemoryBudget:
    """The budget of `serving.gpuMemoryUtilization`, `serving.cotenantMemoryMax` ('auto', 'off' or 'N%':
    each co-tenant slice's cap) and the KV tiers' memoryGiB; BudgetError when it cannot add up."""
    tier = _bp(kv_tier_share(kv_tier_gib))
    model, headroom, slices = _bp(utilization), HEADROOM_PERCENT * 100, len(COTENANT_SLICES)
    left = BASIS - model - tier - headroom  # basis points for the co-tenant caps
    parts = f"gpuMemoryUtilization {utilization:g} ({model / 100:g}%) + {HEADROOM_PERCENT}% headroom"
    if kv_tier_gib:
        parts += f" + kvTier.memoryGiB {kv_tier_gib} ({tier / 100:g}% of a Spark's memory)"
    if left < 0:
        raise BudgetError(f"{parts} is over 100% of the node's memory")
    if cotenant_memory_max == "off":
        return MemoryBudget(utilization, None, kv_tier_gib=kv_tier_gib)
    names = " and ".join(COTENANT_SLICES)
    if cotenant_memory_max == "auto":
        percent = left // slices // 100
        if percent < MIN_AUTO_COTENANT_PERCENT:
            most = (BASIS - tier - headroom - slices * MIN_AUTO_COTENANT_PERCENT * 100) / BASIS
            raise BudgetError(
                f"{parts} leaves {left / 100:g}% for {names}: less than {MIN_AUTO_COTENANT_PERCENT}% each, too little "
                f"to cap them at; lower gpuMemoryUtilization to {most:g} or set cotenantMemoryMax to "
                f"{_fitting(left // slices // 100)}")
        return MemoryBudget(utilization, percent, kv_tier_gib=kv_tier_gib)
    percent = int(cotenant_memory_max.rstrip("%"))
    if slices * percent * 100 > left:
        raise BudgetError(
            f"{parts} + {slices} x {percent}% ({names}) = {(model + tier + headroom + slices * percent * 100) / 100:g}% of "
            f"the node's memory, over 100%: with this gpuMemoryUtilization set cotenantMemoryMax to "
            f"{_fitting(left // slices // 100)}")
    return MemoryBudget(utilization, percent, kv_tier_gib=kv_tier_gib)


def _fitting(most_percent: int) -> str:
    off = "'off' (co-tenants uncapped)"
    return f"at most {most_percent}% or {off}" if most_percent >= 1 else off
