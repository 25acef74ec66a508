"""The stack config contract (Pulumi.spark.yaml) as pydantic models, validated before any resource exists.

`load_stack_config` reads the `twinspark:*` keys, refuses keys it does not know, validates
field and cross-field rules and raises `pulumi.RunError` naming the key path as the user
wrote it, the bad value and, in words, what is expected; `load_secrets` does the same for the
secrets without ever showing them; `resolve_node_addresses` resolves the nodes' names (the
firewall's addresses). Nothing here touches a node.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import ipaddress
import math
import re
import socket
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pulumi
from pulumi.runtime import config as runtime_config
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake

import host_keys
import node_contract as contract
import platform_gate

from . import recipes
from .memory_budget import HEADROOM_PERCENT, MIN_AUTO_COTENANT_PERCENT, BudgetError, MemoryBudget
from .memory_budget import memory_budget as budget_of

NAMESPACE = "twinspark"
STRUCTURED_KEYS = ("ssh", "nodes", "fabric", "model", "serving")
OPTIONAL_STRUCTURED_KEYS = ("observability", "platform")  # omitted: the block's defaults

# vLLM flags extraArgs may not set, and why: a config key (or the node list) owns their value,
# or they would bypass this check.
FLAGS_NOT_IN_EXTRA_ARGS = {
    "--served-model-name": "set model.servedName",
    "--port": "vLLM listens on a Unix socket behind the API gateway; set serving.port for the API",
    "--host": "vLLM listens on a Unix socket only the API gateway opens, behind its key check",
    "--uds": "vLLM's socket is twinspark's: only the API gateway may open it",
    "--max-model-len": "set serving.maxModelLen",
    "--gpu-memory-utilization": "set serving.gpuMemoryUtilization",
    "--kv-cache-dtype": "set serving.kvCacheDtype",
    "--tensor-parallel-size": "set serving.tensorParallel (tensorParallel × pipelineParallel = the node count)",
    "--pipeline-parallel-size": "set serving.pipelineParallel (tensorParallel × pipelineParallel = the node count)",
    "--distributed-executor-backend": "multi-node TP runs on Ray",
    "--api-key": "set twinspark:apiKey, a secret; as a flag it would show in argv and state",
    "--config": "it reads more flags from a file, where twinspark cannot check them; list them in serving.extraArgs",
    # what would blind the monitoring and the guard, which read vLLM's /metrics
    "--disable-log-stats": "it removes every vllm:* metric, which the dashboards, the alerts and the serving "
    "guard's wedge check read",
    "--data-parallel-size": "data parallelism is not a supported setting: TP × PP spans every node, and more than one "
    "engine puts vLLM's metrics in multiprocess mode, where the restart alert's series is missing",
    "--api-server-count": "more than one API server puts vLLM's metrics in multiprocess mode, where the restart "
    "alert's series (process_start_time_seconds) is missing",
}
# A flag as vLLM's parser reads it: '_' for '-' (FlexibleArgumentParser), an optional
# '.key' into a JSON flag, an optional '=value'.
_FLAG = re.compile(r"--(?P<name>[a-z0-9][a-z0-9_-]*)(?P<key>\.[A-Za-z0-9_.-]+)?(?P<value>=.*)?", re.S)
# vLLM's single-dash aliases of refused flags (every other single-dash token is refused as no '--flag')
SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size"}
_SHORT_FLAG = re.compile(r"(?P<name>-[a-z]+)(?P<value>=.*)?", re.S)


def _flag_refusal(name: str, refused: dict[str, str]) -> Optional[str]:
    """Why extraArgs may not hold flag `name` (without '--'), or None; `refused`: flag -> reason.

    argparse (allow_abbrev, vLLM's default) takes any unambiguous prefix of a flag for the flag,
    so every prefix of a refused flag is refused too.
    """
    name = "--" + name.replace("_", "-")
    for flag, reason in refused.items():
        if flag.startswith(name):
            subject = flag if name == flag else f"vLLM takes {name} for {flag}"
            return f"a flag twinspark does not own ({subject}: {reason})"
    return None


def _short_flag_refusal(token: str) -> Optional[str]:
    short = _SHORT_FLAG.fullmatch(token)
    if not short or short["name"] not in SHORT_FLAGS:
        return None
    flag = SHORT_FLAGS[short["name"]]
    return f"a flag twinspark does not own ({short['name']} is {flag}: {FLAGS_NOT_IN_EXTRA_ARGS[flag]})"


def _text(pattern: str, allowed: str) -> Any:
    """A string matching `pattern`; a mismatch says `allowed` in words, never the pattern."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"expected {allowed}")
        return value

    return Annotated[str, AfterValidator(check)]


def _not_a_boolean(value: Any) -> Any:
    # pydantic reads true as 1; `pulumi config set --path` writes 0.9 as a string, so floats stay lax
    if isinstance(value, bool):
        raise ValueError("expected a number, not a YAML boolean")
    return value


def _finite(value: Any) -> Any:
    # YAML's .inf and .nan, and 'inf' as `config set --path` writes it, parse as floats; before
    # the field's bounds, which would call nan "not >= 0"
    _not_a_boolean(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value  # not a number at all: pydantic says so
    if not math.isfinite(number):
        raise ValueError("expected a finite number, not infinity or NaN (no floor or threshold could be met or "
                         "missed)")
    return value


# Every number field is one of these two (a test walks the schema for plain int and float).
Integer = Annotated[int, Strict(), BeforeValidator(_not_a_boolean)]  # YAML and `config set --path` write numbers
Number = Annotated[float, BeforeValidator(_finite)]
NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
NodeName = _text(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?",
                 "1 to 32 lowercase letters, digits or '-', starting and ending with a letter or digit")
# Linux refuses '.', '..', '/', ':', whitespace and 16 bytes or more (dev_valid_name); the
# name also goes into netplan, env files and command lines, so only plain characters.
IfaceName = _text(r"(?!\.\.?$)[A-Za-z0-9_.-]{1,15}",
                  "a Linux interface name as `ip link` shows it: 1 to 15 characters, each a letter, digit, "
                  "'_', '.' or '-', and not '.' or '..'")
UserName = _text(r"[a-z_][a-z0-9_-]{0,31}",
                 "a Linux user name: 1 to 32 lowercase letters, digits, '_' or '-', not starting with a digit "
                 "or '-'")
HcaName = _text(r"[A-Za-z0-9_]{1,64}", "an RDMA device name as `ibv_devinfo` shows it: 1 to 64 letters, digits or '_'")
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+", re.I)


def _one_spelling_of_an_address(value: str) -> str:
    # inet_aton, which ssh, nft and glibc's resolver try before DNS, reads 1 to 4 numbers in
    # decimal, octal (a leading 0) or hex as an IPv4 address: 192.168.1.010 is .8 to them and
    # refused by Python's ipaddress; one spelling, or one machine could pass as two nodes
    if all(_NUMERIC_LABEL.fullmatch(label) for label in value.split(".")):
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError("expected an IPv4 address as four decimal numbers from 0 to 255 without leading zeros, "
                             "like 192.168.1.10, or a DNS name") from None
    return value


HostName = Annotated[_text(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?",
                           "an IPv4 address or DNS name: letters, digits, '.' and '-', starting and ending with a "
                           "letter or digit"),
                     AfterValidator(_one_spelling_of_an_address)]
HostKey = _text(r"(ssh-|ecdsa-)\S+ \S+",
                "a host key as ssh-keyscan prints it after the host: its type and key, like "
                "'ssh-ed25519 AAAAC3Nza...'")
RepoId = _text(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*",
               "a Hugging Face repository OWNER/NAME, each part letters, digits, '_', '.' or '-' and starting "
               "with a letter or digit")
ServedName = _text(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}",
                   "1 to 128 letters, digits, '_', '.', ':' or '-', starting with a letter or digit")
ImageRef = _text(r"[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?",
                 "a docker image reference in lowercase letters, digits and '.', '_', '/', ':', '-', "
                 "optionally ending in @sha256:<64 hex> (a digest)")
KvCacheDtype = _text(r"[a-z0-9_]+", "a vLLM --kv-cache-dtype value: lowercase letters, digits and '_'")
CommitSha = _text(r"[0-9a-f]{40}", "a full commit sha: 40 lowercase hex digits (the hub's \"Files\" tab, "
                  "or `git ls-remote`), not a branch or tag name")
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub's own default (HF_ENDPOINT unset)
_HUB_ENDPOINT = re.compile(r"https?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[A-Za-z0-9._~%-]+)*")


def _hub_endpoint(value: str) -> str:
    # the client appends /api/... and /{repo}/resolve/... to it; it travels in a command line,
    # so no user:password@ (a token is HF_TOKEN, a secret on stdin)
    expected = ("an http(s) URL of the hub, a mirror or a proxy, like https://huggingface.co or "
                "https://hf-mirror.com: scheme, host, optional port and path, no user, query or fragment")
    if value.endswith("/") and _HUB_ENDPOINT.fullmatch(value.rstrip("/")):
        raise ValueError(f"expected the URL without the trailing '/': {value.rstrip('/')}")
    if not _HUB_ENDPOINT.fullmatch(value):
        raise ValueError(f"expected {expected}")
    return value


HubEndpoint = Annotated[str, AfterValidator(_hub_endpoint)]
RayVersion = _text(r"\d+\.\d+\.\d+", "a Ray version MAJOR.MINOR.PATCH, like 2.57.0")
# The Python packages the serving image adds, locked with their hashes (Dockerfile, locked-install.sh)
SERVING_IMAGE_LOCK = Path(__file__).resolve().parent.parent / "launch" / "serving-image" / "ray-requirements.lock"
AptPackage = _text(r"[a-z0-9][a-z0-9+.-]+=[A-Za-z0-9.+~:-]+",
                   "a Debian package at an exact version, NAME=VERSION like nginx=1.22.1-9+deb12u11 (`apt-cache "
                   "policy NAME` in the base image shows the versions)")


def locked_version(package: str, lock: Path = SERVING_IMAGE_LOCK) -> Optional[str]:
    """The version `lock` pins `package` at (`name==version`), or None."""
    found = re.search(rf"^{re.escape(package)}==(\S+)", lock.read_text(), re.M)
    return found.group(1) if found else None


# What docker builds and pulls for: a DGX Spark is linux/arm64; the simulator's machine is
# linux/amd64. Only these two: every image the stack pulls must exist for it.
PLATFORMS = ("linux/arm64", "linux/amd64")


def _platform(value: str) -> str:
    if value not in PLATFORMS:
        raise ValueError(f"expected a docker platform OS/ARCH, one of {', '.join(PLATFORMS)} (a DGX Spark is "
                         "linux/arm64)")
    return value


DockerPlatform = Annotated[str, AfterValidator(_platform)]

# Rails are point-to-point cables in private address space. A shorter prefix than /16 would
# route addresses beyond the cable (at /1, half the internet) over it.
RAIL_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
RAIL_PREFIXES = (16, 31)


def _address_kind(ip: ipaddress.IPv4Address) -> str:
    for is_kind, kind in ((ip.is_loopback, "loopback"), (ip.is_multicast, "multicast"),
                          (ip.is_link_local, "link-local"), (ip.is_reserved, "reserved"),
                          (ip in ipaddress.IPv4Network("0.0.0.0/8"), "'this network'")):
        if is_kind:
            return f"a {kind} address"
    return "a public or special-purpose address"


def _rail_address(value: str) -> str:
    try:
        iface = ipaddress.IPv4Interface(value)
    except ValueError:
        raise ValueError("expected an IPv4 address with prefix length, like 10.0.0.1/24") from None
    if "/" not in value:
        raise ValueError("expected an IPv4 address with a prefix length, like 10.0.0.1/24")
    ip, net = iface.ip, iface.network
    if not any(ip in r for r in RAIL_RANGES):
        ranges = ", ".join(str(r) for r in RAIL_RANGES)
        raise ValueError(f"expected a private address (in {ranges}), not {_address_kind(ip)}")
    low, high = RAIL_PREFIXES
    if not low <= net.prefixlen <= high:
        raise ValueError(f"expected a prefix length from /{low} to /{high}: a rail is one cable, and a shorter "
                         "prefix routes addresses beyond it over the cable")
    if net.prefixlen < 31:  # a /31 has no network or broadcast address (RFC 3021)
        for special, name in ((net.network_address, "network"), (net.broadcast_address, "broadcast")):
            if ip == special:
                raise ValueError(f"expected a host address, not the {name} address of {net}")
    return str(iface)


RailAddress = Annotated[str, AfterValidator(_rail_address)]

# model.dir is bind-mounted into the containers and each worker's copy is made to mirror the
# head's (rsync --delete): a directory holding anything else loses it on the workers.
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
               "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr",
               "/var", "/var/lib", "/var/log", "/var/tmp")
