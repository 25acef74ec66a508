"""ModelWeights: the model on every node, downloaded once and copied over the cable.

Creates:
- on the head: `{head}-weights-fetch` (launch/fetch-weights.sh: resumable download inside
  the serving base image, HF token as a stdin secret) and `{head}-weights-sync-key`
  (launch/sync-key.sh: a dedicated ed25519 key for the copy);
- per worker: `{worker}-weights-authorize` (launch/authorize-key.sh: that key, restricted to
  the head's rail address, in the worker's authorized_keys);
- on the head: `{head}-weights-shape-check` (launch/model-shape-check.sh: config.json's heads
  must split over the nodes and the weights fit gpuMemoryUtilization x each node's MemTotal,
  read over the rail), so a model that cannot load stops `pulumi up` before the copy;
- per worker: `{worker}-weights-sync` (launch/sync-weights.sh on the head: rsync to the
  worker's first-rail address, then verify file list and sizes against the manifest).
No step does anything when its part is already complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

from node_contract import SYNC_KEY, SYNC_KEY_COMMENT, SYNC_KNOWN_HOSTS, WEIGHTS_MANIFEST

from .remote import NodeScript, launch_file, node_command

FETCH_SCRIPT = "fetch-weights.sh"
SYNC_SCRIPT = "sync-weights.sh"
SHAPE_SCRIPT = "model-shape-check.sh"
SHAPE_PROGRAM = "model-shape-check.py"
SYNC_KEY_SCRIPT = "sync-key.sh"
AUTHORIZE_SCRIPT = "authorize-key.sh"


@dataclass(frozen=True)
class NodeAccess:
    name: str
    connection: remote.ConnectionArgs
    ray_ip: str  # first rail: the copy crosses the cable


@dataclass(frozen=True)
class ModelWeightsArgs:
    repo: str
    dir: str
    downloader_image: str  # has huggingface_hub: the serving base image
    ssh_user: str
    head: NodeAccess
    workers: Sequence[NodeAccess]
    hf_token: Optional[pulumi.Input[str]]
    tensor_parallel_size: int
    gpu_memory_utilization: float


def fetch_args(args: ModelWeightsArgs) -> list[str]:
    return ["--repo", args.repo, "--dir", args.dir, "--image", args.downloader_image, "--manifest", WEIGHTS_MANIFEST]


def sync_args(args: ModelWeightsArgs, worker: NodeAccess) -> list[str]:
    return ["--dir", args.dir, "--manifest", WEIGHTS_MANIFEST, "--to", f"{args.ssh_user}@{worker.ray_ip}",
            "--key", SYNC_KEY, "--known-hosts", SYNC_KNOWN_HOSTS]


def shape_check_args(args: ModelWeightsArgs) -> list[str]:
    flags = ["--node", args.head.name, "--dir", args.dir, "--manifest", WEIGHTS_MANIFEST,
             "--tensor-parallel-size", str(args.tensor_parallel_size),
             "--gpu-memory-utilization", f"{args.gpu_memory_utilization:g}",
             "--key", SYNC_KEY, "--known-hosts", SYNC_KNOWN_HOSTS]
    return flags + [a for w in args.workers for a in ("--peer", f"{w.name}={args.ssh_user}@{w.ray_ip}")]


def render_authorized_key_line(head_ray_ip: str, public_key: str) -> str:
    """Only from the head's rail address, and nothing but commands (no pty, no forwarding)."""
    return f'from="{head_ray_ip}",restrict {public_key.strip()}\n'


KEY_FLAGS = ["--key", SYNC_KEY, "--comment", SYNC_KEY_COMMENT]


class ModelWeights(pulumi.ComponentResource):
    def __init__(self, name: str, args: ModelWeightsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:model_weights:ModelWeights", name, None, opts)
        head = args.head
        self.fetch = node_command(
            f"{head.name}-weights-fetch", head.connection,
            NodeScript(FETCH_SCRIPT, fetch_args(args), secrets={"HF_TOKEN": pulumi.Output.secret(args.hf_token or "")}),
            parent=self,
        )
        authorizations: list[remote.Command] = []
        if args.workers:
            # --owner: a renamed resource's old delete (run after the new create) keeps the key
            key_name = f"{head.name}-weights-sync-key"
            key_flags = [*KEY_FLAGS, "--owner", key_name]
            sync_key = node_command(
                key_name, head.connection,
                NodeScript(SYNC_KEY_SCRIPT, ["create", *key_flags], delete_args=["remove", *key_flags]),
                parent=self,
            )
        for worker in args.workers:
            authorize_name = f"{worker.name}-weights-authorize"
            flags = ["--comment", SYNC_KEY_COMMENT, "--owner", authorize_name]
            authorizations.append(node_command(
                authorize_name, worker.connection,
                NodeScript(AUTHORIZE_SCRIPT, ["add", *flags], delete_args=["remove", *flags],
                           payload=sync_key.stdout.apply(lambda key: render_authorized_key_line(head.ray_ip, key))),
                parent=self,
            ))
        # the workers' memory is read with the sync key, so after the authorizations
        self.shape_check = node_command(
            f"{head.name}-weights-shape-check", head.connection,
            NodeScript(SHAPE_SCRIPT, shape_check_args(args), payload=launch_file(SHAPE_PROGRAM)),
            parent=self, triggers=[args.repo], depends_on=[self.fetch, *authorizations],
        )
        self.syncs = [
            node_command(
                f"{worker.name}-weights-sync", head.connection, NodeScript(SYNC_SCRIPT, sync_args(args, worker)),
                parent=self, triggers=[args.repo], depends_on=[self.fetch, authorize, self.shape_check],
            )
            for worker, authorize in zip(args.workers, authorizations)
        ]
        self.register_outputs({})
