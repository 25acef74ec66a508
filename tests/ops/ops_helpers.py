"""What the day-2 tools' tests share: a quiet console, the flags of a small bench plan and of a
target, and how a tool's exit and one-line error are read. The stand-in endpoint is conftest.py's."""

import os

from rich.console import Console

from ops.__main__ import main as ops_main


def quiet():
    return Console(file=open(os.devnull, "w"), width=200)


SMALL_PLAN = dict(single_runs=2, single_max_tokens=5, concurrency=2, long_prompt_tokens=300, sweep=(1, 2),
                  sweep_requests_per_level=1, sweep_input_tokens=100, sweep_output_tokens=3, sweep_repeats=1)
SMALL_FLAGS = ["--runs", "2", "--max-tokens", "5", "--concurrency", "2", "--long-prompt-tokens", "300",
               "--sweep", "1,2", "--sweep-requests", "1", "--sweep-input-tokens", "100", "--sweep-output-tokens", "3",
               "--sweep-repeats", "1"]


def target_flags(target):
    return ["--endpoint", target.endpoint, "--api-key", target.api_key, "--model", target.model]


def run_ops(capsys, *args):
    """ops' exit code, stderr and stdout; argparse's own exit counts too."""
    try:
        code = ops_main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def dead_endpoint():
    """An address where nothing listens."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
