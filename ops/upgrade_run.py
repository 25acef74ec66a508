"""One upgrade, once its plan is checked: the new settings written and deployed, the gates judged,
and on any failure the rollback (the previous settings, pinned to what served, deployed and judged
again, the outputs held to the known-good record); on success the bench's figures become the
stack's baseline. The exit codes are `ops upgrade`'s."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pulumi.automation import CommandError, ConcurrentUpdateError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core import contract

from .api import GuardVerdict
from .inputs import ToolError
from .stack import UpgradeStack, one_line_error
from .target import Target, target_from_outputs
from .upgrade_gates import GateResult, GuardProbe, Options, bench_gate, wait_for_canary, wait_for_endpoint
from .upgrade_plan import KnownGood, Plan, known_good_from
from .upgrade_records import record_baseline

EXIT_ROLLED_BACK = 1
EXIT_ROLLBACK_FAILED = 3
EXIT_STACK_BUSY = 4


class StackBusy(ToolError):
    """Another update holds the stack (or another `ops upgrade` of it runs from this checkout)."""
    exit_code = EXIT_STACK_BUSY


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
    reports: list[dict] = field(default_factory=list)  # each gate table shown, for --json

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

    def target(self) -> Target:
        """The stack's endpoint; `upgrade --model`: its lane's model, recipe and head."""
        return target_from_outputs(self.stack.outputs(), f"stack {self.stack.name} outputs", self.plan.model)

    def serving_gates(self, up_finished: float) -> tuple[list[GateResult], Target]:
        target = self.target()
        results = [wait_for_endpoint(target, self.options.readiness_timeout_s, self.options.poll_s)]
        if results[-1].ok:
            results.append(wait_for_canary(self.guard_probe_for(target), up_finished,
                                           self.options.canary_timeout_s, self.options.poll_s))
        return results, target

    def judged(self, gates: Callable[[], list[GateResult]]) -> list[GateResult]:
        """The gates' results; whatever goes wrong while judging (the outputs unreadable, the
        bench's deadline) fails them, so that the settings are rolled back, never left half-judged."""
        try:
            return gates()
        except Exception as err:  # noqa: BLE001 — after a deploy, any error must end in the rollback
            return [GateResult("judging", False, f"could not judge the deployment: {one_line_error(err)}")]

    def release_own_hold(self) -> bool:
        """A hold the guard raised during this upgrade was caused by the new settings (their
        restarts): the rollback's readiness would fail on it. One raised before stays. Whether
        one was released."""
        if self.hold_release_for is None:
            return False
        try:
            target = self.target()
            reading = self.guard_probe_for(target)()
            verdict = GuardVerdict.model_validate(reading.get("status"))
            head_offset = float(reading["now"]) - time.time()  # the head's clock against ours
            if verdict.hold and verdict.hold.since >= self.started + head_offset:
                self.say(f"the guard held serving during this upgrade ({verdict.hold.reason}): releasing the hold "
                         "for the rollback", "yellow")
                self.hold_release_for(target)()
                return True
        except Exception as err:  # noqa: BLE001 — the rollback goes on; its readiness will say what is wrong
            self.say(f"could not check the guard's hold before the rollback: {one_line_error(err)}", "yellow")
        return False

    def roll_back(self) -> int:
        self.say("rolling back: writing the previous settings back and deploying them", "bold yellow")
        self.release_own_hold()
        self.stack.write_config(self.plan.backward)
        try:
            failure = self.deploy()
            # The guard goes on restarting the rejected settings while the rollback deploys; where
            # those restarts load fast (a small model) they reach its limit and it holds serving,
            # which the rollback's readiness wait then fails on. That hold is this upgrade's own:
            # released, and the rollback deployed once more.
            if failure and self.release_own_hold():
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
        assert then is not None  # roll_back judges it only with a record
        differ = [f"{what}: {a!r} before the upgrade, {b!r} now" for what, a, b in (
            ("servingImage.reference", then.image_reference, now.image_reference),
            ("modelRevision", then.model_revision, now.model_revision),
            *((f"lanes.{n}.revision", r, now.lane_revisions.get(n)) for n, r in then.lane_revisions.items()),
            *((f"launchBundles.{n}", h, now.launch_bundles.get(n)) for n, h in then.launch_bundles.items()))
            if a != b]
        if differ:
            return GateResult("known-good", False, "not what served before: " + "; ".join(differ))
        rebuilt = [n for n, i in then.image_ids.items() if now.image_ids.get(n) not in (None, i)]
        note = f" (image rebuilt from the same inputs on {', '.join(rebuilt)}: another ID)" if rebuilt else ""
        return GateResult("known-good", True, f"base {then.image_reference}, model {then.model_revision}, launch "
                                              f"bundles as before{note}")

    def report(self, title: str, results: list[GateResult]) -> None:
        self.reports.append({"title": title, "gates": [{"gate": r.gate, "passed": r.ok, "detail": r.detail}
                                                       for r in results]})
        table = Table(title=title)
        for column in ("gate", "", "detail"):
            table.add_column(column)
        for r in results:
            table.add_row(Text(r.gate), Text("pass" if r.ok else "FAIL", style="green" if r.ok else "bold red"),
                          Text(r.detail))
        self.console.print(table)

    def run(self, baseline: Optional[dict], baseline_file: Path) -> int:  # None: --gate recipe
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
                gate, result = bench_gate(target, baseline, self.plan.after, self.options, self.console)
                results.append(gate)
            return results

        results = [failure] if failure else self.judged(gates)
        self.report("upgrade gates", results)
        if all(r.ok for r in results):
            assert result is not None  # every gate passed, the bench's among them
            record_baseline(baseline_file, result, {
                "stack": self.stack.name, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "settings": {c.key: c.after for c in self.plan.changes}})
            self.say(f"upgraded; new baseline {baseline_file}", "bold green")
            return 0
        return self.roll_back()
