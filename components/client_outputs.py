"""Client configs for the endpoint, rendered as stack outputs (pure functions, no resources).

Every figure derives from the config: the context window is serving.maxModelLen, and the
compaction fences never exceed it.

- codexConfig:       ~/.codex/config.toml (wire_api "responses", auto-compaction fence)
- codexModelCatalog: the model catalog JSON Codex reads via model_catalog_json: every lane's model
                     with its window and fence
- claudeCodeEnv:     ANTHROPIC_* lines for Claude Code (vLLM serves /v1/messages); secret
- claudeCodeSettings: what ~/.claude/settings.json must hold (client-setup merges it in)
- openaiEnv:         the endpoint and key as OpenAI's clients, Open WebUI and Codex's profile read
                     them, in a file both a shell (`set -a`) and `docker run --env-file` take; secret

Codex's and Claude Code's take the stack's client views (StackConfig.client_views: one a lane, the
head's lane first, the clients' default); one lane renders as before lanes existed.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Mapping, Sequence

from core import contract

from .config import LANE_SERVING_KEYS, StackConfig, Topology

# Agent sessions degrade past a model's fence (DeepSeek: ~150k of history with the native fp8
# KV, ~100-120k with nvfp4 KV, seed gotchas 12 and 14): auto-compaction is the fence, and the
# recipe's client block holds it (recipes/).
# A fence must leave room below the served context for the summary and the next turn.
FENCE_SHARE_OF_CONTEXT = 0.9
CODEX_PROVIDER_ID = "twinspark"
CODEX_KEY_VARIABLE = "VLLM_API_KEY"  # the variable Codex's provider entry reads the key from (env_key)
CODEX_PROFILE = "twinspark"  # `codex -p twinspark`: ops client-setup writes ~/.codex/twinspark.config.toml
# Claude Code asks for a model by its tier (background work: titles, summaries, goes to Haiku's): each tier
# names a model served here, or vLLM answers 404 (vLLM's Claude Code guide, docs/serving/integrations).
# The head's lane answers the main tiers; with several lanes, the next lane the background one.
CLAUDE_CODE_MAIN_TIERS = ("OPUS", "SONNET")
CLAUDE_CODE_BACKGROUND_TIER = "HAIKU"


def endpoint_base(cfg: StackConfig) -> str:
    return f"http://{cfg.head.host}:{cfg.serving.port}"


def grafana_url(cfg: StackConfig) -> str:
    return f"http://{cfg.head.host}:{cfg.observability.grafana_port}"


def prometheus_url() -> str:
    """Prometheus listens on the head's loopback only: this URL works through `prometheus_tunnel`."""
    return f"http://127.0.0.1:{contract.PROMETHEUS_PORT}"


def prometheus_tunnel(cfg: StackConfig) -> str:
    port = contract.PROMETHEUS_PORT
    return f"ssh -N -L {port}:127.0.0.1:{port} {cfg.ssh.user}@{cfg.head.host}"


def endpoint_url(cfg: StackConfig) -> str:
    return endpoint_base(cfg) + "/v1"


def auto_compact_limit(cfg: StackConfig) -> int:
    client = cfg.serving.recipe_spec.client
    fence = client.auto_compact_tokens.get(cfg.serving.kv_cache_dtype, client.auto_compact_tokens_otherwise)
    return min(fence, int(cfg.serving.max_model_len * FENCE_SHARE_OF_CONTEXT))


def claude_code_max_context(cfg: StackConfig) -> int:
    return min(cfg.serving.recipe_spec.client.claude_code_max_context_tokens, cfg.serving.max_model_len)


def catalog_file_name(cfg: StackConfig) -> str:
    return f"{cfg.model.served_name}-model-catalog.json"


def render_codex_config(views: Sequence[StackConfig]) -> str:
    """The profile: the first view's model by default; with several lanes each model's fence is its catalog
    entry's (a fence here would hold every model to the default's)."""
    cfg, others = views[0], views[1:]
    name = cfg.model.served_name
    fence = "" if others else f"model_auto_compact_token_limit = {auto_compact_limit(cfg)}\n"
    also = "".join(f"# also served here: {v.model.served_name} ({v.model.repo}, {v.serving.max_model_len:,} tokens): "
                   f"codex -p {CODEX_PROFILE} -m {v.model.served_name}\n" for v in others)
    return f"""# Codex's profile for twinspark ({cfg.model.repo}): ~/.codex/{CODEX_PROFILE}.config.toml, then, with the
# key from the openaiEnv output's file: set -a && . ~/.config/twinspark/openai.env && set +a && codex -p {CODEX_PROFILE}
{also}model = "{name}"
model_provider = "{CODEX_PROVIDER_ID}"
model_catalog_json = "~/.codex/{catalog_file_name(cfg)}"
{fence}
[model_providers.{CODEX_PROVIDER_ID}]
name = "{name} on twinspark (local vLLM)"
base_url = "{endpoint_url(cfg)}"
wire_api = "responses"
env_key = "{CODEX_KEY_VARIABLE}"
"""


