"""Day-2 tools against a local stand-in endpoint with known timing and known answers."""

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import node_contract as contract
from rich.console import Console

from openai_standin import Behaviour, serve
from ops import bench, bench_compare, bench_load, needle, status
from ops.__main__ import build_parser, main as ops_main
from ops.client_setup import merge_codex_config, setup_clients
from ops.nodes import NODE_PROBE
from ops.stream import StreamResult
from ops.target import Target
from program_harness import ROOT, config_blocks

LAUNCH = ROOT / "launch"


@pytest.fixture
def endpoint():
    behaviour = Behaviour()
    server = serve(behaviour)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield behaviour, Target(endpoint=base + "/v1", api_key=behaviour.api_key, model=behaviour.model)
    server.shutdown()


def quiet():
    return Console(file=open(os.devnull, "w"), width=200)


# ---- pure figures, exact ---------------------------------------------------------------------
def test_stream_result_figures_are_exact():
    r = StreamResult(sent=10.0, first_token=10.5, done=12.5, output_tokens=101, prompt_tokens=7000, text="")
    assert r.ttft_s == 0.5
    assert r.tpot_s == pytest.approx(0.02)
    assert r.decode_tok_s == pytest.approx(50.0)


def test_aggregate_and_percentiles_are_exact():
    results = [StreamResult(0.0, 0.1, 2.0, 100, None, ""), StreamResult(0.5, 0.6, 4.0, 100, None, "")]
    assert bench_load.aggregate_tok_s(results) == 50.0  # 200 tokens over 4 s of wall time
    assert bench_load.percentile([1, 2, 3, 4], 50) == 2.5
    assert bench_load.percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert bench_load.percentile([], 50) is None


def test_compare_flags_a_tcp_fallback_as_a_regression():
    def result(decode, ttft):
        return {"single_stream": {"decode_tok_s": decode}, "concurrent": {"aggregate_tok_s": 80.0},
                "long_prompt": {"ttft_s": ttft, "prefill_tok_s": 1700.0}, "sweep": []}

    rows = {r["metric"]: r for r in bench_compare.compare(result(27.3, 4.3), result(74.8, 4.26))}
    assert rows["single_stream.decode_tok_s"]["regression"] is True
    assert rows["single_stream.decode_tok_s"]["change"] == pytest.approx(27.3 / 74.8 - 1)
    assert rows["long_prompt.ttft_s"]["regression"] is False  # +1% is inside 10%
    assert rows["concurrent.aggregate_tok_s"]["regression"] is False
    worse_ttft = {r["metric"]: r for r in bench_compare.compare(result(74.8, 6.0), result(74.8, 4.26))}
    # one request: shown with its change, never a gate
    assert worse_ttft["long_prompt.ttft_s"]["gated"] is False and worse_ttft["long_prompt.ttft_s"]["regression"] is False
    assert worse_ttft["long_prompt.ttft_s"]["change"] == pytest.approx(6.0 / 4.26 - 1)


