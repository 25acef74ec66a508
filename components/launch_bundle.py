"""LaunchBundle: everything the serving containers run, in one directory per node.

Creates, per node, one idempotent remote command per file under BUNDLE_DIR:
- launch-vllm.sh   the single source of truth for vLLM parameters, rendered with literal
                   values in the recipe's layout (profile + serving.extraArgs)
- boot-common.sh, boot-head.sh, boot-worker.sh, ray-membership.py   from launch/
- twinspark.env    the recipe's environment list plus this node's identity
- secrets.env      head only, mode 600: VLLM_API_KEY, which vLLM reads from its environment
Exposes `content_hash`: the serving containers carry it in a label, so a bundle change
replaces them (the head starts last, after the workers) and nothing else.
"""

from __future__ import annotations

import json
import shlex
from typing import Optional

import pulumi
from pulumi_command import remote

from .config import PROFILES, Node, StackConfig
from .remote import connection, install_file_command, launch_file, remove_file_command, sha256_text

BUNDLE_DIR = "/opt/twinspark"  # on the host
CONTAINER_BUNDLE_DIR = "/twinspark"  # the same files inside the containers (read-only)
LOG_DIR = "/var/log/twinspark"  # host and container
RAY_PORT = 6379
RAY_DASHBOARD_PORT = 8265
STATIC_FILES = ("boot-common.sh", "boot-head.sh", "boot-worker.sh", "ray-membership.py")
SECRETS_FILE = "secrets.env"
# Ray spawns its workers with oom_score_adj 1000: first in line for the kernel OOM killer,
# and one dead TP rank kills the engine (recipe gotcha 13). 0 = an ordinary process.
WORKER_OOM_SCORE_ADJUSTMENT = 0


def speculative_config(profile: str) -> str:
    spec = {
        "method": "dspark",
        "num_speculative_tokens": PROFILES[profile]["num_speculative_tokens"],
        "draft_sample_method": "probabilistic",
    }
    return json.dumps(spec, separators=(",", ":"))


def vllm_serve_args(cfg: StackConfig) -> list[list[str]]:
    """`vllm serve` arguments grouped as the recipe writes them, one group per line."""
    s, m = cfg.serving, cfg.model
    profile = PROFILES[s.profile]
    lines = [
        ["vllm", "serve", m.container_dir],
        ["--served-model-name", m.served_name],
        ["--host", "0.0.0.0", "--port", str(s.port)],
        ["--tensor-parallel-size", str(cfg.tensor_parallel_size)],
        ["--distributed-executor-backend", "ray"],
        ["--trust-remote-code"],
        ["--tokenizer-mode", "deepseek_v4"],
        ["--tool-call-parser", "deepseek_v4"],
        ["--reasoning-parser", "deepseek_v4"],
        ["--enable-auto-tool-choice"],
        ["--kv-cache-dtype", s.kv_cache_dtype],
        ["--moe-backend", "flashinfer_b12x"],
        ["--block-size", "256"],
        ["--max-model-len", str(s.max_model_len)],
        ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"],
        ["--max-num-seqs", str(profile["max_num_seqs"])],
        ["--max-num-batched-tokens", "8192"],
        ["--max-cudagraph-capture-size", "24"],
        ["--generation-config", "vllm"],
        ["--async-scheduling"],
        ["--enable-chunked-prefill"],
        ["--enable-prefix-caching"],
        ["--speculative-config", speculative_config(s.profile)],
    ]
    if s.extra_args:
        lines.append(list(s.extra_args))
    return lines


def vllm_argv(cfg: StackConfig) -> list[str]:
    """The exact argv vLLM must be started with (what a fake `vllm` on PATH records)."""
    return [token for line in vllm_serve_args(cfg) for token in line][1:]


def render_launch_vllm(cfg: StackConfig) -> str:
    command = " \\\n  ".join(" ".join(shlex.quote(t) for t in line) for line in vllm_serve_args(cfg))
    return f"""#!/usr/bin/env bash
# launch-vllm.sh — rendered by twinspark; profile: {cfg.serving.profile}.
# The single source of truth for vLLM parameters. Change them in the stack config
# (`pulumi config set --path serving.profile multiagent`) and run `pulumi up`, which
# rewrites this file and restarts the serving containers (the head starts last).
set -euo pipefail
# VLLM_API_KEY: vLLM reads it from the environment, so the key is never in argv.
set -a
# shellcheck source=/dev/null
. "$(dirname "$0")/{SECRETS_FILE}"
set +a
exec {command}
"""


