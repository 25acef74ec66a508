"""upgrade — change settings, deploy them, and keep them only if serving passes the gates.

    python -m ops upgrade --stack spark --set serving.image=REPO:TAG [--set serving.maxModelLen=65536 ...]

1. Every --set is checked before anything changes: a key upgrade may change (`serving.*`,
   `model.revision`), the whole config as the program will read it (components/config.py), and
   that the previous values can be written back exactly (keys unset before are unset again), and
   that every node answers over SSH with the host key the stack holds it to (ssh_access_check).
   What serves now is recorded (`KnownGood`, from the stack's outputs: the base image digest, the
   model commit, each node's launch bundle hash and image ID, and the config) in
   .twinspark/known-good/<stack>.json.
2. The settings are written to the stack config (Automation API: set_all_config/remove_all_config,
   path=True) and deployed (`up`).
3. Gates: readiness (the up fails when the readiness wait fails; then /health and an
   authenticated /v1/models serving the stack's model), the canary (the head's serving guard:
   a verdict checked after the up finished, ok and without a hold), and a bench run with the
   stored baseline's plan compared with it (bench.compare, --tolerance); with --gate recipe, a
   run of `ops bench`'s default plan held to the published baseline of the recipe the new
   settings serve (bench.compare_with_recipe, --recipe-tolerance), no stored baseline needed.
4. Any gate failing: the previous settings are written back — by digest and commit where the
   program would resolve them again (serving.image as REPO@sha256:<the digest that served>
   when serving.image or serving.platform changed, model.revision as the commit that served when
   it changed: a moved tag or branch is never followed back) — deployed again, readiness and the
   canary must pass again, and the outputs must show the recorded digest, commit and launch
   bundles. On success the bench result becomes the stack's baseline:
   .twinspark/baselines/<stack>.json in the checkout (the previous one kept beside it).

Exit codes: 0 upgraded; 1 a gate failed and serving is back on the previous settings; 2 bad
input (nothing changed); 3 ROLLBACK FAILED, serving not verified back; 4 another update holds
the stack (nothing deployed).
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import json
import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import httpx
from pulumi import RunError
from pulumi.automation import CommandError, ConcurrentUpdateError
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

import node_contract as contract
from components import config as schema

from . import bench
from .api import GuardVerdict, first_problem
from .hold import release_hold
from .inputs import EndpointError, InputError, ToolError, fraction, positive_float
from .nodes import HostKeyRefused, add_ssh_arguments, agent_options, ssh_runner, ssh_shell
from .stack import AutomationStack, UpgradeStack, Writes, apply_writes, cli_text, one_line_error, value_at
from .target import Target, check_endpoint, target_from_outputs

CHECKOUT = Path(__file__).resolve().parent.parent  # the Pulumi project and its .twinspark/
EXIT_ROLLED_BACK = 1
EXIT_ROLLBACK_FAILED = 3
EXIT_STACK_BUSY = 4

BASELINE_DIR = Path(".twinspark") / "baselines"  # under the checkout
KNOWN_GOOD_DIR = Path(".twinspark") / "known-good"  # what served before the last upgrade, per stack
FIRST_BASELINE_PLAN = bench.BenchPlan()  # `ops bench`'s defaults; later runs reuse the baseline's plan
DEFAULT_CANARY_TIMEOUT_MIN = 10
GATE_RECIPE = "recipe"  # --gate recipe: the bench is held to the recipe's published baseline


class StackBusy(ToolError):
    """Another update holds the stack (or another `ops upgrade` of it runs from this checkout)."""
    exit_code = EXIT_STACK_BUSY


class _Unset:
    def __repr__(self) -> str:
        return "(unset)"


UNSET: Any = _Unset()


# ---- what --set may change ---------------------------------------------------------------------------
def upgradable_keys() -> dict[str, bool]:
    """Every key upgrade may set, with whether its value is a list: `serving.*`, and
    `model.revision` where the schema has it."""
    keys = {}
    for block, model, names in (("serving", schema.Serving, None), ("model", schema.ModelConfig, ("revision",))):
        for name, info in model.model_fields.items():
            alias = info.alias or name
            if names is None or alias in names:
                keys[f"{block}.{alias}"] = getattr(info.annotation, "__origin__", None) is list
    return keys


@dataclass(frozen=True)
class Setting:
    key: str
    text: str


def parse_setting(text: str) -> Setting:
    """argparse type for --set KEY=VALUE."""
    key, sep, value = text.partition("=")
    key = key.strip().removeprefix(f"{schema.NAMESPACE}:")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. serving.image=REPO:TAG)")
    keys = upgradable_keys()
    if key not in keys:
        near = difflib.get_close_matches(key, list(keys), n=1)
        hint = f"did you mean {near[0]}?" if near else f"expected one of {', '.join(keys)}"
        raise argparse.ArgumentTypeError(f"{key!r} is not a setting upgrade changes — {hint}")
    return Setting(key, value)


@dataclass(frozen=True)
class Change:
    key: str
    before: Any  # UNSET where the stack did not set it
    after: Any  # as the CLI will store it


@dataclass
class Plan:
    changes: list[Change]
    forward: Writes  # the new settings
    backward: Writes  # the rollback: the previous ones, pinned to what served (KnownGood)
    before: schema.StackConfig  # as the program reads them
    after: schema.StackConfig
    undo: Writes = Writes()  # the previous ones as they were written: when nothing was deployed
    pinned: dict[str, str] = field(default_factory=dict)  # key -> the digest or commit the rollback writes


@dataclass(frozen=True)
class KnownGood:
    """What serves now, from the stack's outputs before anything changes: what a rollback returns to."""
    image_reference: Optional[str]  # REPO@sha256:... every node's image is built FROM (servingImage)
    image_tag: Optional[str]  # serving.image as the config said it
    model_revision: Optional[str]  # the commit every node holds (modelRevision)
    launch_bundles: dict[str, str]  # node -> its launch bundle's hash (keyed: says nothing of its secrets)
    image_ids: dict[str, str]  # node -> the serving image ID it runs (platform facts)

    def record(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"image_reference": self.image_reference, "image_tag": self.image_tag,
                "model_revision": self.model_revision, "launch_bundles": self.launch_bundles,
                "image_ids": self.image_ids, "config": config}


