"""LaunchBundle: everything the serving containers run, in one directory per node.

Creates, per node, one idempotent remote command per file under BUNDLE_DIR (managed files):
- launch-vllm.sh   the single source of truth for vLLM parameters, rendered with literal
                   values in the recipe's layout (profile + serving.extraArgs); with
                   serving.executor mp, this node's rank among vLLM's nodes (workers: --headless)
- prelude.sh, boot-common.sh, boot-head.sh, boot-worker.sh, ray-membership.py,
  memory-check.py   from launch/ (serving.executor mp: boot-head-mp.sh, boot-worker-mp.sh and
                   mp-membership.py in place of the Ray ones)
- twinspark.env    the recipe's environment list, this node's identity and the on-node contract
- ray-token        mode 600: Ray's token authentication (every ray process and client reads it);
                   not with serving.executor mp, which runs no Ray
- secrets.env      head only, mode 600: VLLM_API_KEY, which the API gateway checks
- api-gateway.sh, api-gateway.conf   head only: nginx in front of vLLM, the key on every path
Exposes `content_hash` and `gateway_hash`: the containers carry them in a label, so a
bundle change replaces them (the head starts last, after the workers) and nothing else.
Both are keyed hashes (remote.files_hash): the label says nothing about the secrets.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_command import remote as pulumi_remote

from core import contract, kv_tier

from .config import DEFAULT_LANE, ModelConfig, Node, NodeFabric, Serving
from core.recipes import serve_lines
from .remote import ManagedFile, files_hash, launch_file, managed_file_commands


def static_files(executor: str) -> tuple[str, ...]:
    """The launch/ files a node's bundle holds: the boot scripts and membership watch of its executor."""
    membership = contract.MEMBERSHIP_SCRIPT if executor == "ray" else contract.MP_MEMBERSHIP_SCRIPT
    return (contract.PRELUDE, contract.BOOT_COMMON, contract.boot_script("head", executor),
            contract.boot_script("worker", executor), membership, contract.MEMORY_CHECK_SCRIPT, contract.ROCE_GID_SCRIPT)


# Ray spawns its workers with oom_score_adj 1000: first in line for the kernel OOM killer,
# and one dead TP rank kills the engine (recipe gotcha 13). 0 = an ordinary process.
WORKER_OOM_SCORE_ADJUSTMENT = 0


@dataclass(frozen=True)
class VllmServe:
    """What `vllm serve` is started with."""

    serving: Serving
    model: ModelConfig
    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    lane: str = DEFAULT_LANE  # its KV tier's folder (serving.kvTier)


@dataclass(frozen=True)
class MpRank:
    """serving.executor mp: where this node stands among vLLM's nodes (one GPU, one global rank each)."""

    node_rank: int  # the head is 0
    nnodes: int
    master_addr: str  # the head's address on the rails, where rank 0's TCPStore listens


def mp_rank(fabric: NodeFabric) -> MpRank:
    """The head first (rank 0, vLLM's API server), then the workers in config order."""
    order = [fabric.head_ray_ip, *(ip for ip in fabric.node_ray_ips if ip != fabric.head_ray_ip)]
    return MpRank(order.index(fabric.ray_ip), len(order), fabric.head_ray_ip)


def executor_args(executor: str, rank: Optional[MpRank]) -> list[list[str]]:
    """`--distributed-executor-backend` and, for mp, the node-rank flags (vllm/engine/arg_utils.py)."""
    if executor == "ray":
        return [["--distributed-executor-backend", "ray"]]
    assert rank is not None, "serving.executor mp renders one launch file per node rank"
    return [
        ["--distributed-executor-backend", "mp"],
        ["--nnodes", str(rank.nnodes), "--node-rank", str(rank.node_rank), "--master-addr", rank.master_addr,
         "--master-port", str(contract.MP_MASTER_PORT)],
        # every rank but 0 runs no API server: it joins rank 0's process group and serves its GPU
        *([["--headless"]] if rank.node_rank else []),
    ]


