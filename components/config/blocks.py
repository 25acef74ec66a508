"""The blocks of the stack config (ssh, nodes, fabric, model, serving, observability, platform) as
pydantic models, each with the rules that need only its own fields.

What spans blocks (one head, rails apart, ports apart, TP × PP over the nodes) is StackConfig's
(schema.py). camelCase keys as in Pulumi.spark.yaml; an unknown key is an error.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, StringConstraints, model_validator
from pydantic.alias_generators import to_camel, to_snake

from core import loaders, recipes, vllm_flags
from core.memory_budget import HEADROOM_PERCENT, MIN_AUTO_COTENANT_PERCENT, BudgetError, MemoryBudget
from core.memory_budget import memory_budget as budget_of
from .errors import CrossFieldError
from .values import (DEFAULT_HUB_ENDPOINT, SERVING_IMAGE_LOCK, Acknowledgeable, AptPackage, CommitSha, CotenantMemory,
                     DockerPlatform, EmailAddress, HcaName, HostName, HubEndpoint, IfaceName, ImageRef, Integer, KvCacheDtype,
                     LaneName,
                     ModelDir, NodeName, NonEmpty, Number, PinnedHostKey, PinnedImage, Port, RailAddress, RayVersion,
                     RepoId, ServedName, SmtpHost, UserName, locked_version)

# Keys whose unset value is the chosen recipe's (Serving._recipe_values)
MAX_MODEL_LEN_LIMIT = 2**24  # 16,777,216: no model's context comes near; rendered into the launch script
RECIPE_KEYS = ("serving.maxModelLen", "serving.gpuMemoryUtilization", "serving.kvCacheDtype", "serving.loadFormat")


class ConfigBlock(BaseModel):
    """camelCase keys as in Pulumi.spark.yaml; unknown keys are an error (typos must not pass)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SshConfig(ConfigBlock):
    user: UserName = Field(description="login user on every node (passwordless sudo)")
    private_key_path: Optional[NonEmpty] = Field(
        default=None, description="private key that logs in to every node; omit to use ssh-agent "
        "(a passphrase-protected key must be in ssh-agent: the docker provider's ssh cannot ask for it)")
    private_key_passphrase: Optional[SecretStr] = Field(
        default=None, description="passphrase of `privateKeyPath`, a secret (`pulumi config set --secret --path "
        "ssh.privateKeyPassphrase ...`): the remote commands decrypt the key with it instead of asking ssh-agent")
    trust_on_first_use: bool = Field(
        default=False, description="accept a node without a pinned `hostKey`: its key is read at first contact "
        "and trusted from then on (see docs/security.md); off, `pulumi up` refuses such a node")


class Rail(ConfigBlock):
    iface: IfaceName = Field(description="the rail's network interface (`ip link`)")
    hca: HcaName = Field(description="its RoCE device (`ibv_devinfo`), for NCCL_IB_HCA")
    address: RailAddress = Field(
        description="static private address with prefix (/16 to /31); direct and switch: rail N of every node "
        "shares one subnet; ring: the subnet of this rail's cable twin on `peer`; no two rails overlap")
    peer: Optional[NodeName] = Field(
        default=None,
        description="ring only, and there required: the node (its `name`) this rail's cable goes to; the k-th rail "
        "toward a peer pairs with that peer's k-th rail back")

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(self.address).network


def _undecrypted(value: Any) -> Any:
    """A stack file read as text (the maintainers' tools, the sim's harness) holds a secret as
    {"secure": CIPHERTEXT}; such a reader never needs the value, so it stands as these words.
    `pulumi up` is given the decrypted text."""
    return UNDECRYPTED if isinstance(value, dict) and set(value) == {"secure"} else value


UNDECRYPTED = "(encrypted in the stack file)"
PLUG_URL_SHAPE = r"https?://[^/?#\s]+(/[^?#\s]*)?"


class PowerPlug(ConfigBlock):
    kind: Literal["shelly", "shelly-rpc", "tasmota"] = Field(
        description="the plug's HTTP API: `shelly` (Gen1, `/relay/0?turn=`), `shelly-rpc` (Gen2 and later, "
        "`/rpc/Switch.Set`) or `tasmota` (`/cm?cmnd=Power`)")
    url: Annotated[SecretStr, BeforeValidator(_undecrypted)] = Field(
        description="the plug's address as an http(s) URL with no query, credentials in it if it asks for them, a "
        "secret (`pulumi config set --secret --path 'nodes[1].power.url' http://admin:PASSWORD@192.168.1.60`): only "
        "the node that watches this one holds it (root-only)")


