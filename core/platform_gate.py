"""The platform gate: what each node runs (its facts), and whether that platform may serve.

A leaf module (no Pulumi, nothing of the project): `pulumi up` (components/platform_facts.py)
and `python -m ops status` judge the same facts with the same rules.

- The facts of a node are what launch/platform-facts.py prints: DGX OS, kernel, driver,
  CUDA, GPU, BIOS, CMA, ConnectX firmware, and the serving image (its ID; vLLM, torch, NCCL,
  Ray in it).
- The nodes must agree on `MUST_MATCH`: another driver or kernel on one node is a different
  platform for NCCL and CUDA graphs; another image (or vLLM, torch, NCCL, Ray) is the classic
  TP hang.
- `known-issues.toml` lists platforms that are published to break, each with what breaks,
  the symptom, the fix and its source.

Whatever the gate finds refuses the deployment unless `platform.acknowledge` names it: a
known issue by its id, a difference by `mismatch:<fact>` — all but the build's
(`NEVER_ACKNOWLEDGED`), which nothing acknowledges.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Mapping, Optional, Sequence

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

KNOWN_ISSUES_FILE = Path(__file__).resolve().parents[1] / "known-issues.toml"

# Every fact a node reports (launch/platform-facts.py prints these keys), in display order.
FACTS: dict[str, str] = {
    "os": "DGX OS release (/etc/dgx-release), else the distribution (/etc/os-release)",
    "kernel": "uname -r",
    "driver": "NVIDIA driver (nvidia-smi, else /proc/driver/nvidia/version)",
    "cuda": "the CUDA version the driver supports (nvidia-smi)",
    "gpu": "GPU name (nvidia-smi)",
    "bios_version": "/sys/class/dmi/id/bios_version",
    "bios_date": "/sys/class/dmi/id/bios_date, as YYYY-MM-DD",
    "cma_total_kb": "CmaTotal in /proc/meminfo",
    "cma_free_kb": "CmaFree in /proc/meminfo",
    "image": "the serving image's ID on this node: one build for each engine (the cluster's, or a lane's), the same on its nodes",
    "image_base": "the pinned base image reference the serving image was checked to start with",
    "vllm": "vLLM in the serving image",
    "torch": "PyTorch in the serving image",
    "nccl": "the NCCL PyTorch loads in the serving image",
    "nccl_pip": "the nvidia-nccl wheel in the serving image, if any",
    "image_cuda": "the CUDA PyTorch was built with, in the serving image",
    "ray": "Ray in the serving image",
    "cx_firmware": "ConnectX firmware of each RDMA device, NAME=VERSION (/sys/class/infiniband/*/fw_ver)",
}
# What every node must agree on. The build cannot be acknowledged: a TP group on two builds
# (another image, or one whose vLLM, torch, NCCL or Ray reads differently) hangs in its first
# collective, or worse, computes on.
MUST_MATCH = ("driver", "kernel", "image", "vllm", "torch", "nccl", "ray")
NEVER_ACKNOWLEDGED = ("image", "vllm", "torch", "nccl", "ray")
MISMATCH_PREFIX = "mismatch:"

FactName = Annotated[str, AfterValidator(lambda name: _known_fact(name))]


def _known_fact(name: str) -> str:
    if name not in FACTS:
        raise ValueError(f"unknown fact {name!r} — expected one of {', '.join(FACTS)}")
    return name


def version_key(value: str) -> tuple[int, ...]:
    """'580.173.02' -> (580, 173, 2); '7.0.0-1019-nvidia' -> (7, 0, 0, 1019): numbers in order."""
    return tuple(int(n) for n in re.findall(r"\d+", value))


class Condition(BaseModel):
    """What a fact must be for an entry to match; every condition given must hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    equals: Optional[str] = None
    regex: Optional[str] = Field(default=None, description="re.search on the fact's text")
    version_at_least: Optional[str] = None
    version_below: Optional[str] = None
    date_before: Optional[Annotated[str, StringConstraints(pattern=r"^\d{4}-\d{2}-\d{2}$")]] = None
    greater_than: Optional[float] = None

    @model_validator(mode="after")
    def _some_condition(self) -> "Condition":
        if all(v is None for v in self.model_dump().values()):
            raise ValueError("expected at least one of " + ", ".join(type(self).model_fields))
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as err:
                raise ValueError(f"regex {self.regex!r} is no regular expression: {err}") from None
        return self

    def holds(self, value: Optional[str]) -> bool:
        """An unknown fact matches nothing: an entry needs every fact it names."""
        if value is None:
            return False
        checks = [
            self.equals is None or value == self.equals,
            self.regex is None or re.search(self.regex, value) is not None,
            self.version_at_least is None or version_key(value) >= version_key(self.version_at_least),
            self.version_below is None or version_key(value) < version_key(self.version_below),
            self.date_before is None or value < self.date_before,
        ]
        if self.greater_than is not None:
            try:
                checks.append(float(value) > self.greater_than)
            except ValueError:
                return False
        return all(checks)


class KnownIssue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]*$")]
    breaks: str = Field(min_length=1, description="what breaks")
    symptom: str = Field(min_length=1, description="how it shows")
    fix: str = Field(min_length=1, description="what to do instead")
    source: Annotated[str, StringConstraints(pattern=r"^https://\S+$")]
    match: dict[FactName, Condition] = Field(min_length=1)

    def matches(self, facts: Mapping[str, Optional[str]]) -> bool:
        return all(condition.holds(facts.get(fact)) for fact, condition in self.match.items())