@dataclass(frozen=True)
class LaunchBundleArgs:
    node: Node
    connection: pulumi_remote.ConnectionArgs
    vllm: VllmServe
    fabric: NodeFabric  # the node's addresses and NCCL environment, as fabric.topology makes them
    ray_token: pulumi.Input[str]
    label_key: pulumi.Input[str]  # keys the content hashes (secret)
    api_key: Optional[pulumi.Input[str]]  # the head's secrets.env; None on workers
    front_port: Optional[int] = None  # several lanes, the stack's head: serving.port, the front gateway's (and the router)
    lane_gateway: bool = False  # several lanes: this node heads a lane, its gateway drained for a swap
    # several lanes, a worker that heads a lane: its Ray address, where its gateway also serves vLLM's /metrics
    # to the head's Prometheus (the firewall's `lane-metrics` admits the head alone)
    metrics_address: Optional[str] = None
    # serving.kvTier: the stack's PYTHONHASHSEED (secret: it keys Python's string hashes in vLLM's processes)
    kv_tier_seed: Optional[pulumi.Input[str]] = None


def vllm_serve_args(vllm: VllmServe, rank: Optional[MpRank] = None) -> list[list[str]]:
    """`vllm serve` arguments grouped as the recipe writes them, one group per line: what
    twinspark owns first, then the recipe's (core/recipes.py), serving.extraArgs last.
    `rank`: this node's, with serving.executor mp (every rank gets the same engine flags)."""
    s, m = vllm.serving, vllm.model
    lines = [
        ["vllm", "serve", m.container_dir],
        ["--served-model-name", m.served_name],
        # a Unix socket only the API gateway opens (api-gateway.conf): it listens on serving.port
        ["--uds", contract.VLLM_SOCKET],
        ["--tensor-parallel-size", str(vllm.tensor_parallel_size)],
        # only where PP is used: a stack without it keeps the recipe's argv (§4) and its launch file
        *([["--pipeline-parallel-size", str(vllm.pipeline_parallel_size)]] if vllm.pipeline_parallel_size > 1 else []),
        *executor_args(s.executor, rank),
        *([["--kv-transfer-config", kv_tier.transfer_config(s.kv_tier.memory_gib, vllm.lane)]] if s.kv_tier else []),
        *serve_lines(s.recipe_spec, s.profile, kv_cache_dtype=s.kv_cache_dtype, max_model_len=s.max_model_len,
                     gpu_memory_utilization=s.gpu_memory_utilization, load_format=s.load_format),
    ]
    if s.extra_args:
        lines.append(list(s.extra_args))
    return lines


def vllm_argv(vllm: VllmServe, rank: Optional[MpRank] = None) -> list[str]:
    """The exact argv vLLM must be started with (what a fake `vllm` on PATH records)."""
    return [token for line in vllm_serve_args(vllm, rank) for token in line][1:]


def render_launch_vllm(vllm: VllmServe, rank: Optional[MpRank] = None) -> str:
    command = " \\\n  ".join(" ".join(shlex.quote(t) for t in line) for line in vllm_serve_args(vllm, rank))
    return f"""#!/usr/bin/env bash
# {contract.LAUNCH_VLLM} — rendered by twinspark; profile: {vllm.serving.profile}.
# The single source of truth for vLLM parameters. Change them in the stack config
# (`pulumi config set --path serving.profile multiagent`) and run `pulumi up`, which
# rewrites this file and restarts the serving containers (the head starts last).
set -euo pipefail
# vLLM listens on a Unix socket only the API gateway opens; the gateway checks the key on
# every path (vLLM itself would check it on /v1 only), so vLLM is started without one.
exec {command}
"""