def render_env_file(cfg: StackConfig, node: Node) -> str:
    head = cfg.head
    bootstrap = cfg.fabric.bootstrap_iface
    entries = [
        ("# identity of this node in the cluster", None),
        ("TWINSPARK_NODE_NAME", node.name),
        ("TWINSPARK_ROLE", node.role),
        ("TWINSPARK_NODE_IP", node.ray_ip),
        ("TWINSPARK_HEAD_IP", head.ray_ip),
        ("TWINSPARK_NODE_COUNT", str(len(cfg.nodes))),
        ("TWINSPARK_NODE_IPS", ",".join(n.ray_ip for n in cfg.nodes)),
        ("TWINSPARK_LOG_DIR", LOG_DIR),
        ("RAY_PORT", str(RAY_PORT)),
        ("RAY_DASHBOARD_PORT", str(RAY_DASHBOARD_PORT)),
        ("# vLLM must see the address Ray knows this node by (the first rail)", None),
        ("VLLM_HOST_IP", node.ray_ip),
        ("# the recipe's environment (§1, §4)", None),
        ("NCCL_IB_HCA", ",".join(r.hca for r in node.rails)),
        ("NCCL_NET_GDR_LEVEL", "5"),
        ("NCCL_SOCKET_IFNAME", bootstrap),
        ("GLOO_SOCKET_IFNAME", bootstrap),
        ("RAY_memory_monitor_refresh_ms", "0"),
        ("RAY_DISABLE_MEMORY_MONITOR", "1"),
        ("VLLM_USE_FLASHINFER_SAMPLER", "1"),
        ("VLLM_USE_B12X_MOE", "1"),
        ("VLLM_USE_B12X_WO_PROJECTION", "1"),
        ("VLLM_DSPARK_GPU_REJECTED_CONTEXT_MASK", "1"),
        ("VLLM_USE_BREAKABLE_CUDAGRAPH", "0"),
        ("DEFAULT_THINKING", "low"),
        ("HF_HUB_OFFLINE", "1"),
        ("# Ray model workers are not the kernel OOM killer's first victims (gotcha 13)", None),
        ("RAY_worker_oom_score_adjustment", str(WORKER_OOM_SCORE_ADJUSTMENT)),
    ]
    lines = [f"# twinspark.env — {node.name} ({node.role}); rendered by twinspark"]
    lines += [key if value is None else f"{key}={value}" for key, value in entries]
    return "\n".join(lines) + "\n"


def render_secrets_env(api_key: str) -> str:
    return f"VLLM_API_KEY={shlex.quote(api_key)}\n"


def bundle_files(cfg: StackConfig, node: Node) -> list[tuple[str, str, str]]:
    """(file name, content, mode) of every non-secret bundle file of `node`."""
    files = [("launch-vllm.sh", render_launch_vllm(cfg), "0755")]
    files += [(name, launch_file(name), "0755") for name in STATIC_FILES]
    files.append(("twinspark.env", render_env_file(cfg, node), "0644"))
    return files


class LaunchBundle(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        node: Node,
        api_key: pulumi.Input[str],
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:launch_bundle:LaunchBundle", name, None, opts)
        conn = connection(cfg.ssh, node)
        files = bundle_files(cfg, node)
        self.commands = [
            self._file(name, node, conn, file_name, content, mode) for file_name, content, mode in files
        ]
        plain_hash = sha256_text(*(f"{n}\0{c}" for n, c, _ in files))
        self.content_hash: pulumi.Output[str] = pulumi.Output.from_input(plain_hash)
        if node.role == "head":
            secrets = pulumi.Output.secret(api_key).apply(render_secrets_env)
            self.commands.append(self._file(name, node, conn, SECRETS_FILE, secrets, "0600"))
            # A new key must restart vLLM too; the hash of the key stays a secret.
            self.content_hash = pulumi.Output.secret(secrets).apply(lambda s: sha256_text(plain_hash, s))
        self.register_outputs({"contentHash": self.content_hash})

    def _file(self, name, node, conn, file_name, content, mode) -> remote.Command:
        path = f"{BUNDLE_DIR}/{file_name}"
        step = f"bundle/{file_name}"
        return remote.Command(
            f"{name}-{file_name.replace('.', '-')}",
            connection=conn,
            create=install_file_command(node.name, step, path, mode),
            delete=remove_file_command(node.name, step, path),
            stdin=content,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