class Node(ConfigBlock):
    name: NodeName = Field(description="short name used in resource names (`{node}-{capability}-{step}`)")
    former_name: Optional[NodeName] = Field(
        default=None, description="the name this node had in the stack until now; set it for the `pulumi up` "
        "that renames the node, then remove it (its resources keep their state under the new name: see "
        "docs/operating.md, Operating and recovering)")
    role: Literal["head", "worker"] = Field(description="exactly one `head` (Ray head, API); the rest `worker`")
    host: HostName = Field(description="LAN address or name for SSH and the API")
    host_key: Optional[PinnedHostKey] = Field(
        default=None, description="the node's SSH host key, pinned: `twinspark pin-host-keys` reads it "
        "(`ssh-ed25519 AAAA...`, as `ssh-keyscan` prints it without the host)")
    rails: list[Rail] = Field(
        min_length=1, description="the QSFP rails; direct and switch: the first carries Ray and the weight copy's "
        "control connection (ring: see docs/operating.md, Three or more Sparks)")
    power: Optional[PowerPlug] = Field(
        default=None, description="a smart plug or PDU outlet this node is plugged into: when the node stops "
        "answering (SSH, its exporter, the guard) for `powerWatch.missSeconds`, the node that watches it (the next "
        "in this list) power-cycles it (docs/operating.md, A box that stops answering); unset: nobody does")


class Fabric(ConfigBlock):
    topology: Literal["direct", "switch", "ring"] = Field(
        default="direct",
        description="how the rails are cabled: `direct` (two Sparks, one cable), `switch` (two or more, every "
        "node's rail N on one subnet) or `ring` (three Sparks cabled to each other, each rail naming its `peer`)")
    mtu: Integer = Field(ge=1280, le=9216, description="MTU of every rail; FabricCheck and `ops status` expect it")
    link_speed_mbps: Integer = Field(gt=0, description="link speed every rail must report")
    bootstrap_iface: IfaceName = Field(description="NCCL/GLOO bootstrap interface (NCCL_SOCKET_IFNAME)")
    # The recipe measures ~20 GB/s over both rails, ~2 GB/s when NCCL falls back to TCP.
    min_bus_bandwidth_gbps: Number = Field(
        default=10.0, ge=0, alias="minBusBandwidthGBps",
        description="NcclCheck's floor for all_reduce bus bandwidth in GB/s; `0` skips NcclCheck "
        "(and must, on a single node)")
    nccl_join_timeout_seconds: Optional[Integer] = Field(
        default=None, ge=10, le=3600, alias="ncclJoinTimeoutSeconds",
        description="how long NcclCheck's ranks wait for each other before one alone fails, naming the run that "
        "replaces every rank (unset: 180 s; one `pulumi up` starts them within seconds of each other)")


class ModelConfig(ConfigBlock):
    repo: RepoId = Field(description="Hugging Face repository to serve")
    dir: ModelDir = Field(
        description="where the weights live on every node: a directory of its own (each worker's copy mirrors "
        "the head's), not a system or home directory")
    served_name: ServedName = Field(description="model name clients ask for (`--served-model-name`)")
    revision: Optional[CommitSha] = Field(
        default=None,
        description="the repository's commit to serve (40 hex). Unset: the commit serving.recipe was proven at "
        "when `model.repo` is its repository (see Models; one that runs the model's own code and records none is "
        "refused), else the commit the hub serves at the first `pulumi up`, recorded (output `modelRevision`) and "
        "kept until `model.repo` or this key changes")
    hub_endpoint: HubEndpoint = Field(
        default=DEFAULT_HUB_ENDPOINT,
        description="the Hugging Face Hub the head downloads from (HF_ENDPOINT of the download): a mirror or a "
        "proxy that serves the same repositories; no trailing '/'; `https://` whenever `hfToken` is set. A change "
        "downloads nothing already verified")

    @property
    def container_dir(self) -> str:
        return "/models/" + self.dir.rstrip("/").rsplit("/", 1)[-1]


