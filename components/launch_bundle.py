"""LaunchBundle: everything the serving containers run, in one directory per node.

Creates, per node, one idempotent remote command per file under BUNDLE_DIR (managed files):
- launch-vllm.sh   the single source of truth for vLLM parameters, rendered with literal
                   values in the recipe's layout (profile + serving.extraArgs)
- prelude.sh, boot-common.sh, boot-head.sh, boot-worker.sh, ray-membership.py   from launch/
- twinspark.env    the recipe's environment list, this node's identity and the on-node contract
- secrets.env      head only, mode 600: VLLM_API_KEY, which vLLM reads from its environment
Exposes `content_hash`: the serving containers carry it in a label, so a bundle change
replaces them (the head starts last, after the workers) and nothing else.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

import node_contract as contract

from .config import PROFILES, ModelConfig, Node, Serving
from .remote import ManagedFile, files_hash, launch_file, managed_file_commands

STATIC_FILES = (contract.PRELUDE, contract.BOOT_COMMON, contract.boot_script("head"), contract.boot_script("worker"),
                contract.MEMBERSHIP_SCRIPT)
# Ray spawns its workers with oom_score_adj 1000: first in line for the kernel OOM killer,
# and one dead TP rank kills the engine (recipe gotcha 13). 0 = an ordinary process.
WORKER_OOM_SCORE_ADJUSTMENT = 0


@dataclass(frozen=True)
class VllmServe:
    """What `vllm serve` is started with."""

    serving: Serving
    model: ModelConfig
    tensor_parallel_size: int


@dataclass(frozen=True)
class LaunchBundleArgs:
    node: Node
    connection: remote.ConnectionArgs
    vllm: VllmServe
    head_ray_ip: str
    node_ray_ips: Sequence[str]  # every node's, in config order
    bootstrap_iface: str
    api_key: Optional[pulumi.Input[str]]  # the head's secrets.env; None on workers


def speculative_config(profile: str) -> str:
    spec = {
        "method": "dspark",
        "num_speculative_tokens": PROFILES[profile]["num_speculative_tokens"],
        "draft_sample_method": "probabilistic",
    }
    return json.dumps(spec, separators=(",", ":"))


def vllm_serve_args(vllm: VllmServe) -> list[list[str]]:
    """`vllm serve` arguments grouped as the recipe writes them, one group per line."""
    s, m = vllm.serving, vllm.model
    profile = PROFILES[s.profile]
    lines = [
        ["vllm", "serve", m.container_dir],
        ["--served-model-name", m.served_name],
        ["--host", "0.0.0.0", "--port", str(s.port)],
        ["--tensor-parallel-size", str(vllm.tensor_parallel_size)],
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


def vllm_argv(vllm: VllmServe) -> list[str]:
    """The exact argv vLLM must be started with (what a fake `vllm` on PATH records)."""
    return [token for line in vllm_serve_args(vllm) for token in line][1:]


def render_launch_vllm(vllm: VllmServe) -> str:
    command = " \\\n  ".join(" ".join(shlex.quote(t) for t in line) for line in vllm_serve_args(vllm))
    return f"""#!/usr/bin/env bash
# {contract.LAUNCH_VLLM} — rendered by twinspark; profile: {vllm.serving.profile}.
# The single source of truth for vLLM parameters. Change them in the stack config
# (`pulumi config set --path serving.profile multiagent`) and run `pulumi up`, which
# rewrites this file and restarts the serving containers (the head starts last).
set -euo pipefail
# VLLM_API_KEY: vLLM reads it from the environment, so the key is never in argv.
set -a
# shellcheck source=/dev/null
. "$(dirname "$0")/{contract.SECRETS_FILE}"
set +a
exec {command}
"""


def render_env_file(args: LaunchBundleArgs) -> str:
    node = args.node
    entries = [
        ("# identity of this node in the cluster", None),
        ("TWINSPARK_NODE_NAME", node.name),
        ("TWINSPARK_ROLE", node.role),
        ("TWINSPARK_NODE_IP", node.ray_ip),
        ("TWINSPARK_HEAD_IP", args.head_ray_ip),
        ("TWINSPARK_NODE_COUNT", str(len(args.node_ray_ips))),
        ("TWINSPARK_NODE_IPS", ",".join(args.node_ray_ips)),
        ("# the on-node contract (node_contract.py): the boot scripts hard-code none of it", None),
        ("TWINSPARK_LOG_DIR", contract.LOG_DIR),
        ("TWINSPARK_BOOT_LOG", contract.boot_log(node.role)),
        ("TWINSPARK_VLLM_LOG", contract.VLLM_LOG),
        ("TWINSPARK_LAUNCH_VLLM", contract.LAUNCH_VLLM),
        ("TWINSPARK_MEMBERSHIP_SCRIPT", contract.MEMBERSHIP_SCRIPT),
        ("RAY_PORT", str(contract.RAY_PORT)),
        ("RAY_DASHBOARD_PORT", str(contract.RAY_DASHBOARD_PORT)),
        ("# vLLM must see the address Ray knows this node by (the first rail)", None),
        ("VLLM_HOST_IP", node.ray_ip),
        ("# the recipe's environment (§1, §4)", None),
        ("NCCL_IB_HCA", ",".join(r.hca for r in node.rails)),
        ("NCCL_NET_GDR_LEVEL", "5"),
        ("NCCL_SOCKET_IFNAME", args.bootstrap_iface),
        ("GLOO_SOCKET_IFNAME", args.bootstrap_iface),
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
    lines = [f"# {contract.ENV_FILE} — {node.name} ({node.role}); rendered by twinspark"]
    lines += [key if value is None else f"{key}={value}" for key, value in entries]
    return "\n".join(lines) + "\n"


def render_secrets_env(api_key: str) -> str:
    return f"VLLM_API_KEY={shlex.quote(api_key)}\n"


def bundle_file(name: str, content: pulumi.Input[str], mode: str) -> ManagedFile:
    return ManagedFile(name.replace(".", "-"), f"{contract.BUNDLE_DIR}/{name}", content, mode)


def bundle_files(args: LaunchBundleArgs) -> list[ManagedFile]:
    """Every bundle file of the node; the head's secrets.env last."""
    files = [bundle_file(contract.LAUNCH_VLLM, render_launch_vllm(args.vllm), "0755")]
    files += [bundle_file(name, launch_file(name), "0755") for name in STATIC_FILES]
    files.append(bundle_file(contract.ENV_FILE, render_env_file(args), "0644"))
    if args.api_key is not None:
        secrets = pulumi.Output.secret(args.api_key).apply(render_secrets_env)
        files.append(bundle_file(contract.SECRETS_FILE, secrets, "0600"))
    return files


class LaunchBundle(pulumi.ComponentResource):
    def __init__(self, name: str, args: LaunchBundleArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:launch_bundle:LaunchBundle", name, None, opts)
        files = bundle_files(args)
        self.commands = managed_file_commands(args.node.name, "bundle", args.connection, files, parent=self)
        # A new key must restart vLLM too; on the head the hash covers secrets.env and stays secret.
        self.content_hash = files_hash(files)
        self.env_hash = files_hash([f for f in files if f.path.endswith(contract.ENV_FILE)])
        self.register_outputs({"contentHash": self.content_hash})