def test_compare_allows_each_figure_the_spread_of_its_repeats_and_no_p99_of_few_requests():
    def result(decode_runs, ttft_repeats, requests_per_repeat=4):
        per_repeat = [{"output_tok_s": 100.0, "ttft_p50_s": t, "ttft_p99_s": t * 2, "tpot_p50_ms": 10.0,
                       "tpot_p99_ms": 11.0} for t in ttft_repeats]
        row = {"concurrency": 4, "requests": requests_per_repeat * len(per_repeat), "repeats": len(per_repeat),
               "output_tok_s": 100.0, "ttft_p50_s": sorted(ttft_repeats)[len(ttft_repeats) // 2],
               "ttft_p99_s": max(ttft_repeats) * 2, "tpot_p50_ms": 10.0, "tpot_p99_ms": 11.0, "per_repeat": per_repeat}
        return {"single_stream": {"decode_tok_s": sum(decode_runs) / len(decode_runs), "runs_tok_s": decode_runs},
                "concurrent": {"aggregate_tok_s": 80.0}, "long_prompt": {"ttft_s": 1.0, "prefill_tok_s": 7000.0},
                "sweep": [row]}

    # the case: TTFT +11% between two runs whose own repeats spread by 20%: noise, not a regression
    rows = {r["metric"]: r for r in bench_compare.compare(result([70, 71, 72], [0.08, 0.09, 0.096]),
                                                  result([70, 71, 72], [0.072, 0.081, 0.088]))}
    assert rows["sweep[c=4].ttft_p50_s"]["change"] == pytest.approx(0.09 / 0.081 - 1)
    assert rows["sweep[c=4].ttft_p50_s"]["regression"] is False
    assert rows["sweep[c=4].ttft_p50_s"]["allowed"] == pytest.approx(2 * 0.016 / 0.081)
    assert rows["sweep[c=4].ttft_p99_s"]["gated"] is False and "p99 of 4 requests" in rows["sweep[c=4].ttft_p99_s"]["why_not"]
    # steady repeats: the tolerance is the bound, and a shift beyond it is a regression
    rows = {r["metric"]: r for r in bench_compare.compare(result([70, 71, 72], [0.100, 0.101, 0.102]),
                                                  result([70, 71, 72], [0.080, 0.081, 0.082]))}
    assert rows["sweep[c=4].ttft_p50_s"]["allowed"] == pytest.approx(0.10) and rows["sweep[c=4].ttft_p50_s"]["regression"]
    # decode: the median of the runs, 4x slower is far beyond any spread
    rows = {r["metric"]: r for r in bench_compare.compare(result([17, 18, 18.5], [0.08] * 3), result([70, 71, 72], [0.08] * 3))}
    assert rows["single_stream.decode_tok_s"]["current"] == 18 and rows["single_stream.decode_tok_s"]["regression"]
    # enough requests per repeat: p99 is gated too
    rows = {r["metric"]: r for r in bench_compare.compare(result([70] * 3, [0.2] * 3, 20), result([70] * 3, [0.1] * 3, 20))}
    assert rows["sweep[c=4].ttft_p99_s"]["gated"] and rows["sweep[c=4].ttft_p99_s"]["regression"]


# ---- bench against the stand-in ---------------------------------------------------------------
def test_bench_measures_the_known_rates(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.decode_tok_s, behaviour.prefill_tok_s, behaviour.base_latency_s = 100.0, 20000.0, 0.05
    plan = bench_load.BenchPlan(single_runs=3, single_max_tokens=41, concurrency=4, long_prompt_tokens=7000,
                           sweep=(1, 3), sweep_requests_per_level=2, sweep_input_tokens=400, sweep_output_tokens=21)
    out = tmp_path / "result.json"
    assert bench.run_bench(target, plan, str(out), None, 0.1, quiet()) == 0
    result = json.loads(out.read_text())
    assert result["errors"] == []
    # the stand-in sleeps on a fixed schedule: a busy machine can only make us slower
    assert len(result["single_stream"]["runs_tok_s"]) == 3
    assert 60 <= result["single_stream"]["decode_tok_s"] <= 101
    assert 4 * 60 * 0.6 <= result["concurrent"]["aggregate_tok_s"] <= 4 * 100 * 1.01
    lp = result["long_prompt"]
    long_request = next(r.body for r in behaviour.requests if r.body["max_tokens"] == 1)
    assert long_request["messages"][0]["content"].endswith(bench_load.filler_text(7000) + "\nSummarize the code above.")
    assert lp["prompt_tokens"] == len(long_request["messages"][0]["content"]) // 4
    expected_ttft = 0.05 + lp["prompt_tokens"] / 20000.0
    assert expected_ttft * 0.99 <= lp["ttft_s"] <= expected_ttft + 0.3
    assert lp["prefill_tok_s"] <= 20000.0
    assert [row["concurrency"] for row in result["sweep"]] == [1, 3]
    assert [row["requests"] for row in result["sweep"]] == [2 * 3, 6 * 3]  # each level three times
    assert [len(row["per_repeat"]) for row in result["sweep"]] == [3, 3]
    for row in result["sweep"]:  # the level's figure is the median of its repeats'
        assert row["ttft_p50_s"] == sorted(f["ttft_p50_s"] for f in row["per_repeat"])[1]
    for row in result["sweep"]:
        # 100 tok/s = 10 ms per token; a first token delayed by a busy machine shows as a shorter
        # time per later token (the gap counts in TTFT), so the lower bound is loose
        assert 5.0 <= row["tpot_p50_ms"] <= 20.0
        assert row["tpot_p50_ms"] <= row["tpot_p99_ms"]
    assert all(r.body.get("ignore_eos") for r in behaviour.requests[-8:])  # sweep requests pin their length


def test_bench_compare_exit_code(endpoint, tmp_path):
    behaviour, target = endpoint
    plan = bench_load.BenchPlan(single_runs=1, single_max_tokens=11, concurrency=1, long_prompt_tokens=100, sweep=(1,),
                           sweep_requests_per_level=1, sweep_input_tokens=50, sweep_output_tokens=5)
    base = tmp_path / "baseline.json"
    bench.run_bench(target, plan, str(base), None, 0.1, quiet())
    behaviour.decode_tok_s = 25.0  # the cable fell back to TCP
    assert bench.run_bench(target, plan, str(tmp_path / "now.json"), str(base), 0.1, quiet()) == 1


# ---- against the recipe's published baseline (--compare recipe) -----------------------------------
def recipe_result(decode_runs, four_way, ttft):
    return {"single_stream": {"decode_tok_s": sum(decode_runs) / len(decode_runs), "runs_tok_s": decode_runs},
            "concurrent": {"aggregate_tok_s": four_way}, "long_prompt": {"ttft_s": ttft, "prefill_tok_s": 1700.0},
            "sweep": []}


def test_compare_with_recipe_flags_only_a_shortfall_beyond_the_band():
    from components import recipes

    seed = recipes.recipe_named("DeepSeek-V4-Flash-0731")  # 74.8 tok/s, 82.6 tok/s at 4-way, TTFT 4.26 s
    # the seed's own figures, and a run 15% short on each: inside the 20% band
    for scale in (1.0, 0.85):
        rows = bench_compare.compare_with_recipe(recipe_result([74.8 * scale] * 3, 82.6 * scale, 4.26 / scale), seed)
        assert [r["metric"] for r in rows] == ["single_stream.decode_tok_s", "concurrent.aggregate_tok_s",
                                               "long_prompt.ttft_s"]
        assert not any(r["regression"] for r in rows) and all(r["gated"] for r in rows)
    # NCCL over TCP: decode at the no-spec floor; TTFT 30% late; the 4-way 25% short
    rows = {r["metric"]: r for r in bench_compare.compare_with_recipe(recipe_result([27.2, 27.3, 27.4], 62.0, 5.54), seed)}
    assert rows["single_stream.decode_tok_s"]["regression"] and rows["single_stream.decode_tok_s"]["current"] == 27.3
    assert rows["long_prompt.ttft_s"]["regression"] and rows["concurrent.aggregate_tok_s"]["regression"]
    assert rows["single_stream.decode_tok_s"]["allowed"] == pytest.approx(bench_compare.RECIPE_TOLERANCE)
    assert "seed" in rows["single_stream.decode_tok_s"]["source"]
    # far faster than published, or sooner: never a regression
    assert not any(r["regression"] for r in bench_compare.compare_with_recipe(recipe_result([300.0] * 3, 900.0, 0.1), seed))
    # a run whose own repeats spread widely is allowed twice its spread: 50-70 around 60 is -20%, noise
    rows = {r["metric"]: r for r in bench_compare.compare_with_recipe(recipe_result([50.0, 60.0, 70.0], 82.6, 4.26), seed)}
    assert rows["single_stream.decode_tok_s"]["allowed"] == pytest.approx(2 * 20 / 74.8)
    assert not rows["single_stream.decode_tok_s"]["regression"]
    # a narrower band, asked for: the 15% shortfall is one
    rows = bench_compare.compare_with_recipe(recipe_result([74.8 * 0.85] * 3, 82.6, 4.26), seed, tolerance=0.10)
    assert rows[0]["regression"]
    # a figure the recipe does not publish is not compared (GLM has no TTFT at 7k)
    glm = recipes.recipe_named("GLM-5.3-Flash-NVFP4")
    assert [r["metric"] for r in bench_compare.compare_with_recipe(recipe_result([40.0] * 3, 70.0, 9.0), glm)] == [
        "single_stream.decode_tok_s", "concurrent.aggregate_tok_s"]


RECIPE_FLAGS = ["--runs", "3", "--max-tokens", "16", "--concurrency", "4", "--long-prompt-tokens", "7000",
                "--sweep", "1", "--sweep-requests", "1", "--sweep-input-tokens", "100", "--sweep-output-tokens", "3",
                "--sweep-repeats", "1"]


def test_bench_compare_recipe_gates_on_the_stacks_recipe(endpoint, tmp_path, capsys, monkeypatch):
    """The stack's `recipe` output names the recipe; a run at the stand-in's rates clears the seed's
    figures, the same server with decode at a third of the seed's fails them."""
    monkeypatch.setenv("COLUMNS", "200")  # the table whole
    behaviour, target = endpoint
    behaviour.decode_tok_s, behaviour.prefill_tok_s = 200.0, 100000.0
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"endpoint": target.endpoint, "apiKey": target.api_key, "model": target.model,
                                   "recipe": "DeepSeek-V4-Flash-0731"}))
    flags = ["--outputs-file", str(outputs), *RECIPE_FLAGS, "--profile", "default", "--compare", "recipe"]
    code, err, out = run_ops(capsys, "bench", *flags)
    assert code == 0, err + out
    assert "against recipe DeepSeek-V4-Flash-0731's baseline" in out and "REGRESSION" not in out
    assert "single-stream decode 74.8: seed §5" in out  # each figure's source beside it
    behaviour.decode_tok_s = 25.0  # the cable fell back to TCP
    code, err, out = run_ops(capsys, "bench", *flags)
    assert code == 1 and "REGRESSION" in out and "single_stream.decode_tok_s" in out


@pytest.mark.parametrize("flags, words", [
    ([], ["no recipe: pass --recipe NAME", "GLM-5.3-Flash-NVFP4"]),  # --endpoint alone: no stack read
    (["--recipe", "GLM-5.3"], ["recipe 'GLM-5.3'", "GLM-5.3-Flash-NVFP4"]),
    (["--recipe", "gpt-oss-120b"], ["recipe gpt-oss-120b publishes no baseline figure", "ops bench -o FILE"]),
    (["--recipe", "DeepSeek-V4-Flash-0731", "--concurrency", "2"],
     ["concurrency 2 (its 4-way figure is of 4 streams)", "--allow-plan-mismatch"]),
    (["--recipe", "DeepSeek-V4-Flash-0731", "--profile", "multiagent"], ["profile multiagent", "profile default"]),
    (["--recipe", "DeepSeek-V4-Flash-0731", "--recipe-tolerance", "1.5"], ["--recipe-tolerance", "not below 1"]),
])
def test_bench_compare_recipe_refuses_bad_input_in_one_line_before_any_request(endpoint, capsys, flags, words):
    behaviour, target = endpoint
    code, err, _ = run_ops(capsys, "bench", *target_flags(target), *RECIPE_FLAGS, *flags, "--compare", "recipe")
    assert code == 2
    one_clear_line(err, *words)
    assert behaviour.requests == []


def test_needle_sizes_default_to_the_recipes(endpoint, tmp_path, capsys, monkeypatch):
    from components import recipes
    from ops import needle as needle_module

    behaviour, target = endpoint
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


def test_two_runs_of_an_unchanged_server_never_disagree_and_a_4x_slower_decode_always_does(endpoint, tmp_path):
    """The upgrade's gate: ten fresh pairs of runs at the default tolerance, no regression between the
    two runs of a pair; the same server at a quarter of the decode rate is a regression every time."""
    behaviour, target = endpoint
    behaviour.decode_tok_s = 400.0  # small and quick: about a second a run
    behaviour.ttft_jitter_s = 0.005  # up to +25% on a 21 ms TTFT, per request: the noise two real runs show
    plan = bench_load.BenchPlan(single_runs=3, single_max_tokens=16, concurrency=2, long_prompt_tokens=200, sweep=(1, 2),
                           sweep_requests_per_level=2, sweep_input_tokens=100, sweep_output_tokens=8)
    plan.sweep_repeats = 3  # set after construction: the same test runs against code without repeats
    tolerance = build_parser().parse_args(["bench"]).tolerance  # the default the CLI gates at
    noise, slow = [], []
    for i in range(10):
        base, again, slower = (tmp_path / f"{name}{i}.json" for name in ("base", "again", "slow"))
        assert bench.run_bench(target, plan, str(base), None, tolerance, quiet()) == 0
        noise.append(bench.run_bench(target, plan, str(again), str(base), tolerance, quiet()))
        behaviour.decode_tok_s /= 4
        slow.append(bench.run_bench(target, plan, str(slower), str(base), tolerance, quiet()))
        behaviour.decode_tok_s *= 4
        rows = {r["metric"]: r for r in bench_compare.compare(json.loads(slower.read_text()), json.loads(base.read_text()),
                                                      tolerance)}
        assert rows["single_stream.decode_tok_s"]["regression"], rows["single_stream.decode_tok_s"]
    assert noise == [0] * 10, f"identical runs reported a regression {sum(noise)}/10 times"
    assert slow == [1] * 10


