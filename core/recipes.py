"""Model recipes: what makes one model serve well, as data (recipes/*.yaml), typed here.

A recipe is one YAML file in RECIPE_DIR: the model's repository and a known-good revision, the
image it was proven on, the nodes and parallelism it supports, its vLLM flags and environment,
its launch profiles, the client fences, the needle sizes, what the canary may expect of it, the
panels it warrants and its measured baseline, each figure with its source. `serving.recipe`
picks one by `name`; config keys override the values they name. Adding a model is one file.

Every parser, KV-cache dtype and backend name is checked against the names vLLM registers
(VLLM_NAMES_FILE, extracted once from vLLM's source, with that source named in it), so a
misspelt one stops the program before anything is downloaded.

A leaf module: pydantic and YAML, nothing of Pulumi.
"""

from __future__ import annotations

import functools
import json
import tomllib
from pathlib import Path
from typing import Any, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from core import contract, loaders
from core.fingerprint import Fingerprint

ROOT = Path(__file__).resolve().parent.parent
RECIPE_DIR = ROOT / "recipes"
VLLM_NAMES_FILE = RECIPE_DIR / "vllm-names.toml"
DEFAULT_RECIPE = "DeepSeek-V4-Flash-0731"


# What twinspark.env sets for every model (components/launch_bundle.py): a recipe may not.
OWNED_ENV_PREFIXES = ("NCCL_", "GLOO_", "RAY_", "TWINSPARK_")
OWNED_ENV = ("HF_HUB_OFFLINE", "VLLM_HOST_IP")


class RecipeError(ValueError):
    """A recipe file that cannot be used: names the file and what is wrong."""