class ServingGuard(ConfigBlock):
    enabled: bool = Field(default=True, description="`false`: no guard on the head (and remove it if deployed)")
    interval_seconds: Integer = Field(
        default=120, ge=5, le=3600, description="a canary round this often (and right after every (re)start)")
    retry_seconds: Integer = Field(default=15, ge=1, le=600, description="the next round this soon after a failed one")
    deadline_seconds: Integer = Field(
        default=60, ge=5, le=600, description="each canary request must be answered in full within this")
    failures_before_restart: Integer = Field(
        default=3, ge=1, le=20, description="this many failed rounds in a row restart the head's serving container")
    restart_limit: Integer = Field(
        default=3, ge=1, le=50,
        description="this many serving restarts within restartWindowMinutes: no more restarts, serving is held "
        "until a reboot or `twinspark clear-hold`")
    restart_window_minutes: Integer = Field(default=30, ge=1, le=1440, description="the window restartLimit counts over")
    drain_seconds: Integer = Field(
        default=30, ge=0, le=600,
        description="a rail down or throttled, or NCCL on Socket: the gateway answers 503 and requests in flight get "
        "this long to finish before serving stops for the fabric's re-qualification")
    requalify_seconds: Integer = Field(
        default=120, ge=10, le=3600,
        description="held because the fabric's re-qualification failed: the checks run again this often, and serving "
        "starts the first time they pass")


class KvTier(ConfigBlock):
    """The lane's KV blocks kept on the node's NVMe across engine restarts (core/kv_tier.py)."""

    memory_gib: Integer = Field(
        alias="memoryGiB", ge=1, le=64,
        description="GiB of host memory for the tier's CPU part (vLLM's cpu_bytes_to_use), in front of the disk: "
        "counted in the node's memory budget beside gpuMemoryUtilization")
    disk_gib: Integer = Field(
        alias="diskGiB", ge=1, le=100_000,
        description="GiB of the node's disk (under /var/cache/twinspark/kv-tier) the blocks may hold; the least "
        "recently used go first")


