"""The recipe catalog (recipes/*.yaml): each entry loads, names only what vLLM registers, and
owns exactly its part of a deployment under the program harness."""

import copy
import json
import shutil

import pulumi
import pytest

from core import contract
from core import loaders, recipes
from components.config import parse_stack_config
from program_harness import ROOT, flag_value, runner_call, stack_config
from ssh_fixtures import pinned
from toolbox import load_file

CATALOG = recipes.load_catalog()
RECIPE_KEYS = ("maxModelLen", "gpuMemoryUtilization", "kvCacheDtype")


def test_the_catalog_holds_the_five_models_and_the_seed_is_the_default():
    assert set(CATALOG) == {"DeepSeek-V4-Flash-0731", "GLM-5.3-Flash-NVFP4", "Qwen3.8-Flash-Next", "MiniMax-M2.7",
                            "gpt-oss-120b"}
    assert recipes.DEFAULT_RECIPE == "DeepSeek-V4-Flash-0731"


def test_a_sixth_recipe_is_one_file(tmp_path):
    for path in (ROOT / "recipes").glob("*.yaml"):
        shutil.copy(path, tmp_path)
    text = (ROOT / "recipes" / "gpt-oss-120b.yaml").read_text()
    (tmp_path / "gpt-oss-20b.yaml").write_text(text.replace("name: gpt-oss-120b", "name: gpt-oss-20b")
                                               .replace("repo: openai/gpt-oss-120b", "repo: openai/gpt-oss-20b"))
    found = recipes.load_catalog(tmp_path)
    assert found["gpt-oss-20b"].repo == "openai/gpt-oss-20b" and len(found) == len(CATALOG) + 1
    assert "`gpt-oss-20b`" in recipes.models_table(found)


@pytest.mark.parametrize("key, wrong, kind", [
    ("toolCallParser: glm47", "toolCallParser: glm_47", "tool call parsers"),
    ("reasoningParser: glm45", "reasoningParser: glm4.5", "reasoning parsers"),
    ("kvCacheDtype: nvfp4_ds_mla", "kvCacheDtype: nvfp4_dsmla", "kv cache dtypes"),
    ("moeBackend: b12x", "moeBackend: b12", "moe backends"),
    ("attentionBackend: B12X", "attentionBackend: b12x", "attention backends"),
    ("- [--dtype, bfloat16]", "- [--dtypes, bfloat16]", "engine flags"),
])
def test_a_misspelt_vllm_name_is_refused_naming_the_file_and_the_names(tmp_path, key, wrong, kind):
    text = (ROOT / "recipes" / "glm-5.3-flash-nvfp4.yaml").read_text()
    assert key in text
    (tmp_path / "glm.yaml").write_text(text.replace(key, wrong))
    with pytest.raises(recipes.RecipeError) as err:
        recipes.load_catalog(tmp_path)
    assert "glm.yaml" in str(err.value) and wrong.split(": ")[-1].strip("- [,").split(",")[0] in str(err.value)
    assert kind in str(err.value) or "flag" in str(err.value)


@pytest.mark.parametrize("line, accepted", [
    ("- [--enable-prefix-cachin]", False),      # one letter short of a real flag
    ("- [--no-enable-prefix-cachin]", False),
    ("- [--max-num-partial-prefills, \"2\"]", True),   # upstream flags no recipe uses: from arg_utils.py
    ("- [--no-enable-prefix-caching]", True),   # a bool field's BooleanOptionalAction form
    ("- [--swap-space, \"4\"]", True),
    ("- [--enable-log-requests]", True),         # AsyncEngineArgs
    ("- [--disable-uvicorn-access-log]", True),  # FrontendArgs (cli_args.py)
    ("- [--linear-backend, b12x]", True),       # fork-only, listed with where it was seen
])
def test_engine_flags_are_vllms_parser_flags(tmp_path, line, accepted):
    """vllm.args take what vLLM's extracted parser (or the fork list) registers, and nothing else."""
    text = (ROOT / "recipes" / "glm-5.3-flash-nvfp4.yaml").read_text()
    anchor = "    - [--enable-prefix-caching]\n"
    assert anchor in text
    (tmp_path / "glm.yaml").write_text(text.replace(anchor, anchor + "    " + line + "\n", 1))
    if accepted:
        assert recipes.load_catalog(tmp_path)
    else:
        with pytest.raises(recipes.RecipeError, match=r"glm\.yaml: vllm\.args: --(no-)?enable-prefix-cachin is not"):
            recipes.load_catalog(tmp_path)