class _Data(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Source(_Data):
    what: str = Field(description="what this source gives the recipe")
    url: str


class Figure(_Data):
    value: Optional[float] = Field(default=None, description="None: no public figure found")
    source: str = Field(description="where the figure comes from (a URL, or the reason there is none)")


class BaselineFingerprint(_Data):
    """What the baseline was measured on, for the doctor (core/fingerprint.py): a fact left out is
    unknown, and a difference from it goes unjudged (the nodes must still agree with each other)."""

    driver: Optional[str] = None
    kernel: Optional[str] = None
    nccl: Optional[str] = None  # the NCCL the recipe ran (nccl-tests and vLLM alike): the host's and the image's
    image_digest: Optional[str] = None
    model_sha256: Optional[str] = None
    drafter_sha256: Optional[str] = None
    cstates_enabled: Optional[bool] = None
    rail_mtu: Optional[int] = Field(default=None, gt=0)
    roce_active_mtu: Optional[int] = Field(default=None, gt=0)
    nccl_busbw_gbps: Optional[float] = Field(default=None, gt=0)
    source: str = Field(description="where these facts come from, and which are unknown")

    def fingerprint(self) -> Fingerprint:
        return Fingerprint(driver=self.driver, kernel=self.kernel, nccl=self.nccl, nccl_image=self.nccl,
                           image_digest=self.image_digest,
                           model_sha256=self.model_sha256, drafter_sha256=self.drafter_sha256,
                           cstates_enabled=self.cstates_enabled, nccl_busbw_gbps=self.nccl_busbw_gbps)


class Baseline(_Data):
    """Measured on two Sparks: what `ops bench --compare recipe` and `ops upgrade` gate on."""

    profile: str = "default"
    single_stream_tokens_per_second: Figure
    four_way_tokens_per_second: Figure
    ttft_7k_seconds: Figure = Field(alias="ttft7kSeconds")
    fingerprint: BaselineFingerprint = Field(
        default_factory=lambda: BaselineFingerprint(source="not recorded"),
        description="what the figures were measured on (the doctor compares a pair with it)")


class Speculative(_Data):
    method: str = Field(description="vLLM's speculative method: dspark, mtp, ...")
    extra: dict[str, Any] = Field(default_factory=dict, description="more keys of --speculative-config")


class Profile(_Data):
    max_num_seqs: int = Field(gt=0)
    num_speculative_tokens: Optional[int] = Field(default=None, gt=0)
    measured: str = Field(default="", description="the profile's measured figures, in words (README)")


class VllmFlags(_Data):
    """The flags twinspark renders for the recipe, in the seed's order; `args` last but extraArgs."""

    trust_remote_code: bool = False
    # why the model's own code must run (`--trust-remote-code` runs the repository's Python as root
    # on every node): required with it, shown in the README's Models table and the config's refusal
    trust_remote_code_reason: Optional[str] = None
    tokenizer_mode: Optional[str] = None
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None
    enable_auto_tool_choice: bool = True
    kv_cache_dtype: str
    # `--load-format` (core/loaders.py): rendered only when not vLLM's own `auto`
    load_format: str = loaders.DEFAULT
    quantization: Optional[str] = None
    moe_backend: Optional[str] = None
    attention_backend: Optional[str] = None
    block_size: Optional[int] = None
    max_model_len: int = Field(gt=0)
    gpu_memory_utilization: float = Field(gt=0, le=0.95)
    max_num_batched_tokens: Optional[int] = None
    max_cudagraph_capture_size: Optional[int] = None
    chat_template: Optional[str] = Field(default=None, description="a template path inside the image")
    args: list[list[str]] = Field(default_factory=list, description="more flags, one group per line")
    speculative: Optional[Speculative] = None


class ClientFences(_Data):
    # The fence depends on KV precision (seed gotchas 12, 14): per dtype, and otherwise
    auto_compact_tokens: dict[str, int] = Field(default_factory=dict)
    auto_compact_tokens_otherwise: int = Field(gt=0)
    claude_code_max_context_tokens: int = Field(gt=0)
    default_reasoning_level: str = "low"


class Nodes(_Data):
    min: int = Field(ge=1)
    max: int = Field(ge=1)


class MemoryFacts(_Data):
    """What the memory-fit estimate cannot read from config.json, each with its source."""

    kv_bytes_per_token: Optional[int] = Field(
        default=None, gt=0, description="every layer's KV for one token at the recipe's dtype, on one node")
    kv_bytes_source: str = ""
    overhead_gib: float = Field(default=4.5, ge=0, description="activations, CUDA graphs, non-torch memory per node")
    overhead_source: str = ""


class ModelShape(_Data):
    """What the layout check needs of the model's config.json, known before anything is downloaded:
    stack config validation refuses a TP × PP the model cannot split (the shape check after the
    pin judges the real config.json again)."""

    attention_heads: int = Field(gt=0, description="config.json num_attention_heads")
    kv_heads: Optional[int] = Field(default=None, gt=0, description="num_key_value_heads; none: one per head")
    kv_lora_rank: Optional[int] = Field(default=None, gt=0, description="MLA's latent KV rank, where it has one")
    hidden_layers: int = Field(gt=0, description="num_hidden_layers")
    source: str = Field(description="where the figures come from")

    def as_config_json(self) -> dict[str, int]:
        """The figures under config.json's own names, as launch/weights.py's rules read them."""
        names = {"num_attention_heads": self.attention_heads, "num_key_value_heads": self.kv_heads,
                 "kv_lora_rank": self.kv_lora_rank, "num_hidden_layers": self.hidden_layers}
        return {name: value for name, value in names.items() if value is not None}


class Recipe(_Data):
    name: str
    description: str
    sources: list[Source] = Field(min_length=1)
    repo: str
    revision: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    revision_source: str
    served_name: str
    image: str = Field(description="the serving image the recipe was proven on")
    vllm_version: str = Field(description="the vLLM in that image (the names are checked against it)")
    nodes: Nodes
    parallelism: list[str] = Field(min_length=1, description="what it was proven with: tp, pp (pipeline), dcp, ...; "
                                   "a stack with serving.pipelineParallel over 1 on a recipe without pp is warned")
    vllm: VllmFlags
    env: dict[str, str] = Field(default_factory=dict)
    profiles: dict[str, Profile] = Field(min_length=1)
    client: ClientFences
    needle_sizes: list[int] = Field(min_length=1)
    canary_tool_parser: Optional[str] = Field(
        default=None, description="the served tool parser the guard's canary makes a tool call through; "
        "None: the canary makes none (a model served without a tool parser cannot answer one)")
    spec_decode_advice: str = Field(
        default="Draft tokens are almost all rejected: decode falls toward the no-spec floor. Sample a completion "
        "by hand and compare with the recipe's baseline (`python -m ops bench --compare recipe`).",
        description="the acceptance-collapse alert's advice, where the recipe speculates")
    memory: MemoryFacts = Field(default_factory=MemoryFacts)
    shape: Optional[ModelShape] = Field(
        default=None, description="the model's heads and layers; none: TP × PP is judged only after the download")
    baseline: Baseline
    notes: str = ""

    @property
    def speculates(self) -> bool:
        return self.vllm.speculative is not None

    @property
    def panels(self) -> tuple[str, ...]:
        """The dashboards the recipe warrants: spec decode only where it speculates."""
        return ("overview", "spec-decode", "nodes") if self.speculates else ("overview", "nodes")

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        if "default" not in self.profiles:
            raise ValueError("expected a 'default' profile")
        for name, profile in self.profiles.items():
            if self.speculates != (profile.num_speculative_tokens is not None):
                raise ValueError(f"profile {name!r}: numSpeculativeTokens is set exactly when vllm.speculative is")
        if self.baseline.profile not in self.profiles:
            raise ValueError(f"baseline.profile {self.baseline.profile!r} is not one of the profiles")
        if self.nodes.min > self.nodes.max:
            raise ValueError("nodes.min is over nodes.max")
        if self.vllm.trust_remote_code and not (self.vllm.trust_remote_code_reason or "").strip():
            raise ValueError("vllm.trustRemoteCode: expected vllm.trustRemoteCodeReason, why the repository's own "
                             "code must run (it runs as root on every node)")
        owned = sorted(k for k in self.env if k.startswith(OWNED_ENV_PREFIXES) or k in OWNED_ENV)
        if owned:
            raise ValueError(f"env: {', '.join(owned)} is twinspark's to set ({contract.ENV_FILE}), not a recipe's")
        return self


@functools.cache
def vllm_names() -> dict[str, Any]:
    """The names vLLM registers, by kind: {"source": {...}, "tool_call_parsers": [...], ...}."""
    return tomllib.loads(VLLM_NAMES_FILE.read_text())


def _name_problems(recipe: Recipe) -> list[str]:
    names, v = vllm_names(), recipe.vllm
    checks = [("vllm.toolCallParser", v.tool_call_parser, "tool_call_parsers"),
              ("canaryToolParser", recipe.canary_tool_parser, "tool_call_parsers"),
              ("vllm.reasoningParser", v.reasoning_parser, "reasoning_parsers"),
              ("vllm.kvCacheDtype", v.kv_cache_dtype, "kv_cache_dtypes"),
              ("vllm.tokenizerMode", v.tokenizer_mode, "tokenizer_modes"),
              ("vllm.moeBackend", v.moe_backend, "moe_backends"),
              ("vllm.attentionBackend", v.attention_backend, "attention_backends"),
              ("vllm.speculative.method", v.speculative and v.speculative.method, "speculative_methods")]
    problems = []
    loader = loaders.loader_problem(v.load_format, names["load_formats"]["names"])
    if loader:
        problems.append(f"vllm.loadFormat: {v.load_format!r} is not {loader}")
    for key, value, kind in checks:
        known = names[kind]["names"]
        if value is not None and value not in known:
            problems.append(f"{key}: {value!r} is not a name vLLM registers ({kind.replace('_', ' ')} at "
                            f"{names['source']['ref']}: {', '.join(known)})")
    flags = set(names["engine_flags"]["names"]) | set(names["engine_flags_not_in_source"])
    for line in v.args:
        for token in line:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in flags:
                problems.append(f"vllm.args: {flag} is not a flag of vLLM's argument parser (expected one of "
                                f"[engine_flags] or [engine_flags_not_in_source] in {VLLM_NAMES_FILE.name})")
    return problems


def _canary_problems(recipe: Recipe) -> list[str]:
    """The canary asks with tool_choice "auto": only the served parser, with auto tool choice, answers."""
    v, canary = recipe.vllm, recipe.canary_tool_parser
    if canary is None or (canary == v.tool_call_parser and v.enable_auto_tool_choice):
        return []
    return [f"canaryToolParser {canary!r}: expected the served tool parser (vllm.toolCallParser "
            f"{v.tool_call_parser!r}) with vllm.enableAutoToolChoice"]


def parse_recipe(path: Path) -> Recipe:
    """One recipe file, checked against the schema and vLLM's names; RecipeError names the file."""
    try:
        data = yaml.safe_load(path.read_text())
        recipe = Recipe.model_validate(data)
    except (OSError, yaml.YAMLError) as err:
        raise RecipeError(f"{path}: cannot be read as YAML ({err})") from None
    except ValidationError as err:
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in err.errors())
        raise RecipeError(f"{path}: not a recipe — {details}") from None
    problems = _name_problems(recipe) or _canary_problems(recipe)
    if problems:
        raise RecipeError(f"{path}: " + "; ".join(problems))
    return recipe


