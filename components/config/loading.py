"""Loading the stack config: the `twinspark:*` keys read from Pulumi, unknown keys refused, and
pydantic's errors rendered as one line each, naming the key path as the user wrote it, the bad
value (never where it may be a secret) and, in words, what is expected.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Optional

import pulumi
import yaml
from pulumi.runtime import config as runtime_config
from pydantic import ValidationError

from .blocks import PLUG_URL_SHAPE
from .errors import NAMESPACE, CrossFieldError, config_error, format_key_path
from .schema import OPTIONAL_STRUCTURED_KEYS, STRUCTURED_KEYS, StackConfig
from .secret_keys import SECRET_KEYS


def _stack_config_problems(raw: dict[str, Any]) -> tuple[Optional[StackConfig], list[str]]:
    missing = [k for k in STRUCTURED_KEYS if raw.get(k) is None]
    if missing:
        return None, [f"{NAMESPACE}:{k}: missing — expected the {k} block of the config contract "
                      "(see Pulumi.spark.yaml)" for k in missing]
    try:
        return StackConfig.model_validate(raw), []
    except ValidationError as err:
        return None, _describe_validation_error(err)


def parse_stack_config(raw: dict[str, Any]) -> StackConfig:
    """Validate raw config values (keys without namespace). Raises pulumi.RunError."""
    cfg, problems = _stack_config_problems(raw)
    if problems:
        raise config_error(problems)
    assert cfg is not None  # no problems: validated
    return cfg


def stack_file_config(path: Path) -> StackConfig:
    """A stack file's (Pulumi.<stack>.yaml) structured `twinspark:*` keys, validated as `pulumi up`
    validates them; its plain and secret keys aside (the maintainers' tools read a file, not a stack)."""
    config = yaml.safe_load(path.read_text())["config"]
    raw = {key.split(":", 1)[1]: value for key, value in config.items() if key.startswith(f"{NAMESPACE}:")}
    cfg = parse_stack_config({k: v for k, v in raw.items() if k in STRUCTURED_KEYS + OPTIONAL_STRUCTURED_KEYS})
    not_yet = _lanes_not_yet_deployed(cfg)
    if not_yet:
        raise config_error(not_yet)
    return cfg


def _split_path(path: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


# The ssh block may hold the key's passphrase: an error there shows the value only where it is
# one of these plain fields (a misspelt passphrase key is an unknown key whose value is secret).
SSH_PLAIN_FIELDS = ("user", "privateKeyPath", "trustOnFirstUse")


def _may_hold_secret(loc: tuple[Any, ...]) -> bool:
    in_ssh = bool(loc) and loc[0] == "ssh" and (len(loc) != 2 or loc[1] not in SSH_PLAIN_FIELDS)
    # a node's plug: its URL is a secret, and so may be any misspelt key beside it
    in_plug = len(loc) >= 3 and loc[0] == "nodes" and loc[2] == "power" and loc[3:] != ("kind",)
    return in_ssh or in_plug


def _url_with_credentials(loc: tuple[Any, ...], value: Any) -> bool:
    return loc == ("model", "hubEndpoint") and isinstance(value, str) and "@" in value


def _describe_validation_error(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        ctx_err = (e.get("ctx") or {}).get("error")
        loc = tuple(p for p in e["loc"] if p not in ("function-after", "function-before"))
        if isinstance(ctx_err, CrossFieldError):
            loc = loc + tuple(_split_path(ctx_err.path))
            lines.append(f"{format_key_path(loc)}: {ctx_err}")
            continue
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            lines.append(f"{format_key_path(loc)}: {message}")
        elif _may_hold_secret(loc) or _url_with_credentials(loc, e["input"]):
            lines.append(f"{format_key_path(loc)}: {message} (value not shown: this key may hold a secret)")
        elif e["type"] == "value_error":  # ours: "expected ..."
            lines.append(f"{format_key_path(loc)}: {e['input']!r} — {message}")
        else:
            lines.append(f"{format_key_path(loc)}: {message} (got {e['input']!r})")
    return lines


def stack_config_keys() -> set[str]:
    """Every `twinspark:` key of the stack, without the namespace.

    pulumi.Config can only look a key up. The language host hands the program the whole config
    as PULUMI_CONFIG (sdk/python/cmd/pulumi-language-python/main.go), which
    pulumi-language-python-exec loads with runtime.set_all_config, as the mocks do: the keys
    are those of runtime.config.CONFIG, or of PULUMI_CONFIG where nothing loaded it.
    """
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    prefix = NAMESPACE + ":"
    return {k[len(prefix):] for k in keys if k.startswith(prefix)}


def _unknown_key_problems() -> list[str]:
    """A typo (twinspark:apikey) would otherwise pass unnoticed, leaving the real key unset."""
    known = [*STRUCTURED_KEYS, *OPTIONAL_STRUCTURED_KEYS, *SECRET_KEYS]
    lowered = {k.lower(): k for k in known}
    problems = []
    for key in sorted(stack_config_keys() - set(known)):
        match = difflib.get_close_matches(key.lower(), list(lowered), n=1)
        expected = (f"did you mean {NAMESPACE}:{lowered[match[0]]}?" if match
                    else f"expected one of {', '.join(f'{NAMESPACE}:{k}' for k in known)}")
        problems.append(f"{NAMESPACE}:{key}: unknown key — {expected}")
    return problems


def load_stack_config(config: Optional[pulumi.Config] = None) -> StackConfig:
    """Read every structured `twinspark:*` key from the stack and validate it; refuse unknown keys."""
    config = config or pulumi.Config(NAMESPACE)
    problems, raw = _unknown_key_problems(), {}
    unstructured = []
    for key in STRUCTURED_KEYS + OPTIONAL_STRUCTURED_KEYS:
        try:
            raw[key] = config.get_object(key)
        except Exception:  # pulumi raises a bare ConfigTypeError on non-JSON values
            unstructured.append(f"{NAMESPACE}:{key}: {config.get(key)!r} is not structured — expected a YAML "
                                "mapping or list as in Pulumi.spark.yaml")
    raw = {k: v for k, v in raw.items() if v is not None or k in STRUCTURED_KEYS}
    cfg, invalid = _stack_config_problems(raw) if not unstructured else (None, unstructured)
    if cfg is not None:
        invalid += _plug_url_problems(cfg) + _lanes_not_yet_deployed(cfg)
    if problems or invalid:
        raise config_error(problems + invalid)
    assert cfg is not None  # nothing invalid: validated
    if any(n.power for n in cfg.nodes) and not runtime_config.is_config_secret(config.full_key("nodes")):
        pulumi.log.warn(f"{NAMESPACE}:nodes: a node's power.url is stored in plain text in the stack file: "
                        f"`pulumi config set --secret --path 'nodes[N].power.url' ...` encrypts it")
    return cfg


def _plug_url_problems(cfg: StackConfig) -> list[str]:
    """Each plug's URL that is no http(s) URL, in words that never show it (it is a secret). Here,
    not in the schema: the tools that read a stack file see only its ciphertext."""
    return [f"{NAMESPACE}:nodes[{i}].power.url: not an http(s) URL with no query (value not shown: a secret) — "
            "expected the plug's address, like http://192.168.1.60 or http://admin:PASSWORD@192.168.1.60"
            for i, n in enumerate(cfg.nodes)
            if n.power is not None and not re.fullmatch(PLUG_URL_SHAPE, n.power.url.get_secret_value())]


def _lanes_not_yet_deployed(cfg: StackConfig) -> list[str]:
    """What the config allows for several lanes but this version does not deploy yet (issue 41 in progress):
    refused before any resource rather than half-built. Deployed: one node per lane, one lane per node (the
    dashboards show the head's lane's engine: by lane is not built yet)."""
    if not cfg.several_lanes:
        return []
    problems = [f"{NAMESPACE}:lanes[{i}].nodes: {len(lane.nodes)} nodes — expected one node per lane for now: a "
                "lane across nodes (its own Ray cluster and NCCL check) beside another lane is not deployed yet"
                for i, lane in enumerate(cfg.served_lanes) if len(lane.nodes) > 1]
    problems += [f"{NAMESPACE}:lanes: {node.name} serves {', '.join(lane.name for lane in cfg.lanes_on(node))} — "
                 "expected one lane per node for now: two engines on one node are not deployed yet"
                 for node in cfg.nodes if len(cfg.lanes_on(node)) > 1]
    return problems