def test_the_engine_flags_are_extracted_and_the_fork_list_holds_only_what_upstream_lacks():
    names = recipes.vllm_names()
    extracted, fork = set(names["engine_flags"]["names"]), names["engine_flags_not_in_source"]
    assert "dev/extract_vllm_flags.py" in (ROOT / "recipes" / "vllm-names.toml").read_text()
    assert len(extracted) > 200 and not extracted & set(fork)
    assert all(where.strip() for where in fork.values())


def test_the_extractor_reads_add_argument_calls_field_loops_and_bool_fields():
    module = load_file(ROOT / "dev" / "extract_vllm_flags.py")
    source = """
class EngineArgs:
    enable_x: bool | None = None
    size: int = 1
    def add_cli_args(parser):
        kw = get_kwargs(CacheConfig)
        parser.add_argument("--enable-x", **kw["enable_x"])
        parser.add_argument("--size", "-s", **kw["size"])
        parser.add_argument("--flag", action="store_true")
        parser.add_argument("--toggle", action=argparse.BooleanOptionalAction)
        for arg, type in [("--old-a", str), ("--old-b", bool)]:
            parser.add_argument(arg, type=type)
class FrontendArgs:
    port: int = 8000
    quiet: bool = False
    def add_cli_args(parser):
        frontend_kwargs = get_kwargs(FrontendArgs)
        for key, value in frontend_kwargs.items():
            parser.add_argument(f"--{key.replace('_', '-')}", **value)
def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
"""
    assert module.extract([source]) == sorted([
        "--enable-x", "--no-enable-x", "--size", "-s", "--flag", "--toggle", "--no-toggle", "--old-a", "--old-b",
        "--port", "--quiet", "--no-quiet"])


def test_a_misspelt_kv_dtype_in_the_config_is_a_config_error_before_any_resource(program, recipe_config):
    recipe_config["twinspark:serving"]["kvCacheDtype"] = "fp8_dsmla"
    result = program(recipe_config)
    assert result.resources == [] and "twinspark:serving.kvCacheDtype: 'fp8_dsmla'" in result.error["message"]


def test_an_unknown_recipe_is_a_config_error_naming_the_catalog(program, recipe_config):
    recipe_config["twinspark:serving"]["recipe"] = "GLM-5.3"
    result = program(recipe_config)
    assert result.resources == [] and "twinspark:serving.recipe: 'GLM-5.3'" in result.error["message"]
    assert "GLM-5.3-Flash-NVFP4" in result.error["message"]


def test_a_recipe_may_not_set_what_twinspark_env_sets(tmp_path, monkeypatch):
    text = (ROOT / "recipes" / "minimax-m2.7.yaml").read_text()
    (tmp_path / "m.yaml").write_text(text.replace("env:\n", "env:\n  NCCL_IB_HCA: mlx5_0\n"))
    monkeypatch.setattr(contract, "ENV_FILE", "renamed.env")  # the message names the contract's file, not a copy
    with pytest.raises(recipes.RecipeError, match=r"NCCL_IB_HCA is twinspark's to set \(renamed\.env\)"):
        recipes.load_catalog(tmp_path)


