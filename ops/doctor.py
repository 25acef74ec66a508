"""doctor — why this pair may be slower than its recipe (issue 40, first part).

Each node's fingerprint, read over SSH (read-only): the rails' MTU and RoCE active MTU and the GPU's
clocks and their throttle reasons (launch/node-status.py, as `status` reads them), and the kernel,
driver, host NCCL, each HCA's PCIe link against the card's capability, deep C-states, swap,
earlyoom, the serving image and the weights' and the drafter's hashes (launch/doctor-facts.py). It
is compared with the fingerprint the recipe's figures were measured on (`baseline.fingerprint` in
recipes/) and the nodes with each other where the recipe records nothing, and the likely causes are
printed ranked by what each has cost owners where it was measured (core/fingerprint.py), each with
its evidence and its fix; read from a stack, the NCCL check's bus bandwidth at the last `up` (its
own line in the state) is judged too. Exit 1 when any cause is found. Not yet: the live figures
(decode, acceptance per position, TTFT).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from core import contract
from core.fingerprint import Finding, Fingerprint, diagnose, unknown_in_baseline
from core.recipes import Recipe

from .inputs import InputError, positive_int
from .nodes import DOCTOR_PROBE, NodeRunner, add_ssh_arguments, check_pinned, ssh_runner
from .output import add_json_argument, human_console, print_json
from .status import probe_args
from .target import (add_recipe_argument, add_target_arguments, exported_resources, resolve_target, ssh_user,
                     target_recipe)

STANDS_IN = ("nodes", "ssh_user", "recipe", "dir")
CAPPING = {"application clocks", "power cap"}  # throttle reasons that mean a cap someone set, not load or heat
BUSBW_LINE = re.compile(r"busbw ([0-9.]+) GB/s")  # launch/nccl-allreduce-check.py's own line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, endpoint=False, nodes=True)
    add_recipe_argument(parser, "its baseline fingerprint")
    parser.add_argument("--dir", help="model.dir on the nodes, where the pin's manifest lies (default: the stack's "
                                      "`modelDir` output)")
    parser.add_argument("--expect-mtu", type=positive_int, help="default: the stack's fabric.mtu, else the recipe's")
    add_ssh_arguments(parser)
    add_json_argument(parser)


def doctor_args(node: dict, model_dir: str) -> list[str]:
    args = ["--container", contract.SERVING_CONTAINER, "--manifest", f"{model_dir}/{contract.WEIGHTS_MANIFEST}"]
    for rail in node.get("rails", []):
        args += ["--hca", rail["hca"]]
    return args


def node_fingerprint(status: dict, facts: dict) -> Fingerprint:
    """What the two probes said, as the judgement reads it."""
    rails = [r for r in status.get("rails") or [] if isinstance(r, dict)]
    gpu: dict = status["gpu"] if isinstance(status.get("gpu"), dict) else {}
    capped = bool(CAPPING & set(gpu.get("throttle") or []))
    pcie = {hca: (link["speed_gts"], link["width"], link["max_speed_gts"], link["max_width"])
            for hca, link in (facts.get("pcie") or {}).items()
            if None not in (link.get("speed_gts"), link.get("width"), link.get("max_speed_gts"), link.get("max_width"))}
    return Fingerprint(
        driver=facts.get("driver"), kernel=facts.get("kernel"), nccl=facts.get("nccl"),
        image_digest=facts.get("image_digest"), model_sha256=facts.get("model_sha256"),
        drafter_sha256=facts.get("drafter_sha256"),
        gpu_clock_mhz=gpu.get("sm_clock_mhz") if capped else None, gpu_clock_max_mhz=gpu.get("max_sm_clock_mhz"),
        cstates_enabled=facts.get("cstates_enabled"),
        rail_mtu={r["iface"]: r["mtu"] for r in rails if isinstance(r.get("mtu"), int)},
        roce_active_mtu={r["iface"]: r["roce_active_mtu"] for r in rails if isinstance(r.get("roce_active_mtu"), int)},
        pcie=pcie, swap_enabled=facts.get("swap_enabled"), earlyoom_active=facts.get("earlyoom_active"))


def collect(target, runner: NodeRunner, model_dir: str) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Each node's fingerprint; a node that could not be read goes to the second map with the reason."""
    executor = target.outputs.get("executor") or "ray"
    worker_ips = [n["rayIp"] for n in target.nodes if n["role"] != "head"]

    def one(node: dict) -> tuple[str, Any]:
        try:
            status = json.loads(runner(node, probe_args(node, executor, worker_ips)))
            facts = json.loads(runner(node, doctor_args(node, model_dir), probe=DOCTOR_PROBE))
        except Exception as err:  # one unreachable node must not hide the others
            return node["name"], str(err)
        return node["name"], node_fingerprint(status, facts)

    with ThreadPoolExecutor(max_workers=max(1, len(target.nodes))) as pool:
        results = list(pool.map(one, target.nodes))
    return ({n: r for n, r in results if isinstance(r, Fingerprint)},
            {n: r for n, r in results if not isinstance(r, Fingerprint)})


