"""The stack config contract (Pulumi.spark.yaml) as pydantic models, validated before any resource exists.

`load_stack_config` reads the `twinspark:*` keys, validates field and cross-field rules and
raises `pulumi.RunError` naming the key path as the user wrote it, the bad value and what
is expected. Nothing here touches a node.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal, Optional

import pulumi
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

import host_keys
import node_contract as contract

NAMESPACE = "twinspark"
STRUCTURED_KEYS = ("ssh", "nodes", "fabric", "model", "serving")
OPTIONAL_STRUCTURED_KEYS = ("observability",)  # omitted: the block's defaults

# Launch profiles exactly as the recipe's table (§5): speculative depth and batch width.
PROFILES: dict[str, dict[str, int]] = {
    "default": {"num_speculative_tokens": 7, "max_num_seqs": 6},
    "multiagent": {"num_speculative_tokens": 3, "max_num_seqs": 8},
}

# vLLM flags owned by a config key; extraArgs may not set them behind the config's back.
FLAGS_OWNED_BY_CONFIG = {
    "--served-model-name": "model.servedName",
    "--port": "serving.port",
    "--host": "serving.port (twinspark listens on 0.0.0.0)",
    "--max-model-len": "serving.maxModelLen",
    "--gpu-memory-utilization": "serving.gpuMemoryUtilization",
    "--kv-cache-dtype": "serving.kvCacheDtype",
    "--tensor-parallel-size": "the node list (TP spans every node)",
    "--distributed-executor-backend": "nothing: Ray is required for multi-node TP",
    "--api-key": "twinspark:apiKey (a secret; never a flag, it would show in argv)",
}

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


def _host_key(value: str) -> str:
    try:
        host_keys.parse(value)
    except host_keys.HostKeyError as err:
        raise ValueError(str(err)) from None
    return value


class Contract(BaseModel):
    """camelCase keys as in Pulumi.spark.yaml; unknown keys are an error (typos must not pass)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SshConfig(Contract):
    user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")] = Field(
        description="login user on every node (passwordless sudo)")
    private_key_path: Optional[NonEmpty] = Field(
        default=None, description="private key that logs in to every node; omit to use ssh-agent "
        "(a passphrase-protected key must be in ssh-agent: the docker provider's ssh cannot ask for it)")
    private_key_passphrase: Optional[SecretStr] = Field(
        default=None, description="passphrase of `privateKeyPath`, a secret (`pulumi config set --secret --path "
        "ssh.privateKeyPassphrase ...`): the remote commands decrypt the key with it instead of asking ssh-agent")
    trust_on_first_use: bool = Field(
        default=False, description="accept a node without a pinned `hostKey`: its key is read at first contact "
        "and trusted from then on (see Security); off, `pulumi up` refuses such a node")


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
    host_key: Optional[Annotated[str, AfterValidator(_host_key)]] = Field(
        default=None, description="the node's SSH host key, pinned: `python -m ops pin-host-keys` reads it "
        "(`ssh-ed25519 AAAA...`, as `ssh-keyscan` prints it without the host)")
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
        default_factory=list, description="more vLLM flags, appended last (flags owned by a config key are refused)")
    ray_version: Annotated[str, StringConstraints(pattern=r"^\d+\.\d+\.\d+$")] = Field(
        default="2.57.0", description="Ray installed into the serving image")
    readiness_timeout_minutes: int = Field(
        default=20, ge=1, le=240, description="how long `pulumi up` waits for the endpoint to answer")

    @model_validator(mode="after")
    def _extra_args_are_flags(self) -> "Serving":
        expect_value = False
        for i, token in enumerate(self.extra_args):
            if re.fullmatch(r"--[a-z0-9][a-z0-9-]*(=.*)?", token, re.S):
                flag = token.split("=", 1)[0]
                if flag in FLAGS_OWNED_BY_CONFIG:
                    raise _CrossFieldError(
                        f"extraArgs[{i}]", token, f"a flag twinspark does not own: set {FLAGS_OWNED_BY_CONFIG[flag]}"
                    )
                expect_value = "=" not in token
            elif expect_value and not token.startswith("-"):
                expect_value = False
            else:
                raise _CrossFieldError(
                    f"extraArgs[{i}]", repr(token), "'--flag', '--flag=value', or a value right after a '--flag'"
                )
        return self