def test_the_stack_files_serving_values_are_the_seed_recipes():
    """Pulumi.spark.yaml sets what the DeepSeek recipe would: dropping them changes nothing."""
    cfg = {k.removeprefix("twinspark:"): v for k, v in stack_config().items()}
    dropped = copy.deepcopy(cfg)
    for key in RECIPE_KEYS:
        del dropped["serving"][key]
    assert parse_stack_config(cfg).serving == parse_stack_config(dropped).serving


def on_recipe(name: str) -> dict:
    config = pinned(stack_config())
    serving = {k: v for k, v in config["twinspark:serving"].items() if k not in RECIPE_KEYS}
    config["twinspark:serving"] = {**serving, "recipe": name}
    return config


def inputs_of(run) -> dict:
    return {r.name: json.dumps(r.inputs, sort_keys=True) for r in run.resources}


# What a recipe owns: the launch script and the environment of every node (and what follows
# their hash: the serving containers and the NCCL check, which runs with the serving env), the
# monitoring's dashboards and alert rules (Grafana and Prometheus restart on a change), the
# memory budget where its gpuMemoryUtilization differs, the memory-fit inputs of the shape check
# and of the fetch (which runs it before the download) — the sync key's authorization opens and
# closes again for that check (issue 37) — and the client outputs (and the `recipe` output, and
# `launchBundles`: the bundles' hashes).
OWNED = ("-weights-shape-check", "-weights-fetch", "-weights-authorize", "-weights-revoke", "-bundle-launch-vllm-sh",
         "-bundle-twinspark-env", "-serving-container", "nccl-run",
         "-observability-dashboard-spec-decode", "-observability-alert-rules", "-observability-grafana",
         "-observability-dashboard-overview",  # its prompt-size graph's line: the recipe's compaction fence
         "-observability-prometheus", "-guard-unit")  # the guard's canary: the recipe's tool parser
BUDGET = ("-hostprep-cotenants-", "-fabric-check")  # the fabric check follows host prep
# the seed's recipe records the commit its repository is served at; another recipe on that
# repository records none, so the hub's commit is resolved (StackConfig.model_revision)
REVISION = ("-weights-revision", "-weights-sync")
CLIENT_OUTPUTS = {"codexConfig", "codexModelCatalog", "claudeCodeEnv", "recipe", "launchBundles"}


@pytest.fixture(scope="module")
def seed_run(program):
    run = program(on_recipe(recipes.DEFAULT_RECIPE))
    assert run.error is None, run.error
    return run


def test_the_seed_recipe_named_is_the_recipe_stack(seed_run, recipe_run):
    assert inputs_of(seed_run) == inputs_of(recipe_run) and seed_run.outputs == recipe_run.outputs


@pytest.mark.parametrize("name", sorted(set(CATALOG) - {recipes.DEFAULT_RECIPE}))
def test_switching_the_recipe_changes_exactly_what_it_owns(program, seed_run, name):
    recipe = CATALOG[name]
    run = program(on_recipe(name))
    assert run.error is None, run.error
    before, after = inputs_of(seed_run), inputs_of(run)
    changed = {n for n in set(before) | set(after) if before.get(n) != after.get(n)}
    owned = OWNED + (BUDGET if recipe.vllm.gpu_memory_utilization != 0.85 else ()) + REVISION
    assert flag_value(runner_call(run.named("spark1-weights-revision")).args, "--revision") == ""  # not its commit
    assert changed and [n for n in changed if not any(part in n for part in owned)] == []
    assert {k for k in run.outputs if run.outputs[k] != seed_run.outputs.get(k)} <= CLIENT_OUTPUTS | {"modelRevision"}
    launch = run.named("spark1-bundle-launch-vllm-sh").inputs["create"]
    assert f"--reasoning-parser {recipe.vllm.reasoning_parser}" in json.dumps(run.named("spark1-bundle-launch-vllm-sh").inputs)
    # nothing of DeepSeek's left in what lands on the nodes or the clients (the shipped scripts'
    # own text, such as weights.py's fp8_ds_mla layout, is the same for every model)
    rendered = [r.inputs for r in run.resources if "-bundle-" in r.name or "-observability-" in r.name]
    for run_text in (json.dumps(rendered), json.dumps(run.outputs)):
        for seed_only in ("deepseek_v4", '"method\\":\\"dspark', "DSPARK", "fp8_ds_mla", "flashinfer_b12x",
                          "DEFAULT_THINKING"):
            assert seed_only not in run_text, (name, seed_only)
    assert ("spark1-observability-dashboard-spec-decode" in run.by_name) == recipe.speculates
    assert launch
    guard_unit = json.dumps(run.named("spark1-guard-unit").inputs)
    assert f"--tool-parser {recipe.canary_tool_parser}" in guard_unit and "deepseek_v4" not in guard_unit
    # the stack file's model is DeepSeek's: said once, naming both, and served anyway
    assert [w for w in run.warnings if "model.repo" in w] == [
        f"model.repo deepseek-ai/DeepSeek-V4-Flash-0731 is not {recipe.repo}, the repository of serving.recipe "
        f"{name}: the recipe's flags, environment and parsers are applied to deepseek-ai/DeepSeek-V4-Flash-0731 as "
        "they are; choose the recipe made for it if there is one (see Models in docs/configuration.md)"]