NEVER_INSIDE = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run",
                "/sbin", "/snap", "/sys", "/usr", contract.BUNDLE_DIR, contract.LOG_DIR,
                contract.APPLIED_STATE_DIR.rsplit("/", 1)[0])
_PATH_CHARACTERS = re.compile(r"[A-Za-z0-9._/-]*")


def _model_dir(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError("expected an absolute path, like /home/nvidia/models/NAME")
    if not _PATH_CHARACTERS.fullmatch(value):
        raise ValueError("expected a path of letters, digits, '.', '_', '-' and '/' only (no spaces, quotes or ':'; "
                         "docker's bind mount and rsync read ':' as a separator)")
    parts = value.split("/")[1:]
    if value != "/" and "" in parts:
        raise ValueError("expected no empty component ('//' or a trailing '/')")
    if any(part in (".", "..") for part in parts):
        raise ValueError("expected a path without '.' or '..' components")
    if any(part.startswith(".") for part in parts):
        raise ValueError("expected no hidden component (like ~/.ssh): they hold what a mirror would delete")
    tree = next((t for t in NEVER_INSIDE if value == t or value.startswith(t + "/")), None)
    if value in SYSTEM_DIRS:
        what = "a system directory"
    elif tree:
        what = f"a directory inside {tree}"
    elif len(parts) == 2 and parts[0] == "home":
        what = "a home directory"
    else:
        return value
    raise ValueError(f"expected a directory that holds only the model, not {what} (every worker's copy "
                     "mirrors the head's: whatever else it holds is deleted)")


ModelDir = Annotated[str, AfterValidator(_model_dir)]

# What else listens on the nodes (whether or not a firewall hole would reach it): no
# configured port may be any of it (Port). The monitoring's ports count while observability
# is on, and the configured ports must differ (both: StackConfig._configured_ports_apart).
PORTS_IN_USE = (
    ((contract.SSH_PORT,) * 2, "SSH's"),
    ((contract.RAY_PORT,) * 2, "the Ray GCS's"),
    ((contract.RAY_DASHBOARD_PORT,) * 2, "the Ray dashboard's"),
    ((contract.RAY_CLIENT_PORT,) * 2, "the Ray client server's"),
    ((contract.METRICS_LOOPBACK_PORT,) * 2, "the API gateway's, for vLLM's /metrics on loopback"),
    (contract.RAY_WORKER_PORTS, "one of Ray's worker ports"),
    ((contract.NCCL_RENDEZVOUS_PORT,) * 2, "NcclCheck's NCCL rendezvous"),
    ((contract.WEIGHTS_SYNC_PORT,) * 2, "the weight copy's rsync daemons' (on the rail addresses)"),
    (contract.EPHEMERAL_PORTS, "in the kernel's ephemeral range, where Ray's raylet and agents, NCCL and vLLM pick "
     "random ports"),
)


def _free_port(port: int) -> int:
    for (low, high), owner in PORTS_IN_USE:
        if low <= port <= high:
            taken = [str(lo) if lo == hi else f"{lo}–{hi}" for (lo, hi), _ in sorted(PORTS_IN_USE)]
            raise ValueError(f"expected a port nothing else on the nodes uses (not {', '.join(taken[:-1])} or "
                             f"{taken[-1]}): {port} is {owner}")
    return port


# Every port field of the config is a Port: one check for all, and StackConfig keeps them apart.
Port = Annotated[Integer, Field(ge=1, le=65535), AfterValidator(_free_port)]


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
    user: UserName = Field(description="login user on every node (passwordless sudo)")
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
    hca: HcaName = Field(description="its RoCE device (`ibv_devinfo`), for NCCL_IB_HCA")
    address: RailAddress = Field(
        description="static private address with prefix (/16 to /31); rail N of every node shares one subnet, "
        "and no two rails overlap")

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Interface(self.address).network


class Node(Contract):
    name: NodeName = Field(description="short name used in resource names (`{node}-{capability}-{step}`)")
    role: Literal["head", "worker"] = Field(description="exactly one `head` (Ray head, API); the rest `worker`")
    host: HostName = Field(description="LAN address or name for SSH and the API")
    host_key: Optional[Annotated[HostKey, AfterValidator(_host_key)]] = Field(
        default=None, description="the node's SSH host key, pinned: `python -m ops pin-host-keys` reads it "
        "(`ssh-ed25519 AAAA...`, as `ssh-keyscan` prints it without the host)")
    rails: list[Rail] = Field(min_length=1, description="the QSFP rails; the first carries Ray and the weight copy")

    @property
    def ray_ip(self) -> str:
        """Ray, vLLM's TCP store and the weight sync use the first rail: the cable, not the LAN."""
        return self.rails[0].ip


class Fabric(Contract):
    mtu: Integer = Field(ge=1280, le=9216, description="MTU of every rail; FabricCheck and `ops status` expect it")
    link_speed_mbps: Integer = Field(gt=0, description="link speed every rail must report")
    bootstrap_iface: IfaceName = Field(description="NCCL/GLOO bootstrap interface (NCCL_SOCKET_IFNAME)")
    # The recipe measures ~20 GB/s over both rails, ~2 GB/s when NCCL falls back to TCP.
    min_bus_bandwidth_gbps: Number = Field(
        default=10.0, ge=0, alias="minBusBandwidthGBps",
        description="NcclCheck's floor for all_reduce bus bandwidth in GB/s; `0` skips NcclCheck "
        "(and must, on a single node)")


class ModelConfig(Contract):
    repo: RepoId = Field(description="Hugging Face repository to serve")
    dir: ModelDir = Field(
        description="where the weights live on every node: a directory of its own (each worker's copy mirrors "
        "the head's), not a system or home directory")
    served_name: ServedName = Field(description="model name clients ask for (`--served-model-name`)")
    revision: Optional[CommitSha] = Field(
        default=None,
        description="the repository's commit to serve (40 hex). Unset: the commit the hub serves at the first "
        "`pulumi up` is recorded (output `modelRevision`) and kept until `model.repo` or this key changes")
    hub_endpoint: HubEndpoint = Field(
        default=DEFAULT_HUB_ENDPOINT,
        description="the Hugging Face Hub the head downloads from (HF_ENDPOINT of the download): a mirror or a "
        "proxy that serves the same repositories; no trailing '/'. A change downloads nothing already verified")

    @property
    def container_dir(self) -> str:
        return "/models/" + self.dir.rstrip("/").rsplit("/", 1)[-1]


class ServingGuard(Contract):
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
        "until a reboot or `python -m ops clear-hold`")
    restart_window_minutes: Integer = Field(default=30, ge=1, le=1440, description="the window restartLimit counts over")