# An image is pinned when it names a digest or an exact version tag (major.minor.patch, as
# v3.13.1 or 12.4.5-ubuntu): never "latest", "v3" or "12.4", never a bare repository (which
# docker reads as "latest").
_IMAGE_REFERENCE = re.compile(
    r"^(?P<repo>[a-z0-9][a-z0-9._/-]*(:[0-9]+/[a-z0-9._/-]+)?)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
_EXACT_VERSION = re.compile(r"^v?[0-9]+\.[0-9]+\.[0-9]+([-+._][A-Za-z0-9_.-]+)?$")


def _pinned_image(value: str) -> str:
    match = _IMAGE_REFERENCE.match(value)
    if not match:
        raise ValueError("expected an image reference like prom/prometheus:v3.13.1 or repo@sha256:<64 hex>")
    tag, digest = match.group("tag"), match.group("digest")
    if digest is None and (tag is None or not _EXACT_VERSION.match(tag)):
        raise ValueError("expected an image pinned to an exact version tag (e.g. :v3.13.1) or a @sha256: digest")
    return value


PinnedImage = Annotated[str, AfterValidator(_pinned_image)]


class ObservabilityImages(Contract):
    prometheus: PinnedImage = Field(default="prom/prometheus:v3.13.1", description="Prometheus, on the head")
    grafana: PinnedImage = Field(default="grafana/grafana:12.4.5", description="Grafana, on the head")
    alertmanager: PinnedImage = Field(
        default="prom/alertmanager:v0.28.1", description="Alertmanager, on the head, only with `alertWebhookUrl` set")
    node_exporter: PinnedImage = Field(
        default="prom/node-exporter:v1.12.1",
        description="node exporter on every node: host, RoCE port counters and state, link state, MTU, speed")
    gpu_exporter: PinnedImage = Field(
        default="utkuozdemir/nvidia_gpu_exporter:1.14.0",
        description="nvidia-smi exporter on every node (works on GB10, where DCGM does not)")


class Observability(Contract):
    enabled: bool = Field(
        default=True, description="`false`: deploy no metrics, dashboards or alerts (and remove them if deployed)")
    retention_days: int = Field(default=30, ge=1, le=3650, description="Prometheus keeps this many days of samples")
    retention_size: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*(KB|MB|GB|TB)$")] = Field(
        default="100GB", description="...and at most this much of the head's disk, whichever limit is hit first")
    scrape_interval_seconds: int = Field(
        default=15, ge=1, le=300, description="how often every target is scraped and every rule evaluated")
    grafana_port: int = Field(default=3000, ge=1, le=65535, description="Grafana's port on every interface of the head")
    images: ObservabilityImages = Field(
        default_factory=ObservabilityImages,
        description="the images, each pinned to an exact `major.minor.patch` tag or a `@sha256:` digest")
    gpu_temperature_alert_celsius: float = Field(
        default=85.0, gt=0, le=120, description="TwinsparkGpuHot fires above this GPU temperature for 5 min")
    spec_decode_min_acceptance: float = Field(
        default=0.2, ge=0, lt=1,
        description="TwinsparkSpecDecodeAcceptanceCollapse fires when accepted/drafted tokens stay below this")
    throughput_floor_tokens_per_second: float = Field(
        default=10.0, gt=0,
        description="TwinsparkThroughputCollapse fires when requests run but output stays under this many tok/s "
        "(and prefill under 20 times it) for 10 min; healthy decode is 27-105 tok/s")