def render_env_file(args: LaunchBundleArgs) -> str:
    node, fabric = args.node, args.fabric
    ray = args.vllm.serving.executor == "ray"
    # serving.executor mp: the rank watch in place of Ray's membership, and no Ray at all
    mp_entries = [] if ray else [
        ("TWINSPARK_MP_MEMBERSHIP_SCRIPT", contract.MP_MEMBERSHIP_SCRIPT),
        ("# vLLM's master port: rank 0's TCPStore on the head's rail address, which every node rank joins", None),
        ("TWINSPARK_MP_MASTER_PORT", str(contract.MP_MASTER_PORT)),
    ]
    entries = [
        ("# identity of this node in the cluster", None),
        ("TWINSPARK_NODE_NAME", node.name),
        ("TWINSPARK_ROLE", node.role),
        ("TWINSPARK_NODE_IP", fabric.ray_ip),
        ("TWINSPARK_HEAD_IP", fabric.head_ray_ip),
        ("TWINSPARK_NODE_COUNT", str(len(fabric.node_ray_ips))),
        ("TWINSPARK_NODE_IPS", ",".join(fabric.node_ray_ips)),
        # names the contract by its file before core/ (a node file: renaming it would re-run the step)
        ("# the on-node contract (node_contract.py): the boot scripts hard-code none of it", None),
        ("TWINSPARK_LOG_DIR", contract.LOG_DIR),
        ("TWINSPARK_BOOT_LOG", contract.boot_log(node.role)),
        ("TWINSPARK_VLLM_LOG", contract.VLLM_LOG),
        ("TWINSPARK_LAUNCH_VLLM", contract.LAUNCH_VLLM),
        *([("TWINSPARK_MEMBERSHIP_SCRIPT", contract.MEMBERSHIP_SCRIPT)] if ray else mp_entries),
        ("# memory before load: the node's memory budget (what vLLM takes, the co-tenant slices' caps),", None),
        ("# where the model is, where the verdict goes, where the host's cgroup tree is mounted", None),
        ("TWINSPARK_MEMORY_CHECK_SCRIPT", contract.MEMORY_CHECK_SCRIPT),
        ("TWINSPARK_MEMORY_CHECK_STATUS", contract.MEMORY_CHECK_STATUS),
        ("TWINSPARK_UNCLEAN_BOOT_HOLD", contract.UNCLEAN_BOOT_HOLD),
        ("TWINSPARK_MODEL_DIR", args.vllm.model.container_dir),
        *args.vllm.serving.memory_budget.env_entries(),
        ("TWINSPARK_HOST_CGROUP_DIR", contract.HOST_CGROUP_DIR),
        *kv_tier_entries(args.vllm),
        ("TWINSPARK_ROCE_GID_SCRIPT", contract.ROCE_GID_SCRIPT),
        *([("RAY_PORT", str(contract.RAY_PORT))] if ray else []),
        ("TWINSPARK_API_GATEWAY_CONF", contract.API_GATEWAY_CONF),
        ("TWINSPARK_API_GATEWAY_LOG", contract.API_GATEWAY_LOG),
        ("TWINSPARK_API_GATEWAY_RUN_DIR", contract.API_GATEWAY_RUN_DIR),
        ("TWINSPARK_API_GATEWAY_KEY_MAP", contract.API_GATEWAY_KEY_MAP),
        ("TWINSPARK_API_GATEWAY_TEMP_DIR", contract.API_GATEWAY_TEMP_DIR),
        ("TWINSPARK_VLLM_SOCKET_DIR", contract.VLLM_SOCKET_DIR),
        ("TWINSPARK_VLLM_SOCKET", contract.VLLM_SOCKET),
        ("TWINSPARK_API_SOCKET_GROUP", contract.API_SOCKET_GROUP),
        *([("# Ray's token authentication: every ray start, driver and client (docker exec too)", None),
           *contract.ray_auth_env().items()] if ray else []),
        (f"# vLLM must see the address Ray knows this node by ({fabric.ray_ip_origin})" if ray else
         f"# the address vLLM's message queues announce to the other ranks ({fabric.ray_ip_origin})", None),
        ("VLLM_HOST_IP", fabric.ray_ip),
        ("# the recipe's environment (§1, §4)", None),
        ("NCCL_IB_HCA", ",".join(r.hca for r in node.rails)),
        ("NCCL_NET_GDR_LEVEL", "5"),
        ("NCCL_SOCKET_IFNAME", fabric.bootstrap_iface),
        ("GLOO_SOCKET_IFNAME", fabric.bootstrap_iface),
        *fabric.nccl_env,
        ("# NCCL says which network it chose (INIT and NET lines only): the serving guard reads it", None),
        *contract.NCCL_DEBUG_ENV.items(),
        *([("RAY_memory_monitor_refresh_ms", "0"), ("RAY_DISABLE_MEMORY_MONITOR", "1")] if ray else []),
        # Ray starts one idle Python worker for the first driver; vLLM's workers are actors with
        # processes of their own, so it only idles on the head (~80 MB, ~0.5 CPU-s a minute)
        *([("RAY_prestart_worker_first_driver", "0")] if ray else []),
        *args.vllm.serving.recipe_spec.env.items(),  # the model recipe's (recipes/)
        ("HF_HUB_OFFLINE", "1"),
        ("# compile and kernel caches on the host: a replaced container starts warm", None),
        *contract.compile_cache_env().items(),
        # (mp's workers are the engine's own children: they inherit its oom_score_adj, 0)
        *([("# Ray model workers are not the kernel OOM killer's first victims (gotcha 13)", None),
           ("RAY_worker_oom_score_adjustment", str(WORKER_OOM_SCORE_ADJUSTMENT))] if ray else []),
    ]
    lines = [f"# {contract.ENV_FILE} — {node.name} ({node.role}); rendered by twinspark"]
    lines += [key if value is None else f"{key}={value}" for key, value in entries]
    return "\n".join(lines) + "\n"