class Serving(ConfigBlock):
    image: ImageRef = Field(
        description="base image with vLLM for GB10 (sm_121), e.g. `ghcr.io/anemll/dspark-vllm-gx10:0.1.1`; a tag "
        "is resolved to its digest once and kept (output `servingImage`), a `@sha256:` digest is used as it is")
    recipe: str = Field(
        default=recipes.DEFAULT_RECIPE,
        description="the model recipe (a file in recipes/, by its `name`): vLLM's flags and environment, profiles, "
        "client fences, needle sizes, panels and baseline; see Models")
    profile: str = Field(
        default="default",
        description="one of the recipe's launch profiles; DeepSeek's: `default` (spec decode 7, 6 seqs: 74.8 tok/s "
        "single stream) or `multiagent` (spec 3, 8 seqs: 105.7 tok/s at 4-way)")
    port: Port = Field(
        default=8000,
        description="API port on the head; not a port SSH, Ray, vLLM, NcclCheck, the weight copy, the kernel's "
        "ephemeral range or the monitoring (while on) use, nor grafanaPort")
    # unset: the recipe's value (filled in by _recipe_values before validation)
    max_model_len: Integer = Field(  # type: ignore[assignment]  # None until _recipe_values: never once validated
        default=None, gt=0, le=MAX_MODEL_LEN_LIMIT,
        description="`--max-model-len`; also the clients' context window and fences (at most 2^24 tokens, beyond "
        "any model's context)")
    gpu_memory_utilization: Number = Field(  # type: ignore[assignment]  # None until _recipe_values: never once validated
        default=None, gt=0.0, le=0.95, description="`--gpu-memory-utilization` (0 < x ≤ 0.95)")
    kv_cache_dtype: KvCacheDtype = Field(
        default=None,
        description="a KV-cache dtype vLLM registers; DeepSeek: keep the native fp8 (gotcha 14), any other value "
        "tightens the compaction fence to 110k")
    load_format: str = Field(  # type: ignore[assignment]  # None until _recipe_values: never once validated
        default=None,
        description="how vLLM reads the weights (`--load-format`): `auto` (vLLM's own reader), `safetensors`, "
        "`fastsafetensors`, `instanttensor` or `runai_streamer` (each reads the downloaded safetensors; the "
        "serving image carries their packages); unset: the recipe's (`auto` in every recipe until a loader is "
        "measured on a Spark)")
    kv_tier: Optional[KvTier] = Field(
        default=None,
        description="off unless set (not yet measured on a GPU): `{memoryGiB, diskGiB}` keeps the prompts' KV blocks "
        "on the node's disk, so a long context is read back after an engine restart instead of prefilled again "
        "(vLLM's own file tier); only for a lane on one node (vLLM 0.24.0's tier holds the head's ranks only)")
    extra_args: list[str] = Field(
        default_factory=list,
        description="more vLLM flags, appended last; refused: a flag a config key, the recipe or the profile sets, "
        "any abbreviation of one (vLLM's parser takes them), `--config` and the flags that make vLLM import code by "
        "name (`--middleware`, `--worker-cls`, ...)")
    ray_version: RayVersion = Field(
        default="2.57.0", description="Ray installed into the serving image: the version "
        "launch/serving-image/ray-requirements.lock pins (with every dependency's hashes)")
    # Ubuntu 22.04's nginx, as in the recipe's base (vLLM's image); a base of another release
    # names its own versions. NOT read from the recipe's base image yet: the build names every
    # package it would add unpinned.
    apt_packages: list[AptPackage] = Field(
        default_factory=lambda: ["nginx=1.18.0-6ubuntu14"], min_length=1,
        description="the Debian packages the serving image adds (nginx for the API gateway), each at an exact "
        "version NAME=VERSION; the build refuses any other package apt would pull in")
    platform: DockerPlatform = Field(
        default="linux/arm64",
        description="the platform the serving image is built for and every image is pulled for: `linux/arm64` "
        "(a DGX Spark) or `linux/amd64` (the simulator)")
    # unset: the node count ÷ pipelineParallel (StackConfig.tensor_parallel_size)
    tensor_parallel: Optional[Integer] = Field(
        default=None, ge=1,
        description="`--tensor-parallel-size`: nodes in each pipeline stage, splitting every layer's heads; "
        "tensorParallel × pipelineParallel must equal the node count (one GPU per Spark)")
    pipeline_parallel: Integer = Field(
        default=1, ge=1,
        description="`--pipeline-parallel-size`: stages the layers are split over (`--pipeline-parallel-size` is "
        "passed only above 1); what 3 nodes need for a model TP=3 cannot split (the config check lists the layouts "
        "that work)")
    executor: Literal["ray", "mp"] = Field(
        default="ray",
        description="vLLM's executor across the nodes: `ray` (the recipe's: a Ray cluster whose membership the "
        "workers watch) or `mp` (vLLM's multiprocessing executor, no Ray: the head serves with `--nnodes/--node-rank "
        "0/--master-addr`, each worker runs `--headless`; see docs/architecture.md, The mp executor)")
    readiness_timeout_minutes: Integer = Field(
        default=20, ge=1, le=240, description="how long `pulumi up` waits for the endpoint to answer")
    gpu_clock_cap_mhz: Optional[Integer] = Field(
        default=None, ge=300, le=4000,
        description="cap every node's GPU clock at this many MHz, applied now and at every boot "
        "(`nvidia-smi -lgc 0,N`, which alone does not survive a reboot): what cures overheat shutdowns "
        "on some Sparks; unset: the driver's clocks")
    guard: ServingGuard = Field(
        default_factory=ServingGuard,
        description="the head's guard: answer canary, wedge detection, crash-loop hold")
    cotenant_memory_max: CotenantMemory = Field(
        default="auto",
        description="cap on memory for sessions (user.slice) and, apart, other services (system.slice) on every "
        "node, so the OOM killer takes a co-tenant before a TP rank: `auto` = half of what gpuMemoryUtilization "
        f"and the {HEADROOM_PERCENT}% headroom leave (5% each at 0.85; refused below {MIN_AUTO_COTENANT_PERCENT}%), "
        "a percentage for each, or `off`; refused when model + caps + headroom exceed 100%")

    @model_validator(mode="before")
    @classmethod
    def _recipe_values(cls, data: Any) -> Any:
        """Config keys override the recipe's values: an unset key takes the recipe's."""
        if not isinstance(data, dict):
            return data
        try:
            spec = recipes.recipe_named(data.get("recipe", recipes.DEFAULT_RECIPE))
        except recipes.RecipeError:
            return data  # _known_recipe says what is wrong
        values = {key.removeprefix("serving."): getattr(spec.vllm, to_snake(key.removeprefix("serving.")))
                  for key in RECIPE_KEYS}
        return {**{k: v for k, v in values.items() if k not in data and to_snake(k) not in data}, **data}

    @property
    def recipe_spec(self) -> recipes.Recipe:
        return recipes.recipe_named(self.recipe)

    @model_validator(mode="after")
    def _known_recipe_and_profile(self) -> "Serving":
        try:
            spec = self.recipe_spec
        except recipes.RecipeError as err:
            raise CrossFieldError("recipe", repr(self.recipe), str(err).removeprefix("expected ")) from None
        if self.profile not in spec.profiles:
            known = " or ".join(repr(p) for p in spec.profiles)
            raise CrossFieldError("profile", repr(self.profile), f"one of recipe {spec.name}'s profiles: {known}")
        loader = loaders.loader_problem(self.load_format, recipes.vllm_names()["load_formats"]["names"])
        if loader:
            raise CrossFieldError("loadFormat", repr(self.load_format), loader)
        names = recipes.vllm_names()["kv_cache_dtypes"]
        if self.kv_cache_dtype not in names["names"]:
            raise CrossFieldError("kvCacheDtype", repr(self.kv_cache_dtype),
                                   f"a KV-cache dtype vLLM registers ({', '.join(names['names'])}; "
                                   f"{names['source']})")
        return self

    @property
    def refused_flags(self) -> dict[str, str]:
        """What extraArgs may not set: what twinspark's keys own, every flag the recipe renders, and
        what vLLM's executor (serving.executor) refuses."""
        return vllm_flags.refused_flags(self.recipe_spec, self.executor)

    @property
    def memory_budget(self) -> MemoryBudget:
        """The node's budget (core/memory_budget.py): validated below, so it adds up."""
        return budget_of(self.gpu_memory_utilization, self.cotenant_memory_max, self.kv_tier_gib)

    @property
    def kv_tier_gib(self) -> int:
        return self.kv_tier.memory_gib if self.kv_tier else 0

    @property
    def cotenant_memory_percent(self) -> Optional[int]:
        return self.memory_budget.cotenant_percent

    @model_validator(mode="after")
    def _memory_budget_adds_up(self) -> "Serving":
        try:
            _ = self.memory_budget  # the property raises when the budget does not add up
        except BudgetError as err:
            raise CrossFieldError("cotenantMemoryMax", repr(self.cotenant_memory_max),
                                   f"a memory budget that adds up: {err}") from None
        return self

    @model_validator(mode="after")
    def _ray_version_is_locked(self) -> "Serving":
        locked = locked_version("ray")
        if locked != self.ray_version:
            raise CrossFieldError("rayVersion", self.ray_version,
                                   f"the Ray version {SERVING_IMAGE_LOCK.name} pins ({locked}): compile the lock for "
                                   "another one with the command in its header")
        return self

    @model_validator(mode="after")
    def _extra_args_are_flags(self) -> "Serving":
        problem = vllm_flags.extra_args_problem(self.extra_args, self.refused_flags)
        if problem:
            i, shown, expected = problem
            raise CrossFieldError(f"extraArgs[{i}]", shown, expected)
        return self