_COTENANT_MEMORY = re.compile(r"^(auto|off|[1-9][0-9]?%)$")


def _cotenant_memory(value: str) -> str:
    if not _COTENANT_MEMORY.match(value):
        raise ValueError("expected 'auto', 'off' or a percentage of the node's memory such as '12%'")
    return value


class Serving(Contract):
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
    max_model_len: Integer = Field(
        default=None, gt=0, description="`--max-model-len`; also the clients' context window and fences")
    gpu_memory_utilization: Number = Field(
        default=None, gt=0.0, le=0.95, description="`--gpu-memory-utilization` (0 < x ≤ 0.95)")
    kv_cache_dtype: KvCacheDtype = Field(
        default=None,
        description="a KV-cache dtype vLLM registers; DeepSeek: keep the native fp8 (gotcha 14), any other value "
        "tightens the compaction fence to 110k")
    extra_args: list[str] = Field(
        default_factory=list,
        description="more vLLM flags, appended last; refused: a flag a config key, the recipe or the profile sets, "
        "any abbreviation of one (vLLM's parser takes them), and `--config`")
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
    cotenant_memory_max: Annotated[str, AfterValidator(_cotenant_memory)] = Field(
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
            raise _CrossFieldError("recipe", repr(self.recipe), str(err).removeprefix("expected ")) from None
        if self.profile not in spec.profiles:
            known = " or ".join(repr(p) for p in spec.profiles)
            raise _CrossFieldError("profile", repr(self.profile), f"one of recipe {spec.name}'s profiles: {known}")
        names = recipes.vllm_names()["kv_cache_dtypes"]
        if self.kv_cache_dtype not in names["names"]:
            raise _CrossFieldError("kvCacheDtype", repr(self.kv_cache_dtype),
                                   f"a KV-cache dtype vLLM registers ({', '.join(names['names'])}; "
                                   f"{names['source']})")
        return self

    @property
    def refused_flags(self) -> dict[str, str]:
        """What extraArgs may not set: what twinspark's keys own, and every flag the recipe renders."""
        spec, refused = self.recipe_spec, dict(FLAGS_NOT_IN_EXTRA_ARGS)
        profiles = " or ".join(repr(p) for p in spec.profiles)
        for flag in recipes.rendered_flags(spec):
            refused.setdefault(flag, f"set by serving.profile of recipe {spec.name}, which is not meant to be "
                               f"overridden; choose {profiles}" if flag in recipes.PROFILE_FLAGS else
                               f"set by serving.recipe {spec.name} (recipes/): choose or add a recipe instead")
        return refused

    @property
    def memory_budget(self) -> MemoryBudget:
        """The node's budget (components/memory_budget.py): validated below, so it adds up."""
        return budget_of(self.gpu_memory_utilization, self.cotenant_memory_max)

    @property
    def cotenant_memory_percent(self) -> Optional[int]:
        return self.memory_budget.cotenant_percent

    @model_validator(mode="after")
    def _memory_budget_adds_up(self) -> "Serving":
        try:
            self.memory_budget
        except BudgetError as err:
            raise _CrossFieldError("cotenantMemoryMax", repr(self.cotenant_memory_max),
                                   f"a memory budget that adds up: {err}") from None
        return self

    @model_validator(mode="after")
    def _ray_version_is_locked(self) -> "Serving":
        locked = locked_version("ray")
        if locked != self.ray_version:
            raise _CrossFieldError("rayVersion", self.ray_version,
                                   f"the Ray version {SERVING_IMAGE_LOCK.name} pins ({locked}): compile the lock for "
                                   "another one with the command in its header")
        return self

    @model_validator(mode="after")
    def _extra_args_are_flags(self) -> "Serving":
        expect_value, refused = False, self.refused_flags
        for i, token in enumerate(self.extra_args):
            flag = _FLAG.fullmatch(token)
            if flag:
                refusal = _flag_refusal(flag["name"], refused)
                if refusal:  # the value is left out: it may be the very secret that belongs elsewhere
                    shown = token if flag["value"] is None else token.split("=", 1)[0] + "=(value not shown)"
                    raise _CrossFieldError(f"extraArgs[{i}]", shown, refusal)
                expect_value = flag["value"] is None
            elif expect_value and not token.startswith("-"):
                expect_value = False
            elif refusal := _short_flag_refusal(token):
                raise _CrossFieldError(f"extraArgs[{i}]", token.split("=", 1)[0], refusal)
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


def _acknowledgeable(key: str) -> str:
    if key in [platform_gate.MISMATCH_PREFIX + fact for fact in platform_gate.NEVER_ACKNOWLEDGED]:
        raise ValueError("nothing acknowledges nodes on different images (a tensor-parallel group on two builds "
                         "hangs or computes garbage): rebuild so every node runs the same one")
    known = platform_gate.acknowledgeable()
    if key not in known:
        raise ValueError(f"expected a known-issue id from known-issues.toml or a node difference: one of "
                         f"{', '.join(known)}")
    return key


class PlatformConfig(Contract):
    acknowledge: list[Annotated[str, AfterValidator(_acknowledgeable)]] = Field(
        default_factory=list,
        description="what the platform gate lets pass: known-issue ids (known-issues.toml) and node differences "
        "`mismatch:driver`, `mismatch:kernel`; nodes on different images are never let pass")


class StackConfig(Contract):
    ssh: SshConfig
    nodes: list[Node] = Field(min_length=1)
    fabric: Fabric
    model: ModelConfig
    serving: Serving
    observability: Observability = Field(default_factory=Observability)
    platform: PlatformConfig = Field(default_factory=PlatformConfig)

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def world_size(self) -> int:
        return len(self.nodes)  # one GB10 GPU per Spark: one rank each

    @property
    def pipeline_parallel_size(self) -> int:
        return self.serving.pipeline_parallel

    @property
    def tensor_parallel_size(self) -> int:
        """serving.tensorParallel, or unset the node count ÷ PP (the node count without PP)."""
        return self.serving.tensor_parallel or self.world_size // self.pipeline_parallel_size

    @property
    def parallelism_in_words(self) -> str:
        tp, pp, n = self.tensor_parallel_size, self.pipeline_parallel_size, self.world_size
        if pp == 1:
            return f"tensor parallel over {n} DGX Sparks"
        return f"{'' if tp == 1 else f'tensor parallel {tp} × '}pipeline parallel {pp} over {n} DGX Sparks"

    @property
    def head_public_ports_by_key(self) -> dict[str, int]:
        """Every configured port in use, by its key: what the head serves to the LAN."""
        ports = {"serving.port": self.serving.port}
        if self.observability.enabled:
            ports["observability.grafanaPort"] = self.observability.grafana_port
        return ports

    @property
    def head_public_ports(self) -> tuple[int, ...]:
        """What the head serves to the LAN (the host firewall opens these and SSH, nothing else)."""
        return tuple(self.head_public_ports_by_key.values())

    def peers_on_rail(self, node: Node, rail_index: int) -> list[str]:
        return [n.rails[rail_index].ip for n in self.nodes if n.name != node.name]

    @model_validator(mode="after")
    def _cross_field_rules(self) -> "StackConfig":
        heads = [i for i, n in enumerate(self.nodes) if n.role == "head"]
        if len(heads) != 1:
            raise _CrossFieldError(
                "nodes", f"{len(heads)} nodes have role head", "exactly one node with role: head"
            )
        _require_distinct(self.nodes, "nodes", "name")
        self._one_node_per_machine()
        rail_counts = {len(n.rails) for n in self.nodes}
        if len(rail_counts) != 1:
            raise _CrossFieldError(
                "nodes", f"rail counts {sorted(rail_counts)}", "the same number of rails on every node"
            )
        for i, node in enumerate(self.nodes):
            for r, rail in enumerate(node.rails):
                if rail.iface == self.fabric.bootstrap_iface:
                    raise _CrossFieldError(
                        f"nodes[{i}].rails[{r}].iface", rail.iface,
                        "a QSFP interface, not fabric.bootstrapIface (the LAN port SSH uses: the rails' netplan "
                        "would switch its DHCP off)")
            _require_distinct(node.rails, f"nodes[{i}].rails", "iface")
            _require_distinct(node.rails, f"nodes[{i}].rails", "hca")
        self._rails_are_separate_cables()
        if len(self.nodes) == 1 and self.fabric.min_bus_bandwidth_gbps > 0:
            raise _CrossFieldError(
                "fabric.minBusBandwidthGBps", self.fabric.min_bus_bandwidth_gbps,
                "0 on a single-node stack (NcclCheck measures the cable between nodes; alone, it can never pass)")
        self._configured_ports_apart()
        self._nodes_the_recipe_supports()
        self._parallelism_spans_the_nodes()
        self._layout_splits_the_model()
        return self

    def _parallelism_spans_the_nodes(self) -> None:
        """One rank per node: TP × PP = the node count, or a rank has no GPU (or a GPU no rank)."""
        n, pp, tp_set = self.world_size, self.pipeline_parallel_size, self.serving.tensor_parallel
        rules = shape_rules()
        layouts = " or ".join(rules.layout_option(t, p) for t, p in rules.layouts_of(n))
        if tp_set is None and n % pp:
            raise _CrossFieldError("serving.pipelineParallel", pp,
                                   f"a pipelineParallel that divides the node count {n} (tensorParallel, unset, is "
                                   f"the node count ÷ pipelineParallel): with {n} nodes set {layouts}")
        if self.tensor_parallel_size * pp != n:
            key = "serving.tensorParallel" if "pipeline_parallel" not in self.serving.model_fields_set \
                else "serving.pipelineParallel"
            raise _CrossFieldError(key, f"tensorParallel {tp_set} × pipelineParallel {pp} = {tp_set * pp} ranks on "
                                   f"{n} nodes",
                                   f"tensorParallel × pipelineParallel = {n}, the node count (one rank on each "
                                   f"node's GPU): with {n} nodes set {layouts}")

    def _layout_splits_the_model(self) -> None:
        """Where the recipe records its model's shape, a TP × PP it cannot split stops here,
        before any resource, with the layouts that work (the rules: launch/weights.py's)."""
        recipe = self.serving.recipe_spec
        if recipe.shape is None or self.model.repo != recipe.repo:  # another model: judged after the pin
            return
        shape, tp, pp = recipe.shape.as_config_json(), self.tensor_parallel_size, self.pipeline_parallel_size
        rules = shape_rules()
        fails = [line.removeprefix("FAIL ") for line in rules.head_lines(shape, tp, pp) if line.startswith("FAIL")]
        if not fails:
            return
        works = [rules.layout_option(t, p) for t, p in rules.workable_layouts(shape, self.world_size)]
        key = "serving.pipelineParallel" if all(f.startswith("hidden layers") for f in fails) else \
            "serving.tensorParallel"
        advice = (f"with {self.world_size} nodes set {' or '.join(works)}" if works else
                  f"no TP × PP of {self.world_size} nodes splits it: another node count")
        figures = (f"{recipe.shape.attention_heads} attention heads, {recipe.shape.kv_heads or 'one per head'} KV "
                   f"heads{', latent' if recipe.shape.kv_lora_rank else ''}, {recipe.shape.hidden_layers} layers")
        raise _CrossFieldError(key, f"TP={tp} × PP={pp} on {self.world_size} nodes: " + "; ".join(fails),
                               f"a layout model {recipe.repo} splits over (recipe {recipe.name}'s shape: {figures}): "
                               f"{advice}")

    @property
    def parallelism_warning(self) -> Optional[str]:
        """PP on a recipe proven without it: allowed (it is what 3 nodes may need), said out loud."""
        recipe = self.serving.recipe_spec
        if self.pipeline_parallel_size == 1 or "pp" in recipe.parallelism:
            return None
        return (f"serving.pipelineParallel {self.pipeline_parallel_size}: recipe {recipe.name} was proven with "
                f"{', '.join(recipe.parallelism)} only, not pipeline parallelism: its flags (speculative decoding "
                "above all) and its baseline are unproven at this layout; vLLM refuses at load what it cannot run")

    def _nodes_the_recipe_supports(self) -> None:
        """As many nodes as the recipe was proven on: TP × PP spans them all (world_size)."""
        recipe = self.serving.recipe_spec
        if not recipe.nodes.min <= len(self.nodes) <= recipe.nodes.max:
            span = (f"{recipe.nodes.min}" if recipe.nodes.min == recipe.nodes.max
                    else f"{recipe.nodes.min} to {recipe.nodes.max}")
            raise _CrossFieldError("nodes", f"{len(self.nodes)} nodes",
                                   f"{span} nodes, what serving.recipe {recipe.name} supports (its nodes in recipes/), "
                                   "or a recipe made for this many")

    @property
    def recipe_repo_warning(self) -> Optional[str]:
        """model.repo is not the repository the chosen recipe was proven on: said, not refused (a
        fine-tune or a mirror of the same model is served with the recipe's flags on purpose)."""
        recipe = self.serving.recipe_spec
        if self.model.repo == recipe.repo:
            return None
        return (f"model.repo {self.model.repo} is not {recipe.repo}, the repository of serving.recipe {recipe.name}: "
                f"the recipe's flags, environment and parsers are applied to {self.model.repo} as they are; choose "
                "the recipe made for it if there is one (see Models in the README)")

    def _one_node_per_machine(self) -> None:
        """DNS names ignore case (an address has one spelling: HostName), so SPARK-A.local is spark-a.local."""
        seen: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            j = seen.setdefault(node.host.lower(), i)
            if j != i:
                other = self.nodes[j].host
                why = "" if other == node.host else " (DNS names ignore case: both name one machine)"
                raise _CrossFieldError(f"nodes[{i}].host", node.host,
                                       f"a machine other than nodes[{j}].host {other!r}{why}")

    def _configured_ports_apart(self) -> None:
        """Each configured port is checked against what always listens by its field (Port); here
        against the monitoring's, while it is on, and against each other (the key blamed is one
        the user set, where only one of them is)."""
        ports = self.head_public_ports_by_key
        monitoring = contract.OBSERVABILITY_PORTS if self.observability.enabled else {}
        keys = list(ports)
        for i, key in enumerate(keys):
            owner = next((name for name, port in monitoring.items() if port == ports[key]), None)
            if owner:
                raise _CrossFieldError(key, ports[key], f"a port other than {owner}'s, while observability is on")
            for other in keys[:i]:
                if ports[key] == ports[other]:
                    if self._set_by_user(other) and not self._set_by_user(key):
                        key, other = other, key
                    raise _CrossFieldError(key, ports[key], f"a port other than {other}'s: both listen on the head")

    def _set_by_user(self, key: str) -> bool:
        block, field = key.split(".")
        return to_snake(field) in getattr(self, block).model_fields_set

    def _rails_are_separate_cables(self) -> None:
        """Rail N of every node in one subnet of its own, apart from every other rail and the LAN."""
        first = self.nodes[0].rails
        for r, rail in enumerate(first):  # node 0's first: every other node must match it
            for q in range(r):
                if rail.network.overlaps(first[q].network):
                    raise _CrossFieldError(
                        f"nodes[0].rails[{r}].address", rail.address,
                        f"a subnet that does not overlap nodes[0].rails[{q}]'s {first[q].network} (each rail is "
                        "its own cable)")
        hosts = {}
        for j, node in enumerate(self.nodes):
            try:
                hosts[j] = ipaddress.IPv4Address(node.host)
            except ValueError:
                continue  # a DNS name: its address is not known here
        seen: dict[str, str] = {}
        for i, node in enumerate(self.nodes):
            for r, rail in enumerate(node.rails):
                path = f"nodes[{i}].rails[{r}].address"
                if rail.ip in seen:
                    raise _CrossFieldError(path, rail.address, f"a rail address not already used by {seen[rail.ip]}")
                seen[rail.ip] = path
                if rail.network != first[r].network:
                    raise _CrossFieldError(
                        path,
                        rail.address,
                        f"an address in {first[r].network} (rail {r} of every node shares one subnet, "
                        f"as nodes[0].rails[{r}] does)",
                    )
                for j, host in hosts.items():
                    if host in rail.network:
                        raise _CrossFieldError(
                            path, rail.address,
                            f"a subnet apart from the LAN, without nodes[{j}].host {host} (SSH and the API would "
                            "be routed over the cable)")


@functools.cache
def shape_rules():
    """launch/weights.py, whose shape rules the node runs (stdlib only): one copy of vLLM's rules."""
    path = Path(__file__).resolve().parent.parent / "launch" / "weights.py"
    spec = importlib.util.spec_from_file_location("twinspark_weights_program", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _CrossFieldError(ValueError):
    """A rule failed at `path` (relative to the validated model); pydantic carries it in ctx."""

    def __init__(self, path: str, value: Any, expected: str):
        super().__init__(f"{value} — expected {expected}")
        self.path, self.value, self.expected = path, value, expected


def _require_distinct(items: list[BaseModel], prefix: str, field: str) -> None:
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        value = getattr(item, field)
        if value in seen:
            raise _CrossFieldError(
                f"{prefix}[{i}].{field}", value, f"a value different from {prefix}[{seen[value]}].{field}"
            )
        seen[value] = i


def _ipv4_addresses(host: str) -> list[str]:
    return [info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)]


def resolve_node_addresses(nodes: list[Node], resolve=_ipv4_addresses) -> dict[str, tuple[str, ...]]:
    """Every node's IPv4 addresses, by name: its `host`, a name resolved here and now.

    The host firewall admits the other nodes by address and loads at boot, before the network,
    where no name resolves: a table holding a name would not load at all (no firewall). So the
    firewall gets addresses, resolved when `pulumi up` runs. Names stay allowed: Spark owners
    reach their nodes as spark-1.local, and `pulumi up` must resolve them for SSH anyway. A
    name that does not resolve here, resolves to loopback, or shares an address with another
    node stops the program before any resource; a node whose address changes needs a
    `pulumi up` (until then the firewall drops its LAN traffic, it does not open).
    """
    problems, found, owner = [], {}, {}
    for i, node in enumerate(nodes):
        key = f"{NAMESPACE}:nodes[{i}].host"
        loopback = []
        try:
            addresses = [str(ipaddress.IPv4Address(node.host))]  # an address (HostName: one spelling)
        except ValueError:
            try:
                addresses = sorted(set(resolve(node.host)), key=ipaddress.IPv4Address)
            except OSError as err:  # socket.gaierror
                problems.append(f"{key}: {node.host!r} does not resolve on this machine ({err.strerror or err}) — "
                                "expected a name this machine resolves to the node's LAN address, or the address "
                                "itself (the host firewall admits the nodes by the addresses their names have when "
                                "`pulumi up` runs)")
                continue
            loopback = [a for a in addresses if ipaddress.IPv4Address(a).is_loopback]
        shared = next((a for a in addresses if a in owner), None)
        if loopback or not addresses:
            problems.append(f"{key}: {node.host!r} resolves to {', '.join(loopback) or 'no IPv4 address'} on this "
                            "machine — expected a name that resolves to the node's LAN address (this machine's "
                            "/etc/hosts may map its own name to loopback), or the address itself")
        elif shared:
            j = owner[shared]
            problems.append(f"{key}: {node.host!r} resolves to {shared}, as nodes[{j}].host {nodes[j].host!r} does — "
                            "expected a machine of its own for each node")
        owner.update((a, i) for a in addresses)
        found[node.name] = tuple(addresses)
    if problems:
        raise _config_error(problems)
    return found


# A secret lands in a shell's environment, a curl config line, an env file and an HTTP
# header. RFC 6750's bearer-token characters are plain in all of them, so a valid value
# cannot end a line, close a quote or expand.
SECRET_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~+/=")
SECRET_CHARACTERS_IN_WORDS = "a letter, digit or one of - . _ ~ + / ="
# A URL's characters (RFC 3986) but quotes and backslashes: it only lands in a YAML file.
URL_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&()*+,;=%")
URL_CHARACTERS_IN_WORDS = "a letter, digit or one of - . _ ~ : / ? # [ ] @ ! $ & ( ) * + , ; = %"


@dataclass(frozen=True)
class SecretKey:
    meaning: str
    min_length: int
    max_length: int = 256
    characters: frozenset = SECRET_CHARACTERS
    characters_in_words: str = SECRET_CHARACTERS_IN_WORDS
    shape: Optional[str] = None  # a regular expression the whole value must match
    shape_in_words: str = ""
SECRET_KEYS = {
    # shorter keys can be guessed; the generated one has 48 characters
    "apiKey": SecretKey(
        "the API key clients send; generated once when unset (`pulumi config set --secret apiKey ...`)",
        min_length=16),
    "hfToken": SecretKey("Hugging Face token, for gated models", min_length=8),
    "grafanaAdminPassword": SecretKey("Grafana's `admin` password; generated once when unset", min_length=12),
    "alertWebhookUrl": SecretKey(
        "where alerts are sent (an Alertmanager webhook receiver: JSON POST); unset: they show in Grafana and "
        "Prometheus only", min_length=10, characters=URL_CHARACTERS, characters_in_words=URL_CHARACTERS_IN_WORDS,
        shape=r"https?://[^/]+(/.*)?", shape_in_words="an http(s) URL of a receiver for Alertmanager's webhook POSTs"),
}
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", " ": "a space"}


def secret_problem(key: str, value: str) -> Optional[str]:
    """Why `value` cannot be the secret `key`, in words that never show the value; None if it can."""
    spec = SECRET_KEYS[key]
    expected = f"expected {spec.min_length} to {spec.max_length} characters, each {spec.characters_in_words}"
    if not value:
        return f"the value (a secret, not shown) is empty — {expected}"
    outside = sorted({c for c in value if c not in spec.characters})
    if outside:
        names = ", ".join(_CHARACTER_NAMES.get(c, repr(c)) for c in outside)
        return f"the value (a secret, not shown) holds {names} — {expected}"
    if not spec.min_length <= len(value) <= spec.max_length:
        return f"the value (a secret, not shown) has {len(value)} characters — {expected}"
    if spec.shape and not re.fullmatch(spec.shape, value):
        return f"the value (a secret, not shown) is not {spec.shape_in_words.split(' of ')[0]} — expected {spec.shape_in_words}"
    return None


def load_secrets(config: Optional[pulumi.Config] = None) -> dict[str, Optional[pulumi.Output[str]]]:
    """Every secret key, validated and wrapped as a secret at once; None where unset."""
    values = _checked_secrets(config or pulumi.Config(NAMESPACE))
    return {key: None if value is None else pulumi.Output.secret(value) for key, value in values.items()}


def _checked_secrets(config: pulumi.Config) -> dict[str, Optional[str]]:
    """The plain values, for load_secrets only: refused unless valid, warned about if stored plain."""
    values, problems = {}, []
    for key in SECRET_KEYS:
        values[key] = value = config.get(key)
        if value is not None and (problem := secret_problem(key, value)):
            problems.append(f"{NAMESPACE}:{key}: {problem}")
        elif value is not None and not runtime_config.is_config_secret(config.full_key(key)):
            pulumi.log.warn(f"{NAMESPACE}:{key} is stored in plain text in the stack file: "
                            f"`pulumi config set --secret {key} ...` encrypts it")
    if problems:
        raise _config_error(problems)
    return values



# Keys whose unset value is the chosen recipe's (Serving._recipe_values)
RECIPE_KEYS = ("serving.maxModelLen", "serving.gpuMemoryUtilization", "serving.kvCacheDtype")
# Keys whose unset value follows from others (StackConfig)
DERIVED_DEFAULTS = {"serving.tensorParallel": "node count ÷ `pipelineParallel`"}


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
                if key in RECIPE_KEYS:
                    default = "the recipe's"
                elif key in DERIVED_DEFAULTS:
                    default = DERIVED_DEFAULTS[key]
                else:
                    default = "none" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"
            rows.append(f"| `{key}` | {default} | {field.description} |")

    for block in STRUCTURED_KEYS + OPTIONAL_STRUCTURED_KEYS:
        model = StackConfig.model_fields[block].annotation
        inner = getattr(model, "__args__", (model,))[0]
        walk(inner, f"{block}{'[]' if block == 'nodes' else ''}.")
    for key, spec in SECRET_KEYS.items():
        shown = "".join(sorted(spec.characters - set(string.ascii_letters + string.digits)))
        rules = f"{spec.min_length}–{spec.max_length} letters, digits or `{shown}`"
        rows.append(f"| `{key}` (secret) | none | {spec.meaning}; {rules} |")
    return "\n".join(rows) + "\n"


def format_key_path(loc: tuple[Any, ...]) -> str:
    """('nodes', 1, 'rails', 0, 'address') -> 'twinspark:nodes[1].rails[0].address'."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{NAMESPACE}:{path}"


def _config_error(problems: list[str]) -> pulumi.RunError:
    return pulumi.RunError("invalid stack config:\n  " + "\n  ".join(problems))


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
        raise _config_error(problems)
    return cfg


def _split_path(path: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]


# The ssh block may hold the key's passphrase: an error there shows the value only where it is
# one of these plain fields (a misspelt passphrase key is an unknown key whose value is secret).
SSH_PLAIN_FIELDS = ("user", "privateKeyPath", "trustOnFirstUse")


def _may_hold_secret(loc: tuple[Any, ...]) -> bool:
    return bool(loc) and loc[0] == "ssh" and (len(loc) != 2 or loc[1] not in SSH_PLAIN_FIELDS)


def _url_with_credentials(loc: tuple[Any, ...], value: Any) -> bool:
    return loc == ("model", "hubEndpoint") and isinstance(value, str) and "@" in value


def _describe_validation_error(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        ctx_err = (e.get("ctx") or {}).get("error")
        loc = tuple(p for p in e["loc"] if p not in ("function-after", "function-before"))
        if isinstance(ctx_err, _CrossFieldError):
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
    if problems or invalid:
        raise _config_error(problems + invalid)
    return cfg
