"""The stack config contract (Pulumi.spark.yaml) as pydantic models, validated before any resource exists.

`load_stack_config` reads the `twinspark:*` keys, validates field and cross-field rules and
raises `pulumi.RunError` naming the key path as the user wrote it, the bad value and what
is expected. Nothing here touches a node.
"""

from __future__ import annotations

import ipaddress
import re
import string
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import pulumi
from pulumi.runtime.config import is_config_secret
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

NAMESPACE = "twinspark"
STRUCTURED_KEYS = ("ssh", "nodes", "fabric", "model", "serving")

# Launch profiles exactly as the recipe's table (§5): speculative depth and batch width.
PROFILES: dict[str, dict[str, int]] = {
    "default": {"num_speculative_tokens": 7, "max_num_seqs": 6},
    "multiagent": {"num_speculative_tokens": 3, "max_num_seqs": 8},
}

# vLLM flags extraArgs may not set, and why: a config key (or the node list) owns their value,
# or they would bypass this check.
FLAGS_NOT_IN_EXTRA_ARGS = {
    "--served-model-name": "set model.servedName",
    "--port": "set serving.port",
    "--host": "twinspark listens on 0.0.0.0; set serving.port",
    "--max-model-len": "set serving.maxModelLen",
    "--gpu-memory-utilization": "set serving.gpuMemoryUtilization",
    "--kv-cache-dtype": "set serving.kvCacheDtype",
    "--tensor-parallel-size": "TP spans every node: change the node list",
    "--distributed-executor-backend": "multi-node TP runs on Ray",
    "--api-key": "set twinspark:apiKey, a secret; as a flag it would show in argv and state",
    # a profile is a measured pair (recipe §5): overriding half of it serves an unmeasured one
    "--max-num-seqs": "set by serving.profile, which is not meant to be overridden; choose 'default' or 'multiagent'",
    "--speculative-config": "set by serving.profile, which is not meant to be overridden; choose 'default' or "
    "'multiagent'",
    "--config": "it reads more flags from a file, where twinspark cannot check them; list them in serving.extraArgs",
}
# A flag as vLLM's parser reads it: '_' for '-' (FlexibleArgumentParser), an optional
# '.key' into a JSON flag, an optional '=value'.
_FLAG = re.compile(r"--(?P<name>[a-z0-9][a-z0-9_-]*)(?P<key>\.[A-Za-z0-9_.-]+)?(?P<value>=.*)?", re.S)


def _flag_refusal(name: str) -> Optional[str]:
    """Why extraArgs may not hold flag `name` (without '--'), or None.

    argparse (allow_abbrev, vLLM's default) takes any unambiguous prefix of a flag for the flag,
    so every prefix of a refused flag is refused too.
    """
    name = "--" + name.replace("_", "-")
    for flag, reason in FLAGS_NOT_IN_EXTRA_ARGS.items():
        if flag.startswith(name):
            subject = flag if name == flag else f"vLLM takes {name} for {flag}"
            return f"a flag twinspark does not own ({subject}: {reason})"
    return None


NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
NodeName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$"),
]
IfaceName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,15}$")]
AbsolutePath = Annotated[str, StringConstraints(pattern=r"^/[^\s'\"$`\\]*[^/\s'\"$`\\]$")]


def _ipv4_interface(value: str) -> str:
    try:
        iface = ipaddress.IPv4Interface(value)
    except ValueError:
        raise ValueError("expected an IPv4 address with prefix length, like 10.0.0.1/24") from None
    if "/" not in value or iface.network.prefixlen in (0, 32) or iface.ip == iface.network.network_address:
        raise ValueError("expected a host address with a prefix length between /1 and /31, like 10.0.0.1/24")
    return str(iface)


RailAddress = Annotated[str, AfterValidator(_ipv4_interface)]