class ObservabilityImages(ConfigBlock):
    prometheus: PinnedImage = Field(default="prom/prometheus:v3.13.1", description="Prometheus, on the head")
    grafana: PinnedImage = Field(default="grafana/grafana:12.4.5", description="Grafana, on the head")
    alertmanager: PinnedImage = Field(
        default="prom/alertmanager:v0.28.1", description="Alertmanager, on the head, only with an alert receiver set")
    node_exporter: PinnedImage = Field(
        default="prom/node-exporter:v1.12.1",
        description="node exporter on every node: host, RoCE port counters and state, link state, MTU, speed")
    gpu_exporter: PinnedImage = Field(
        default="utkuozdemir/nvidia_gpu_exporter:1.14.0",
        description="nvidia-smi exporter on every node (works on GB10, where DCGM does not)")


class AlertEmail(ConfigBlock):
    to: EmailAddress = Field(description="where alert emails go")
    from_: EmailAddress = Field(alias="from", description="the sender address alert emails carry")
    smarthost: SmtpHost = Field(description="the SMTP server as HOST:PORT (587: STARTTLS)")
    username: Optional[NonEmpty] = Field(
        default=None, description="the SMTP login; its password is the secret `alertEmailPassword`")
    require_tls: bool = Field(default=True, description="refuse to send without STARTTLS (off only for a relay on your LAN)")


