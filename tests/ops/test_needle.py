"""ops needle: the haystack, the scorer and the probe against the stand-in endpoint."""

import json

import pytest

from ops import needle
from ops.__main__ import main as ops_main
from ops_helpers import quiet, run_ops, target_flags
from toolbox import one_clear_line


def test_needle_sizes_default_to_the_recipes(endpoint, tmp_path, capsys, monkeypatch):
    from core import recipes
    from ops import needle as needle_module

    behaviour, target = endpoint
    behaviour.max_model_len = 262_144  # a context the recipes' sizes fit in
    asked = []
    monkeypatch.setattr(needle_module, "run_needle", lambda target, sizes, *rest, **kw: asked.append(list(sizes)) or 0)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"endpoint": target.endpoint, "apiKey": target.api_key, "model": target.model,
                                   "recipe": "GLM-5.3-Flash-NVFP4"}))
    assert ops_main(["needle", "--outputs-file", str(outputs)]) == 0
    assert ops_main(["needle", *target_flags(target), "--recipe", "Qwen3.8-Flash-Next"]) == 0
    assert ops_main(["needle", *target_flags(target)]) == 0  # no recipe named: the default recipe's
    assert ops_main(["needle", "--outputs-file", str(outputs), "--sizes", "2k"]) == 0  # given: those
    assert asked == [recipes.recipe_named("GLM-5.3-Flash-NVFP4").needle_sizes,
                     recipes.recipe_named("Qwen3.8-Flash-Next").needle_sizes,
                     [74000, 110000, 129000, 148000, 166000, 184000], [2000]]
    assert "sizes: recipe GLM-5.3-Flash-NVFP4's needleSizes" in capsys.readouterr().out
    code, err, _ = run_ops(capsys, "needle", *target_flags(target), "--recipe", "nope")
    assert code == 2 and behaviour.requests == []
    one_clear_line(err, "ops needle: recipe 'nope'", "DeepSeek-V4-Flash-0731")


def test_haystack_plants_codes_at_depths():
    stack = needle.build_haystack(5000, needles=3, seed=1)
    assert len(stack.codes) == 3
    positions = [stack.prompt.index(code) / len(stack.prompt) for code in stack.codes.values()]
    assert positions == sorted(positions)
    for found, expected in zip(positions, (0.25, 0.5, 0.75)):
        assert abs(found - expected) < 0.05
    assert 5000 * 4 <= len(stack.prompt) <= 5000 * 4 + 1000
    assert needle.build_haystack(5000, 3, seed=2).codes != stack.codes  # not guessable across trials
    assert needle.build_haystack(5000, 3, seed=1) == stack  # but reproducible


@pytest.mark.parametrize("answer, verdict", [
    ("alpha: AAAA-BBBB-CCCC\nbravo: DDDD-EEEE-FFFF", "pass"),
    ("**alpha**: `AAAA-BBBB-CCCC`\n bravo : DDDD-EEEE-FFFF\n", "pass"),
    ("alpha: AAAA-BBBB-CCCC\nbravo: DDDD-EEEE-FFFF\n</tool_call>", "junk"),
    ("alpha: AAAA-BBBB-CCCX\nbravo: DDDD-EEEE-FFFF", "fail"),
    ("alpha: AAAA-BBBB-CCCC", "fail"),
    ("I cannot help with a prompt injection test.", "fail"),
    ("", "fail"),
])
def test_needle_scorer(answer, verdict):
    assert needle.score(answer, {"alpha": "AAAA-BBBB-CCCC", "bravo": "DDDD-EEEE-FFFF"}) == verdict


def test_needle_probe_counts_known_outcomes(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.decode_tok_s = 5000.0
    behaviour.needle_behaviors = ["correct", "junk", "wrong", "correct", "missing", "refuse"]
    out = tmp_path / "needle.json"
    assert needle.run_needle(target, [2000, 4000], trials=3, needles=3, max_tokens=64, console=quiet(),
                             output=str(out), max_failures=3) == 0  # 3 real failures: within the gate
    rows = json.loads(out.read_text())["sizes"]
    assert [(r["size"], r["passes"], r["junk"], r["real_failures"]) for r in rows] == [(2000, 1, 1, 1), (4000, 1, 0, 2)]
    assert all(r.body["temperature"] == 0.0 for r in behaviour.requests)
    assert rows[0]["prompt_tokens"] > 1900


def test_needle_exits_1_when_real_failures_pass_the_gate(endpoint, tmp_path, capsys):
    """A wrong or missing code is a real failure: any of them fails the run by default
    (--max-failures 0); the gate lets as many as it is given."""
    behaviour, target = endpoint
    behaviour.decode_tok_s = 5000.0
    behaviour.needle_behaviors = ["correct", "wrong", "correct", "missing"]
    flags = [*target_flags(target), "--sizes", "2k", "--trials", "4", "--max-tokens", "64"]
    code, _, out = run_ops(capsys, "needle", *flags)
    assert code == 1 and "FAIL: 2 real failures, more than --max-failures 0" in out, out
    behaviour.needle_behaviors = ["correct", "wrong", "correct", "missing"]
    code, _, out = run_ops(capsys, "needle", *flags, "--max-failures", "2")
    assert code == 0 and "FAIL" not in out, out
    code, err, _ = run_ops(capsys, "needle", *flags, "--max-failures", "-1")
    assert code == 2
    one_clear_line(err, "--max-failures", "-1 is below 0")


def test_needle_reports_a_reply_cut_off_by_reasoning_as_truncated(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.decode_tok_s, behaviour.reasoning_tokens = 20000.0, 100
    out = tmp_path / "needle.json"
    assert needle.run_needle(target, [2000], trials=2, needles=3, max_tokens=64, console=quiet(), output=str(out)) == 0
    row = json.loads(out.read_text())["sizes"][0]
    assert (row["truncated"], row["real_failures"], row["passes"]) == (2, 0, 0)
    assert row["max_completion_tokens"] == 64 and row["examples"][0]["finish_reason"] == "length"


def test_needle_default_budget_leaves_room_to_reason(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.decode_tok_s, behaviour.reasoning_tokens = 50000.0, 2000  # a model that thinks before answering
    out = tmp_path / "needle.json"
    assert ops_main(["needle", *target_flags(target), "--sizes", "2k", "--trials", "2", "--profile", "default",
                     "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sizes"][0]["passes"] == 2 and result["sizes"][0]["truncated"] == 0
    assert result["plan"] == {"sizes": [2000], "trials": 2, "needles": 3, "max_tokens": 8192, "temperature": 0.0,
                              "model": "fake-model", "endpoint": target.endpoint, "profile": "default"}
