"""The day-2 tools on a stack that serves several lanes (issue 41 part 4): `--model` picks the lane
(its recipe for the recipe's figures and sizes), a model no lane serves is one line naming every
lane's, and `status` says of each lane whether the endpoint serves its model."""

import argparse
import json

import pytest
from rich.console import Console

from ops import status
from ops.target import resolve_target
from ops_helpers import run_ops
from toolbox import one_clear_line

LANES = {"coder": {"model": "coder", "recipe": "gpt-oss-120b", "nodes": ["spark1"], "revision": "a" * 40},
         "fast": {"model": "fast", "recipe": "minimax-m2.7", "nodes": ["spark2"], "revision": "b" * 40}}
NODES = [{"name": "spark1", "role": "head", "host": "192.168.1.10", "rayIp": "10.0.0.1", "rails": []},
         {"name": "spark2", "role": "worker", "host": "192.168.1.11", "rayIp": "10.0.0.2", "rails": []}]


def lanes_outputs(tmp_path, endpoint="http://192.168.1.10:8000/v1", api_key="sk-test"):
    """A two-lane stack's outputs as `pulumi stack output --json --show-secrets` writes them."""
    outputs = {"endpoint": endpoint, "apiKey": api_key, "model": "coder", "recipe": "gpt-oss-120b", "nodes": NODES,
               "sshUser": "nvidia", "fabric": {"mtu": 9000, "linkSpeedMbps": 200000}, "lanes": LANES}
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(outputs))
    return path


def target_args(outputs_file, **flags) -> argparse.Namespace:
    return argparse.Namespace(**{"outputs_file": str(outputs_file), "stack": None, "project_dir": None, "endpoint": None,
                                 "api_key": None, "model": None, "recipe": None, "nodes": None, **flags})


def test_the_model_flag_picks_the_lane_and_its_recipe(tmp_path):
    outputs = lanes_outputs(tmp_path)
    default = resolve_target(target_args(outputs))
    assert (default.model, default.lane, default.recipe) == ("coder", "coder", "gpt-oss-120b")  # the head's lane
    fast = resolve_target(target_args(outputs, model="fast"))
    assert (fast.model, fast.lane, fast.recipe) == ("fast", "fast", "minimax-m2.7")
    assert resolve_target(target_args(outputs, model="fast", recipe="gpt-oss-120b")).recipe == "gpt-oss-120b"
    # an endpoint of the owner's own is not the stack's: its model is not held to the stack's lanes
    elsewhere = resolve_target(target_args(outputs, model="other", endpoint="http://10.9.9.9:8000/v1"))
    assert (elsewhere.model, elsewhere.lane, elsewhere.recipe) == ("other", None, "gpt-oss-120b")


@pytest.mark.parametrize("tool", ["status", "bench", "needle", "doctor"])
def test_a_model_no_lane_serves_is_one_line_naming_every_lanes_model(tmp_path, capsys, tool):
    code, err, _ = run_ops(capsys, tool, "--outputs-file", str(lanes_outputs(tmp_path)), "--model", "codr")
    assert code == 2
    one_clear_line(err, f"ops {tool}: ", "--model 'codr': no lane of the stack serves it",
                   "it serves coder (lane coder), fast (lane fast)")


def test_status_names_a_lane_whose_model_the_endpoint_does_not_serve(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.model = "coder"  # the router lists the coder lane alone: the fast lane's engine is gone
    target = resolve_target(target_args(lanes_outputs(tmp_path, target.endpoint, target.api_key)))
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key, target.model), "nodes": [],
              "lanes": target.outputs["lanes"]}
    assert status.problems(report, 9000, 200000) == [
        f"lane fast (spark2): {target.base_url} does not serve its model fast"]
    status.render(report, status.problems(report, 9000, 200000), Console(width=200))
    shown = capsys.readouterr().out
    assert "lanes (one model each, behind the endpoint)" in shown
    assert [line.split() for line in shown.splitlines() if line.startswith("│ fast")] == [
        ["│", "fast", "│", "fast", "│", "minimax-m2.7", "│", "spark2", "│", "NOT", "SERVED", "│"]]
    behaviour.model = "fast"  # now the coder lane is the one gone: the stack's own model, named once
    report["endpoint"] = status.endpoint_status(target.base_url, target.api_key, target.model)
    assert status.problems(report, 9000, 200000) == [
        f"endpoint {target.base_url}: serves fast, not the stack's model coder"]


def lanes_client_outputs(endpoint: str, api_key: str) -> dict:
    """A two-lane stack's client outputs as the program renders them (coder on spark1, fast on spark2)."""
    from test_client_setup import rendered_client_outputs
    from test_lanes_config import two_lanes

    from components.config import parse_stack_config

    outputs = rendered_client_outputs(parse_stack_config(two_lanes()).client_views, api_key)
    outputs["codexConfig"] = outputs["codexConfig"].replace("http://192.168.1.10:8000/v1", endpoint)
    return {**outputs, "endpoint": endpoint, "apiKey": api_key, "model": "coder", "lanes": LANES}


def test_codex_lists_every_lanes_model_with_its_window_and_asks_another_lane_by_name(endpoint, tmp_path, capsys):
    """The real Codex CLI reads the two-lane catalog (each entry's own fence) and `-m fast` asks the fast lane."""
    import os
    import subprocess

    from toolbox import agent_cli

    behaviour, target = endpoint
    behaviour.model, behaviour.api_key = "fast", "sk-outputs-key"
    codex, codex_home = agent_cli("codex"), tmp_path / "codex"
    codex_home.mkdir()
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(lanes_client_outputs(target.endpoint, "sk-outputs-key")))
    openai_env = tmp_path / "openai.env"
    code, err, out = run_ops(capsys, "client-setup", "--outputs-file", str(outputs_file), "--codex-home", str(codex_home),
                             "--claude-env-file", str(tmp_path / "claude.env"), "--claude-settings",
                             str(tmp_path / "settings.json"), "--openai-env-file", str(openai_env), "--codex-default")
    assert code == 0, err
    assert "Also served: fast (Codex: add -m NAME" in out
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"} | {"CODEX_HOME": str(codex_home)}
    models = subprocess.run([codex, "debug", "models"], capture_output=True, text=True, timeout=120, env=env)
    assert models.returncode == 0, models.stderr[-2000:]
    assert [(m["slug"], m["context_window"]) for m in json.loads(models.stdout)["models"]] == [
        ("coder", 1048576), ("fast", 65536)]
    asked = subprocess.run(["bash", "-c", 'set -a && . "$1" && set +a && exec "$2" exec --skip-git-repo-check -m fast '
                            '"What is 512 + 301?"', "ask", openai_env, codex],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert asked.returncode == 0, (asked.stdout + asked.stderr)[-2000:]
    assert "model: fast\nprovider: twinspark\n" in asked.stderr and "813" in asked.stdout, asked
    assert "ANTHROPIC_DEFAULT_HAIKU_MODEL=fast" in (tmp_path / "claude.env").read_text()
