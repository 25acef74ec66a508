"""python -m ops {status,clear-hold,bench,needle,client-setup,pin-host-keys,upgrade} — see each one's --help."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from components.recipes import DEFAULT_RECIPE

from .bench import RECIPE_TOLERANCE
from .inputs import ToolError, positive_float, positive_int, positive_int_list
from .needle import DEFAULT_MAX_TOKENS, parse_sizes
from .pin_host_keys import add_parser as add_pin_host_keys_parser
from .target import add_target_arguments, check_endpoint, resolve_target, ssh_user, status_expectations, target_recipe

# Overall deadlines: a hanging server must not hold a run for hours. The default bench takes
# ~2 min at the recipe's rates; a default needle run up to ~2 h when the model thinks long.
BENCH_DEADLINE_MIN = 30
NEEDLE_DEADLINE_MIN = 180
COMPARE_RECIPE = "recipe"  # --compare recipe: the recipe's published baseline, not a file


class Parser(argparse.ArgumentParser):
    """argparse's errors in one line (its usage block would bury the reason), exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def add_ssh_arguments(parser: argparse.ArgumentParser) -> None:
    """How the tools reach the nodes (ops status's ssh runner), always held to each node's pinned host key."""
    parser.add_argument("--ssh-user", default=os.environ.get("TWINSPARK_SSH_USER"), help="default: the stack's ssh.user")
    parser.add_argument("--ssh-key", help="private key (default: ssh's own choice / the agent)")
    parser.add_argument("--ssh-option", action="append", default=[],
                        help="extra `ssh -o` option, repeatable (the host key check comes first: none loosens it)")


def add_recipe_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--recipe", help=f"the serving recipe, by name, for {what} (default: the stack's `recipe` "
                                         "output)")


def fraction(text: str) -> float:
    """argparse type: a share such as 0.2 (above 0, below 1)."""
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text} is not below 1 (0.2 is 20%)")
    return value