class Contract(BaseModel):
    """camelCase keys as in Pulumi.spark.yaml; unknown keys are an error (typos must not pass)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SshConfig(Contract):
    user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")] = Field(
        description="login user on every node (passwordless sudo)")
    private_key_path: Optional[NonEmpty] = Field(
        default=None, description="private key that logs in to every node; omit to use ssh-agent")


class Rail(Contract):
    iface: IfaceName = Field(description="the rail's network interface (`ip link`)")
    hca: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]{1,64}$")] = Field(
        description="its RoCE device (`ibv_devinfo`), for NCCL_IB_HCA")
    address: RailAddress = Field(description="static address with prefix; rail N of every node shares one subnet")

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(self.address).network


class Node(Contract):
    name: NodeName = Field(description="short name used in resource names (`{node}-{capability}-{step}`)")
    role: Literal["head", "worker"] = Field(description="exactly one `head` (Ray head, API); the rest `worker`")
    host: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")] = Field(
        description="LAN address or name for SSH and the API")
    host_key: Optional[Annotated[str, StringConstraints(pattern=r"^(ssh-|ecdsa-)\S+ \S+$")]] = Field(
        default=None, description="the node's SSH host key (`ssh-keyscan -t ed25519 HOST`, without the host)")
    rails: list[Rail] = Field(min_length=1, description="the QSFP rails; the first carries Ray and the weight copy")

    @property
    def ray_ip(self) -> str:
        """Ray, vLLM's TCP store and the weight sync use the first rail: the cable, not the LAN."""
        return self.rails[0].ip


class Fabric(Contract):
    mtu: int = Field(ge=1280, le=9216, description="MTU of every rail; FabricCheck and `ops status` expect it")
    link_speed_mbps: int = Field(gt=0, description="link speed every rail must report")
    bootstrap_iface: IfaceName = Field(description="NCCL/GLOO bootstrap interface (NCCL_SOCKET_IFNAME)")
    # The recipe measures ~20 GB/s over both rails, ~2 GB/s when NCCL falls back to TCP.
    min_bus_bandwidth_gbps: float = Field(
        default=10.0, ge=0, alias="minBusBandwidthGBps",
        description="NcclCheck's floor for all_reduce bus bandwidth in GB/s; `0` skips NcclCheck")


class ModelConfig(Contract):
    repo: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")] = Field(
        description="Hugging Face repository to serve")
    dir: AbsolutePath = Field(description="where the weights live on every node")
    served_name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")] = Field(
        description="model name clients ask for (`--served-model-name`)")

    @property
    def container_dir(self) -> str:
        return "/models/" + self.dir.rstrip("/").rsplit("/", 1)[-1]


class Serving(Contract):
    image: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._/:@-]*$")] = Field(
        description="base image with vLLM for GB10 (sm_121), e.g. `ghcr.io/anemll/dspark-vllm-gx10:0.1.1`")
    profile: Literal["default", "multiagent"] = Field(
        default="default",
        description="`default` (spec decode 7, 6 seqs: 74.8 tok/s single stream) or `multiagent` "
        "(spec 3, 8 seqs: 105.7 tok/s at 4-way)")
    port: int = Field(default=8000, ge=1, le=65535, description="API port on the head")
    max_model_len: int = Field(
        default=1048576, gt=0, description="`--max-model-len`; also the clients' context window and fences")
    gpu_memory_utilization: float = Field(
        default=0.85, gt=0.0, le=0.95, description="`--gpu-memory-utilization` (0 < x ≤ 0.95)")
    kv_cache_dtype: Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]+$")] = Field(
        default="fp8_ds_mla",
        description="keep the native fp8 (gotcha 14); any other value tightens the compaction fence to 110k")
    extra_args: list[str] = Field(
        default_factory=list, description="more vLLM flags, appended last; refused: a flag a config key or the profile sets, any "
        "abbreviation of one (vLLM's parser takes them), and `--config`")
    ray_version: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+\.\d+$")] = Field(
        default="2.57.0", description="Ray installed into the serving image")
    readiness_timeout_minutes: int = Field(
        default=20, ge=1, le=240, description="how long `pulumi up` waits for the endpoint to answer")

    @model_validator(mode="after")
    def _extra_args_are_flags(self) -> "Serving":
        expect_value = False
        for i, token in enumerate(self.extra_args):
            flag = _FLAG.fullmatch(token)
            if flag:
                refusal = _flag_refusal(flag["name"])
                if refusal:  # the value is left out: it may be the very secret that belongs elsewhere
                    shown = token if flag["value"] is None else token.split("=", 1)[0] + "=(value not shown)"
                    raise _CrossFieldError(f"extraArgs[{i}]", shown, refusal)
                expect_value = flag["value"] is None
            elif expect_value and not token.startswith("-"):
                expect_value = False
            else:
                raise _CrossFieldError(
                    f"extraArgs[{i}]", repr(token), "'--flag', '--flag=value', or a value right after a '--flag'"
                )
        return self