SMALL_PLAN = dict(single_runs=2, single_max_tokens=5, concurrency=2, long_prompt_tokens=300, sweep=(1, 2),
                  sweep_requests_per_level=1, sweep_input_tokens=100, sweep_output_tokens=3, sweep_repeats=1)
SMALL_FLAGS = ["--runs", "2", "--max-tokens", "5", "--concurrency", "2", "--long-prompt-tokens", "300",
               "--sweep", "1,2", "--sweep-requests", "1", "--sweep-input-tokens", "100", "--sweep-output-tokens", "3",
               "--sweep-repeats", "1"]


def target_flags(target):
    return ["--endpoint", target.endpoint, "--api-key", target.api_key, "--model", target.model]


def first_user_content(body):
    return body["messages"][0]["content"]


def test_bench_measures_prefill_not_prefix_cache_hits(endpoint):
    """Against a prefix cache like vLLM's: no request of two runs hits it, so run 2 pays full prefill."""
    behaviour, target = endpoint
    behaviour.prefix_cache, behaviour.prefill_tok_s, behaviour.base_latency_s = True, 20000.0, 0.01
    behaviour.decode_tok_s = 2000.0
    plan = bench_load.BenchPlan(single_runs=2, single_max_tokens=4, concurrency=2, long_prompt_tokens=4000, sweep=(1, 2),
                           sweep_requests_per_level=1, sweep_input_tokens=2000, sweep_output_tokens=3, sweep_repeats=1)
    runs = [asyncio.run(bench_load.Bench(target.endpoint, target.api_key, target.model, plan).run()) for _ in range(2)]
    assert all(r["errors"] == [] for r in runs)
    # the stand-in caches 4-token blocks, finer than vLLM's 16: not one block of any prompt was reused
    assert [r.cached_prompt_tokens for r in behaviour.requests] == [0] * 2 * (1 + 8)  # warm-up + 8 measured, per run
    openings = [first_user_content(r.body)[:behaviour.cache_block_chars] for r in behaviour.requests]
    assert len(set(openings)) == len(openings)
    second = runs[1]
    assert second["prompt_uniqueness"] == "salt"
    assert second["server_cached_prompt_tokens"] == {"requests_reporting": 8, "total": 0}
    # lower bounds only (the stand-in sleeps at least this long): a cache hit would answer in ~0.01 s
    lp = second["long_prompt"]
    assert lp["ttft_s"] >= 0.99 * (0.01 + lp["prompt_tokens"] / 20000.0)
    level2 = second["sweep"][1]
    assert level2["concurrency"] == 2 and level2["ttft_p50_s"] >= 0.99 * (0.01 + 2000 / 20000.0)


def test_bench_cache_salt_flag_sends_a_unique_cache_salt_and_says_so(endpoint, tmp_path):
    behaviour, target = endpoint
    out = tmp_path / "r.json"
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, "--cache-salt", "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["prompt_uniqueness"] == "salt+cache_salt"
    salts = [r.body["cache_salt"] for r in behaviour.requests]
    assert len(salts) == 1 + 2 + 2 + 1 + 3 and len(set(salts)) == len(salts)
    assert all(result["run_id"] in salt for salt in salts)
    behaviour.accept_cache_salt = False  # vLLM's V0 engine refuses the field: every request says why
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, "--cache-salt", "-o", str(out)]) == 1
    assert all("cache_salt" in e for e in json.loads(out.read_text())["errors"])


def test_bench_warms_up_outside_the_figures_and_reports_the_spread(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.decode_tok_s = 1000.0
    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    out = tmp_path / "r.json"
    assert bench.run_bench(target, bench_load.BenchPlan(**SMALL_PLAN), str(out), None, 0.1, console) == 0
    result = json.loads(out.read_text())
    warmup = behaviour.requests[0].body
    assert first_user_content(warmup).startswith(f"[{result['run_id']}.warmup] ")
    assert warmup["max_tokens"] == bench_load.WARMUP_MAX_TOKENS and result["warmup"]["error"] is None
    assert len(behaviour.requests) == 1 + 8 and result["usage"]["server"] == 8  # the figures are the other 8
    single = result["single_stream"]
    runs = single["runs_tok_s"]
    assert len(runs) == 2
    assert [single["min_tok_s"], single["median_tok_s"], single["max_tok_s"]] == [min(runs), sum(runs) / 2, max(runs)]
    spread = f"{single['min_tok_s']:.1f} / {single['median_tok_s']:.1f} / {single['max_tok_s']:.1f}"
    assert spread in console.export_text()


def test_server_error_with_markup_is_printed_literally_and_the_results_kept(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.chat_error = (500, "template error near [/INST] and [bold]")
    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    out = tmp_path / "r.json"
    assert bench.run_bench(target, bench_load.BenchPlan(**SMALL_PLAN), str(out), None, 0.1, console) == 1
    assert len(json.loads(out.read_text())["errors"]) == 1 + 8  # the warm-up says so too
    text = console.export_text()
    assert "request failed: HTTP 500" in text and "near [/INST] and [bold]" in text


def test_compare_table_names_every_metric_literally():
    def result(rate):
        row = lambda c: {"concurrency": c, "requests": c, "output_tok_s": rate * c, "ttft_p50_s": 0.5,  # noqa: E731
                         "ttft_p99_s": 0.6, "tpot_p50_ms": 13.0, "tpot_p99_ms": 14.0}
        return {"model": "m[x]", "endpoint": "http://h/v1", "single_stream": {"decode_tok_s": 70.0},
                "concurrent": {"streams": 4, "aggregate_tok_s": 250.0},
                "long_prompt": {"prompt_tokens": 7000, "ttft_s": 4.0, "prefill_tok_s": 1750.0},
                "sweep": [row(1), row(2)], "errors": []}

    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    bench.render(result(30.0), console, bench_compare.compare(result(30.0), result(40.0)))
    text = console.export_text()
    for metric in ("sweep[c=1].output_tok_s", "sweep[c=2].output_tok_s", "sweep[c=2].tpot_p99_ms"):
        assert text.count(metric) == 1, metric
    assert "bench m[x] @ http://h/v1" in text and "REGRESSION" in text


def test_results_keep_the_plan_and_the_profile(endpoint, tmp_path):
    behaviour, target = endpoint
    out = tmp_path / "r.json"
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, "--profile", "multiagent", "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["schema"] == 2
    assert result["plan"] == {"runs": 2, "max_tokens": 5, "concurrency": 2, "long_prompt_tokens": 300, "sweep": [1, 2],
                              "sweep_requests": 1, "sweep_input_tokens": 100, "sweep_output_tokens": 3,
                              "sweep_repeats": 1, "temperature": 0.2, "model": "fake-model",
                              "endpoint": target.endpoint, "profile": "multiagent"}
    # a results file from before the repeats measured each level once: the same plan as --sweep-repeats 1
    older = {**result, "plan": {k: v for k, v in result["plan"].items() if k != "sweep_repeats"}}
    assert bench_compare.plan_differences(result["plan"], older) == []
    assert bench_load.plan_from_record(older["plan"]).sweep_repeats == 1
    assert bench_compare.plan_differences({**result["plan"], "sweep_repeats": 3}, older) == ["sweep_repeats 1→3"]
    assert result["usage"] == {"server": 8, "chunk_count_fallback": 0}
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, "-o", str(out)]) == 0
    assert json.loads(out.read_text())["plan"]["profile"] is None  # not given: unknown, and said so


