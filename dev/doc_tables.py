#!/usr/bin/env python3
"""dev/doc_tables.py — the docs' generated blocks, written from the code that holds their facts.

    .venv/bin/python dev/doc_tables.py           # rewrite every block that drifted, name each
    .venv/bin/python dev/doc_tables.py --check   # name the blocks that drifted; exit 1 if any

A block sits between `<!-- NAME: generated ... -->` and `<!-- /NAME -->` in its page; BLOCKS says
what fills each. A new recipe, config key, firewall flow or dashboard panel is the code's change
plus this command; tests/test_docs.py holds that running it changes nothing.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a program: the repository's modules

from components import firewall, launch_bundle, model_weights, serving_image  # noqa: E402
from components.config import parameter_table, stack_file_config  # noqa: E402
from components.observability_files import panel_list, plan_from_config  # noqa: E402
from core import contract, recipes  # noqa: E402
from ops import nodes  # noqa: E402


def dashboards_of_the_recipes_stack() -> str:
    return panel_list(plan_from_config(stack_file_config(ROOT / "Pulumi.spark.yaml"), alertmanager=False))


# ---- launch/ by role ---------------------------------------------------------------------------
LAUNCH = ROOT / "launch"


def launch_names() -> set[str]:
    """The entries of launch/ as its table names them (a folder with a trailing /)."""
    return {p.name + ("/" if p.is_dir() else "") for p in LAUNCH.iterdir() if not p.name.startswith((".", "__"))}


def constants_naming_launch_files() -> dict[str, list[tuple[str, str]]]:
    """launch/ entry -> (module path, CONSTANT) for each module-level UPPER_CASE assignment of
    core/, components/ or ops/ whose value spells the entry's name (read from the source, not
    imported: an ops tool runs nothing by being read)."""
    names = {name.rstrip("/"): name for name in launch_names()}
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for package in ("core", "components", "ops"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper()):
                    continue
                for leaf in ast.walk(node.value):
                    if isinstance(leaf, ast.Constant) and leaf.value in names:
                        found[names[leaf.value]].append((str(path.relative_to(ROOT)), node.targets[0].id))
    return found


def bundle_files() -> list[str]:
    both = [*launch_bundle.static_files("ray"), *launch_bundle.static_files("mp"), contract.API_GATEWAY_SCRIPT,
            contract.KV_TIER_BOUND_SCRIPT]  # with serving.kvTier
    return [name for name in dict.fromkeys(both) if name != contract.PRELUDE]


# the boot scripts, whose names contract.boot_script spells from the role and the executor (no constant)
BOOT_SCRIPTS = {contract.boot_script(role, executor) for role in ("head", "worker") for executor in ("ray", "mp")}

# (role, its files from the code), in the table's order; None: every other launch/ entry a
# component's constant names (a step's script or payload)
LAUNCH_ROLES: list[tuple[str, Callable[[], Iterable[str]] | None]] = [
    ("the bundle: what the serving containers run, installed under `/opt/twinspark` (and the rendered "
     f"`{contract.LAUNCH_VLLM}`, `{contract.ENV_FILE}`)", bundle_files),
    ("shared by every script a step sends, and by the bundle", lambda: [contract.PRELUDE]),
    ("shared by the steps that reach a peer or keep owner records, sent ahead of a script that sources it "
     "(never in the bundle)", lambda: [contract.STEP_PRELUDE]),
    ("what a step runs on a node, and its payload (stdin after the script)", None),
    ("the serving image's build context", lambda: [serving_image.BUILD_CONTEXT.name + "/"]),
    ("on the host, as a unit (the fabric watch it imports beside it)",
     lambda: [contract.SERVING_GUARD_SCRIPT, contract.FABRIC_WATCH_MODULE]),
    ("on every node, root-owned beside the guard: the fabric's re-qualification (on a worker, the forced "
     "command of the head's re-qualification key)", lambda: [contract.REQUALIFY_SCRIPT]),
    ("on every node, as units: the node recorder (an unclean boot's report and hold), and on a node that "
     "watches another's plug, the power watch", lambda: [contract.NODE_RECORDER_SCRIPT, contract.POWER_WATCH_SCRIPT]),
    (f"on a worker, root-owned: all a sync key may run there (its forced command, beside `{model_weights.WEIGHTS_PROGRAM}`)",
     lambda: [model_weights.FORCED_COMMAND]),
    ("probes `ops` sends over SSH", lambda: [nodes.NODE_PROBE.name, nodes.FACTS_PROBE.name, nodes.DOCTOR_PROBE.name]),
    ("several lanes, on the head in a container of its own: the lanes' router, each request to the gateway of the "
     "lane serving the model it names", lambda: [contract.LANE_ROUTER_SCRIPT]),
]

def launch_roles_table() -> str:
    """docs/architecture.md's `launch/` by role: each entry once, with the constants naming it."""
    named = constants_naming_launch_files()
    given = {role: list(files()) for role, files in LAUNCH_ROLES if files is not None}
    placed = {name for files in given.values() for name in files}
    rest = sorted(name for name, where in named.items()
                  if name not in placed and any(m.startswith("components/") for m, _ in where))
    rows = [(role, given.get(role, rest)) for role, _ in LAUNCH_ROLES]
    placed |= set(rest)
    if placed != launch_names():
        raise SystemExit("doc_tables: launch/ entries with no role (no constant of components/ names them, nor a "
                         f"role of LAUNCH_ROLES): {sorted(launch_names() - placed)}")
    lines = ["| role | files | its name lives in |", "|---|---|---|"]
    for role, files in rows:
        where: dict[str, list[str]] = defaultdict(list)
        for name in files:
            for module, constant in named.get(name) or ([("core/contract.py", "boot_script")] if name in BOOT_SCRIPTS else []):
                if constant not in where[module]:
                    where[module].append(constant)
        lives = "; ".join(f"`{module}` ({', '.join(f'`{c}`' for c in constants)})" for module, constants in where.items())
        lines.append(f"| {role} | {', '.join(f'`{name}`' for name in files)} | {lives} |")
    return "\n".join(lines) + "\n"