def kv_tier_entries(vllm: VllmServe) -> list[tuple[str, Optional[str]]]:
    """twinspark.env with serving.kvTier: what boot-common.sh's prepare_kv_tier reads."""
    tier = vllm.serving.kv_tier
    if tier is None:
        return []
    return [("# the KV tier (serving.kvTier): its folder, its bound on the disk, its hash seed (core/kv_tier.py)", None),
            ("TWINSPARK_KV_TIER_DIR", kv_tier.tier_dir(vllm.lane)),
            ("TWINSPARK_KV_TIER_DISK_BYTES", str(tier.disk_gib * kv_tier.GIB)),
            ("TWINSPARK_KV_TIER_BOUND_SCRIPT", contract.KV_TIER_BOUND_SCRIPT),
            ("TWINSPARK_KV_TIER_BOUND_LOG", contract.KV_TIER_BOUND_LOG),
            ("TWINSPARK_KV_TIER_SEED_FILE", contract.KV_TIER_SEED_FILE)]


def render_secrets_env(api_key: str) -> str:
    return f"VLLM_API_KEY={shlex.quote(api_key)}\n"


# The path exactly as the client sent it (nginx's $request_uri, before any %-decoding or
# dot-segment removal): plain segments only, an optional query. vLLM routes the raw path while
# nginx matches the normalised one, so anything nginx would rewrite (`/metrics/../health`,
# `%2e%2e`, `%2F`, `//`, a segment starting with a dot) is refused rather than checked on one
# path and served on another. No OpenAI-compatible path needs any of it.
PLAIN_REQUEST_PATH = r"^(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?(\?.*)?$"


# The gateway's limits per client address, so that one client cannot lock out the others: a slow
# or half-sent request header is dropped after CLIENT_HEADER_TIMEOUT (nginx's 60 s default let
# 2,100 half-sent requests from one address hold every connection for a minute: issue 37), at
# most REQUESTS_PER_CLIENT requests in progress at once (more than any vLLM batch holds), and
# requests without a valid key answered at WRONG_KEYS_PER_SECOND (bursts of WRONG_KEY_BURST),
# beyond that 429, so keys cannot be guessed at nginx's pace (13,500/s measured).
CLIENT_HEADER_TIMEOUT_S = 10
REQUESTS_PER_CLIENT = 256
WRONG_KEYS_PER_SECOND = 5
WRONG_KEY_BURST = 20
# Connections each worker holds (a proxied request takes two) and the files that needs.
WORKER_CONNECTIONS = 8192
# an internal location: a request without a valid key is answered there, after the rate limit
UNAUTHORIZED = "/.twinspark-unauthorized"
DRAIN_RETRY_AFTER_S = 60  # a re-qualification takes about a minute


@dataclass(frozen=True)
class GatewayRole:
    """What a gateway stands in front of: a lane's vLLM (its socket, the guard's drain, /metrics for
    Prometheus), or with several lanes the head's front, in front of the lane router."""

    conf: str = contract.API_GATEWAY_CONF
    upstream: str = f"unix:{contract.VLLM_SOCKET}"
    error_log: str = contract.API_GATEWAY_LOG
    drain_file: Optional[str] = contract.DRAIN_FILE  # None: no drain here (each lane's gateway has its own)
    metrics: bool = True  # vLLM's /metrics on the head's loopback
    draining: str = "serving is draining: the fabric is re-qualified (twinspark status says why)"


# several lanes: each lane's own gateway, drained too while `up` swaps the lane's engine (launch/lane-drain.sh)
LANE = GatewayRole(draining="this lane is draining: its engine is being swapped by pulumi up, or the fabric "
                   "re-qualified (twinspark status says why)")
FRONT = GatewayRole(contract.API_FRONT_CONF, f"127.0.0.1:{contract.LANE_ROUTER_PORT}", contract.API_FRONT_LOG,
                    drain_file=None, metrics=False)


