"""The memory-fit estimate before the load (launch/model-shape.py), against the seed's own
load: model 79.2 GiB per node, KV 20.5 (head) + 18.4 GiB -> 2,682,310 tokens (seed §4)."""

import argparse
import math

import pytest

from core import recipes
from components.config import parse_stack_config
from components.model_weights import memory_fit_args, parse_memory_fit
from program_harness import stack_config
from test_node_artifacts import GIB, run_shape_check
from toolbox import load_launch

shape_check = load_launch("model-shape.py")

SEED_WEIGHTS = 167 * 10**9  # 48 shards, 167 GB of safetensors (seed §3)
SPARK_MEMTOTAL = 127535148 * 1024  # a Spark's MemTotal (121.6 GiB)


def seed_fit(max_model_len=1048576):
    seed = recipes.recipe_named(recipes.DEFAULT_RECIPE)
    return shape_check.memory_fit(SEED_WEIGHTS, 2, 0.85, SPARK_MEMTOTAL, seed.memory.kv_bytes_per_token,
                                  seed.memory.overhead_gib * GIB, max_model_len)


def test_the_estimate_reproduces_the_seeds_load_within_ten_percent():
    fit = seed_fit()
    assert fit["weightsPerNodeGiB"] == pytest.approx(79.2, rel=0.10)
    assert fit["kvGiB"] == pytest.approx(20.5, rel=0.10)
    assert fit["kvTokens"] == pytest.approx(2_682_310, rel=0.10)
    assert "ok   memory fit" in shape_check.fit_line(fit, 0.85)


def test_mla_kv_per_token_is_the_compressed_latent_not_the_heads():
    """DeepSeek-V3's shape: 61 layers, kv_lora_rank 512 + rope 64; 128 heads would be 250x more."""
    config = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
              "qk_rope_head_dim": 64, "head_dim": 128}
    assert shape_check.kv_bytes_per_token(config, 2, "fp8_ds_mla") == 61 * 656
    assert shape_check.kv_bytes_per_token(config, 2, "bfloat16") == 61 * 576 * 2
    gqa = {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}
    assert shape_check.kv_bytes_per_token(gqa, 2, "fp8") == 36 * 2 * 4 * 64


def test_a_max_model_len_that_cannot_fit_is_refused_with_the_numbers():
    line = shape_check.fit_line(seed_fit(max_model_len=4_194_304), 0.85)
    assert line.startswith("FAIL memory fit") and "4,194,304" in line and "lower serving.maxModelLen to at most" in line


