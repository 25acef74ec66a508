"""`python -m ops`: one table of tools (ops/__main__.py), each tool's module its own parser and
runner, and node access in ops/nodes.py alone."""

import argparse
import ast
import os
import subprocess
import sys

import pytest

from ops.__main__ import TOOLS, build_parser, main as ops_main
from ops.inputs import InputError
from program_harness import ROOT

# The fewest flags each tool parses with (upgrade requires --set).
MINIMAL_FLAGS = {"upgrade": ["--set", "serving.image=repo:tag"]}


def test_every_tool_in_the_table_has_a_parser_and_a_runner_and_is_a_subcommand():
    for name, tool in TOOLS.items():
        assert callable(getattr(tool.module, "add_arguments", None)), f"{name}: {tool.module.__name__}.add_arguments"
        assert callable(getattr(tool.module, "run", None)), f"{name}: {tool.module.__name__}.run"
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subcommands.choices) == list(TOOLS)


def test_ops_help_lists_every_tool_with_its_help():
    proc = subprocess.run([sys.executable, "-m", "ops", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    for name, tool in TOOLS.items():
        assert f"    {name} " in proc.stdout and tool.help in proc.stdout, name


def test_each_tools_help_shows_its_defaults_but_never_a_value_from_the_environment():
    env = {**os.environ, "COLUMNS": "200", "VLLM_API_KEY": "sk-from-the-env-123", "TWINSPARK_SSH_USER": "env-user-456"}
    shown = {}
    for name in TOOLS:
        proc = subprocess.run([sys.executable, "-m", "ops", name, "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "sk-from-the-env-123" not in proc.stdout and "env-user-456" not in proc.stdout, name
        shown[name] = proc.stdout
    assert "--trials TRIALS       default: 5" in shown["needle"]
    assert "more than this (default: 0)" in shown["needle"]  # a default of 0 is shown too
    assert "--api-key API_KEY     default: $VLLM_API_KEY" in shown["bench"]


@pytest.mark.parametrize("name", list(TOOLS))
def test_main_runs_the_tool_named_with_what_its_parser_made(monkeypatch, name):
    ran = []
    for other, tool in TOOLS.items():
        monkeypatch.setattr(tool.module, "run", lambda args, other=other: ran.append((other, args.tool)) or 7)
    assert ops_main([name, *MINIMAL_FLAGS.get(name, [])]) == 7
    assert ran == [(name, name)]


@pytest.mark.parametrize("name", list(TOOLS))
def test_bad_input_found_by_a_tool_is_one_line_and_its_exit_code(monkeypatch, capsys, name):
    def refuse(args):
        raise InputError("--x: not what is expected")

    monkeypatch.setattr(TOOLS[name].module, "run", refuse)
    assert ops_main([name, *MINIMAL_FLAGS.get(name, [])]) == 2
    assert capsys.readouterr().err == f"python -m ops {name}: --x: not what is expected\n"


def test_only_ops_nodes_runs_ssh():
    """Node access for every tool is ops/nodes.py: no other module of ops spells the ssh command."""
    spelling_ssh = []
    for path in sorted((ROOT / "ops").glob("*.py")):
        if path.name == "nodes.py":
            continue
        tree = ast.parse(path.read_text())
        spelling_ssh += [f"{path.name}:{node.lineno}" for node in ast.walk(tree)
                         if isinstance(node, ast.Constant) and node.value == "ssh"]
    assert spelling_ssh == []
