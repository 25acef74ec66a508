"""`--json` on every day-2 tool (issue 39): stdout holds one JSON document, the tool's result, and
nothing else; what a person reads (tables, progress, hints) goes to stderr."""

import json

import pytest
from ops_helpers import SMALL_FLAGS, run_ops, target_flags
from ssh_fixtures import new_key
from test_client_setup import client_setup_args, stack_outputs_for_tests
from toolbox import free_port

from ops.__main__ import TOOLS, build_parser


def one_document(out: str):
    """stdout parsed as exactly one JSON document (json.loads refuses anything around it)."""
    return json.loads(out)


@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_tool_offers_json(tool):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "tool").choices[tool]  # argparse's own table of tools
    assert "--json" in sub._option_string_actions, f"{tool} has no --json"


def test_bench_json_is_its_results_and_verdict(endpoint, capsys):
    _, target = endpoint
    code, err, out = run_ops(capsys, "bench", *target_flags(target), *SMALL_FLAGS, "--json")
    assert code == 0, err
    document = one_document(out)
    assert document["passed"] is True and document["comparison"] is None
    assert document["result"]["single_stream"]["decode_tok_s"] > 0, document["result"].keys()
    assert "single-stream decode" in err  # the table, for a person, on stderr


def test_needle_json_is_the_output_files_document_and_the_gate(endpoint, capsys):
    _, target = endpoint
    code, err, out = run_ops(capsys, "needle", *target_flags(target), "--sizes", "2k", "--trials", "1", "--json")
    assert code == 0, err
    document = one_document(out)
    assert [row["size"] for row in document["sizes"]] == [2000] and document["passed"] is True
    assert document["real_failures"] == 0 and document["max_failures"] == 0


def test_client_setup_json_names_each_file_written(tmp_path, capsys):
    codex_home, env_file, args = client_setup_args(tmp_path, stack_outputs_for_tests())
    code, err, out = run_ops(capsys, *args, "--json")
    assert code == 0, err
    document = one_document(out)
    assert {f["action"] for f in document["files"]} == {"created"}
    assert str(env_file) in [f["path"] for f in document["files"]]
    assert document["start"]["codex"].endswith("codex -p twinspark")
    assert str(env_file) in err  # the person's list, on stderr


def test_verify_weights_json_names_each_node_and_why_it_was_not_checked(tmp_path, capsys):
    nodes = [{"name": "spark1", "role": "head", "host": "127.0.0.1", "rayIp": "10.0.0.1", "rails": [],
              "hostKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}]
    code, err, out = run_ops(capsys, "verify-weights", "--nodes", json.dumps(nodes), "--ssh-user", "nvidia",
                             "--ssh-key", str(new_key(tmp_path / "id")), "--ssh-option", f"Port={free_port()}",
                             "--dir", "/home/nvidia/models/m", "--json")
    assert code == 1
    document = one_document(out)
    assert document["intact"] is False and document["model_dir"] == "/home/nvidia/models/m"
    [node] = document["nodes"]
    assert node["node"] == "spark1" and node["checked"] is False and "not reached" in node["summary"]
    assert "spark1: not checked" in err


def test_pin_host_keys_json_names_a_node_that_did_not_answer(tmp_path, capsys):
    stack_file = tmp_path / "Pulumi.spark.yaml"
    stack_file.write_text("config:\n  twinspark:nodes:\n    - name: spark1\n      host: 127.0.0.1\n")
    code, err, out = run_ops(capsys, "pin-host-keys", "--stack-file", str(stack_file), "--port", str(free_port()),
                             "--timeout", "2", "--json")
    assert code == 1
    document = one_document(out)
    assert document["commands"] == [] and document["recorded"] is False
    [node] = document["nodes"]
    assert node["name"] == "spark1" and node["error"], node
    assert "spark1" in err and "FAILED" in err