class StackConfig(Contract):
    ssh: SshConfig
    nodes: list[Node] = Field(min_length=1)
    fabric: Fabric
    model: ModelConfig
    serving: Serving
    observability: Observability = Field(default_factory=Observability)

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def tensor_parallel_size(self) -> int:
        return len(self.nodes)  # one GB10 GPU per Spark

    @property
    def head_public_ports(self) -> tuple[int, ...]:
        """What the head serves to the LAN (the host firewall opens these and SSH, nothing else)."""
        grafana = (self.observability.grafana_port,) if self.observability.enabled else ()
        return (self.serving.port, *grafana)

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
        if self.observability.enabled:
            taken = {**contract.OBSERVABILITY_PORTS, "Ray": contract.RAY_PORT,
                     "the Ray dashboard": contract.RAY_DASHBOARD_PORT}
            for path, port in (("serving.port", self.serving.port),
                               ("observability.grafanaPort", self.observability.grafana_port)):
                user = next((name for name, p in taken.items() if p == port), None)
                if user:
                    raise _CrossFieldError(path, port, f"a port other than {user}'s ({port}, on the head)")
                taken[path] = port
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


SECRET_KEYS = {
    "apiKey": "the API key clients send; generated once when unset (`pulumi config set --secret apiKey ...`)",
    "hfToken": "Hugging Face token, for gated models",
    "grafanaAdminPassword": "Grafana's `admin` password; generated once when unset",
    "alertWebhookUrl": "where alerts are sent (an Alertmanager webhook receiver: JSON POST); unset: they show "
    "in Grafana and Prometheus only",
}


def check_webhook_url(url: str) -> str:
    """twinspark:alertWebhookUrl is a secret: the message never shows it."""
    if not re.fullmatch(r"https?://[^\s/'\"]+(/\S*)?", url or ""):
        raise pulumi.RunError(f"{NAMESPACE}:alertWebhookUrl: not an http(s) URL (value not shown: it is a secret) "
                              "— expected the URL of a receiver for Alertmanager's webhook POSTs")
    return url


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
                rows.append(f"| `{key}` | {'required' if field.is_required() else 'see below'} | {field.description} |")
                walk(nested, f"{key}{'[]' if getattr(annotation, '__origin__', None) is list else ''}.")
                continue
            if field.is_required():
                default = "required"
            else:
                value = field.get_default(call_default_factory=True)
                default = "none" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"
            rows.append(f"| `{key}` | {default} | {field.description} |")

    for block in STRUCTURED_KEYS + OPTIONAL_STRUCTURED_KEYS:
        model = StackConfig.model_fields[block].annotation
        inner = getattr(model, "__args__", (model,))[0]
        walk(inner, f"{block}{'[]' if block == 'nodes' else ''}.")
    for key, meaning in SECRET_KEYS.items():
        rows.append(f"| `{key}` (secret) | none | {meaning} |")
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


# The ssh block may hold the key's passphrase: an error there shows the value only where it is
# one of these plain fields (a misspelt passphrase key is an unknown key whose value is secret).
SSH_PLAIN_FIELDS = ("user", "privateKeyPath", "trustOnFirstUse")


def _may_hold_secret(loc: tuple[Any, ...]) -> bool:
    return bool(loc) and loc[0] == "ssh" and (len(loc) != 2 or loc[1] not in SSH_PLAIN_FIELDS)


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
        shown = "" if e["type"] == "missing" or _may_hold_secret(loc) else f" (got {value!r})"
        lines.append(f"{format_key_path(loc)}: {message}{shown}")
    return "invalid stack config:\n  " + "\n  ".join(lines)


def load_stack_config(config: Optional[pulumi.Config] = None) -> StackConfig:
    """Read every structured `twinspark:*` key from the stack and validate it."""
    config = config or pulumi.Config(NAMESPACE)
    raw = {}
    for key in STRUCTURED_KEYS + OPTIONAL_STRUCTURED_KEYS:
        try:
            raw[key] = config.get_object(key)
        except Exception:  # pulumi raises a bare ConfigTypeError on non-JSON values
            raise pulumi.RunError(
                f"{NAMESPACE}:{key}: {config.get(key)!r} is not structured — expected a YAML "
                "mapping or list as in Pulumi.spark.yaml"
            ) from None
    return parse_stack_config({k: v for k, v in raw.items() if v is not None or k in STRUCTURED_KEYS})
