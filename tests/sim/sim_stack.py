"""The simulator as the stack `ops upgrade` changes (ops.stack.UpgradeStack).

Where the real one runs the Pulumi CLI through the Automation API, this one runs the real
program under mocks (`run_program`) and applies what changed on the simulated nodes the way
the engine would for a serving change: each remote command whose compared inputs changed runs
again (its create, with the new program's line and stdin); each node whose serving containers'
inputs changed has them replaced, workers first and the head last (ServingCluster's order), its
dockerd (the sim supervisor) restarted on the new program's inputs; then the head's readiness
wait runs, as its trigger (the new container ids) makes it. A failed step is reported as the
engine reports a failed resource: a CommandError made by the Automation API's own
`create_command_error` from the step's output.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from pulumi.automation import errors as auto_errors
from pulumi.automation._cmd import CommandResult

from ops.stack import PreviewReport, Writes, apply_writes
from program_harness import compared_inputs, run_program, unwrap

NAMESPACE = "twinspark:"
CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"


def command_error(text: str) -> Exception:
    return auto_errors.create_command_error(CommandResult(stdout=text, stderr="", code=255))


class SimStack:
    def __init__(self, sim, name: str, run_step: Callable, restart_node: Callable[[str], None]):
        self.sim, self.name = sim, name
        self.run_step, self.restart_node = run_step, restart_node
        self.blocks = {k[len(NAMESPACE):]: copy.deepcopy(v) for k, v in sim.config.items() if k.startswith(NAMESPACE)}
        self.deployed = sim.program  # the last run deployed in full (its outputs are the stack's)
        # what the nodes hold, per resource, as the engine's state does: a step is recorded once it
        # succeeded, so a failed up leaves the steps it did run recorded for the next one to diff
        self.state = {r.name: compared_inputs(r) for r in sim.program.resources}
        self.ups: list[dict] = []  # the serving block of each up, in order

    def stack_config(self, blocks: dict) -> dict:
        return {**{k: v for k, v in self.sim.config.items() if not k.startswith(NAMESPACE)},
                **{NAMESPACE + k: v for k, v in blocks.items()}}

    # ---- UpgradeStack ----
    def config(self) -> dict[str, Any]:
        return copy.deepcopy(self.blocks)

    def write_config(self, writes: Writes) -> None:
        self.blocks = apply_writes(self.blocks, writes)

    def changed(self, run) -> list:
        """The resources of `run` whose compared inputs differ from what the nodes hold."""
        return [r for r in run.resources if self.state.get(r.name) != compared_inputs(r)]

    def preview(self, writes: Writes) -> PreviewReport:
        run = run_program(self.stack_config(apply_writes(self.blocks, writes)), preview=True)
        if run.error:
            raise command_error(str(run.error))
        changed = self.changed(run)
        return PreviewReport({"update": len(changed), "same": len(run.resources) - len(changed)},
                             "\n".join(f"~ {r.type} {r.name}" for r in changed))

    def up(self, on_output: Callable[[str], None]) -> None:
        self.ups.append(copy.deepcopy(self.blocks.get("serving")))
        run = run_program(self.stack_config(self.blocks))
        if run.error:
            raise command_error(str(run.error.get("message", run.error)))
        changed = self.changed(run)
        for step in [r for r in changed if r.type == COMMAND and not r.name.endswith("-readiness-wait")]:
            self.step(run, step.name, on_output)
            self.state[step.name] = compared_inputs(step)
        containers = [r for r in changed if r.type == CONTAINER]
        nodes = {r.name.split("-serving-")[0] for r in containers}
        self.sim.program = run  # the sim's dockerd starts what this run declares
        for node in sorted(nodes, key=lambda n: n == self.head(run)):  # workers first, the head last
            on_output(f"replacing {node}'s serving containers")
            self.restart_node(node)
            self.state.update({r.name: compared_inputs(r) for r in containers if r.name.startswith(f"{node}-")})
        if nodes:
            self.step(run, f"{self.head(run)}-readiness-wait", on_output)
        self.state.update({r.name: compared_inputs(r) for r in run.resources})
        self.deployed = run

    def outputs(self) -> dict[str, Any]:
        return {name: value["value"] for name, value in self.deployed.outputs.items()}

    # ---- internals ----
    def head(self, run) -> str:
        return next(n["name"] for n in unwrap(run.outputs["nodes"]["value"]) if n["role"] == "head")

    def step(self, run, name: str, on_output: Callable[[str], None]) -> None:
        result = self.run_step(self.sim, run, name, check=False)
        on_output(f"{name}: {result.stdout[-400:]}")
        if result.returncode != 0:
            raise command_error(f"{name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
