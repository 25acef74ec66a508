"""doctor — why this pair may be slower than its recipe (issue 40, first part).

Each node's fingerprint, read over SSH (read-only): the rails' MTU and RoCE active MTU and the GPU's
clocks and their throttle reasons (launch/node-status.py, as `status` reads them), and the kernel,
driver, host NCCL, each HCA's PCIe link against the card's capability, deep C-states, swap,
earlyoom, the serving image and the weights' and the drafter's hashes (launch/doctor-facts.py). It
is compared with the fingerprint the recipe's figures were measured on (`baseline.fingerprint` in
recipes/) and the nodes with each other where the recipe records nothing, and the likely causes are
printed ranked by what each has cost owners where it was measured (core/fingerprint.py), each with
its evidence and its fix; read from a stack, the NCCL check's bus bandwidth at the last `up` (its
own line in the state) is judged too. With --live it also measures the endpoint (ops bench's single
stream, 4-way and 7k-token TTFT, about a minute on a Spark pair) beside the recipe's published
figures, and spec decode's acceptance per draft position over those requests (vLLM's counters
before and after): the symptoms, above the causes. Exit 1 when any cause is found, or a figure falls
short of the recipe's beyond bench's band.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, replace
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import httpx
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core import contract
from core.fingerprint import Finding, Fingerprint, diagnose, unknown_in_baseline
from core.recipes import Recipe

from .bench import measure
from .bench_compare import compare_with_recipe
from .bench_requests import BenchPlan
from .inputs import InputError, positive_int
from .nodes import DOCTOR_PROBE, NodeRunner, add_ssh_arguments, check_pinned, ssh_runner
from .output import add_json_argument, human_console, print_json
from .status import parse_metrics, probe_args, spec_decode
from .target import (add_recipe_argument, add_target_arguments, exported_resources, resolve_target, ssh_user,
                     target_recipe)

STANDS_IN = ("nodes", "ssh_user", "recipe", "dir")
CAPPING = {"application clocks", "power cap"}  # throttle reasons that mean a cap someone set, not load or heat
BUSBW_LINE = re.compile(r"busbw ([0-9.]+) GB/s")  # launch/nccl-allreduce-check.py's own line
# --live: what the recipes' figures are of (single stream, 4-way, a 7k-token prompt's TTFT), no sweep
LIVE_PLAN = BenchPlan(single_runs=3, single_max_tokens=256, concurrency=4, long_prompt_tokens=7000, sweep=(),
                      sweep_repeats=0)
SPEC_COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_drafts_total")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, nodes=True)
    parser.add_argument("--live", action="store_true",
                        help="also measure the endpoint (about a minute: 3 single streams, 4 at once, a 7k-token prompt) "
                             "and spec decode's acceptance per draft position, beside the recipe's figures")
    add_recipe_argument(parser, "its baseline fingerprint")
    parser.add_argument("--dir", help="model.dir on the nodes, where the pin's manifest lies (default: the stack's "
                                      "`modelDir` output)")
    parser.add_argument("--expect-mtu", type=positive_int, help="default: the stack's fabric.mtu, else the recipe's")
    add_ssh_arguments(parser)
    add_json_argument(parser)


def doctor_args(node: dict, model_dir: str) -> list[str]:
    args = ["--container", contract.SERVING_CONTAINER, "--manifest", f"{model_dir}/{contract.WEIGHTS_MANIFEST}",
            "--nccl-debug-dir", contract.NCCL_DEBUG_DIR]
    for rail in node.get("rails", []):
        args += ["--hca", rail["hca"]]
    return args


def node_fingerprint(status: dict, facts: dict) -> Fingerprint:
    """What the two probes said, as the judgement reads it."""
    rails = [r for r in status.get("rails") or [] if isinstance(r, dict)]
    gpu: dict = status["gpu"] if isinstance(status.get("gpu"), dict) else {}
    capped = bool(CAPPING & set(gpu.get("throttle") or []))
    power: dict = facts["power"] if isinstance(facts.get("power"), dict) else {}
    pcie = {hca: (link["speed_gts"], link["width"], link["max_speed_gts"], link["max_width"])
            for hca, link in (facts.get("pcie") or {}).items()
            if None not in (link.get("speed_gts"), link.get("width"), link.get("max_speed_gts"), link.get("max_width"))}
    return Fingerprint(
        driver=facts.get("driver"), kernel=facts.get("kernel"), nccl=facts.get("nccl"), nccl_image=facts.get("nccl_image"),
        image_digest=facts.get("image_digest"), bios=facts.get("bios"), hca_firmware=facts.get("hca_firmware"),
        gid_index=facts.get("gid_index"), model_sha256=facts.get("model_sha256"),
        drafter_sha256=facts.get("drafter_sha256"),
        gpu_clock_mhz=gpu.get("sm_clock_mhz") if capped else None, gpu_clock_max_mhz=gpu.get("max_sm_clock_mhz"),
        cstates_enabled=facts.get("cstates_enabled"),
        rail_mtu={r["iface"]: r["mtu"] for r in rails if isinstance(r.get("mtu"), int)},
        roce_active_mtu={r["iface"]: r["roce_active_mtu"] for r in rails if isinstance(r.get("roce_active_mtu"), int)},
        pcie=pcie, swap_enabled=facts.get("swap_enabled"), earlyoom_active=facts.get("earlyoom_active"),
        platform_profile=power.get("platform_profile"), cpu_governor=power.get("governor"),
        cpufreq_driver=power.get("cpufreq_driver"), page_cache_gib=facts.get("page_cache_gib"))


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


def counters(target) -> dict:
    """vLLM's spec decode counters through the gateway (the key is wanted on /metrics too)."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        reply = httpx.get(f"{target.base_url}/metrics", headers=headers, timeout=10)
        reply.raise_for_status()
    except httpx.HTTPError:
        return {}
    return {name: values for name, values in parse_metrics(reply.text).items() if name in SPEC_COUNTERS}