class KnownIssues(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    issue: list[KnownIssue]

    @model_validator(mode="after")
    def _distinct_ids(self) -> "KnownIssues":
        ids = [i.id for i in self.issue]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"ids must be distinct: {', '.join(twice)} appear more than once")
        return self


class KnownIssuesError(ValueError):
    """The known-issues file cannot be read: its path and why."""


def parse_known_issues(text: str, origin: str = "known-issues.toml") -> list[KnownIssue]:
    try:
        return KnownIssues.model_validate(tomllib.loads(text)).issue
    except (tomllib.TOMLDecodeError, ValidationError) as err:
        raise KnownIssuesError(f"{origin}: {err}") from None


@lru_cache(maxsize=None)
def known_issues(path: Path = KNOWN_ISSUES_FILE) -> tuple[KnownIssue, ...]:
    return tuple(parse_known_issues(path.read_text(), str(path)))


def acknowledgeable() -> list[str]:
    """Every key `platform.acknowledge` may hold."""
    return [i.id for i in known_issues()] + [MISMATCH_PREFIX + f for f in MUST_MATCH if f not in NEVER_ACKNOWLEDGED]


@dataclass(frozen=True)
class Finding:
    key: str  # what acknowledges it: an issue id or mismatch:<fact>
    text: str
    acknowledgeable: bool = True


def _show(value: Optional[str]) -> str:
    return "unreadable" if value is None else repr(value)


def mismatches(facts_by_node: Mapping[str, Mapping[str, Optional[str]]],
               groups: Sequence[Sequence[str]] = ()) -> list[Finding]:
    """MUST_MATCH across every node; the build's facts (NEVER_ACKNOWLEDGED) within each of `groups` (the
    nodes of one engine: a lane's; none given, every node is one)."""
    found = []
    every_node = [list(facts_by_node)]
    for fact in MUST_MATCH:
        for group in (groups or every_node) if fact in NEVER_ACKNOWLEDGED else every_node:
            found += _mismatch(fact, {node: facts_by_node[node].get(fact) for node in group})
    return found


def _mismatch(fact: str, values: Mapping[str, Optional[str]]) -> list[Finding]:
    if len(set(values.values())) <= 1:
        return []
    first, *others = values.items()
    other = next((node, v) for node, v in others if v != first[1])
    every = ", ".join(f"{node} has {_show(v)}" for node, v in values.items())
    why = ("every node of an engine must run the same build (a tensor-parallel group on two builds hangs or "
           "computes garbage); this cannot be acknowledged" if fact in NEVER_ACKNOWLEDGED
           else f"acknowledge with {MISMATCH_PREFIX}{fact}")
    return [Finding(
        MISMATCH_PREFIX + fact,
        f"nodes differ in {fact} ({FACTS[fact]}): {first[0]} has {_show(first[1])}, {other[0]} has "
        f"{_show(other[1])}" + (f" ({every})" if len(values) > 2 else "") + f" — {why}",
        acknowledgeable=fact not in NEVER_ACKNOWLEDGED,
    )]


def known_issue_findings(
    facts_by_node: Mapping[str, Mapping[str, Optional[str]]], issues: tuple[KnownIssue, ...]
) -> list[Finding]:
    found = []
    for issue in issues:
        nodes = [node for node, facts in facts_by_node.items() if issue.matches(facts)]
        if not nodes:
            continue
        seen = "; ".join(
            f"{node}: " + ", ".join(f"{fact} {_show(facts_by_node[node].get(fact))}" for fact in issue.match)
            for node in nodes)
        found.append(Finding(
            issue.id,
            f"known issue {issue.id} on {seen}. Breaks: {issue.breaks} Symptom: {issue.symptom} Fix: {issue.fix} "
            f"Source: {issue.source} — acknowledge with {issue.id}",
        ))
    return found


def evaluate(
    facts_by_node: Mapping[str, Mapping[str, Optional[str]]],
    acknowledged: tuple[str, ...] | list[str] = (),
    issues: Optional[tuple[KnownIssue, ...]] = None,
    groups: Sequence[Sequence[str]] = (),
) -> list[Finding]:
    """Everything that refuses this platform: findings not acknowledged (the image never is); `groups`: the
    nodes of each engine (several lanes), whose build alone must be one."""
    findings = mismatches(facts_by_node, groups) + known_issue_findings(
        facts_by_node, known_issues() if issues is None else issues)
    return [f for f in findings if not (f.acknowledgeable and f.key in acknowledged)]


def refusal(findings: list[Finding]) -> str:
    lines = "\n  - ".join(f.text for f in findings)
    return ("platform gate: this platform is refused before any serving container starts "
            "(twinspark:platform.acknowledge lists what you accept):\n  - " + lines)


def parse_report(stdout: str, node: str) -> dict[str, Optional[str]]:
    """The facts a node printed: its last stdout line is the JSON report of platform-facts.py."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        report = json.loads(lines[-1])
        facts = report["facts"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise ValueError(f"{node}: the platform-facts step printed no report (last line: "
                         f"{lines[-1][:200] if lines else 'none'!r})") from None
    return {name: None if facts.get(name) is None else str(facts[name]) for name in FACTS}