def test_the_seed_stack_serves_its_recipes_repo_without_a_warning_and_its_canary_calls_a_tool(seed_run):
    assert not [w for w in seed_run.warnings if "model.repo" in w]
    assert "--tool-parser deepseek_v4" in json.dumps(seed_run.named("spark1-guard-unit").inputs)


def test_a_node_count_the_recipe_does_not_support_stops_the_program_before_any_resource(program):
    config = on_recipe("GLM-5.3-Flash-NVFP4")  # two Sparks, no more
    config["twinspark:nodes"].append({"name": "spark3", "role": "worker", "host": "192.168.1.12", "rails": [
        {"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.3/24"},
        {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.3/24"}]})
    config["twinspark:fabric"] = {**config["twinspark:fabric"], "topology": "switch"}  # three Sparks need one
    run = program(config)
    assert run.resources == [] and run.error["kind"] == "RunError"
    assert "twinspark:nodes: 3 nodes — expected 2 nodes, what serving.recipe GLM-5.3-Flash-NVFP4 supports" in \
        run.error["message"]


@pytest.mark.parametrize("canary, words", [
    ("canaryToolParser: glm45", "expected the served tool parser (vllm.toolCallParser 'glm47')"),
    ("enableAutoToolChoice: true", "with vllm.enableAutoToolChoice"),
])
def test_the_canarys_tool_parser_is_the_served_one(tmp_path, canary, words):
    """The canary asks with tool_choice auto: another parser, or no auto tool choice, never answers it."""
    text = (ROOT / "recipes" / "glm-5.3-flash-nvfp4.yaml").read_text()
    if canary.startswith("canary"):
        text = text.replace("canaryToolParser: glm47", canary)
    else:
        text = text.replace("  toolCallParser: glm47\n", "  toolCallParser: glm47\n  enableAutoToolChoice: false\n")
    (tmp_path / "glm.yaml").write_text(text)
    with pytest.raises(recipes.RecipeError, match="canaryToolParser") as err:
        recipes.load_catalog(tmp_path)
    assert words in str(err.value)


def test_a_config_key_overrides_the_recipes_value(program):
    config = on_recipe("gpt-oss-120b")
    config["twinspark:serving"]["maxModelLen"] = 65536
    run = program(config)
    text = json.dumps(run.named("spark1-bundle-launch-vllm-sh").inputs)
    assert "--max-model-len 65536" in text and "--max-model-len 131072" not in text


def test_parse_rejects_a_profile_the_recipe_lacks():
    cfg = {k.removeprefix("twinspark:"): v for k, v in stack_config().items()}
    cfg["serving"] = {**cfg["serving"], "recipe": "gpt-oss-120b", "profile": "multiagent"}
    for key in RECIPE_KEYS:
        del cfg["serving"][key]
    with pytest.raises(pulumi.RunError, match="twinspark:serving.profile: 'multiagent' — expected one of recipe "
                                              "gpt-oss-120b's profiles: 'default'"):
        parse_stack_config(cfg)


def test_a_recipe_that_runs_the_models_code_says_why(tmp_path):
    text = (ROOT / "recipes" / "minimax-m2.7.yaml").read_text()
    reason = next(line for line in text.splitlines() if "trustRemoteCodeReason" in line)
    (tmp_path / "m.yaml").write_text(text.replace(reason + "\n", ""))
    with pytest.raises(recipes.RecipeError, match="expected vllm.trustRemoteCodeReason"):
        recipes.load_catalog(tmp_path)


def test_the_models_code_runs_only_at_a_recorded_commit():
    """Issue 37: MiniMax's recipe runs its repository's code and records no commit: on its own
    repository without model.revision it is refused, naming the key; with one it is served."""
    recipe = CATALOG["MiniMax-M2.7"]
    config = {k.split(":", 1)[1]: v for k, v in stack_config().items()}
    config["serving"] = {**config["serving"], "recipe": recipe.name}
    config["model"] = {**config["model"], "repo": recipe.repo}
    for key in ("maxModelLen", "kvCacheDtype"):
        config["serving"].pop(key, None)
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(config)
    assert "twinspark:model.revision:" in str(err.value) and "--trust-remote-code" in str(err.value), err.value
    config["model"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    assert parse_stack_config(config).model_revision == "0123456789abcdef0123456789abcdef01234567"


def test_every_loader_twinspark_serves_with_is_a_load_format_vllm_registers():
    registered = recipes.vllm_names()["load_formats"]["names"]
    assert set(loaders.LOADERS) <= set(registered) and loaders.DEFAULT in loaders.LOADERS
    assert all(recipe.vllm.load_format in loaders.LOADERS for recipe in CATALOG.values())


def test_a_chosen_loader_is_rendered_and_the_default_renders_none(program, seed_run):
    """Issue 42 item 1: `serving.loadFormat` (or the recipe's) is vLLM's `--load-format`; vLLM's own
    `auto` adds no flag, so a stack that chooses nothing keeps its launch script."""
    launch = json.dumps(seed_run.named("spark1-bundle-launch-vllm-sh").inputs)
    assert "--load-format" not in launch
    config = on_recipe(recipes.DEFAULT_RECIPE)
    config["twinspark:serving"]["loadFormat"] = "instanttensor"
    run = program(config)
    assert run.error is None, run.error
    for node in ("spark1", "spark2"):
        assert "--load-format instanttensor" in json.dumps(run.named(f"{node}-bundle-launch-vllm-sh").inputs)


@pytest.mark.parametrize("value, said", [
    ("dummy", "vLLM's 'dummy' reads another format or none (dummy weights) and is not served here"),
    ("fastsafetensor", "a --load-format vLLM registers, and one of twinspark's loaders: auto, safetensors, "
                       "fastsafetensors, instanttensor, runai_streamer"),
])
def test_a_loader_twinspark_does_not_serve_with_is_refused_before_any_resource(program, value, said):
    config = on_recipe(recipes.DEFAULT_RECIPE)
    config["twinspark:serving"]["loadFormat"] = value
    result = program(config)
    assert result.resources == [], "refused before anything is registered"
    assert f"twinspark:serving.loadFormat: {value!r}" in result.error["message"] and said in result.error["message"]


def test_the_load_format_is_not_an_extra_arg(program):
    config = on_recipe(recipes.DEFAULT_RECIPE)
    config["twinspark:serving"]["extraArgs"] = ["--load-format", "fastsafetensors"]
    result = program(config)
    assert result.resources == [] and "set serving.loadFormat" in result.error["message"], result.error
