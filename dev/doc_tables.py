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
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a program: the repository's modules

from components import firewall  # noqa: E402
from components.config import parameter_table  # noqa: E402
from components.observability_files import panel_list, plan_from_config  # noqa: E402
from core import recipes  # noqa: E402
from sim_images import sim_stack  # noqa: E402  (a stack file's structured config)


def dashboards_of_the_recipes_stack() -> str:
    return panel_list(plan_from_config(sim_stack(ROOT / "Pulumi.spark.yaml"), alertmanager=False))


# (page, block) -> what fills it
BLOCKS: dict[tuple[str, str], Callable[[], str]] = {
    ("README.md", "parameters"): parameter_table,
    ("README.md", "models"): recipes.models_table,
    ("docs/security.md", "flows"): firewall.flows_table,
    ("docs/observability.md", "panels"): dashboards_of_the_recipes_stack,
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