def load_catalog(directory: Path = RECIPE_DIR) -> dict[str, Recipe]:
    """Every recipe in `directory` (*.yaml), by name; two files with one name are refused."""
    catalog: dict[str, Recipe] = {}
    for path in sorted(directory.glob("*.yaml")):
        recipe = parse_recipe(path)
        if recipe.name in catalog:
            raise RecipeError(f"{path}: name {recipe.name!r} is already another recipe's")
        catalog[recipe.name] = recipe
    return catalog


@functools.cache
def catalog() -> dict[str, Recipe]:
    return load_catalog()


def recipe_named(name: str) -> Recipe:
    found = catalog()
    if name not in found:
        raise RecipeError(f"expected one of the recipes in recipes/: {', '.join(found)}")
    return found[name]


def speculative_config(recipe: Recipe, profile: str) -> Optional[str]:
    """--speculative-config's JSON for `profile`, or None where the recipe does not speculate."""
    spec = recipe.vllm.speculative
    if spec is None:
        return None
    value = {"method": spec.method, "num_speculative_tokens": recipe.profiles[profile].num_speculative_tokens,
             **spec.extra}
    return json.dumps(value, separators=(",", ":"))


# a profile is a measured pair (seed §5): overriding half of it serves an unmeasured one
PROFILE_FLAGS = ("--max-num-seqs", "--speculative-config")