def render_api_gateway_conf(port: int, role: GatewayRole = GatewayRole(), metrics_address: Optional[str] = None) -> str:
    """nginx in front of vLLM: every path needs the key but /health, which says only up or down.

    The key map is written at container start by api-gateway.sh (from secrets.env, into a
    private tmpfs file), so this file holds no secret. vLLM listens on a Unix socket only the
    gateway's workers (group API_SOCKET_GROUP) can open; a request reaches it on the one path
    that was checked ($uri, equal to the raw path once PLAIN_REQUEST_PATH holds). The front (several
    lanes) is the same gateway in front of the router, which hands each request to its lane's gateway.
    `metrics_address`: an address /metrics is served on beside loopback (LaunchBundleArgs.metrics_address).
    """
    run, temp = contract.API_GATEWAY_RUN_DIR, contract.API_GATEWAY_TEMP_DIR
    refuse_odd_paths = "if ($twinspark_plain_path = 0) { return 404; }"
    # the serving guard's drain (contract.DRAIN_FILE, the folder mounted read-only): checked per request
    drain = f"if (-f {role.drain_file}) {{ return 503; }}" if role.drain_file else ""
    metrics_port = contract.metrics_loopback_port(port)
    # a worker's lane: the head's Prometheus reads it over the rail, the firewall admitting the head alone
    also_listen = f"\n        listen {metrics_address}:{metrics_port};" if metrics_address else ""
    metrics = f"""
    # Prometheus (on the head's network) reads vLLM's /metrics here, and nothing else
    server {{
        listen 127.0.0.1:{metrics_port};{also_listen}
        {refuse_odd_paths}
        location = /metrics {{ proxy_pass http://vllm/metrics; }}
        location / {{ return 404; }}
    }}""" if role.metrics else ""
    return f"""# {role.conf} — rendered by twinspark; the API on serving.port ({port}).
user nobody {contract.API_SOCKET_GROUP};  # the group that may open vLLM's socket
worker_processes 2;
worker_rlimit_nofile {2 * WORKER_CONNECTIONS + 1024};
pid {run}/nginx.pid;
error_log {contract.LOG_DIR}/{role.error_log} warn;
events {{ worker_connections {WORKER_CONNECTIONS}; }}
http {{
    access_log off;
    server_tokens off;
    # map $http_authorization $twinspark_key_ok {{ default 0; "~^(?i:bearer) +<key>$" 1; }}: a
    # case-sensitive regex (a string key would be matched ignoring case, and one of 40
    # characters or more would not fit map_hash_bucket_size)
    include {run}/{contract.API_GATEWAY_KEY_MAP};
    map $request_uri $twinspark_plain_path {{
        default 0;
        "~{PLAIN_REQUEST_PATH}" 1;
    }}
    # one client cannot hold every connection: a header must arrive within {CLIENT_HEADER_TIMEOUT_S} s, an idle
    # kept-alive connection is closed after 30 s, requests in progress are counted per address
    client_header_timeout {CLIENT_HEADER_TIMEOUT_S}s;
    client_body_timeout 60s;
    keepalive_timeout 30s;
    limit_conn_zone $binary_remote_addr zone=twinspark_per_client:10m;
    limit_conn_status 429;
    # requests without a valid key, limited per address (an empty key, a valid one, is not counted)
    map $twinspark_key_ok $twinspark_wrong_key_client {{
        default $binary_remote_addr;
        1 "";
    }}
    limit_req_zone $twinspark_wrong_key_client zone=twinspark_wrong_keys:10m rate={WRONG_KEYS_PER_SECOND}r/s;
    limit_req_status 429;
    client_max_body_size 64m;  # a 1M-token prompt is a few MB of JSON
    # the workers' own folders (api-gateway.sh makes them): the run dir is root's alone
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    # A fresh connection per request (nginx's default, Connection: close): a kept-alive one can
    # be closed by uvicorn (5 s keep-alive) just as a request goes out on it, and nginx does not
    # retry a POST, so the client would get a 502.
    upstream vllm {{ server {role.upstream}; }}
    server {{
        listen {port};
        listen [::]:{port};
        {refuse_odd_paths}
        limit_conn twinspark_per_client {REQUESTS_PER_CLIENT};
        location = /health {{
            {drain}
            proxy_pass http://vllm/health;
        }}
        location / {{
            # answered in {UNAUTHORIZED}: a `return` here would answer before the rate limit counts
            if ($twinspark_key_ok = 0) {{ rewrite ^ {UNAUTHORIZED} last; }}
            {drain}
            proxy_pass http://vllm$uri$is_args$args;
            proxy_http_version 1.1;
            # stream tokens as vLLM sends them; long generations take minutes
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }}
        location = {UNAUTHORIZED} {{
            internal;
            limit_req zone=twinspark_wrong_keys burst={WRONG_KEY_BURST} nodelay;
            add_header Retry-After 1 always;  # on the 429s
            # the 401 in the content phase (try_files finds nothing), after limit_req's count
            try_files /nonexistent =401;
        }}
        error_page 401 @unauthorized;
        # nginx's own 503s only (vLLM's, while it loads, pass as they are: no proxy_intercept_errors)
        error_page 503 @draining;
        location @draining {{
            add_header Retry-After {DRAIN_RETRY_AFTER_S} always;
            default_type application/json;
            return 503 '{{"error":"{role.draining}"}}\n';
        }}
        location @unauthorized {{
            add_header WWW-Authenticate Bearer always;
            default_type application/json;
            return 401 '{{"error":"a valid API key is required (Authorization: Bearer ...)"}}\n';
        }}
    }}{metrics}
}}
"""