def test_compare_refuses_a_baseline_with_another_plan(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    base = tmp_path / "base.json"
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, "-o", str(base)]) == 0
    sent = len(behaviour.requests)
    capsys.readouterr()
    other = [*SMALL_FLAGS, "--runs", "3", "--sweep", "1,3"]  # the last of a repeated flag wins
    assert ops_main(["bench", *target_flags(target), *other, "--compare", str(base)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runs 2→3" in err and "sweep [1, 2]→[1, 3]" in err
    assert "--allow-plan-mismatch" in err
    assert len(behaviour.requests) == sent  # refused before a single request
    loose = ["--tolerance", "100"]  # tiny timings are noisy; this test is about plans, not regressions
    assert ops_main(["bench", *target_flags(target), *other, *loose, "--compare", str(base),
                     "--allow-plan-mismatch"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: the plans differ" in out and "sweep[c=1].output_tok_s" in out
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, *loose, "--compare", str(base)]) == 0  # like with like
    assert "WARNING" not in capsys.readouterr().out


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ("[1, 2]", "not the results of ops bench"),
    (json.dumps({"single_stream": {"decode_tok_s": 70.0}, "concurrent": {}, "long_prompt": {}, "sweep": []}),
     "schema 1→2"),  # a results file from before the plan was kept
    (json.dumps({"single_stream": 5, "concurrent": {}, "long_prompt": {}, "sweep": []}),
     "single_stream: Input should be a valid dictionary"),  # the right keys, the wrong shape
    (json.dumps({"single_stream": {}, "concurrent": {}, "long_prompt": {}, "sweep": [{"concurrency": "x"}]}),
     "sweep[0].concurrency: Input should be a valid integer"),
])
def test_unusable_baseline_is_one_line_before_any_request(endpoint, tmp_path, capsys, content, message):
    behaviour, target = endpoint
    base = tmp_path / "base.json"
    if content is not None:
        base.write_text(content)
    assert ops_main(["bench", *target_flags(target), *SMALL_FLAGS, "--compare", str(base)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert behaviour.requests == []


@pytest.mark.parametrize("send_usage, source, tokens", [(True, "server", 12), (False, "chunks", 4)])
def test_token_count_says_where_it_came_from(endpoint, send_usage, source, tokens):
    """Three tokens a chunk, as under speculative decoding: only the server's usage counts them all."""
    from ops.stream import client, stream_chat

    behaviour, target = endpoint
    behaviour.tokens_per_chunk, behaviour.send_usage, behaviour.decode_tok_s = 3, send_usage, 5000.0

    async def one():
        async with client(target.api_key) as http:
            return await stream_chat(http, target.endpoint, target.model, [{"role": "user", "content": "hi"}], 12, 0.2)

    result = asyncio.run(one())
    assert behaviour.requests[0].body["stream_options"] == {"include_usage": True}
    assert (result.usage_source, result.output_tokens) == (source, tokens)


def test_bench_says_loudly_when_the_server_sends_no_usage(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.tokens_per_chunk, behaviour.send_usage = 3, False
    console = Console(record=True, width=300, file=open(os.devnull, "w"))
    out = tmp_path / "r.json"
    assert bench.run_bench(target, bench_load.BenchPlan(**SMALL_PLAN), str(out), None, 0.1, console) == 0
    assert json.loads(out.read_text())["usage"] == {"server": 0, "chunk_count_fallback": 8}
    assert "WARNING: 8 of 8 requests came without usage from the server" in console.export_text()


def test_reasoning_deltas_count_as_output_in_either_field_name(endpoint):
    """vLLM's reasoning parsers stream `reasoning_content` (older) or `reasoning` (newer)."""
    from ops.stream import client, stream_chat

    behaviour, target = endpoint
    behaviour.reasoning_tokens, behaviour.reasoning_field, behaviour.send_usage = 5, "reasoning", False
    behaviour.decode_tok_s = 5000.0

    async def one():
        async with client(target.api_key) as http:
            return await stream_chat(http, target.endpoint, target.model, [{"role": "user", "content": "hi"}], 8, 0.2)

    result = asyncio.run(one())
    assert result.output_tokens == 8 and result.finish_reason == "length"
    assert result.reasoning_text == "r0 r1 r2 r3 r4 " and result.text == "t0 t1 t2 "


# ---- needle ---------------------------------------------------------------------------------------
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
                             output=str(out)) == 0
    rows = json.loads(out.read_text())["sizes"]
    assert [(r["size"], r["passes"], r["junk"], r["real_failures"]) for r in rows] == [(2000, 1, 1, 1), (4000, 1, 0, 2)]
    assert all(r.body["temperature"] == 0.0 for r in behaviour.requests)
    assert rows[0]["prompt_tokens"] > 1900


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


# ---- status ---------------------------------------------------------------------------------------
METRICS = """# HELP vllm:spec_decode_num_drafts_total drafts
vllm:spec_decode_num_drafts_total{model_name="fake-model"} 100
vllm:spec_decode_num_draft_tokens_total{model_name="fake-model"} 700
vllm:spec_decode_num_accepted_tokens_total{model_name="fake-model"} 350
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",position="0"} 93
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",position="1"} 80
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="fake-model",position="2"} 60
vllm:num_requests_running{model_name="fake-model"} 2
vllm:num_requests_waiting{model_name="fake-model"} 1
"""


def test_endpoint_status_reads_spec_decode_and_queue(endpoint):
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    ep = status.endpoint_status(target.base_url, target.api_key)
    assert ep["health"] == 200 and ep["model"] == "fake-model"
    assert ep["requests_running"] == 2 and ep["requests_waiting"] == 1
    assert ep["spec_decode"]["acceptance"] == 0.5
    assert ep["spec_decode"]["per_position"] == [0.93, 0.80, 0.60]
    assert ep["spec_decode"]["mean_accepted_length"] == 4.5
    assert status.endpoint_status(target.base_url, "wrong")["models_status"] == 401


def shim_bin(tmp_path, restarting="false", restart_count=0, ray_gpus=(1, 1), driver="580.173.02",
             firewall_unit="active", firewall_loaded=True):
    """docker, nvidia-smi, ibv_devinfo, systemctl, sudo and nft as a Spark would answer them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    nodes = json.dumps([{"node_id": f"n{i}", "node_ip": f"10.0.0.{i + 1}", "gpus": g} for i, g in enumerate(ray_gpus)])
    scripts = {
        "docker": f"""#!/bin/sh
case "$1 $3" in
  "inspect {{{{.Image}}}}") echo sha256:served ;;
  inspect*) echo '{{"Status":"running","Restarting":{restarting},"StartedAt":"2026-11-29T10:00:00Z","ExitCode":0}}|{restart_count}' ;;
  image*) echo sha256:served ;;
  run*) cat >/dev/null; echo '{{"vllm": "0.25.2", "nccl": "2.30.7", "nccl_pip": null}}' ;;
  exec*) case "$*" in *"/twinspark/ray-membership.py alive --head 10.0.0.1 --gcs-port 6379") echo '{nodes}' ;; *) exit 1 ;; esac ;;
esac""",
        "nvidia-smi": f"""#!/bin/sh
case "$1" in
  # temperature, power, SM clock, max SM clock, throttle reasons (power cap + hardware thermal)
  --query-gpu=temperature*) echo '71, 64.25, 2405, 3003, 0x0000000000000044' ;;
  --query-gpu=driver*) echo '{driver}, NVIDIA GB10' ;;
  *) echo '| Driver Version: {driver}   CUDA Version: 13.0 |' ;;
esac""",
        "ibv_devinfo": "#!/bin/sh\nprintf '\\tstate:\\t\\t\\tPORT_ACTIVE (4)\\n\\tactive_mtu:\\t\\t4096 (5)\\n'",
        # `systemctl is-active` prints the state and exits 0 for active only
        "systemctl": f"""#!/bin/sh
[ "$1 $2" = "is-active {contract.FIREWALL_UNIT}" ] || exit 4
echo {firewall_unit}; [ {firewall_unit} = active ]""",
        "sudo": '#!/bin/sh\n[ "$1" = -n ] && shift\nexec "$@"',
        # nft's own answer for a table that is not there
        "nft": f"""#!/bin/sh
[ "$*" = "list table inet {contract.FIREWALL_TABLE}" ] || exit 1
case {firewall_loaded} in
  True) echo 'table inet {contract.FIREWALL_TABLE} {{'; echo '}}' ;;
  False) echo 'Error: No such file or directory' >&2; echo "$*" >&2; exit 1 ;;
  *) echo 'netlink: Error: cache initialization failed: Operation not permitted' >&2; exit 1 ;;