class StackConfig(Contract):
    ssh: SshConfig
    nodes: list[Node] = Field(min_length=1)
    fabric: Fabric
    model: ModelConfig
    serving: Serving

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.nodes)  # one GB10 GPU per Spark

    def peers_on_rail(self, node: Node, rail_index: int) -> list[str]:
        return [n.rails[rail_index].ip for n in self.nodes if n.name != node.name]

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "StackConfig":
        heads = [i for i, n in enumerate(self.nodes) if n.role == "head"]
        if len(heads) != 1:
            raise _CrossFieldError(
                "nodes", f"{len(heads)} nodes have role head", "exactly one node with role: head"
            )
        _require_distinct(self.nodes, "name", lambda n: n.name)
        _require_distinct(self.nodes, "host", lambda n: n.host)
        rail_counts = {len(n.rails) for n in self.nodes}
        if len(rail_counts) != 1:
            raise _CrossFieldError(
                "nodes", f"rail counts {sorted(rail_counts)}", "the same number of rails on every node"
            )
        seen: dict[str, str] = {}
        for i, node in enumerate(self.nodes):
            for r, rail in enumerate(node.rails):
                path = f"nodes[{i}].rails[{r}].address"
                if rail.ip in seen:
                    raise _CrossFieldError(path, rail.address, f"a rail address not already used by {seen[rail.ip]}")
                seen[rail.ip] = path
                first = self.nodes[0].rails[r]
                if rail.network != first.network:
                    raise _CrossFieldError(
                        path,
                        rail.address,
                        f"an address in {first.network} (rail {r} of every node shares one subnet, "
                        f"as nodes[0].rails[{r}] does)",
                    )
        return self


class _CrossFieldError(ValueError):
    """A rule failed at `path` (relative to the validated model); pydantic carries it in ctx."""

    def __init__(self, path: str, value: Any, expected: str):
        super().__init__(f"{value} — expected {expected}")
        self.path, self.value, self.expected = path, value, expected


def _require_distinct(nodes: list[Node], field: str, key) -> None:
    seen: dict[str, int] = {}
    for i, node in enumerate(nodes):
        value = key(node)
        if value in seen:
            raise _CrossFieldError(
                f"nodes[{i}].{field}", value, f"a {field} different from nodes[{seen[value]}].{field}"
            )
        seen[value] = i


@dataclass(frozen=True)
class SecretKey:
    meaning: str
    min_length: int
    max_length: int = 256


# A secret lands in a shell's environment, a curl config line, an env file and an HTTP
# header. RFC 6750's bearer-token characters are plain in all of them, so a valid value
# cannot end a line, close a quote or expand.
SECRET_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~+/=")
SECRET_CHARACTERS_IN_WORDS = "a letter, digit or one of - . _ ~ + / ="
SECRET_KEYS = {
    # shorter keys can be guessed; the generated one has 48 characters
    "apiKey": SecretKey(
        "the API key clients send; generated once when unset (`pulumi config set --secret apiKey ...`)",
        min_length=16),
    "hfToken": SecretKey("Hugging Face token, for gated models", min_length=8),
}
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a space"}


def secret_problem(key: str, value: str) -> Optional[str]:
    """Why `value` cannot be the secret `key`, in words that never show the value; None if it can."""
    spec = SECRET_KEYS[key]
    expected = f"expected {spec.min_length} to {spec.max_length} characters, each {SECRET_CHARACTERS_IN_WORDS}"
    if not value:
        return f"the value (a secret, not shown) is empty — {expected}"
    outside = sorted({c for c in value if c not in SECRET_CHARACTERS})
    if outside:
        names = ", ".join(_CHARACTER_NAMES.get(c, repr(c)) for c in outside)
        return f"the value (a secret, not shown) holds {names} — {expected}"
    if not spec.min_length <= len(value) <= spec.max_length:
        return f"the value (a secret, not shown) has {len(value)} characters — {expected}"
    return None