def add_upgrade_parser(sub) -> None:
    from .upgrade import DEFAULT_CANARY_TIMEOUT_MIN, parse_setting

    p = sub.add_parser("upgrade", help="change settings, deploy, gate (readiness, canary, bench), roll back on failure",
                       description="Exit 0 upgraded; 1 a gate failed and serving is back on the previous settings; "
                                   "2 bad input (nothing changed); 3 ROLLBACK FAILED; 4 another update holds the stack.")
    p.add_argument("--stack", help="the Pulumi stack to upgrade (required)")
    p.add_argument("--set", dest="settings", action="append", type=parse_setting, required=True, metavar="KEY=VALUE",
                   help="serving.<key> or model.revision, repeatable; a list as JSON: serving.extraArgs='[\"--x\"]'")
    p.add_argument("--dry-run", action="store_true", help="show the preview of what would change; change nothing")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed worsening against the baseline (0.10 = 10%%), "
                   "or a figure's run-to-run spread when larger")
    p.add_argument("--gate", choices=("baseline", "recipe"), default="baseline",
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
    p.add_argument("--bench-deadline-min", type=positive_float, default=BENCH_DEADLINE_MIN)
    add_ssh_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m ops", description=__doc__)
    sub = parser.add_subparsers(dest="tool", required=True)

    p = sub.add_parser("status", help="nodes, rails, Ray, GPUs, guard, endpoint and spec decode at a glance")
    add_target_arguments(p)
    add_ssh_arguments(p)
    p.add_argument("--expect-mtu", type=int, help="default: the stack's fabric.mtu")
    p.add_argument("--expect-speed-mbps", type=int, help="default: the stack's fabric.linkSpeedMbps")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("clear-hold", help="serving held by the guard after a restart loop: let it start again")
    add_target_arguments(p)
    add_ssh_arguments(p)

    p = sub.add_parser("bench", help="the recipe's benchmarks: decode, concurrency, TTFT, prefill, sweep")
    add_target_arguments(p)
    p.add_argument("--runs", type=positive_int, default=3, help="single-stream runs to average")
    p.add_argument("--max-tokens", type=positive_int, default=256, help="output tokens per single/concurrent request")
    p.add_argument("--concurrency", type=positive_int, default=4, help="streams in the N-way aggregate test")
    p.add_argument("--long-prompt-tokens", type=positive_int, default=7000)
    p.add_argument("--sweep", type=positive_int_list, default=[1, 2, 4, 6], help="concurrency levels, comma separated")
    p.add_argument("--sweep-requests", type=positive_int, default=2, help="requests per level, times the level")
    p.add_argument("--sweep-input-tokens", type=positive_int, default=1000)
    p.add_argument("--sweep-output-tokens", type=positive_int, default=128)
    p.add_argument("--sweep-repeats", type=positive_int, default=3,
                   help="times each sweep level is measured: the run-to-run spread --compare allows")
    p.add_argument("--profile", help="serving profile in use (default, multiagent), kept in the plan; "
                                     "--compare refuses a baseline with another one")
    p.add_argument("--cache-salt", action="store_true",
                   help="also send vLLM's per-request cache_salt (vLLM >= 0.9 with the V1 engine; the prompt "
                        "salt alone already defeats the prefix cache)")
    p.add_argument("--output", "-o", help="write the results JSON here")
    p.add_argument("--compare", help="a previous results JSON made with the same plan: flag regressions; or "
                                     "`recipe`: the serving recipe's published baseline (a file named recipe: ./recipe)")
    p.add_argument("--recipe-tolerance", type=fraction, default=RECIPE_TOLERANCE,
                   help="with --compare recipe: the shortfall below a recipe's figure allowed (default %(default)s); "
                        "a recipe's figure has no spread, so a fixed band stands in for it")
    add_recipe_argument(p, "--compare recipe")
    p.add_argument("--allow-plan-mismatch", action="store_true",
                   help="compare with a baseline made with another plan anyway (with a warning)")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed worsening before a regression (0.10 = 10%%); a "
                   "figure noisier than that in its own repeats is allowed its spread")
    p.add_argument("--deadline-min", type=positive_float, default=BENCH_DEADLINE_MIN,
                   help=f"stop the whole run after this many minutes (default {BENCH_DEADLINE_MIN})")

    p = sub.add_parser("needle", help="long-context retrieval probe: real failures and junk per size")
    add_target_arguments(p)
    p.add_argument("--sizes", type=parse_sizes,
                   help="context sizes in tokens, comma separated (default: the recipe's needleSizes)")
    add_recipe_argument(p, "its needle sizes")
    p.add_argument("--trials", type=positive_int, default=5)
    p.add_argument("--needles", type=positive_int, default=3)
    p.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                   help="per reply, reasoning included; a reply cut off here counts as truncated, not failed")
    p.add_argument("--profile", help="serving profile in use (default, multiagent), kept in the plan")
    p.add_argument("--output", "-o")
    p.add_argument("--deadline-min", type=positive_float, default=NEEDLE_DEADLINE_MIN,
                   help=f"stop the whole run after this many minutes, keeping the sizes done (default {NEEDLE_DEADLINE_MIN})")

    p = sub.add_parser("client-setup", help="write Codex and Claude Code configs from the stack outputs")
    add_target_arguments(p)
    p.add_argument("--codex-home", type=Path, default=Path(os.environ.get("CODEX_HOME", "~/.codex")).expanduser())
    p.add_argument("--claude-env-file", type=Path, default=Path("~/.config/twinspark/claude-code.env").expanduser())

    add_pin_host_keys_parser(sub)
    add_upgrade_parser(sub)
    return parser


def measurement_recipe(args, target):
    """The recipe bench or needle needs (the needle's default sizes, --compare recipe), or None;
    read before any request, so a wrong --recipe costs one line."""
    if args.tool == "needle" and args.sizes is None:
        return target_recipe(target, default=DEFAULT_RECIPE)  # a stack that names none serves the default
    if args.tool == "bench" and args.compare == COMPARE_RECIPE:
        return target_recipe(target)
    return None