# (page, block) -> what fills it
BLOCKS: dict[tuple[str, str], Callable[[], str]] = {
    ("docs/configuration.md", "parameters"): parameter_table,
    ("docs/configuration.md", "models"): recipes.models_table,
    ("docs/security.md", "flows"): firewall.flows_table,
    ("docs/observability.md", "panels"): dashboards_of_the_recipes_stack,
    ("docs/architecture.md", "launch-roles"): launch_roles_table,
}


def block_span(text: str, name: str, page: str) -> tuple[int, int]:
    """Where the block's body starts (the line after its opening comment) and ends (its closing one)."""
    opening, closing = text.find(f"<!-- {name}:"), text.find(f"<!-- /{name} -->")
    if opening < 0 or closing < opening:
        raise SystemExit(f"doc_tables: {page} has no block `<!-- {name}: ... -->` ... `<!-- /{name} -->`")
    return text.index("\n", opening) + 1, closing


def drifted(root: Path = ROOT, write: bool = False) -> list[str]:
    """`page: block` for each block that is not what its generator writes (rewritten when `write`)."""
    names = []
    for (page, name), generate in BLOCKS.items():
        path = root / page
        text = path.read_text()
        start, end = block_span(text, name, page)
        wanted = generate()
        if text[start:end] != wanted:
            names.append(f"{page}: {name}")
            if write:
                path.write_text(text[:start] + wanted + text[end:])
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing: name the blocks that drifted, exit 1 if any")
    args = parser.parse_args(argv)
    names = drifted(write=not args.check)
    for name in names:
        print(f"{name}: {'drifted from the code' if args.check else 'rewritten'}")
    return 1 if names and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