def counters_between(before: dict, after: dict) -> dict:
    """Each counter series' growth from `before` to `after` (a series new since counts whole)."""
    grown: dict = {}
    for name, series in after.items():
        earlier = {tuple(sorted(labels.items())): value for labels, value in before.get(name, [])}
        grown[name] = [(labels, value - earlier.get(tuple(sorted(labels.items())), 0.0)) for labels, value in series]
    return grown


def live_figures(target, recipe: Recipe, console: Console) -> dict:
    """The endpoint measured as the recipe's figures are, and spec decode over those requests."""
    before = counters(target)
    result = measure(target, LIVE_PLAN, console)
    rows = compare_with_recipe(result, recipe)
    return {"figures": [{"figure": r["label"], "measured": r["current"], "recipe": r["baseline"],
                         "change": r["change"], "short": r["regression"], "source": r["source"]} for r in rows],
            "single_stream_tok_s": result["single_stream"]["decode_tok_s"],
            "ttft_7k_s": result["long_prompt"]["ttft_s"],
            "spec_decode": spec_decode(counters_between(before, counters(target))),
            "errors": result["errors"]}


def render_live(live: dict, console: Console) -> None:
    table = Table(title="measured now, beside the recipe's figures")
    for column in ("figure", "measured", "recipe", "change", ""):
        table.add_column(column)
    for f in live["figures"]:
        table.add_row(Text(f["figure"]), Text(f"{f['measured']:.2f}"), Text(f"{f['recipe']:g}"),
                      Text(f"{f['change']:+.0%}"), Text("short" if f["short"] else "", style="bold red"))
    console.print(table)
    spec = live["spec_decode"]
    if spec:
        positions = " ".join(f"{p:.2f}" for p in spec["per_position"])
        console.print(Text(f"spec decode over these requests: acceptance {spec['acceptance']:.2f}, per draft "
                           f"position {positions or 'n/a'}"))
    for error in live["errors"]:
        console.print(Text(f"request failed: {error}", style="red"))


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
    target = resolve_target(args, STANDS_IN + (("endpoint", "api_key") if args.live else ()))
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
    console = human_console(args)
    live = live_figures(target, recipe, console) if args.live else None
    if live:
        render_live(live, console)
    render(recipe, findings, unreached, unknown, console)
    short = [f["figure"] for f in live["figures"] if f["short"]] if live else []
    if short and not findings:
        console.print(Text(f"short of the recipe ({', '.join(short)}) with no known cause in the fingerprint: "
                           "`twinspark bench --compare recipe` measures it in full", style="bold yellow"))
    for label, shown in (("NCCL_IB_GID_INDEX of the last serving start", lambda fp: fp.gid_index),
                         ("page cache (Cached + Buffers), GiB", lambda fp: fp.page_cache_gib),
                         ("power (ACPI platform profile / CPU governor)",
                          lambda fp: f"{fp.platform_profile or 'none'} / {fp.cpu_governor or 'none'}")):
        each = ", ".join(f"{node} {'unknown' if shown(fp) is None else shown(fp)}" for node, fp in sorted(nodes.items()))
        console.print(Text(f"{label}: {each}", style="dim"))
    print_json(args, {"recipe": recipe.name, "unreached": unreached, "baseline_unknown": unknown, "live": live,
                      "fingerprints": {node: asdict(fp) for node, fp in sorted(nodes.items())},
                      "findings": [{"rank": i, "node": f.node, "cause": f.key, "title": f.cause.title,
                                    "evidence": f.evidence, "cost": f.cause.cost, "measured": f.cause.measured,
                                    "fix": f.cause.fix} for i, f in enumerate(findings, 1)]})
    return 1 if findings or unreached or short else 0