def known_good_from(outputs: dict[str, Any]) -> KnownGood:
    image = outputs.get("servingImage") if isinstance(outputs.get("servingImage"), dict) else {}
    platform = outputs.get("platform") if isinstance(outputs.get("platform"), dict) else {}
    facts = platform.get("facts") if isinstance(platform.get("facts"), dict) else {}
    bundles = outputs.get("launchBundles") if isinstance(outputs.get("launchBundles"), dict) else {}
    revision = outputs.get("modelRevision")
    return KnownGood(
        image_reference=image.get("reference") if isinstance(image.get("reference"), str) else None,
        image_tag=image.get("tag") if isinstance(image.get("tag"), str) else None,
        model_revision=revision if isinstance(revision, str) else None,
        launch_bundles={n: h for n, h in bundles.items() if isinstance(h, str)},
        image_ids={n: f.get("image") for n, f in facts.items() if isinstance(f, dict) and isinstance(f.get("image"), str)})


# What the program resolves again when these keys change, and the output that says what served:
# serving.image (or its platform) -> image-pin-resolve pulls the tag anew; model.revision -> the
# revision step asks the hub for the branch's head.
PINNED_BY = {"serving.image": ("serving.image", "serving.platform"), "model.revision": ("model.revision",)}


def pins(changes: list[Change], known_good: KnownGood) -> dict[str, str]:
    """The keys the rollback writes as what served (digest, commit), not as they were written."""
    changed = {c.key for c in changes}
    served = {"serving.image": known_good.image_reference, "model.revision": known_good.model_revision}
    what = {"serving.image": "servingImage.reference (the digest that serves)",
            "model.revision": "modelRevision (the commit that serves)"}
    result = {}
    for key, triggers in PINNED_BY.items():
        if changed & set(triggers):
            if not served[key]:
                raise InputError(f"the stack's outputs name no {what[key]}, so a rollback could not return to it: "
                                 "run `pulumi up` with this version of twinspark first; nothing changed")
            result[key] = served[key]
    return result