esac""",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text + "\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def local_runner(bin_dir, per_node=None, run_dir=None):
    """The probes run here instead of over ssh: same script, same arguments, same stdin
    (`per_node`: another shim directory for some nodes; the node's state files, the contract's
    RUN_DIR, read from `run_dir`)."""
    def run(node, args, probe=NODE_PROBE):
        path = (per_node or {}).get(node["name"], bin_dir)
        if run_dir is not None:
            args = [a.replace(contract.RUN_DIR, str(run_dir)) for a in args]
        proc = subprocess.run([sys.executable, "-", *args], input=probe.read_text(), capture_output=True,
                              text=True, env={**os.environ, "PATH": f"{path}:{os.environ['PATH']}"}, check=True)
        return proc.stdout
    return run


NODES = [
    {"name": "spark1", "role": "head", "host": "h1", "rayIp": "10.0.0.1", "rails": [{"iface": "lo", "hca": "rocep1s0f0", "address": "10.0.0.1/24"}]},
    {"name": "spark2", "role": "worker", "host": "h2", "rayIp": "10.0.0.2", "rails": [{"iface": "lo", "hca": "rocep1s0f0", "address": "10.0.0.2/24"}]},
]


def test_node_probe_reports_container_rails_gpu_and_ray(tmp_path):
    out = json.loads(local_runner(shim_bin(tmp_path, restart_count=3))(NODES[0], status.probe_args(NODES[0])))
    assert out["memory_check"] is None and out["guard"] is None and out["hold"] is None  # none written here
    assert out["container"] == {"name": "twinspark-serving", "present": True, "status": "running", "restarting": False,
                                "restart_count": 3, "started_at": "2026-11-29T10:00:00Z", "exit_code": 0}
    assert out["rails"][0]["operstate"] == "unknown" and out["rails"][0]["mtu"] == 65536  # lo, read from sysfs
    assert out["rails"][0]["roce_state"] == "PORT_ACTIVE" and out["rails"][0]["roce_active_mtu"] == 4096
    assert out["gpu"] == {"temperature_c": 71.0, "power_w": 64.25, "sm_clock_mhz": 2405.0, "max_sm_clock_mhz": 3003.0,
                          "throttle": ["power cap", "thermal (hardware)"]}
    assert [n["node_ip"] for n in out["ray"]["nodes"]] == ["10.0.0.1", "10.0.0.2"]


def test_status_exit_code_and_problems(endpoint, tmp_path):
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    target.nodes = NODES
    run_dir = node_state(tmp_path / "run", guard=GUARD_OK)
    healthy = status.collect(target, local_runner(shim_bin(tmp_path), run_dir=run_dir))
    for node in healthy["nodes"]:  # lo stands in for a rail: make it look like a good one
        node["rails"][0].update(operstate="up", speed_mbps=200000, mtu=9000)
    assert status.problems(healthy, 9000, 200000) == []

    sick = status.collect(target, local_runner(shim_bin(tmp_path / "sick", restarting="true", ray_gpus=(1,))))
    found = status.problems(sick, 9000, 200000)
    assert any("spark2: container twinspark-serving running (restarts: 0)" in f for f in found)
    assert any("spark1: Ray has 1 of 2 GPU nodes alive" in f for f in found)
    assert any("spark1 rail lo: MTU 65536, expected 9000" in f for f in found)
    assert status.run_status(target, local_runner(shim_bin(tmp_path / "sick2")), True, 9000, 200000, quiet()) == 1


def test_status_shows_each_nodes_platform_and_judges_it_with_the_stacks_acknowledgements(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.metrics_text = METRICS
    target.nodes = NODES
    updated = local_runner(shim_bin(tmp_path), {"spark2": shim_bin(tmp_path / "updated", driver="590.44.01")})
    report = status.collect(target, updated)
    assert [n["platform"]["facts"]["driver"] for n in report["nodes"]] == ["580.173.02", "590.44.01"]
    assert report["nodes"][0]["platform"]["facts"]["vllm"] == "0.25.2"
    found = [f for f in status.problems(report, 9000, 200000) if f.startswith("platform: ")]
    assert [f.split(" ")[1:4] for f in found] == [["nodes", "differ", "in"], ["known", "issue", "driver-590-cudagraph-deadlock"]]
    assert "spark1 has '580.173.02', spark2 has '590.44.01'" in found[0]
    # what the stack acknowledged (its `platform` output) is accepted here too
    target.outputs = {"platform": {"acknowledge": ["mismatch:driver", "driver-590-cudagraph-deadlock"]}}
    assert not [f for f in status.problems(status.collect(target, updated), 9000, 200000) if f.startswith("platform")]
    status.render(report, found, Console(width=200))
    shown = capsys.readouterr().out
    assert "590.44.01 / 13.0" in shown and "UNHEALTHY platform: nodes differ in driver" in shown


GUARD_OK = {"checked_at": 1764470000.0, "ok": True, "failures": [], "consecutive_failures": 0,
            "restarts_in_window": 1, "restart_limit": 3, "window_s": 1800, "hold": None}
HOLD = {"reason": "restart loop: 3 serving restarts in 30 min (limit 3). ... reboot spark1 and spark2", "since": 1.0}
MEMORY_SHORT = {"ok": False, "need_gib": 101.7, "available_gib": 95.0,
                "message": "not enough memory to load: vLLM needs 101.7 GiB (0.85 x 119.7 GiB), 95.0 GiB available"}


def node_state(run_dir, guard=None, hold=None, memory=None):
    """The files the guard and the memory check leave under the contract's RUN_DIR."""
    for path, value in ((contract.SERVING_GUARD_STATUS, guard), (contract.SERVING_HOLD, hold),
                        (contract.MEMORY_CHECK_STATUS, memory)):
        if value is not None:
            target = run_dir / Path(path).relative_to(contract.RUN_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(value))
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def test_status_shows_the_guard_the_hold_and_the_memory_check(endpoint, tmp_path):
    behaviour, target = endpoint
    target.nodes = NODES
    failing = {**GUARD_OK, "ok": False, "consecutive_failures": 2,
               "failures": ["known answer: 512 + 301 gave '<unk>', not 813"]}
    run_dir = node_state(tmp_path / "run", guard=failing, hold=HOLD, memory=MEMORY_SHORT)
    report = status.collect(target, local_runner(shim_bin(tmp_path), run_dir=run_dir))
    found = status.problems(report, 65536, None)
    assert "spark1: serving held: restart loop: 3 serving restarts in 30 min (limit 3). ... reboot spark1 and spark2" in found
    assert "spark1: canary failing (2 rounds in a row): known answer: 512 + 301 gave '<unk>', not 813" in found
    assert ("spark2: memory check before load: not enough memory to load: vLLM needs 101.7 GiB (0.85 x 119.7 GiB), "
            "95.0 GiB available") in found
    console = Console(record=True, width=400)  # wide enough that no cell wraps
    status.render(report, found, console)
    shown = console.export_text()
    assert "canary: FAILING" in shown and "restarts 1/3 in 30 min" in shown and "HELD" in shown
    assert "memory: WAITING (95.0 of 101.7 GiB available)" in shown
    assert "throttled: power cap, thermal (hardware)" in shown
    # no verdict at all: the guard is not running
    bare = status.collect(target, local_runner(shim_bin(tmp_path / "bare"), run_dir=node_state(tmp_path / "bare-run")))
    assert any("the serving guard has written no verdict" in f for f in status.problems(bare, 65536, None))


@pytest.mark.parametrize("not_counted, note, shown_as, problem", [
    ("busy", "busy, not wedged: 6 running, 3 waiting, 412 tokens in 5 s", "canary: busy (late, tokens flowing)", None),
    ("key refused", "the gateway refused the key (not counted): /v1/models: HTTP 401 from the gateway",
     "canary: KEY REFUSED", "spark1: the gateway refused the key (not counted): /v1/models: HTTP 401 from the gateway"),
])
def test_status_shows_a_round_the_guard_did_not_count(endpoint, tmp_path, not_counted, note, shown_as, problem):
    """A busy engine is healthy; a refused key is a problem (clients with that key are refused too)."""
    behaviour, target = endpoint
    target.nodes = NODES
    guard = {**GUARD_OK, "ok": None, "not_counted": not_counted, "note": note}
    report = status.collect(target, local_runner(shim_bin(tmp_path), run_dir=node_state(tmp_path / "run", guard=guard)))
    found = [f for f in status.problems(report, 65536, None) if "gateway" in f or "canary" in f]
    assert found == ([problem] if problem else [])
    console = Console(record=True, width=400)
    status.render(report, found, console)
    assert shown_as in console.export_text()


