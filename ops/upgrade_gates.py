"""The gates a deployment must pass before `ops upgrade` keeps it, and again after a rollback:
readiness (/health, /v1/models), the canary (the serving guard on the engine's head, a lane's own with
`--model`, over SSH as `ops status` reaches the nodes) and the bench (the stored baseline, or with
--gate recipe the recipe's figures); with the SSH checks before anything changes and the hold's
release before a rollback."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import httpx
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from core import contract
from components import config as schema

from . import bench
from .api import GuardVerdict, first_problem
from .bench_compare import RECIPE_TOLERANCE, check_recipe_reference, compare, compare_with_recipe, comparison_warnings
from .bench_requests import BenchPlan, plan_from_record
from .clear_hold import release_hold
from .inputs import EndpointError, InputError, ToolError
from .nodes import HostKeyRefused, agent_options, ssh_runner, ssh_shell
from .stack import one_line_error
from .target import Target, check_endpoint, engine_head
from .upgrade_plan import Plan
from .upgrade_records import read_baseline, record_baseline

FIRST_BASELINE_PLAN = BenchPlan()  # `ops bench`'s defaults; later runs reuse the baseline's plan
DEFAULT_CANARY_TIMEOUT_MIN = 10
GATE_RECIPE = "recipe"  # --gate recipe: the bench is held to the recipe's published baseline


@dataclass
class GateResult:
    gate: str
    ok: bool
    detail: str


GuardProbe = Callable[[], dict]  # the head's {"now": unix s, "status": {...}} or {"now", "error"}


def ssh_access_check(ssh_user: Optional[str], ssh_key: Optional[str], ssh_options: list[str]
                     ) -> Callable[[Target], Callable[[], None]]:
    """Before anything changes: every node answers over SSH with the host key `pulumi up` holds it
    to (`true` on each, as `ops status` reaches them). The agent is checked at once."""
    agent_options(ssh_key)

    def for_target(target: Target) -> Callable[[], None]:
        def check() -> None:
            user = ssh_user or target.ssh_user
            assert user is not None  # target_from_outputs requires the stack's sshUser
            shell = ssh_shell(user, ssh_key, ssh_options)
            for node in target.nodes:
                try:
                    shell(node, "true", "")
                except (RuntimeError, subprocess.SubprocessError) as err:
                    raise ToolError(f"cannot reach {node['name']} over SSH: {one_line_error(err, 300)}; nothing "
                                    "changed") from None

        return check

    return for_target


def ssh_hold_release(ssh_user: Optional[str], ssh_key: Optional[str], ssh_options: list[str]
                     ) -> Callable[[Target], Callable[[], None]]:
    """Removes the head's hold file over SSH, as `ops clear-hold` does (the guard then lets serving start)."""
    def for_target(target: Target) -> Callable[[], None]:
        head = engine_head(target)
        user = ssh_user or target.ssh_user
        assert user is not None  # target_from_outputs requires the stack's sshUser
        shell = ssh_shell(user, ssh_key, ssh_options)
        return lambda: release_hold(shell, head)

    return for_target


def ssh_guard_probe(ssh_user: Optional[str], ssh_key: Optional[str], ssh_options: list[str]
                    ) -> Callable[[Target], GuardProbe]:
    """Reads the head's guard verdict over SSH exactly as `ops status` reaches the nodes."""
    def for_target(target: Target) -> GuardProbe:
        head = engine_head(target)
        user = ssh_user or target.ssh_user
        assert user is not None  # target_from_outputs requires the stack's sshUser
        run = ssh_runner(user, ssh_key, ssh_options)
        args = ["--name", head["name"], "--container", contract.SERVING_CONTAINER,
                "--guard-status", contract.SERVING_GUARD_STATUS, "--hold", contract.SERVING_HOLD]

        def probe() -> dict:
            reading = json.loads(run(head, args))
            if reading.get("guard") is None:
                return {"now": reading["now"], "error": f"{contract.SERVING_GUARD_STATUS}: no such file "
                                                        "(is the serving guard running?)"}
            return {"now": reading["now"], "status": reading["guard"]}

        return probe

    return for_target


@dataclass
class Options:
    tolerance: float = 0.10
    rebaseline: bool = False
    readiness_timeout_s: float = 120.0
    canary_timeout_s: float = DEFAULT_CANARY_TIMEOUT_MIN * 60
    poll_s: float = 10.0
    bench_deadline_s: float = 30 * 60
    gate: str = "baseline"  # or GATE_RECIPE
    recipe_tolerance: float = RECIPE_TOLERANCE


def wait_for_endpoint(target: Target, timeout_s: float, poll_s: float) -> GateResult:
    """/health 200 and an authenticated /v1/models serving the stack's model, within timeout_s."""
    deadline, problem = time.monotonic() + timeout_s, ""
    while True:
        try:
            health = httpx.get(f"{target.base_url}/health", timeout=10).status_code
            if health != 200:
                raise EndpointError(f"{target.base_url}/health answered HTTP {health}")
            check_endpoint(target)
            return GateResult("readiness", True, f"/health 200, /v1/models serves {target.model}")
        except httpx.HTTPError as err:
            problem = f"cannot reach {target.base_url}/health: {type(err).__name__}"
        except EndpointError as err:
            problem = str(err).removesuffix(": pass --model")  # the model is the stack's, not a flag's
        if time.monotonic() >= deadline:
            return GateResult("readiness", False, f"not serving after {timeout_s:g} s: {problem}")
        time.sleep(poll_s)