def load_secrets(config: Optional[pulumi.Config] = None) -> dict[str, Optional[pulumi.Output[str]]]:
    """Every secret key, validated and wrapped as a secret at once; None where unset."""
    config = config or pulumi.Config(NAMESPACE)
    secrets, problems = {}, []
    for key in SECRET_KEYS:
        value = config.get(key)  # plain only for the check below
        if value is not None and (problem := secret_problem(key, value)):
            problems.append(f"{NAMESPACE}:{key}: {problem}")
        elif value is not None and not is_config_secret(config.full_key(key)):
            pulumi.log.warn(f"{NAMESPACE}:{key} is stored in plain text in the stack file: "
                            f"`pulumi config set --secret {key} ...` encrypts it")
        secrets[key] = None if value is None else pulumi.Output.secret(value)
    if problems:
        raise pulumi.RunError("invalid stack config:\n  " + "\n  ".join(problems))
    return secrets


def parameter_table() -> str:
    """The README's parameter table, from the field descriptions: the two cannot drift."""
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            annotation = field.annotation
            inner = getattr(annotation, "__args__", (annotation,))
            nested = next((t for t in inner if isinstance(t, type) and issubclass(t, Contract)), None)
            if nested is not None:
                rows.append(f"| `{key}` | required | {field.description} |")
                walk(nested, f"{key}{'[]' if getattr(annotation, '__origin__', None) is list else ''}.")
                continue
            if field.is_required():
                default = "required"
            else:
                value = field.get_default(call_default_factory=True)
                default = "none" if value is None else f"`{value}`"
            rows.append(f"| `{key}` | {default} | {field.description} |")

    for block in STRUCTURED_KEYS:
        model = StackConfig.model_fields[block].annotation
        inner = getattr(model, "__args__", (model,))[0]
        walk(inner, f"{block}{'[]' if block == 'nodes' else ''}.")
    for key, spec in SECRET_KEYS.items():
        rules = f"{spec.min_length}–{spec.max_length} letters, digits or `-._~+/=`"
        rows.append(f"| `{key}` (secret) | none | {spec.meaning}; {rules} |")
    return "\n".join(rows) + "\n"


def format_key_path(loc: tuple[Any, ...]) -> str:
    """('nodes', 1, 'rails', 0, 'address') -> 'twinspark:nodes[1].rails[0].address'."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{NAMESPACE}:{path}"


def parse_stack_config(raw: dict[str, Any]) -> StackConfig:
    """Validate raw config values (keys without namespace). Raises pulumi.RunError."""
    missing = [k for k in STRUCTURED_KEYS if raw.get(k) is None]
    if missing:
        raise pulumi.RunError(
            "; ".join(f"{NAMESPACE}:{k}: missing — expected the {k} block of the config contract "
                      "(see Pulumi.spark.yaml)" for k in missing)
        )
    try:
        return StackConfig.model_validate(raw)
    except ValidationError as err:
        raise pulumi.RunError(_describe_validation_error(err)) from None


def _split_path(path: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


def _describe_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        ctx_err = (e.get("ctx") or {}).get("error")
        loc = tuple(p for p in e["loc"] if p not in ("function-after",))
        if isinstance(ctx_err, _CrossFieldError):
            loc = loc + tuple(_split_path(ctx_err.path))
            lines.append(f"{format_key_path(loc)}: {ctx_err}")
            continue
        message = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        shown = "" if e["type"] == "missing" else f" (got {value!r})"
        lines.append(f"{format_key_path(loc)}: {message}{shown}")
    return "invalid stack config:\n  " + "\n  ".join(lines)


def load_stack_config(config: Optional[pulumi.Config] = None) -> StackConfig:
    """Read every structured `twinspark:*` key from the stack and validate it."""
    config = config or pulumi.Config(NAMESPACE)
    raw = {}
    for key in STRUCTURED_KEYS:
        try:
            raw[key] = config.get_object(key)
        except Exception:  # pulumi raises a bare ConfigTypeError on non-JSON values
            raise pulumi.RunError(
                f"{NAMESPACE}:{key}: {config.get(key)!r} is not structured — expected a YAML "
                "mapping or list as in Pulumi.spark.yaml"
            ) from None
    return parse_stack_config(raw)