def run_measurement(args, target, recipe, console: Console) -> int:
    """bench or needle; bad input is found before any request."""
    from .bench import BenchPlan, run_bench
    from .needle import run_needle

    profile = args.profile  # the stack does not export its serving profile; unknown stays null in the plan
    deadline_s = args.deadline_min * 60
    if args.tool == "needle":
        sizes = args.sizes
        if sizes is None:
            sizes = recipe.needle_sizes
            console.print(Text(f"sizes: recipe {recipe.name}'s needleSizes" + ("" if target.recipe else
                               " (no recipe named: the default recipe's; pass --recipe)"), style="dim"))
        return run_needle(target, sizes, args.trials, args.needles, args.max_tokens, console, args.output,
                          profile, deadline_s=deadline_s)
    plan = BenchPlan(single_runs=args.runs, single_max_tokens=args.max_tokens, concurrency=args.concurrency,
                     long_prompt_tokens=args.long_prompt_tokens, sweep=args.sweep,
                     sweep_requests_per_level=args.sweep_requests, sweep_input_tokens=args.sweep_input_tokens,
                     sweep_output_tokens=args.sweep_output_tokens, sweep_repeats=args.sweep_repeats)
    return run_bench(target, plan, args.output, None if recipe else args.compare, args.tolerance, console, profile=profile,
                     send_cache_salt=args.cache_salt, allow_plan_mismatch=args.allow_plan_mismatch,
                     deadline_s=deadline_s, recipe=recipe, recipe_tolerance=args.recipe_tolerance)


def run_tool(args, console: Console) -> int:
    target = resolve_target(args, need_nodes=args.tool in ("status", "clear-hold"))
    if args.tool in ("status", "clear-hold"):
        from .status import pinned_key

        for node in target.nodes:  # every node verifiable, before any is reached
            pinned_key(node)
    if args.tool == "status":
        from .status import run_status, ssh_runner

        expect = status_expectations(args, target)
        return run_status(target, ssh_runner(expect.ssh_user, args.ssh_key, args.ssh_option), args.json, expect.mtu,
                          expect.speed_mbps, console)
    if args.tool == "clear-hold":
        from .hold import clear_hold
        from .status import ssh_shell

        return clear_hold(target, ssh_shell(ssh_user(args, target), args.ssh_key, args.ssh_option), console)
    if args.tool in ("bench", "needle"):
        recipe = measurement_recipe(args, target)
        target.model = check_endpoint(target)  # a dead endpoint or a refused key ends here, in one line
        return run_measurement(args, target, recipe, console)
    from .client_setup import setup_clients

    written = setup_clients(target.outputs, args.codex_home, args.claude_env_file)
    for f in written:
        console.print(Text(f"{f.action:9} {f.path}" + (f"  (previous kept as {f.backup.name})" if f.backup else "")))
    console.print(Text.assemble("Claude Code: ", (f"source {args.claude_env_file}", "bold"),
                                '; Codex: export VLLM_API_KEY="$(pulumi stack output apiKey --show-secrets)"'))
    return 0


CHECKOUT = Path(__file__).resolve().parent.parent  # the Pulumi project and its .twinspark/


def run_upgrade_tool(args, console: Console, work_dir: Path = CHECKOUT) -> int:
    from .stack import AutomationStack
    from .upgrade import run_upgrade, ssh_access_check, ssh_guard_probe, ssh_hold_release

    ssh = (args.ssh_user, args.ssh_key, args.ssh_option)
    return run_upgrade(args, console, lambda name: AutomationStack(name, work_dir), ssh_guard_probe(*ssh), work_dir,
                       ssh_hold_release(*ssh), ssh_access_check(*ssh))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.tool == "pin-host-keys":  # reads the stack file, not the stack's outputs
        from .pin_host_keys import run_pin_host_keys

        return run_pin_host_keys(args)
    try:
        if args.tool == "upgrade":
            return run_upgrade_tool(args, Console())
        return run_tool(args, Console())
    except ToolError as err:
        print(f"ops {args.tool}: {err}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