def requested_writes(setting: Setting, is_list: bool) -> tuple[list[str], list[tuple[str, str]]]:
    if not is_list:
        return [], [(setting.key, setting.text)]
    try:
        items = json.loads(setting.text)
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise InputError(f"--set {setting.key}: {setting.text!r} is not a JSON list of strings "
                         f"(e.g. {setting.key}='[\"--enforce-eager\"]')")
    return [setting.key], [(f"{setting.key}[{i}]", item) for i, item in enumerate(items)]


def restoring_writes(key: str, before: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """What writes `before` back at key: unset is removed, a list element by element."""
    if before is UNSET:
        return [key], []
    if isinstance(before, list):
        return [key], [(f"{key}[{i}]", cli_text(item)) for i, item in enumerate(before)]
    return [], [(key, cli_text(before))]


def combined(parts) -> Writes:
    """One Writes from (removes, sets) pairs: every remove first, then the sets in order."""
    removes, sets = [], []
    for part_removes, part_sets in parts:
        removes += part_removes
        sets += part_sets
    return Writes(tuple(removes), tuple(sets))


def validated(blocks: dict[str, Any], what: str) -> schema.StackConfig:
    structured = {k: v for k, v in blocks.items() if k in schema.STRUCTURED_KEYS + schema.OPTIONAL_STRUCTURED_KEYS}
    try:
        return schema.parse_stack_config(structured)
    except RunError as err:
        problems = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        raise InputError(f"{what}: {'; '.join(problems) or err}") from None


def plan_upgrade(blocks: dict[str, Any], settings: list[Setting], known_good: Optional[KnownGood] = None) -> Plan:
    """The writes there and back, checked before anything changes. InputError on bad input.
    `known_good` (what serves now): the rollback writes its digest and commit where the program
    would resolve the previous text again; without it, the previous text as it was."""
    keys = upgradable_keys()
    seen = [s.key for s in settings]
    twice = sorted({k for k in seen if seen.count(k) > 1})
    if twice:
        raise InputError(f"--set {', '.join(twice)} given more than once")
    before = validated(blocks, "the stack's current config is invalid")
    forward = combined(requested_writes(setting, keys[setting.key]) for setting in settings)
    after_blocks = apply_writes(blocks, forward)
    after = validated(after_blocks, "the new settings are refused")
    changes = [Change(s.key, value_at(blocks, s.key, UNSET), value_at(after_blocks, s.key, UNSET)) for s in settings]
    undo = combined(restoring_writes(change.key, change.before) for change in changes)
    try:
        restored = validated(apply_writes(after_blocks, undo), "")
    except InputError:
        restored = None
    if restored != before:
        raise InputError("the previous values of " + ", ".join(c.key for c in changes) + " cannot be written back "
                         "exactly with `pulumi config set --path` (it stores 'true' and whole numbers as such): "
                         "change them with `pulumi config` and `pulumi up`")
    pinned = pins(changes, known_good) if known_good else {}
    backward = combined([restoring_writes(c.key, pinned.get(c.key, c.before)) for c in changes]
                        + [([], [(key, value)]) for key, value in pinned.items() if key not in seen])
    return Plan(changes, forward, backward, before, after, undo, pinned)


# ---- gates -------------------------------------------------------------------------------------------
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
            shell = ssh_shell(ssh_user or target.ssh_user, ssh_key, ssh_options)
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
        head = next(n for n in target.nodes if n["role"] == "head")
        shell = ssh_shell(ssh_user or target.ssh_user, ssh_key, ssh_options)
        return lambda: release_hold(shell, head)

    return for_target


def ssh_guard_probe(ssh_user: Optional[str], ssh_key: Optional[str], ssh_options: list[str]
                    ) -> Callable[[Target], GuardProbe]:
    """Reads the head's guard verdict over SSH exactly as `ops status` reaches the nodes."""
    def for_target(target: Target) -> GuardProbe:
        head = next(n for n in target.nodes if n["role"] == "head")
        run = ssh_runner(ssh_user or target.ssh_user, ssh_key, ssh_options)
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
    recipe_tolerance: float = bench.RECIPE_TOLERANCE


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


# ---- the baseline ----------------------------------------------------------------------------------
def baseline_path(work_dir: Path, stack_name: str) -> Path:
    return work_dir / BASELINE_DIR / f"{stack_name.replace('/', '--')}.json"


def read_baseline(path: Path) -> dict:
    try:
        return bench.load_baseline(str(path))
    except InputError as err:
        raise InputError(str(err).replace("--compare ", "baseline ", 1)) from None


def write_keeping_previous(path: Path, record: dict) -> None:
    """`record` as JSON at path, written whole or not at all; the previous one kept as <stack>.previous.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        os.replace(path, path.with_suffix(".previous.json"))
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2))
    os.replace(temporary, path)


def record_baseline(path: Path, result: dict, upgrade: Optional[dict] = None) -> None:
    """The new baseline (the previous one kept beside it)."""
    write_keeping_previous(path, {**result, **({"upgrade": upgrade} if upgrade else {})})


def known_good_path(work_dir: Path, stack_name: str) -> Path:
    return work_dir / KNOWN_GOOD_DIR / f"{stack_name.replace('/', '--')}.json"


@contextmanager
def upgrade_lock(work_dir: Path, stack_name: str) -> Iterator[None]:
    """One `ops upgrade` per stack from this checkout at a time."""
    path = work_dir / ".twinspark" / f"upgrade-{stack_name.replace('/', '--')}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackBusy(f"another `ops upgrade` of stack {stack_name} runs from this checkout ({path})") from None
        yield


# ---- the upgrade -----------------------------------------------------------------------------------
@dataclass
class Upgrade:
    stack: UpgradeStack
    plan: Plan
    options: Options
    console: Console
    guard_probe_for: Callable[[Target], GuardProbe]
    work_dir: Path
    # removes the guard's hold on the head (None: never); see release_own_hold
    hold_release_for: Optional[Callable[[Target], Callable[[], None]]] = None
    known_good: Optional[KnownGood] = None  # what served before: the rollback must show it again
    started: float = field(default_factory=time.time)
    results: list[GateResult] = field(default_factory=list)

    def say(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style))

    def deploy(self) -> Optional[GateResult]:
        """`up`; a failed update is the readiness gate failing (the readiness wait is in it)."""
        try:
            self.stack.up(on_output=lambda line: self.say(line.rstrip(), "dim"))
        except ConcurrentUpdateError:
            raise
        except CommandError as err:
            return GateResult("readiness", False, f"pulumi up failed: {one_line_error(err)}")
        return None

    def serving_gates(self, up_finished: float) -> tuple[list[GateResult], Optional[Target]]:
        target = target_from_outputs(self.stack.outputs(), f"stack {self.stack.name} outputs")
        results = [wait_for_endpoint(target, self.options.readiness_timeout_s, self.options.poll_s)]
        if results[-1].ok:
            results.append(wait_for_canary(self.guard_probe_for(target), up_finished,
                                           self.options.canary_timeout_s, self.options.poll_s))
        return results, target

    def bench_gate(self, target: Target, baseline: Optional[dict]) -> tuple[GateResult, dict]:
        profile = self.plan.after.serving.profile
        if self.options.gate == GATE_RECIPE:
            recipe = self.plan.after.serving.recipe_spec
            result = bench.measure(target, FIRST_BASELINE_PLAN, self.console, profile=profile,
                                   deadline_s=self.options.bench_deadline_s)
            comparison = bench.compare_with_recipe(result, recipe, self.options.recipe_tolerance)
            bound = f"{self.options.recipe_tolerance:.0%} below recipe {recipe.name}'s published figures"
            bench.render(result, self.console, comparison, against=f"recipe {recipe.name}'s baseline")
        else:
            plan = bench.plan_from_record(baseline["plan"])
            result = bench.measure(target, plan, self.console, profile=profile, deadline_s=self.options.bench_deadline_s)
            comparison = bench.compare(result, baseline, self.options.tolerance)
            bound = f"the larger of {self.options.tolerance:.0%} and the measured spread"
            bench.render(result, self.console, comparison, bench.comparison_warnings(result, baseline))
        regressions = [r for r in comparison if r["regression"]]
        if result["errors"]:
            return GateResult("bench", False, f"{len(result['errors'])} requests failed, e.g. {result['errors'][0]}"), result
        if regressions and not self.options.rebaseline:
            worst = ", ".join(f"{r['metric']} {r['baseline']:.2f}→{r['current']:.2f} ({r['change']:+.0%}, "
                              f"allowed ±{r['allowed']:.0%})" for r in regressions[:3])
            return GateResult("bench", False, f"{len(regressions)} regressions beyond {bound}: {worst}"), result
        note = " (--rebaseline: the comparison does not gate)" if regressions else ""
        return GateResult("bench", True, f"within {bound}{note}"), result

    def judged(self, gates: Callable[[], list[GateResult]]) -> list[GateResult]:
        """The gates' results; whatever goes wrong while judging (the outputs unreadable, the
        bench's deadline) fails them, so that the settings are rolled back, never left half-judged."""
        try:
            return gates()
        except Exception as err:  # noqa: BLE001 — after a deploy, any error must end in the rollback
            return [GateResult("judging", False, f"could not judge the deployment: {one_line_error(err)}")]

    def release_own_hold(self) -> None:
        """A hold the guard raised during this upgrade was caused by the new settings (their
        restarts): the rollback's readiness would fail on it. One raised before stays."""
        if self.hold_release_for is None:
            return
        try:
            target = target_from_outputs(self.stack.outputs(), f"stack {self.stack.name} outputs")
            reading = self.guard_probe_for(target)()
            verdict = GuardVerdict.model_validate(reading.get("status"))
            head_offset = float(reading["now"]) - time.time()  # the head's clock against ours
            if verdict.hold and verdict.hold.since >= self.started + head_offset:
                self.say(f"the guard held serving during this upgrade ({verdict.hold.reason}): releasing the hold "
                         "for the rollback", "yellow")
                self.hold_release_for(target)()
        except Exception as err:  # noqa: BLE001 — the rollback goes on; its readiness will say what is wrong
            self.say(f"could not check the guard's hold before the rollback: {one_line_error(err)}", "yellow")

    def roll_back(self) -> int:
        self.say("rolling back: writing the previous settings back and deploying them", "bold yellow")
        self.release_own_hold()
        self.stack.write_config(self.plan.backward)
        try:
            failure = self.deploy()
        except ConcurrentUpdateError:
            failure = GateResult("readiness", False, "another update took the stack: run `pulumi up` when it ends")
        back = [failure] if failure else self.judged(lambda: self.serving_gates(time.time())[0])
        if not failure and self.known_good:
            back.append(self.judged(lambda: [self.known_good_gate()])[0])
        self.report("after the rollback", back)
        if all(r.ok for r in back):
            self.say("rolled back: serving again on the previous settings", "bold yellow")
            for key, value in self.plan.pinned.items():
                self.say(f"{key} is now {value}, what served before the upgrade (the program would have resolved "
                         f"the previous text again: a tag or branch may have moved since); set it back to follow it",
                         "yellow")
            return EXIT_ROLLED_BACK
        self.say("ROLLBACK FAILED: serving is NOT verified back on the previous settings. The stack config holds "
                 f"them again; see `python -m ops status`, the head's logs ({contract.LOG_DIR}) and `pulumi up`.",
                 "bold red")
        return EXIT_ROLLBACK_FAILED

    def known_good_gate(self) -> GateResult:
        """The rollback's outputs against what served before: digest, commit, launch bundles."""
        now, then = known_good_from(self.stack.outputs()), self.known_good
        differ = [f"{what}: {a!r} before the upgrade, {b!r} now" for what, a, b in (
            ("servingImage.reference", then.image_reference, now.image_reference),
            ("modelRevision", then.model_revision, now.model_revision),
            *((f"launchBundles.{n}", h, now.launch_bundles.get(n)) for n, h in then.launch_bundles.items()))
            if a != b]
        if differ:
            return GateResult("known-good", False, "not what served before: " + "; ".join(differ))
        rebuilt = [n for n, i in then.image_ids.items() if now.image_ids.get(n) not in (None, i)]
        note = f" (image rebuilt from the same inputs on {', '.join(rebuilt)}: another ID)" if rebuilt else ""
        return GateResult("known-good", True, f"base {then.image_reference}, model {then.model_revision}, launch "
                                              f"bundles as before{note}")

    def report(self, title: str, results: list[GateResult]) -> None:
        table = Table(title=title)
        for column in ("gate", "", "detail"):
            table.add_column(column)
        for r in results:
            table.add_row(Text(r.gate), Text("pass" if r.ok else "FAIL", style="green" if r.ok else "bold red"),
                          Text(r.detail))
        self.console.print(table)

    def run(self, baseline: dict, baseline_file: Path) -> int:
        try:
            self.stack.write_config(self.plan.forward)
        except CommandError as err:
            self.stack.write_config(self.plan.undo)
            raise ToolError(f"could not write the new settings ({one_line_error(err)}); the previous ones were "
                            "written back, nothing deployed") from None
        try:
            failure = self.deploy()
        except ConcurrentUpdateError:
            self.stack.write_config(self.plan.undo)
            raise StackBusy(f"another update is running on stack {self.stack.name}: nothing deployed, the previous "
                            "settings written back; try again when it ends") from None
        up_finished, result = time.time(), None

        def gates() -> list[GateResult]:
            nonlocal result
            results, target = self.serving_gates(up_finished)
            if all(r.ok for r in results):
                gate, result = self.bench_gate(target, baseline)
                results.append(gate)
            return results

        results = [failure] if failure else self.judged(gates)
        self.report("upgrade gates", results)
        if all(r.ok for r in results):
            record_baseline(baseline_file, result, {
                "stack": self.stack.name, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "settings": {c.key: c.after for c in self.plan.changes}})
            self.say(f"upgraded; new baseline {baseline_file}", "bold green")
            return 0
        return self.roll_back()


def show_changes(plan: Plan, console: Console) -> None:
    table = Table(title="settings")
    for column in ("key", "now", "new"):
        table.add_column(column)
    for c in plan.changes:
        table.add_row(Text(c.key), Text(json.dumps(c.before) if c.before is not UNSET else "(unset)"),
                      Text(json.dumps(c.after)))
    console.print(table)


def predicted_plan_differences(plan: Plan, target: Target, baseline: dict) -> list[str]:
    """How the bench plan after the upgrade will differ from the baseline's (profile, endpoint)."""
    endpoint = target.endpoint.replace(f":{plan.before.serving.port}/", f":{plan.after.serving.port}/", 1)
    record = bench.plan_record(bench.plan_from_record(baseline["plan"]), target.model, endpoint,
                               plan.after.serving.profile)
    return bench.plan_differences(record, baseline)


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
    bench.check_recipe_reference(plan.after.serving.recipe_spec, FIRST_BASELINE_PLAN, plan.after.serving.profile,
                                 allow_plan_mismatch=rebaseline, what="--gate recipe",
                                 way_out="use the stored baseline (--gate baseline), or pass --rebaseline")


def opening(open_stack: Callable[[str], UpgradeStack], work_dir: Path) -> Callable[[str], UpgradeStack]:
    """open_stack, its failures as one line each (bad input: nothing has changed)."""
    from pulumi.automation import InvalidVersionError, StackNotFoundError

    def open_(name: str) -> UpgradeStack:
        try:
            return open_stack(name)
        except StackNotFoundError:
            raise InputError(f"--stack {name}: no such stack for the project in {work_dir} (`pulumi stack ls` lists "
                             "them)") from None
        except FileNotFoundError:
            raise InputError("the Pulumi CLI is not on PATH: ops upgrade deploys through it "
                             "(https://www.pulumi.com/docs/install/)") from None
        except InvalidVersionError as err:
            raise InputError(f"the Pulumi CLI: {one_line_error(err)}") from None
        except CommandError as err:
            raise InputError(f"--stack {name}: {one_line_error(err)}") from None

    return open_


def run_upgrade(args: argparse.Namespace, console: Console, open_stack: Callable[[str], UpgradeStack],
                guard_probe_for: Callable[[Target], GuardProbe], work_dir: Path,
                hold_release_for: Optional[Callable[[Target], Callable[[], None]]] = None,
                access_check_for: Optional[Callable[[Target], Callable[[], None]]] = None) -> int:
    if not args.stack:
        raise InputError("--stack is required: the stack to upgrade (`pulumi stack ls` lists them)")
    stack = opening(open_stack, work_dir)(args.stack)
    config = stack.config()
    known_good = known_good_from(stack.outputs())
    plan = plan_upgrade(config, args.settings, known_good)
    show_changes(plan, console)
    if plan.after == plan.before:
        console.print(Text("nothing to change: the stack already has these settings"))
        return 0
    if args.gate == GATE_RECIPE:  # before anything changes: the recipe publishes what the gate needs
        check_recipe_gate(plan, args.rebaseline)
    if args.dry_run:
        report = stack.preview(plan.forward)
        console.print(Text(report.text.rstrip()))
        summary = ", ".join(f"{op} {n}" for op, n in report.change_summary.items() if op != "same")
        console.print(Text(f"dry run: nothing changed; `up` would: {summary or 'change nothing'}", style="bold"))
        return 0
    options = Options(tolerance=args.tolerance, rebaseline=args.rebaseline,
                      readiness_timeout_s=args.readiness_timeout_min * 60, canary_timeout_s=args.canary_timeout_min * 60, poll_s=args.poll_seconds,
                      bench_deadline_s=args.bench_deadline_min * 60, gate=args.gate,
                      recipe_tolerance=args.recipe_tolerance)
    with upgrade_lock(work_dir, stack.name):
        target = target_from_outputs(stack.outputs(), f"stack {stack.name} outputs")
        if access_check_for is not None:  # a node refused (its host key, the credentials) ends it here
            access_check_for(target)()
        path = baseline_path(work_dir, stack.name)
        if options.gate == GATE_RECIPE:  # the recipe's figures judge: no stored baseline is measured or read
            return Upgrade(stack, plan, options, console, guard_probe_for, work_dir, hold_release_for).run(None, path)
        baseline = ensure_baseline(path, target, plan.before.serving.profile, console, options.bench_deadline_s)
        differences = predicted_plan_differences(plan, target, baseline)
        if differences and not args.rebaseline:
            raise InputError(f"the baseline {path} was measured with another plan ({'; '.join(differences)}), so "
                             "it cannot judge the new figures: pass --rebaseline (readiness and the canary gate, "
                             "and the new figures become the baseline)")
        write_keeping_previous(known_good_path(work_dir, stack.name), known_good.record(config))
        return Upgrade(stack, plan, options, console, guard_probe_for, work_dir, hold_release_for,
                       known_good).run(baseline, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Exit 0 upgraded; 1 a gate failed and serving is back on the previous settings; "
                     "2 bad input (nothing changed); 3 ROLLBACK FAILED; 4 another update holds the stack.")
    p.add_argument("--stack", help="the Pulumi stack to upgrade (required)")
    p.add_argument("--set", dest="settings", action="append", type=parse_setting, required=True, metavar="KEY=VALUE",
                   help="serving.<key> or model.revision, repeatable; a list as JSON: serving.extraArgs='[\"--x\"]'")
    p.add_argument("--dry-run", action="store_true", help="show the preview of what would change; change nothing")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed worsening against the baseline (0.10 = 10%%), "
                   "or a figure's run-to-run spread when larger")
    p.add_argument("--gate", choices=("baseline", GATE_RECIPE), default="baseline",
                   help="what the bench is held to: the stack's stored baseline (default), or the published baseline "
                        "of the recipe serving.recipe names after the upgrade (see ops bench --compare recipe)")
    p.add_argument("--recipe-tolerance", type=fraction, default=bench.RECIPE_TOLERANCE,
                   help="with --gate recipe: the shortfall below a recipe's figure allowed (default %(default)s)")
    p.add_argument("--rebaseline", action="store_true",
                   help="the bench does not gate against the old baseline (e.g. another serving.profile); its "
                        "figures become the new baseline when readiness and the canary pass")
    p.add_argument("--canary-timeout-min", type=positive_float, default=DEFAULT_CANARY_TIMEOUT_MIN,
                   help="wait this long for the serving guard's first verdict after the update")
    p.add_argument("--readiness-timeout-min", type=positive_float, default=2,
                   help="after the update, wait this long for /health and /v1/models")
    p.add_argument("--poll-seconds", type=positive_float, default=10.0, help="between endpoint and canary checks")
    p.add_argument("--bench-deadline-min", type=positive_float, default=bench.DEADLINE_MIN)
    add_ssh_arguments(p)


def run(args: argparse.Namespace, console: Optional[Console] = None, work_dir: Path = CHECKOUT) -> int:
    """The stack through the Automation API in work_dir (the checkout); the nodes over SSH."""
    ssh = (args.ssh_user, args.ssh_key, args.ssh_option)
    return run_upgrade(args, console or Console(), lambda name: AutomationStack(name, work_dir), ssh_guard_probe(*ssh),
                       work_dir, ssh_hold_release(*ssh), ssh_access_check(*ssh))