def test_the_shape_check_refuses_before_the_copy_and_prints_the_estimate(tmp_path):
    """As the program sends it: a peer of 64 GiB holds 2 GiB of weights, but not 64 GiB of KV."""
    config = {"num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 32, "head_dim": 128}
    fit = ["--kv-cache-dtype", "bfloat16", "--max-model-len", "1048576",
           "--kv-bytes-per-token", "0", "--overhead-gib", "1"]
    proc = run_shape_check(tmp_path, config, {"m.safetensors": 4 * GIB}, tp=2, peers_kb=[64 << 20],
                           memory_fit=fit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL memory fit: 2.0 GiB weights per node" in proc.stdout and "65536 B/token" in proc.stdout
    assert parse_memory_fit(proc.stdout)["maxModelLen"] == 1048576


def test_the_program_sends_the_recipes_facts_and_the_config_values():
    cfg = parse_stack_config({k.removeprefix("twinspark:"): v for k, v in stack_config().items()})
    assert memory_fit_args(cfg.serving) == ["--kv-cache-dtype", "fp8_ds_mla", "--max-model-len", "1048576",
                                            "--kv-bytes-per-token", "8206",
                                            "--overhead-gib", "4.5"]


def test_a_shape_that_gives_no_kv_size_skips_the_fit_instead_of_refusing_it(tmp_path):
    """Found by the engine simulator: a config.json without layers (and a recipe without its own
    figure) made 0 B a token, 0 tokens, and refused every maxModelLen."""
    config = {"num_attention_heads": 64, "num_key_value_heads": 8}  # no num_hidden_layers, no head size
    fit = ["--kv-cache-dtype", "fp8", "--max-model-len", "32768", "--kv-bytes-per-token", "0", "--overhead-gib", "1"]
    proc = run_shape_check(tmp_path, config, {"m.safetensors": 4 * GIB}, tp=2, peers_kb=[64 << 20],
                           memory_fit=fit)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skip memory fit: config.json gives no KV size per token" in proc.stdout
    assert parse_memory_fit(proc.stdout) == {}


def test_pp_divides_the_weights_and_each_stage_caches_its_own_layers_kv():
    """At TP 1 × PP 3 each node holds a third of the weights and the KV of its stage's layers only;
    at TP 2 the same figures as without PP (both of these against the node's memory)."""
    gqa = {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}
    assert shape_check.kv_bytes_per_token(gqa, 2, "fp8", pp=1) == 36 * 2 * 4 * 64
    assert shape_check.kv_bytes_per_token(gqa, 1, "fp8", pp=3) == 12 * 2 * 8 * 64
    hybrid = {**gqa, "num_hidden_layers": 8, "layer_types": ["linear_attention"] * 3 + ["full_attention"]
              + ["linear_attention"] * 2 + ["full_attention"] * 2}
    assert shape_check.kv_layers(hybrid, 1) == 3 and shape_check.kv_layers(hybrid, 2) == 2  # stage 2 holds two
    two = seed_fit()
    three = shape_check.memory_fit(SEED_WEIGHTS, 1, 0.85, SPARK_MEMTOTAL, math.ceil(8206 * 15 / 43), 4.5 * GIB,
                                   1048576, pp=3)
    assert two == shape_check.memory_fit(SEED_WEIGHTS, 2, 0.85, SPARK_MEMTOTAL, 8206, 4.5 * GIB, 1048576, pp=1)
    assert three["weightsPerNodeGiB"] == round(SEED_WEIGHTS / 3 / GIB, 1) == 51.8
    assert three["kvGiB"] > two["kvGiB"] and three["kvTokens"] > 3 * two["kvTokens"]


def test_the_shape_check_scales_the_recipes_kv_figure_to_the_fullest_stage():
    """The recipe's 8206 B/token is every layer's, on one node: at PP 3 a node keeps 15 of the 43
    layers (14/15/14); at TP 2 the check computes what it computed before PP existed. Through
    shape_lines, with the flags as model-shape.py parses them from the program's command line."""
    seed = recipes.recipe_named(recipes.DEFAULT_RECIPE)
    config = seed.shape.as_config_json()
    files = {f"model-{i:05d}.safetensors": {"size": SEED_WEIGHTS // 48} for i in range(48)}
    fit = memory_fit_args(parse_stack_config({k.removeprefix("twinspark:"): v for k, v in stack_config().items()})
                          .serving)
    memory = [f"spark{i}={SPARK_MEMTOTAL >> 10}" for i in (1, 2, 3)]

    def lines(tp, pp):
        parser = argparse.ArgumentParser()
        shape_check.add_shape_flags(parser)
        pipeline = ["--pipeline-parallel-size", str(pp)] if pp > 1 else []  # as model_weights.shape_args sends it
        args = parser.parse_args(["--tensor-parallel-size", str(tp), *pipeline, "--gpu-memory-utilization", "0.85",
                                  *(a for m in memory[:tp * pp] for a in ("--memory-kb", m)), *fit])
        return shape_check.shape_lines(config, files, args)

    two_lines, two = lines(2, 1)
    three_lines, three = lines(1, 3)
    assert two == seed_fit() and two["kvBytesPerToken"] == 8206, two
    assert three["kvBytesPerToken"] == math.ceil(8206 * 15 / 43) == 2863, three
    assert three["weightsPerNodeGiB"] == 51.8 and three["kvTokens"] > 3 * two["kvTokens"], three
    assert not any(line.startswith("FAIL") for line in two_lines + three_lines), two_lines + three_lines
    assert "ok   hidden layers: 43 over PP 3, 14/15/14 per stage" in "\n".join(three_lines)
