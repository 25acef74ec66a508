"""upgrade — change settings, deploy them, and keep them only if serving passes the gates.

    python -m ops upgrade --stack spark --set serving.image=REPO:TAG [--set serving.maxModelLen=65536 ...]
    python -m ops upgrade --stack spark --model fast --set serving.maxModelLen=65536   (one lane of several)

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

With --model (a stack with several lanes): the settings are that lane's (its lane keys of `serving` and
its model.revision, written as lanes[i].serving.X and lanes[i].model.revision), the gates ask its model
and read its head's guard, its baseline is its own (.twinspark/baselines/<stack>-<lane>.json) and the
rollback returns to its commit; the other lanes serve on (the program swaps the lane alone, with a drain).

Exit codes: 0 upgraded; 1 a gate failed and serving is back on the previous settings; 2 bad
input (nothing changed); 3 ROLLBACK FAILED, serving not verified back; 4 another update holds
the stack (nothing deployed).

Here: the tool (its flags, the checks before anything changes, the lock); the plan in
upgrade_plan.py, the gates in upgrade_gates.py, the run and its rollback in upgrade_run.py, the
files under .twinspark/ in upgrade_records.py.
"""

from __future__ import annotations

import argparse
import fcntl
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from pulumi.automation import CommandError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .output import add_json_argument, human_console, print_json
from . import bench
from .bench_compare import RECIPE_TOLERANCE, plan_differences
from .bench_requests import plan_from_record, plan_record
from .inputs import InputError, fraction, positive_float
from .nodes import add_ssh_arguments
from .stack import AutomationStack, UpgradeStack, one_line_error
from .target import Target, add_project_dir_argument, project_dir, target_from_outputs
from .upgrade_gates import (DEFAULT_CANARY_TIMEOUT_MIN, GATE_RECIPE, GuardProbe, Options, check_recipe_gate,
                            ensure_baseline, ssh_access_check, ssh_guard_probe, ssh_hold_release)
from .upgrade_plan import UNSET, Plan, known_good_from, parse_setting, plan_upgrade
from .upgrade_records import baseline_path, known_good_path, write_keeping_previous
from .upgrade_run import EXIT_ROLLBACK_FAILED, EXIT_ROLLED_BACK, EXIT_STACK_BUSY  # noqa: F401 (the exits above)
from .upgrade_run import StackBusy, Upgrade

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
    record = plan_record(plan_from_record(baseline["plan"]), target.model, endpoint, plan.after.serving.profile)
    return plan_differences(record, baseline)


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
                access_check_for: Optional[Callable[[Target], Callable[[], None]]] = None,
                outcome: Optional[dict] = None) -> int:
    """`outcome` (for --json) gets the stack, the settings asked for, a dry run's change summary and
    each gate table the upgrade showed."""
    outcome = {} if outcome is None else outcome
    outcome.update(stack=args.stack, settings=args.settings, gates=[])
    if not args.stack:
        raise InputError("--stack is required: the stack to upgrade (`pulumi stack ls` lists them)")
    stack = opening(open_stack, work_dir)(args.stack)
    config = stack.config()
    known_good = known_good_from(stack.outputs())
    plan = plan_upgrade(config, args.settings, known_good, args.model)
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
        outcome["dry_run"] = {op: n for op, n in report.change_summary.items() if op != "same"}
        return 0
    options = Options(tolerance=args.tolerance, rebaseline=args.rebaseline,
                      readiness_timeout_s=args.readiness_timeout_min * 60, canary_timeout_s=args.canary_timeout_min * 60,
                      poll_s=args.poll_seconds,
                      bench_deadline_s=args.bench_deadline_min * 60, gate=args.gate,
                      recipe_tolerance=args.recipe_tolerance)
    with upgrade_lock(work_dir, stack.name):
        target = target_from_outputs(stack.outputs(), f"stack {stack.name} outputs", plan.model)
        if access_check_for is not None:  # a node refused (its host key, the credentials) ends it here
            access_check_for(target)()
        path = baseline_path(work_dir, stack.name, plan.lane.name if plan.lane else None)
        if options.gate == GATE_RECIPE:  # the recipe's figures judge: no stored baseline is measured or read
            upgrade = Upgrade(stack, plan, options, console, guard_probe_for, work_dir, hold_release_for,
                              reports=outcome["gates"])
            return upgrade.run(None, path)
        baseline = ensure_baseline(path, target, plan.before.serving.profile, console, options.bench_deadline_s)
        differences = predicted_plan_differences(plan, target, baseline)
        if differences and not args.rebaseline:
            raise InputError(f"the baseline {path} was measured with another plan ({'; '.join(differences)}), so "
                             "it cannot judge the new figures: pass --rebaseline (readiness and the canary gate, "
                             "and the new figures become the baseline)")
        write_keeping_previous(known_good_path(work_dir, stack.name), known_good.record(config))
        return Upgrade(stack, plan, options, console, guard_probe_for, work_dir, hold_release_for,
                       known_good, reports=outcome["gates"]).run(baseline, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Exit 0 upgraded; 1 a gate failed and serving is back on the previous settings; "
                     "2 bad input (nothing changed); 3 ROLLBACK FAILED; 4 another update holds the stack.")
    p.add_argument("--stack", help="the Pulumi stack to upgrade (required)")
    add_project_dir_argument(p)
    p.add_argument("--set", dest="settings", action="append", type=parse_setting, required=True, metavar="KEY=VALUE",
                   help="serving.<key> or model.revision, repeatable; a list as JSON: serving.extraArgs='[\"--x\"]'")
    p.add_argument("--model", help="a stack with several lanes: the served model (or lane name) whose lane the --set "
                                   "keys change (its lane keys of serving, and model.revision); default: the stack's")
    p.add_argument("--dry-run", action="store_true", help="show the preview of what would change; change nothing")
    p.add_argument("--tolerance", type=positive_float, default=0.10, help="allowed worsening against the baseline (0.10 = 10%%), "
                   "or a figure's run-to-run spread when larger")
    p.add_argument("--gate", choices=("baseline", GATE_RECIPE), default="baseline",
                   help="what the bench is held to: the stack's stored baseline (default), or the published baseline "
                        "of the recipe serving.recipe names after the upgrade (see ops bench --compare recipe)")
    p.add_argument("--recipe-tolerance", type=fraction, default=RECIPE_TOLERANCE,
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
    add_json_argument(p)


def run(args: argparse.Namespace, console: Optional[Console] = None) -> int:
    """The stack through the Automation API in the project's directory (its .twinspark/ keeps the records);
    the nodes over SSH."""
    work_dir = project_dir(args)
    ssh = (args.ssh_user, args.ssh_key, args.ssh_option)
    outcome: dict = {}
    code = run_upgrade(args, console or human_console(args), lambda name: AutomationStack(name, work_dir),
                       ssh_guard_probe(*ssh), work_dir, ssh_hold_release(*ssh), ssh_access_check(*ssh), outcome)
    print_json(args, {**outcome, "exit": code})
    return code