@pytest.mark.parametrize("unit, loaded, words", [
    ("failed", False, ["table inet twinspark is not loaded, so every port is open to the LAN",
                       "twinspark-firewall.service failed", "journalctl -u twinspark-firewall.service"]),
    ("failed", True, ["twinspark-firewall.service failed, so the next boot leaves the node open",
                      "table inet twinspark is loaded now"]),
    ("active", False, ["table inet twinspark is not loaded", "twinspark-firewall.service active"]),
    ("active", None, ["cannot tell whether table inet twinspark is loaded", "Operation not permitted"]),
])
def test_status_shows_a_firewall_that_failed_to_load(endpoint, tmp_path, unit, loaded, words):
    """Issue 19 item 6: a table that failed to load at boot (a name nft could not resolve) leaves
    the node open; ops status says so, per node, from the unit's state and the table itself."""
    behaviour, target = endpoint
    target.nodes = NODES
    broken = shim_bin(tmp_path / "broken", firewall_unit=unit, firewall_loaded=loaded)
    report = status.collect(target, local_runner(shim_bin(tmp_path), {"spark2": broken}))
    assert report["nodes"][0]["firewall"] == {"unit": "twinspark-firewall.service", "table": "inet twinspark",
                                              "unit_state": "active", "loaded": True}
    assert report["nodes"][1]["firewall"]["unit_state"] == unit and report["nodes"][1]["firewall"]["loaded"] is loaded
    found = [f for f in status.problems(report, 65536, None) if "firewall" in f]
    assert len(found) == 1 and found[0].startswith("spark2: firewall: "), found
    assert all(word in found[0] for word in words), found[0]
    console = Console(record=True, width=400)
    status.render(report, status.problems(report, 65536, None), console)
    shown = console.export_text()
    assert "table loaded" in shown and "unit active" in shown  # spark1
    assert f"table {({True: 'loaded', False: 'NOT LOADED'}).get(loaded, 'unknown')}" in shown and f"unit {unit}" in shown
    assert status.run_status(target, local_runner(shim_bin(tmp_path), {"spark2": broken}), True, 65536, 200000,
                             quiet()) == 1


def test_a_loaded_table_whose_unit_has_not_run_since_the_deploy_is_healthy(endpoint, tmp_path):
    """`pulumi up` loads the table and enables the unit, which first runs at the next boot."""
    behaviour, target = endpoint
    target.nodes = NODES
    report = status.collect(target, local_runner(shim_bin(tmp_path, firewall_unit="inactive")))
    assert [n["firewall"]["unit_state"] for n in report["nodes"]] == ["inactive", "inactive"]
    assert not [f for f in status.problems(report, 65536, None) if "firewall" in f]


def test_clear_hold_removes_the_hold_and_waits_for_the_guard(endpoint, tmp_path):
    from ops.hold import clear_hold

    behaviour, target = endpoint
    target.nodes = NODES
    verdicts = [{**GUARD_OK, "hold": HOLD}, {**GUARD_OK, "hold": None, "restarts_in_window": 0}]
    commands = []

    def shell(node, command, stdin):
        commands.append((node["name"], command))
        return json.dumps(verdicts[0] if len(commands) == 1 else verdicts[1])

    assert clear_hold(target, shell, quiet(), wait_s=10) == 0
    assert ("spark1", "sudo -n rm -f /run/twinspark/serving-hold") in commands
    assert all(name == "spark1" for name, _ in commands)
    # not held: nothing removed
    commands.clear()
    verdicts[0] = GUARD_OK
    assert clear_hold(target, shell, quiet(), wait_s=10) == 0
    assert commands == [("spark1", "cat /run/twinspark/serving-guard/status.json")]


def test_status_survives_an_unreachable_node(endpoint):
    behaviour, target = endpoint
    target.nodes = NODES

    def unreachable(node, args):
        raise RuntimeError(f"ssh nvidia@{node['host']} failed: Connection timed out")

    report = status.collect(target, unreachable)
    assert [n["error"] for n in report["nodes"]] == ["ssh nvidia@h1 failed: Connection timed out",
                                                    "ssh nvidia@h2 failed: Connection timed out"]
    assert len(status.problems(report, 9000, 200000)) == 2


# ---- client setup ---------------------------------------------------------------------------------
def stack_outputs_for_tests():
    from components.client_outputs import render_claude_code_env, render_codex_config, render_codex_model_catalog
    from components.config import parse_stack_config

    cfg = parse_stack_config(config_blocks())
    return {"codexConfig": render_codex_config(cfg), "codexModelCatalog": render_codex_model_catalog(cfg),
            "claudeCodeEnv": render_claude_code_env(cfg, "sk-outputs-key"), "model": "ds-0731",
            "endpoint": "http://192.168.1.10:8000/v1"}


EXISTING_CONFIG = """# my codex settings
model = "gpt-5.5"          # the cloud default
approval_policy = "on-request"

[model_providers.openrouter]
name = "OpenRouter"
base_url = "https://openrouter.ai/api/v1"
env_key = "OPENROUTER_API_KEY"

[profiles.cloud]
model = "gpt-5.5"
model_provider = "openai"
"""


def test_codex_merge_keeps_everything_else():
    merged = merge_codex_config(EXISTING_CONFIG, stack_outputs_for_tests()["codexConfig"])
    import tomllib

    doc = tomllib.loads(merged)
    assert doc["model"] == "ds-0731" and doc["model_provider"] == "twinspark"
    assert doc["model_auto_compact_token_limit"] == 150000
    assert doc["approval_policy"] == "on-request"
    assert doc["model_providers"]["openrouter"]["env_key"] == "OPENROUTER_API_KEY"
    assert doc["model_providers"]["twinspark"]["wire_api"] == "responses"
    assert doc["profiles"]["cloud"]["model"] == "gpt-5.5"
    assert "# my codex settings" in merged


