"""The value types of the stack config: one annotated type per kind of value, each refusing in words.

Every field of the blocks (blocks.py) is one of these or a plain bool, Literal or list of them:
a mismatch says what is expected, never a regular expression. Nothing here touches a node or Pulumi.
"""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BeforeValidator, Field, Strict, StringConstraints

from core import host_keys
from core import contract
from core import platform_gate


def _matches(pattern: str, allowed: str) -> AfterValidator:
    """The check of a string against `pattern`; a mismatch says `allowed` in words, never the pattern."""
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"expected {allowed}")
        return value

    return AfterValidator(check)


def _text(pattern: str, allowed: str) -> Any:
    """A string matching `pattern`: a type built at run time, so Any to mypy (an alias inside another
    Annotated spells Annotated[str, _matches(...)] instead, which mypy reads as str)."""
    return Annotated[str, _matches(pattern, allowed)]


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


HostName = Annotated[str, _matches(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?",
                                   "an IPv4 address or DNS name: letters, digits, '.' and '-', starting and ending with a "
                                   "letter or digit"),
                     AfterValidator(_one_spelling_of_an_address)]
EmailAddress = _text(r"[^@\s\"'\\]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}", "an email address like you@example.com")
SmtpHost = _text(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?:[0-9]{1,5}",
                 "an SMTP server as HOST:PORT, like smtp.example.com:587")
HostKey = Annotated[str, _matches(r"(ssh-|ecdsa-)\S+ \S+",
                                  "a host key as ssh-keyscan prints it after the host: its type and key, like "
                                  "'ssh-ed25519 AAAAC3Nza...'")]
RepoId = _text(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*",
               "a Hugging Face repository OWNER/NAME, each part letters, digits, '_', '.' or '-' and starting "
               "with a letter or digit")
# a lane's name goes into container, socket and resource names: short, plain, lowercase
LaneName = _text(r"[a-z]([a-z0-9-]{0,14}[a-z0-9])?",
                 "1 to 16 lowercase letters, digits or '-', starting with a letter and ending with a letter or digit")
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
SERVING_IMAGE_LOCK = Path(__file__).resolve().parents[2] / "launch" / "serving-image" / "ray-requirements.lock"
# the weight loaders the serving image adds where its base lacks them (core/loaders.py, locked-install.sh)
LOADER_LOCK = SERVING_IMAGE_LOCK.with_name("loader-requirements.lock")
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
                contract.APPLIED_STATE_DIR.rsplit("/", 1)[0],  # (twinspark's own named before the trees they are in)
                "/var/log", "/var/cache", "/var/spool", "/var/lib/docker", "/var/lib/containerd")
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
    elif len(parts) == 3 and parts[:2] == ["var", "lib"]:
        what = "a directory of /var/lib (a service's own state, like /var/lib/docker)"
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
    ((contract.LANE_GATEWAY_PORT,) * 2, "a lane's gateway's (several lanes)"),
    ((contract.LANE_METRICS_PORT,) * 2, "a lane gateway's, for vLLM's /metrics (several lanes)"),
    ((contract.LANE_ROUTER_PORT,) * 2, "the lane router's, on the head's loopback (several lanes)"),
    (contract.RAY_WORKER_PORTS, "one of Ray's worker ports"),
    ((contract.NCCL_RENDEZVOUS_PORT,) * 2, "NcclCheck's NCCL rendezvous"),
    ((contract.MP_MASTER_PORT,) * 2, "vLLM's master port (serving.executor mp: the head's rank 0, on the rails)"),
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


PinnedHostKey = Annotated[HostKey, AfterValidator(_host_key)]
_COTENANT_MEMORY = re.compile(r"^(auto|off|[1-9][0-9]?%)$")


def _cotenant_memory(value: str) -> str:
    if not _COTENANT_MEMORY.match(value):
        raise ValueError("expected 'auto', 'off' or a percentage of the node's memory such as '12%'")
    return value


CotenantMemory = Annotated[str, AfterValidator(_cotenant_memory)]

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


def _acknowledgeable(key: str) -> str:
    if key in [platform_gate.MISMATCH_PREFIX + fact for fact in platform_gate.NEVER_ACKNOWLEDGED]:
        raise ValueError("nothing acknowledges nodes on different images (a tensor-parallel group on two builds "
                         "hangs or computes garbage): rebuild so every node runs the same one")
    known = platform_gate.acknowledgeable()
    if key not in known:
        raise ValueError(f"expected a known-issue id from known-issues.toml or a node difference: one of "
                         f"{', '.join(known)}")
    return key


Acknowledgeable = Annotated[str, AfterValidator(_acknowledgeable)]