def last_up_busbw(args: argparse.Namespace, head: str) -> Optional[float]:
    """The all_reduce bus bandwidth the head's NCCL check printed at the last `up` (the stack's state
    keeps the step's output); None with flags alone, an outputs file, or no such step."""
    if args.outputs_file or args.nodes:
        return None
    stdout = ((exported_resources(args).get(f"{head}-nccl-check") or {}).get("outputs") or {}).get("stdout")
    found = BUSBW_LINE.findall(stdout) if isinstance(stdout, str) else []
    return float(found[-1]) if found else None


def judge(head: str, recipe: Recipe, nodes: dict[str, Fingerprint], expected_mtu: Optional[int]) -> list[Finding]:
    if head not in nodes:
        return []
    baseline = recipe.baseline.fingerprint
    return diagnose(nodes, baseline.fingerprint(), head, expected_mtu or baseline.rail_mtu, baseline.roce_active_mtu)


def render(recipe: Recipe, findings: list[Finding], unreached: dict[str, str], unknown: list[str],
           console: Console) -> None:
    if findings:
        table = Table(title=f"likely causes, costliest first (against recipe {recipe.name})")
        for column in ("#", "node", "cause", "evidence", "cost where measured", "fix"):
            table.add_column(column)
        for rank, f in enumerate(findings, 1):
            table.add_row(Text(str(rank)), Text(f.node), Text(f.cause.title), Text(f.evidence), Text(f.cause.measured),
                          Text(f.cause.fix))
        console.print(table)
    else:
        console.print(Text(f"no known cause of a gap against recipe {recipe.name}'s fingerprint", style="green"))
    for node, why in unreached.items():
        console.print(Text(f"{node}: not read: {why}", style="bold red"))
    console.print(Text(f"the recipe's baseline does not record: {', '.join(unknown) or 'nothing'} "
                       f"({recipe.baseline.fingerprint.source})", style="dim"))


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, STANDS_IN)
    recipe = target_recipe(target)
    model_dir = args.dir or target.outputs.get("modelDir")
    if not model_dir or not str(model_dir).startswith("/"):
        raise InputError("no model directory: pass --dir (model.dir of the stack, an absolute path on the nodes)")
    check_pinned(target.nodes)
    runner = ssh_runner(ssh_user(args, target), args.ssh_key, args.ssh_option)
    nodes, unreached = collect(target, runner, str(model_dir))
    head = next(n["name"] for n in target.nodes if n["role"] == "head")
    busbw = last_up_busbw(args, head)
    if head in nodes and busbw is not None:
        nodes[head] = replace(nodes[head], nccl_busbw_gbps=busbw)
    expected_mtu = args.expect_mtu or (target.fabric or {}).get("mtu")
    findings = judge(head, recipe, nodes, expected_mtu)
    unknown = unknown_in_baseline(recipe.baseline.fingerprint.fingerprint())
    render(recipe, findings, unreached, unknown, human_console(args))
    print_json(args, {"recipe": recipe.name, "unreached": unreached, "baseline_unknown": unknown,
                      "findings": [{"rank": i, "node": f.node, "cause": f.key, "title": f.cause.title,
                                    "evidence": f.evidence, "cost": f.cause.cost, "measured": f.cause.measured,
                                    "fix": f.cause.fix} for i, f in enumerate(findings, 1)]})
    return 1 if findings or unreached else 0