class Observability(ConfigBlock):
    enabled: bool = Field(
        default=True, description="`false`: deploy no metrics, dashboards or alerts (and remove them if deployed)")
    retention_days: Integer = Field(
        default=30, ge=1, le=3650, description="Prometheus keeps this many days of samples")
    retention_size: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*(KB|MB|GB|TB)$")] = Field(
        default="100GB", description="...and at most this much of the head's disk, whichever limit is hit first")
    scrape_interval_seconds: Integer = Field(
        default=15, ge=1, le=300, description="how often every target is scraped and every rule evaluated")
    grafana_port: Port = Field(
        default=3000, description="Grafana's port on every interface of the head; refused as serving.port is")
    images: ObservabilityImages = Field(
        default_factory=ObservabilityImages,
        description="the images, each pinned to an exact `major.minor.patch` tag or a `@sha256:` digest")
    gpu_temperature_alert_celsius: Number = Field(
        default=85.0, gt=0, le=120, description="TwinsparkGpuHot fires above this GPU temperature for 5 min")
    spec_decode_min_acceptance: Number = Field(
        default=0.2, ge=0, lt=1,
        description="TwinsparkSpecDecodeAcceptanceCollapse fires when accepted/drafted tokens stay below this")
    throughput_floor_tokens_per_second: Number = Field(
        default=10.0, gt=0,
        description="TwinsparkThroughputCollapse fires when requests run but output stays under this many tok/s "
        "(and prefill under 20 times it) for 10 min; healthy decode is 27-105 tok/s")
    alert_email: Optional[AlertEmail] = Field(
        default=None, description="alerts by email through your SMTP server (`to`, `from`, `smarthost`, `username`, "
        "`requireTls`); with `alertSlackWebhookUrl`, `alertNtfyUrl` and `alertWebhookUrl` the receivers Alertmanager "
        "sends to (see docs/observability.md)")


class PowerWatch(ConfigBlock):
    miss_seconds: Integer = Field(
        default=180, ge=15, le=3600,
        description="a node with a `power` plug that shows no sign of life (the SSH banner, its node exporter, on the "
        "head the guard's heartbeat) this long is power-cycled")
    off_seconds: Integer = Field(default=10, ge=1, le=300, description="the plug stays off this long in a power cycle")
    window_seconds: Integer = Field(
        default=3600, ge=60, le=86400,
        description="at most one power cycle of a node in this window: still silent after one, it is held for a person")


class PlatformConfig(ConfigBlock):
    acknowledge: list[Acknowledgeable] = Field(
        default_factory=list,
        description="what the platform gate lets pass: known-issue ids (known-issues.toml) and node differences "
        "`mismatch:driver`, `mismatch:kernel`; nodes on different images are never let pass")


# The serving keys that describe one lane's engine (what it serves and how); the rest of `serving`
# (image, port, guard, ...) is the stack's, one for every lane.
LANE_SERVING_KEYS = ("recipe", "profile", "maxModelLen", "gpuMemoryUtilization", "kvCacheDtype", "loadFormat", "kvTier",
                     "extraArgs", "tensorParallel", "pipelineParallel", "executor")


class LaneConfig(ConfigBlock):
    """One model served on a set of nodes (issue 41): its own engine, routed to by its served name."""

    name: LaneName = Field(description="the lane's short name (in its containers', sockets' and resources' names)")
    nodes: list[NodeName] = Field(
        min_length=1, description="the nodes whose GPUs serve it, by `name`: tensorParallel × pipelineParallel spans "
        "them; a node may serve several lanes when their memory shares fit it together")
    model: ModelConfig = Field(description="what it serves: the keys of `model`")
    # merged by StackConfig before validation: the stack's `serving`, this lane's keys over it
    serving: Serving = Field(
        description="its own values of the lane keys of `serving` (" + ", ".join(LANE_SERVING_KEYS) + "); an "
        "unset one is the stack's `serving` value, or the lane recipe's")
