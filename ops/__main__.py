"""The day-2 tools: `twinspark TOOL` (in a checkout also `python -m ops TOOL`); each one's --help says more."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType
from typing import NamedTuple

from twinspark import __version__

from . import bench, clear_hold, client_setup, doctor, forensics, needle, pin_host_keys, status, upgrade, verify_weights
from .inputs import ToolError

class Tool(NamedTuple):
    """A day-2 tool: its module exports add_arguments(parser) and run(args) -> exit code."""
    module: ModuleType
    help: str


TOOLS = {
    "status": Tool(status, "nodes, rails, Ray, GPUs, guard, endpoint and spec decode at a glance"),
    "doctor": Tool(doctor, "why the pair may be slower than its recipe: fingerprints compared, causes ranked"),
    "clear-hold": Tool(clear_hold, "serving held by the guard after a restart loop: let it start again"),
    "forensics": Tool(forensics, "what a node's unclean boots left (kernel log, Xid, memory): the reports, or one"),
    "bench": Tool(bench, "the recipe's benchmarks: decode, concurrency, TTFT, prefill, sweep"),
    "needle": Tool(needle, "long-context retrieval probe: real failures and junk per size"),
    "client-setup": Tool(client_setup, "write Codex and Claude Code configs from the stack outputs"),
    "pin-host-keys": Tool(pin_host_keys, "read each node's SSH host key once and pin it in the stack config"),
    "upgrade": Tool(upgrade, "change settings, deploy, gate (readiness, canary, bench), roll back on failure"),
    "verify-weights": Tool(verify_weights, "hash every weights file on every node again: bit rot named, and its repair"),
}


class Parser(argparse.ArgumentParser):
    """argparse's errors in one line (its usage block would bury the reason), exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every flag's default in its help, where the help does not already say it in words (those
    from the environment, such as --api-key's $VLLM_API_KEY, say where, never the value)."""
    for action in parser._actions:  # argparse has no public list of a parser's actions
        if (action.default is None or action.default is False or action.default == [] or action.default == argparse.SUPPRESS
                or "default" in (action.help or "")):
            continue
        action.help = f"{action.help} (default: %(default)s)" if action.help else "default: %(default)s"


def build_parser(prog: str = "python -m ops") -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description=__doc__)
    parser.add_argument("--version", action="version", version=f"twinspark {__version__}")
    sub = parser.add_subparsers(dest="tool", required=True)
    for name, tool in TOOLS.items():
        tool_parser = sub.add_parser(name, help=tool.help)
        tool.module.add_arguments(tool_parser)
        show_defaults(tool_parser)
    return parser


def main(argv=None, prog: str = "python -m ops") -> int:
    """`prog`: how the tools were started, as their help and errors name them (twinspark/cli.py: `twinspark`)."""
    args = build_parser(prog).parse_args(argv)
    try:
        return TOOLS[args.tool].module.run(args)
    except ToolError as err:
        print(f"{prog} {args.tool}: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