def bundle_file(name: str, content: pulumi.Input[str], mode: str) -> ManagedFile:
    return ManagedFile(name.replace(".", "-"), f"{contract.BUNDLE_DIR}/{name}", content, mode)


def bundle_files(args: LaunchBundleArgs) -> list[ManagedFile]:
    """Every bundle file of the node; the secret ones last."""
    executor = args.vllm.serving.executor
    rank = mp_rank(args.fabric) if executor == "mp" else None
    files = [bundle_file(contract.LAUNCH_VLLM, render_launch_vllm(args.vllm, rank), "0755")]
    files += [bundle_file(name, launch_file(name), "0755") for name in static_files(executor)]
    files.append(bundle_file(contract.ENV_FILE, render_env_file(args), "0644"))
    if args.vllm.serving.kv_tier:
        assert args.kv_tier_seed is not None, "serving.kvTier: the stack's hash seed goes with it"
        files += [bundle_file(contract.KV_TIER_BOUND_SCRIPT, launch_file(contract.KV_TIER_BOUND_SCRIPT), "0755"),
                  bundle_file(contract.KV_TIER_SEED_FILE, pulumi.Output.secret(args.kv_tier_seed), "0600")]
    if executor == "ray":
        files.append(bundle_file(contract.RAY_TOKEN_FILE, pulumi.Output.secret(args.ray_token), "0600"))
    return files


def gateway_files(args: LaunchBundleArgs) -> list[ManagedFile]:
    """The head's API gateway: its entrypoint, its nginx config and the key it checks."""
    assert args.api_key is not None  # the head's bundle alone has a gateway, and an API key
    secrets = pulumi.Output.secret(args.api_key).apply(render_secrets_env)
    front = [bundle_file(contract.API_FRONT_CONF, render_api_gateway_conf(args.front_port, FRONT), "0644"),
             bundle_file(contract.LANE_ROUTER_SCRIPT, launch_file(contract.LANE_ROUTER_SCRIPT), "0755")] \
        if args.front_port else []
    return [
        bundle_file(contract.API_GATEWAY_SCRIPT, launch_file(contract.API_GATEWAY_SCRIPT), "0755"),
        bundle_file(contract.API_GATEWAY_CONF,
                    render_api_gateway_conf(args.vllm.serving.port, LANE if args.lane_gateway else GatewayRole(),
                                            args.metrics_address), "0644"),
        *front,
        bundle_file(contract.SECRETS_FILE, secrets, "0600"),
    ]


class LaunchBundle(pulumi.ComponentResource):
    def __init__(self, name: str, args: LaunchBundleArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:launch_bundle:LaunchBundle", name, None, opts)
        files = bundle_files(args)
        gateway = gateway_files(args) if args.api_key is not None else []
        self.commands = managed_file_commands(args.node.name, "bundle", args.connection, files + gateway, parent=self)
        # keyed: the ray token (and on the head the API key) is in what they cover
        self.content_hash = files_hash(files, key=args.label_key)
        self.gateway_hash = files_hash(gateway, key=args.label_key) if gateway else None
        self.env_hash = files_hash([f for f in files if f.path.endswith(contract.ENV_FILE)])
        self.register_outputs({"contentHash": self.content_hash})