def judge_verdict(verdict: GuardVerdict) -> GateResult:
    if verdict.ok and verdict.hold is None:
        return GateResult("canary", True, f"ok (restarts in window: {verdict.restarts_in_window})")
    why = "; ".join(verdict.failures) or "no failure named"
    hold = f"; hold: {verdict.hold.reason}" if verdict.hold else ""
    return GateResult("canary", False, f"{'ok' if verdict.ok else 'not ok'}: {why}{hold} "
                                       f"(consecutive failures {verdict.consecutive_failures}, "
                                       f"restarts in window {verdict.restarts_in_window})")


def wait_for_canary(probe: GuardProbe, up_finished: float, timeout_s: float, poll_s: float) -> GateResult:
    """The first guard verdict checked after the up finished (by the head's clock) decides."""
    deadline, threshold, problem = time.monotonic() + timeout_s, None, "no answer yet"
    while True:
        asked = time.time()
        try:
            reading = probe()
            if threshold is None:  # the up's end on the head's clock, whatever the skew between clocks
                threshold = float(reading["now"]) - (asked - up_finished)
            if reading.get("error"):
                problem = str(reading["error"])
            else:
                verdict = GuardVerdict.model_validate(reading.get("status"))
                if verdict.checked_at is None:
                    problem = "the guard has made no canary round yet"
                elif verdict.checked_at > threshold:
                    return judge_verdict(verdict)
                else:
                    problem = f"the latest verdict was checked {threshold - verdict.checked_at:.0f} s before the up finished"
        except ValidationError as err:
            problem = f"the guard's status is not a verdict ({first_problem(err)})"
        except (HostKeyRefused, InputError) as err:  # no later try can pass
            return GateResult("canary", False, str(err))
        except Exception as err:  # ssh, JSON: one more try until the deadline
            problem = f"cannot read the guard's status: {one_line_error(err, 300)}"
        if time.monotonic() >= deadline:
            return GateResult("canary", False, f"no fresh verdict within {timeout_s / 60:g} min: {problem}")
        time.sleep(poll_s)


def bench_gate(target: Target, baseline: Optional[dict], after: schema.StackConfig, options: Options,
               console: Console) -> tuple[GateResult, dict]:
    """The bench after the up: against the stored baseline's plan and figures, or (--gate recipe)
    `ops bench`'s default plan against the recipe the new settings serve."""
    profile = after.serving.profile
    if options.gate == GATE_RECIPE:
        recipe = after.serving.recipe_spec
        result = bench.measure(target, FIRST_BASELINE_PLAN, console, profile=profile,
                               deadline_s=options.bench_deadline_s)
        comparison = compare_with_recipe(result, recipe, options.recipe_tolerance)
        bound = f"{options.recipe_tolerance:.0%} below recipe {recipe.name}'s published figures"
        bench.render(result, console, comparison, against=f"recipe {recipe.name}'s baseline")
    else:
        assert baseline is not None  # run_upgrade reads the stored one for every gate but the recipe's
        plan = plan_from_record(baseline["plan"])
        result = bench.measure(target, plan, console, profile=profile, deadline_s=options.bench_deadline_s)
        comparison = compare(result, baseline, options.tolerance)
        bound = f"the larger of {options.tolerance:.0%} and the measured spread"
        bench.render(result, console, comparison, comparison_warnings(result, baseline))
    regressions = [r for r in comparison if r["regression"]]
    if result["errors"]:
        return GateResult("bench", False, f"{len(result['errors'])} requests failed, e.g. {result['errors'][0]}"), result
    if regressions and not options.rebaseline:
        worst = ", ".join(f"{r['metric']} {r['baseline']:.2f}→{r['current']:.2f} ({r['change']:+.0%}, "
                          f"allowed ±{r['allowed']:.0%})" for r in regressions[:3])
        return GateResult("bench", False, f"{len(regressions)} regressions beyond {bound}: {worst}"), result
    note = " (--rebaseline: the comparison does not gate)" if regressions else ""
    return GateResult("bench", True, f"within {bound}{note}"), result


def ensure_baseline(path: Path, target: Target, profile: str, console: Console, deadline_s: float) -> dict:
    if path.exists():
        return read_baseline(path)
    console.print(Text(f"no baseline for this stack yet ({path}): measuring the deployment as it is, "
                       "before anything changes", style="bold"))
    target.model = check_endpoint(target)
    result = bench.measure(target, FIRST_BASELINE_PLAN, console, profile=profile, deadline_s=deadline_s)
    if result["errors"]:
        raise ToolError(f"the current deployment failed {len(result['errors'])} bench requests (e.g. "
                        f"{result['errors'][0]}): nothing changed; fix serving first (`python -m ops status`)")
    record_baseline(path, result)
    return read_baseline(path)


def check_recipe_gate(plan: Plan, rebaseline: bool) -> None:
    """--gate recipe: the recipe the new settings serve publishes a figure, and the bench will
    measure what its figures are of (the profile among them, unless --rebaseline); InputError."""
    check_recipe_reference(plan.after.serving.recipe_spec, FIRST_BASELINE_PLAN, plan.after.serving.profile,
                           allow_plan_mismatch=rebaseline, what="--gate recipe",
                           way_out="use the stored baseline (--gate baseline), or pass --rebaseline")