def codex_catalog_entry(cfg: StackConfig, priority: int, fence: bool) -> dict:
    """Every field Codex's parser requires, with this model's facts (`fence`: its own auto-compaction
    limit, where the profile sets none for all)."""
    name = cfg.model.served_name
    entry = {
        "slug": name,
        "display_name": f"{name} (twinspark)",
        "description": f"{cfg.model.repo} served by vLLM on twinspark, {cfg.parallelism_in_words}",
        "default_reasoning_level": cfg.serving.recipe_spec.client.default_reasoning_level,
        "supported_reasoning_levels": [
            {"effort": "low", "description": "Fast responses with lighter reasoning"},
            {"effort": "medium", "description": "Balances speed and reasoning depth"},
            {"effort": "high", "description": "Greater reasoning depth for complex problems"},
        ],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "support_verbosity": False,
        "apply_patch_tool_type": "freeform",
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "experimental_supported_tools": [],
        "context_window": cfg.serving.max_model_len,
        "input_modalities": ["text"],
        "base_instructions": (
            "You are a coding agent running in the user's terminal. Read the workspace before "
            "changing it, use the tools provided, keep changes small and verified, and report "
            "what you did and what you could not check."
        ),
    }
    return {**entry, "auto_compact_token_limit": auto_compact_limit(cfg)} if fence else entry


def render_codex_model_catalog(views: Sequence[StackConfig]) -> str:
    """One entry a served model, the default first."""
    several = len(views) > 1
    return json.dumps({"models": [codex_catalog_entry(v, priority, several) for priority, v in enumerate(views, 1)]},
                      indent=2) + "\n"


def render_claude_code_env(views: Sequence[StackConfig], api_key: str) -> str:
    """Lines to `source`: every value shell-quoted, so none can run as code ($(...), `...`, ;). The main
    tiers and the context are the first view's model's; the background tier the next view's, if any."""
    main, background = views[0], views[1] if len(views) > 1 else views[0]
    values = {
        "ANTHROPIC_BASE_URL": endpoint_base(main),
        "ANTHROPIC_MODEL": main.model.served_name,
        **{f"ANTHROPIC_DEFAULT_{tier}_MODEL": main.model.served_name for tier in CLAUDE_CODE_MAIN_TIERS},
        f"ANTHROPIC_DEFAULT_{CLAUDE_CODE_BACKGROUND_TIER}_MODEL": background.model.served_name,
        "ANTHROPIC_AUTH_TOKEN": api_key,
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(claude_code_max_context(main)),
    }
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items())


# A value either reader takes as it is: docker's --env-file does not unquote, so nothing may need quoting
# (the config allows the key only these characters, and a host only an address or a name)
PLAIN_ENV_VALUE = re.compile(r"[A-Za-z0-9+\-./=_~:\[\]]+")


def render_openai_env(cfg: StackConfig, api_key: str) -> str:
    """OPENAI_BASE_URL and OPENAI_API_KEY (OpenAI's SDKs, aider, most OpenAI-compatible tools),
    OPENAI_API_BASE_URL (Open WebUI's name), the key again as Codex's profile reads it."""
    values = {"OPENAI_BASE_URL": endpoint_url(cfg), "OPENAI_API_BASE_URL": endpoint_url(cfg), "OPENAI_API_KEY": api_key,
              CODEX_KEY_VARIABLE: api_key}
    for name, value in values.items():
        if not PLAIN_ENV_VALUE.fullmatch(value):
            raise ValueError(f"{name}: a character an env file cannot hold unquoted")
    return ("# twinspark's endpoint: `set -a && . THIS_FILE && set +a` in a shell, or docker run --env-file THIS_FILE\n"
            + "".join(f"{name}={value}\n" for name, value in values.items()))


def render_claude_code_settings() -> str:
    """Claude Code's attribution header changes with every request and so defeats vLLM's prefix
    cache; Claude Code reads the switch only from its settings file, not from the shell (vLLM's
    guide). Nothing secret: the key stays in the env file."""
    return json.dumps({"env": {"CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}}, indent=2) + "\n"


def lanes_output(cfg: StackConfig, revisions: Mapping[str, object]) -> dict:
    """Several lanes: each lane's model, recipe, nodes, head (the node whose guard watches its engine),
    revision (`revisions`: the commit each lane's weights hold) and its lane keys of `serving` as it is
    served, so `pulumi preview` shows which lanes a change touches (its Outputs:
    `~ lanes: { ~ fast: { ~ serving: { ~ maxModelLen: ...`)."""
    out = {}
    for lane in cfg.served_lanes:
        serving = lane.serving.model_dump(by_alias=True, mode="json")
        out[lane.name] = {"model": lane.model.served_name, "recipe": lane.serving.recipe,
                          "nodes": [n.name for n in lane.nodes], "head": cfg.lane_head(lane).name,
                          "revision": revisions[lane.name],
                          "serving": {key: serving[key] for key in LANE_SERVING_KEYS}}
    return out


def nodes_output(cfg: StackConfig, host_keys: Mapping[str, str], topology: Topology) -> list[dict]:
    """What the day-2 tools need of each node, typed: nothing for them to re-derive. `hostKey` is
    the key this run held the node to (pinned, or recorded at first contact): ops holds its ssh
    to the same one."""
    return [
        {
            "name": n.name,
            "role": n.role,
            "host": n.host,
            "rayIp": topology.ray_ip(n),
            # a rail's peer only where it has one (a ring): a direct stack's output stays as it was
            "rails": [r.model_dump(by_alias=True, exclude_none=True) for r in n.rails],
            "hostKey": host_keys[n.name],
        }
        for n in cfg.nodes
    ]


def fabric_output(cfg: StackConfig) -> dict:
    """What `ops status` expects of every rail."""
    return {"mtu": cfg.fabric.mtu, "linkSpeedMbps": cfg.fabric.link_speed_mbps}