def test_client_setup_writes_backs_up_and_is_idempotent(tmp_path):
    codex_home, env_file = tmp_path / "codex", tmp_path / "cfg" / "claude-code.env"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(EXISTING_CONFIG)
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(stack_outputs_for_tests()))
    args = ["client-setup", "--outputs-file", str(outputs_file), "--endpoint", "http://h:8000/v1",
            "--codex-home", str(codex_home), "--claude-env-file", str(env_file)]
    assert ops_main(args) == 0
    backups = list(codex_home.glob("config.toml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == EXISTING_CONFIG
    catalog = codex_home / "ds-0731-model-catalog.json"
    assert json.loads(catalog.read_text())["models"][0]["context_window"] == 1048576
    assert f'model_catalog_json = "{catalog}"' in (codex_home / "config.toml").read_text()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert "ANTHROPIC_AUTH_TOKEN=sk-outputs-key" in env_file.read_text()
    before = {p.name: p.read_text() for p in codex_home.iterdir()}
    assert ops_main(args) == 0  # a second run changes nothing and keeps no second backup
    assert {p.name: p.read_text() for p in codex_home.iterdir()} == before


def test_codex_accepts_the_merged_config(tmp_path):
    codex = ROOT / "build/codex/node_modules/.bin/codex"
    assert codex.exists(), "scripts/test.sh installs the Codex CLI into build/codex"
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(EXISTING_CONFIG)
    setup_clients(stack_outputs_for_tests(), codex_home, tmp_path / "claude.env")
    proc = subprocess.run([str(codex), "debug", "models"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CODEX_HOME": str(codex_home)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    models = json.loads(proc.stdout)["models"]
    assert [m["slug"] for m in models] == ["ds-0731"] and models[0]["context_window"] == 1048576


def test_missing_outputs_are_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="stack output 'codexConfig' is missing"):
        setup_clients({}, tmp_path, tmp_path / "env")


# ---- bad input, a bad endpoint: one clear line and a nonzero exit (issue 9) --------------------------
def run_ops(capsys, *args):
    """ops' exit code, stderr and stdout; argparse's own exit counts too."""
    try:
        code = ops_main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def one_clear_line(err, *words):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(word in lines[0] for word in words), err
    return lines[0]


def dead_endpoint():
    """An address where nothing listens."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("tool, flags, words", [
    ("bench", ["--sweep", "1,x"], ["--sweep", "'x' is not a whole number"]),
    ("bench", ["--runs", "0"], ["--runs", "not above zero"]),
    ("bench", ["--sweep-repeats", "0"], ["--sweep-repeats", "not above zero"]),
    ("bench", ["-o", "/nonexistent-dir/r.json"], ["no such directory"]),
    ("bench", ["--deadline-min", "soon"], ["--deadline-min", "not a number"]),
    ("needle", ["--sizes", "12q"], ["--sizes", "'12q' is not a number of tokens"]),
    ("needle", ["--sizes", "2k,abc"], ["--sizes", "'abc'"]),
    ("needle", ["--sizes", "inf"], ["--sizes", "'inf'"]),
    ("needle", ["--sizes", "0"], ["--sizes", "not above zero"]),
    ("needle", ["--trials", "-1"], ["--trials"]),
])
def test_bad_flags_are_one_line_before_any_request(endpoint, capsys, tool, flags, words):
    behaviour, target = endpoint
    extra = SMALL_FLAGS if tool == "bench" else []
    code, err, _ = run_ops(capsys, tool, *target_flags(target), *extra, *flags)
    assert code == 2
    assert one_clear_line(err, *words).startswith((f"ops {tool}: ", f"python -m ops {tool}: "))
    assert behaviour.requests == []


@pytest.mark.parametrize("tool", ["bench", "needle"])
def test_a_dead_endpoint_or_a_refused_key_is_an_error(endpoint, capsys, tool):
    behaviour, target = endpoint
    code, err, _ = run_ops(capsys, tool, "--endpoint", dead_endpoint(), "--api-key", "k", "--model", target.model)
    assert code == 1
    one_clear_line(err, f"ops {tool}: cannot reach", "ConnectError")
    code, err, _ = run_ops(capsys, tool, "--endpoint", target.endpoint, "--api-key", "wrong", "--model", target.model)
    assert code == 1
    one_clear_line(err, f"ops {tool}: ", "refused the API key (HTTP 401)")
    behaviour.model = "another-model"
    code, err, _ = run_ops(capsys, tool, *target_flags(target))
    assert code == 1
    one_clear_line(err, "does not serve 'fake-model' (it serves another-model)")
    assert all(r.path == "/v1/chat/completions" and not r.authorized for r in behaviour.requests) or not behaviour.requests


def test_needle_counts_trials_without_an_answer_as_errors_not_model_failures(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.chat_error = (500, "engine dead")
    out = tmp_path / "needle.json"
    code, _, stdout = run_ops(capsys, "needle", *target_flags(target), "--sizes", "2k", "--trials", "2", "-o", str(out))
    assert code == 1
    row = json.loads(out.read_text())["sizes"][0]
    assert (row["errors"], row["real_failures"], row["passes"]) == (2, 0, 0)
    assert "ERROR: 2 of 2 trials got no answer to score" in stdout


GARBAGE_STREAMS = [
    (b"<html><body>502 Bad Gateway</body></html>\n", "not a server-sent event line"),
    (b"data: {not json\n\n", "malformed stream event"),
    (b'data: {"choices": "abc"}\n\n', "malformed stream event (choices: Input should be a valid array)"),
    (b"data: [1, 2]\n\n", "malformed stream event"),
    (b'data: {"choices": [{"delta": "x"}]}\n\n', "malformed stream event (choices[0].delta"),
    (b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', "the stream ended before `data: [DONE]`"),
]


@pytest.mark.parametrize("garbage, message", GARBAGE_STREAMS)
def test_garbage_streams_are_request_errors_not_tracebacks(endpoint, tmp_path, capsys, garbage, message):
    behaviour, target = endpoint
    behaviour.raw_stream = garbage
    out = tmp_path / "r.json"
    assert run_ops(capsys, "bench", *target_flags(target), *SMALL_FLAGS, "-o", str(out))[0] == 1
    errors = json.loads(out.read_text())["errors"]
    assert len(errors) == 1 + 8 and all(message in e for e in errors)
    out = tmp_path / "n.json"
    assert run_ops(capsys, "needle", *target_flags(target), "--sizes", "2k", "--trials", "1", "-o", str(out))[0] == 1
    assert json.loads(out.read_text())["sizes"][0]["errors"] == 1


@pytest.mark.parametrize("body, message", [
    (b"<html>it works</html>", "not a model list"),
    (b'{"data": []}', "data: List should have at least 1 item"),
    (b'{"data": [{"name": "m"}]}', "data[0].id: Field required"),
    (b"[1, 2]", "not a model list"),
])
def test_status_judges_what_v1_models_says(endpoint, capsys, body, message):
    behaviour, target = endpoint
    behaviour.raw_models = body
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key, target.model), "nodes": []}
    assert [p for p in status.problems(report, 9000, 200000) if message in p and "/v1/models" in p]
    code, err, _ = run_ops(capsys, "bench", *target_flags(target))  # bench and needle check it before any request
    assert code == 1 and message in one_clear_line(err)


def test_status_flags_a_model_other_than_the_stacks(endpoint):
    behaviour, target = endpoint
    behaviour.model = "something-else"
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key, "fake-model"), "nodes": []}
    assert status.problems(report, 9000, 200000) == [
        f"endpoint {target.base_url}: serves something-else, not the stack's model fake-model"]


def test_status_prints_what_servers_say_literally(endpoint, capsys):
    behaviour, target = endpoint
    behaviour.raw_models = b"[/oops] [bold]"  # rich would read it as markup and raise
    console = Console(record=True, width=300, file=open(os.devnull, "w"))
    report = {"endpoint": status.endpoint_status(target.base_url, target.api_key), "nodes": [
        {"node": "spark1", "error": "ssh nvidia@h1 failed: [/x] closed"}]}
    status.render(report, status.problems(report, 9000, 200000), console)
    text = console.export_text()
    assert "[/x] closed" in text and "[/oops] [bold]" in text


@pytest.mark.parametrize("nodes, words", [
    ("not json", ["--nodes: not JSON"]),
    ('{"name": "spark1"}', ["--nodes: the top level: Input should be a valid array"]),
    ("[1]", ["--nodes: [0]: Input should be an object"]),
    ('[{"name": "spark1"}]', ["--nodes: [0].role: Field required"]),
    ('[{"name": "a", "role": "boss", "host": "h", "rayIp": "10.0.0.1", "rails": []}]', ["--nodes: [0].role: "]),
    ('[{"name": "a", "role": "worker", "host": "h", "rayIp": "10.0.0.1", "rails": [{"iface": "x"}]}]',
     ["--nodes: [0].rails[0].hca: Field required"]),
    ('[{"name": "a", "role": "worker", "host": "h", "rayIp": "10.0.0.1", "rails": []}]', ["exactly one with role head"]),
    ('[{"name": "a", "role": "head", "host": "h", "rayIp": "10.0.0.1", "rails": [], "hostKey": "ssh-ed25519 AAAA!"}]',
     ["--nodes: [0].hostKey: ", "not a base64 SSH public key"]),
    ('[{"name": "a", "role": "head", "host": "h", "rayIp": "10.0.0.1", "rails": []}]', ["a: no hostKey", "pulumi up"]),
])
def test_bad_nodes_are_one_line(endpoint, capsys, nodes, words):
    behaviour, target = endpoint
    code, err, _ = run_ops(capsys, "status", *target_flags(target), "--nodes", nodes, "--ssh-user", "u",
                        "--expect-mtu", "9000", "--expect-speed-mbps", "200000")
    assert code == 2
    one_clear_line(err, "ops status: ", *words)


@pytest.mark.parametrize("tool", ["status", "bench", "needle", "client-setup"])
@pytest.mark.parametrize("content, words", [
    (None, ["--outputs-file", "no such file"]),
    ("{oops", ["--outputs-file", "not JSON"]),
    ("[1, 2]", ["--outputs-file", "not `pulumi stack output --json --show-secrets`"]),
    ('{"endpoint": "http://h:8000/v1", "nodes": 5}', ["nodes: Input should be a valid list"]),
    ('{"endpoint": ["http://h"]}', ["endpoint: Input should be a valid string"]),
])
def test_bad_outputs_file_is_one_line(tmp_path, capsys, tool, content, words):
    outputs = tmp_path / "outputs.json"
    if content is not None:
        outputs.write_text(content)
    code, err, _ = run_ops(capsys, tool, "--outputs-file", str(outputs))
    assert code == 2
    one_clear_line(err, f"ops {tool}: ", *words)


@pytest.mark.parametrize("tool, flags", [
    ("bench", ["--max-tokens", "100000", "--deadline-min", "0.02"]),
    ("needle", ["--sizes", "1k,2k", "--trials", "1", "--max-tokens", "100000", "--deadline-min", "0.02"]),
])
def test_bench_and_needle_stop_at_their_overall_deadline(endpoint, capsys, tool, flags):
    behaviour, target = endpoint
    behaviour.decode_tok_s = 5.0  # a server that has all but stopped answering
    started = time.monotonic()
    code, err, _ = run_ops(capsys, tool, *target_flags(target), *flags)
    assert code == 1 and time.monotonic() - started < 10
    one_clear_line(err, f"ops {tool}: stopped at the overall deadline of 0.02 min (--deadline-min)")


def test_needle_keeps_the_sizes_done_at_the_deadline(endpoint, tmp_path, capsys):
    behaviour, target = endpoint
    behaviour.decode_tok_s = 50000.0
    out = tmp_path / "n.json"
    calls = []

    def hangs_after_the_first_size(tokens):
        calls.append(tokens)
        if len(calls) > 1:
            time.sleep(5)  # past the deadline; the client has given up by then
        return [f"t{i} " for i in range(tokens)]

    behaviour.engine = hangs_after_the_first_size
    code, err, _ = run_ops(capsys, "needle", *target_flags(target), "--sizes", "1k,2k", "--trials", "1",
                        "--deadline-min", "0.03", "-o", str(out))
    assert code == 1
    one_clear_line(err, "overall deadline", "1 of 2 sizes were done and are written to")
    result = json.loads(out.read_text())
    assert result["complete"] is False and [row["size"] for row in result["sizes"]] == [1000]


# The user's providers in each way TOML allows, without and with an older twinspark provider of theirs.
PROVIDER_STYLES = {
    "inline table": ('model_providers = { openrouter = { name = "OR", base_url = "https://or/v1" }{} }\n',
                     ', twinspark = { name = "old", x = 1 }'),
    "dotted keys": ('model_providers.openrouter.name = "OR"\nmodel_providers.openrouter.base_url = "https://or/v1"\n{}',
                    'model_providers.twinspark.name = "old"\nmodel_providers.twinspark.x = 1\n'),
    "dotted inline": ('model_providers.openrouter = { name = "OR", base_url = "https://or/v1" }\n{}',
                      'model_providers.twinspark = { name = "old", x = 1 }\n'),
    "inline in a table": ('[model_providers]\nopenrouter = { name = "OR", base_url = "https://or/v1" }\n{}',
                          'twinspark = { name = "old", x = 1 }\n'),
    "dotted in a table": ('[model_providers]\nopenrouter.name = "OR"\nopenrouter.base_url = "https://or/v1"\n{}',
                          'twinspark.name = "old"\ntwinspark.x = 1\n'),
    "split tables": ('[model_providers.openrouter]\nname = "OR"\n[profiles.a]\nmodel = "m"\n'
                     '[model_providers.other]\nname = "O"\n{}', '[model_providers.twinspark]\nname = "old"\nx = 1\n'),
}


@pytest.mark.parametrize("style", PROVIDER_STYLES)
@pytest.mark.parametrize("with_old_twinspark", [False, True])
def test_codex_merge_keeps_providers_in_any_toml_style(style, with_old_twinspark):
    """Whatever way the user wrote their providers, they are all still there, and ours replaces only ours."""
    import tomllib

    template, old_twinspark = PROVIDER_STYLES[style]
    existing = template.replace("{}", old_twinspark if with_old_twinspark else "")
    user = tomllib.loads(existing)
    assert ("twinspark" in user["model_providers"]) == with_old_twinspark
    generated = stack_outputs_for_tests()["codexConfig"]
    merged = tomllib.loads(merge_codex_config(existing, generated))
    ours = tomllib.loads(generated)
    assert merged["model_providers"] == {**user["model_providers"], "twinspark": ours["model_providers"]["twinspark"]}
    assert merged["model"] == "ds-0731" and merged["model_provider"] == "twinspark"
    assert merged.get("profiles") == user.get("profiles")


def client_setup_args(tmp_path, outputs):
    codex_home, env_file = tmp_path / "codex", tmp_path / "cfg" / "claude-code.env"
    codex_home.mkdir(exist_ok=True)
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    return codex_home, env_file, ["client-setup", "--outputs-file", str(outputs_file), "--codex-home", str(codex_home),
                                  "--claude-env-file", str(env_file)]


def test_client_setup_twice_in_one_second_keeps_every_backup(tmp_path, monkeypatch):
    import ops.client_setup

    moment = time.gmtime(1_800_000_000)
    monkeypatch.setattr(ops.client_setup.time, "gmtime", lambda *_: moment)  # both runs in one second
    outputs = stack_outputs_for_tests()
    codex_home, _, args = client_setup_args(tmp_path, outputs)
    (codex_home / "config.toml").write_text(EXISTING_CONFIG)
    assert ops_main(args) == 0
    first = (codex_home / "config.toml").read_text()
    outputs["codexConfig"] = outputs["codexConfig"].replace("150000", "140000")  # the stack changed meanwhile
    _, _, args = client_setup_args(tmp_path, outputs)
    assert ops_main(args) == 0
    backups = sorted(codex_home.glob("config.toml.bak-*"))
    assert [b.name for b in backups] == ["config.toml.bak-20270115T080000Z", "config.toml.bak-20270115T080000Z-1"]
    assert [b.read_text() for b in backups] == [EXISTING_CONFIG, first]  # the user's own file is still there


@pytest.mark.parametrize("broken", ["config.toml is a directory", "config.toml is not TOML", "catalog is a directory"])
def test_client_setup_refuses_what_it_cannot_merge_and_writes_nothing(tmp_path, capsys, broken):
    codex_home, env_file, args = client_setup_args(tmp_path, stack_outputs_for_tests())
    if broken == "config.toml is a directory":
        (codex_home / "config.toml").mkdir()
    elif broken == "config.toml is not TOML":
        (codex_home / "config.toml").write_text("model = [unclosed\n")
    else:
        (codex_home / "ds-0731-model-catalog.json").mkdir()
    before = sorted(p.name for p in codex_home.iterdir())
    code, err, _ = run_ops(capsys, *args)
    assert code == 2
    one_clear_line(err, "ops client-setup: ", "nothing was written")
    assert sorted(p.name for p in codex_home.iterdir()) == before and not env_file.exists()
    if broken == "config.toml is not TOML":
        assert (codex_home / "config.toml").read_text() == "model = [unclosed\n"


def test_claude_env_file_is_private_from_its_creation(tmp_path, monkeypatch):
    """With a permissive umask and every chmod a no-op, the key's file and its backup are still 0600:
    they were created that way, never written under a wider mode and narrowed afterwards."""
    import pathlib

    for module, name in ((os, "chmod"), (os, "fchmod"), (pathlib.Path, "chmod")):
        monkeypatch.setattr(module, name, lambda *a, **k: None)
    old_umask = os.umask(0)
    try:
        outputs = stack_outputs_for_tests()
        _, env_file, args = client_setup_args(tmp_path, outputs)
        assert ops_main(args) == 0
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        outputs["claudeCodeEnv"] = outputs["claudeCodeEnv"].replace("sk-outputs-key", "sk-rotated")
        _, _, args = client_setup_args(tmp_path, outputs)
        assert ops_main(args) == 0
        for path in env_file.parent.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
        assert len(list(env_file.parent.iterdir())) == 2  # the file and its backup, no temporary left
    finally:
        os.umask(old_umask)


# ---- the stand-in itself ----------------------------------------------------------------------------
def test_standin_streams_vllms_chunk_format(endpoint):
    """Every event is a whole chat.completion.chunk (one id for the stream), so any OpenAI client can read it;
    the first carries the role alone, as vLLM's does (tests/test_standin_matches_vllm.py holds the rest)."""
    import httpx

    behaviour, target = endpoint
    behaviour.decode_tok_s = 5000.0
    body = {"model": target.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    resp = httpx.post(target.endpoint + "/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {target.api_key}"})
    lines = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    assert len(events) == 5 and len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == "fake-model" and isinstance(e["created"], int)
               for e in events)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["finish_reason"] for e in events[:4]] == [None, None, None, "length"]
    assert events[4]["choices"] == [] and events[4]["usage"]["completion_tokens"] == 3
