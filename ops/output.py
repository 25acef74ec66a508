"""How the day-2 tools print: one console for all of them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, TextIO

from rich.console import Console

# wide enough that no line of a report or table is ever cut, narrow enough for Rich's layout
PIPED_WIDTH = 10_000


def tool_console(file: Optional[TextIO] = None, **options: Any) -> Console:
    """A terminal's own width; piped or redirected (`ops status > f`, a script), no hard wrap: each
    line as long as it is, so a grep or a diff sees whole lines."""
    out = file or sys.stdout
    if not out.isatty():
        options.setdefault("width", PIPED_WIDTH)
    return Console(file=out, **options)


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="the result as one JSON document on stdout (what a person reads goes to stderr)")


def human_console(args: argparse.Namespace, **options: Any) -> Console:
    """Where a person's output goes: stdout, or stderr under --json, so stdout holds the JSON alone."""
    return tool_console(sys.stderr if getattr(args, "json", False) else None, **options)


def print_json(args: argparse.Namespace, document: Any) -> None:
    """The tool's result on stdout, under --json only."""
    if getattr(args, "json", False):
        print(json.dumps(document, indent=2, default=str), flush=True)