def serve_lines(recipe: Recipe, profile: str, *, kv_cache_dtype: str, max_model_len: int,
                gpu_memory_utilization: float, load_format: str = loaders.DEFAULT) -> list[list[str]]:
    """The recipe's part of `vllm serve`, one flag group per line, in the seed's order; the values
    config keys override come in as arguments."""
    v, chosen = recipe.vllm, recipe.profiles[profile]
    lines: list[list[str]] = [["--trust-remote-code"]] if v.trust_remote_code else []
    lines += [[flag, value] for flag, value in (("--tokenizer-mode", v.tokenizer_mode),
                                                ("--tool-call-parser", v.tool_call_parser),
                                                ("--reasoning-parser", v.reasoning_parser)) if value]
    if v.tool_call_parser and v.enable_auto_tool_choice:
        lines.append(["--enable-auto-tool-choice"])
    lines.append(["--kv-cache-dtype", kv_cache_dtype])
    optional = (("--quantization", v.quantization), ("--moe-backend", v.moe_backend),
                ("--attention-backend", v.attention_backend), ("--block-size", v.block_size),
                ("--load-format", None if load_format == loaders.DEFAULT else load_format))
    lines += [[flag, str(value)] for flag, value in optional if value is not None]
    lines += [["--max-model-len", str(max_model_len)], ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"],
              ["--max-num-seqs", str(chosen.max_num_seqs)]]
    sized = (("--max-num-batched-tokens", v.max_num_batched_tokens),
             ("--max-cudagraph-capture-size", v.max_cudagraph_capture_size), ("--chat-template", v.chat_template))
    lines += [[flag, str(value)] for flag, value in sized if value is not None]
    lines += [list(line) for line in v.args]
    spec = speculative_config(recipe, profile)
    if spec is not None:
        lines.append(["--speculative-config", spec])
    return lines


def rendered_flags(recipe: Recipe) -> list[str]:
    """Every flag the recipe renders, under any of its profiles."""
    flags: list[str] = []
    for profile in recipe.profiles:
        for line in serve_lines(recipe, profile, kv_cache_dtype=recipe.vllm.kv_cache_dtype,
                                max_model_len=recipe.vllm.max_model_len,
                                gpu_memory_utilization=recipe.vllm.gpu_memory_utilization):
            flags += [t.split("=", 1)[0] for t in line if t.startswith("--") and t.split("=", 1)[0] not in flags]
    return flags


def _figure(figure: Figure, unit: str) -> str:
    return "—" if figure.value is None else f"{figure.value:g} {unit}"


def models_table(found: Optional[dict[str, Recipe]] = None) -> str:
    """The README's Models section table, from the catalog: the two cannot drift."""
    rows = ["| `serving.recipe` | model | revision; the model's own code | nodes | parsers (tool / reasoning) | KV | "
            "spec decode | profiles | single stream | 4-way | TTFT 7k |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (found or catalog()).values():
        v, b = r.vllm, r.baseline
        spec = f"{v.speculative.method}" if v.speculative else "off"
        profiles = "; ".join(f"`{name}`: {p.measured}" if p.measured else f"`{name}`" for name, p in r.profiles.items())
        pinned = f"`{r.revision[:7]}`" if r.revision else "none (set `model.revision`)"
        code = f"runs: {v.trust_remote_code_reason}" if v.trust_remote_code else "not run"
        rows.append(f"| `{r.name}` | `{r.repo}` | {pinned}; {code} | {r.nodes.min}–{r.nodes.max} | `{v.tool_call_parser}` / "
                    f"`{v.reasoning_parser}` | `{v.kv_cache_dtype}` | {spec} | {profiles} | "
                    f"{_figure(b.single_stream_tokens_per_second, 'tok/s')} | "
                    f"{_figure(b.four_way_tokens_per_second, 'tok/s')} | {_figure(b.ttft_7k_seconds, 's')} |")
    return "\n".join(rows) + "\n"
