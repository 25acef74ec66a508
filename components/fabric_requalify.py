"""FabricRequalify: what the head's serving guard runs when the fabric fails while it serves.

The guard (components/serving_guard.py) watches the head's rails, the workers' (their `look`
over its key) and NCCL's choice in vLLM's log (launch/fabric_watch.py); on a rail down or
throttled, or NCCL on Socket, it drains the gateway, stops serving and runs launch/requalify.py:
every node's fabric check, then every node's NCCL rank, with the flags `pulumi up` ran them with,
and serves again only when all pass.

Creates, on every node (managed files, root-owned): requalify.py beside the guard, the checks'
scripts under REQUALIFY_DIR (fabric-check.sh, nccl-check.sh, the prelude they source,
nccl-allreduce-check.py, and fabric_watch.py for a worker's `look` at its own rails) and the
node's plan (its fabric-check and NCCL-rank flags; on the head the workers and the key too). On
the head: a key of its own (`{head}-requalify-key`, launch/sync-key.sh) and, per worker, the
worker's pinned host key for the address it is reached at (`{worker}-requalify-host-key`). On
each worker: that key authorized from the head's rail address only, to run `requalify.py forced`
(`{worker}-requalify-authorize`): the `fabric`, `nccl-rank` or `look` of the worker's own plan
and nothing else — no shell, no forwarding, no pty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import pulumi
from pulumi_command import remote as pulumi_remote

from core import contract

from .remote import ManagedFile, NodeScript, launch_file, managed_file_commands, node_command, render_authorized_key_line

KEY_SCRIPT = "sync-key.sh"  # makes any dedicated key: --key, --comment
HOST_KEY_SCRIPT = "peer-host-key.sh"
AUTHORIZE_SCRIPT = "authorize-key.sh"
# each check's file, by the step that installs it (no `-nccl-` in a step's name: that names the NCCL check's ranks)
CHECK_FILES = {"fabric-script": "fabric-check.sh", "rank-script": "nccl-check.sh", "prelude": "prelude.sh",
               "rank-program": "nccl-allreduce-check.py", "fabric-watch": contract.FABRIC_WATCH_MODULE}
PLAN_PATH = contract.REQUALIFY_PLAN
FORCED_COMMAND = ["python3", f"{contract.SERVING_GUARD_DIR}/{contract.REQUALIFY_SCRIPT}", "forced", "--plan", PLAN_PATH]


@dataclass(frozen=True)
class RequalifyNode:
    name: str
    connection: pulumi_remote.ConnectionArgs
    fabric_flags: Sequence[str]  # the node's fabric-check.sh flags as `up` runs it (FabricCheck's)
    nccl_flags: pulumi.Input[Sequence[str]]  # its NCCL rank's nccl-check.sh flags; [] when the check is off
    address: str = ""  # a worker: the head reaches it here (its first rail toward the head)
    source_address: str = ""  # a worker: the head's end of that rail (the authorization's from=)
    host_key: str = ""  # a worker: its pinned SSH host key
    # what runs as root once every check passed: the node recorder's release of an unclean boot's hold
    # (components/box_recovery.py's release_argv)
    release: Sequence[str] = ()


@dataclass(frozen=True)
class FabricRequalifyArgs:
    head: RequalifyNode
    workers: Sequence[RequalifyNode]
    ssh_user: str


def requalify_args(cfg, topology, conns: Mapping[str, pulumi_remote.ConnectionArgs], host_keys: Mapping[str, str],
                   fabric_flags: Mapping[str, Sequence[str]],
                   nccl_flags: Mapping[str, pulumi.Input[Sequence[str]]],
                   release: Mapping[str, Sequence[str]]) -> FabricRequalifyArgs:
    """Each node's checks as `up` runs them (FabricCheck's flags, its NCCL rank's); a worker
    reached over its first rail toward the head; `release`: each node's, once they pass."""
    def node(n, rail=None) -> RequalifyNode:
        return RequalifyNode(n.name, conns[n.name], fabric_flags[n.name], nccl_flags[n.name],
                             address=rail.worker_ip if rail else "", source_address=rail.source_ip if rail else "",
                             host_key=host_keys[n.name] if rail else "", release=release[n.name])

    return FabricRequalifyArgs(head=node(cfg.head), workers=[node(w, topology.copy_rails(w)[0]) for w in cfg.workers],
                               ssh_user=cfg.ssh.user)


def node_plan(node: RequalifyNode, nccl_flags: Sequence[str]) -> dict:
    """A node's own half: the fabric check without the login's memlock (no login here, and the
    limit does not change while serving), its NCCL rank."""
    return {"node": node.name, "fabric": [*node.fabric_flags, "--memlock", "skip"],
            "nccl": list(nccl_flags), "release": list(node.release), "unclean_boot_hold": contract.UNCLEAN_BOOT_HOLD}


def render_plan(args: FabricRequalifyArgs, node: RequalifyNode, nccl_flags: Sequence[str]) -> str:
    plan = node_plan(node, nccl_flags)
    if node is args.head:
        # the guard runs as root: the key and known_hosts are the ssh user's, named by ~user
        home = f"~{args.ssh_user}/"
        plan.update(peers=[{"node": w.name, "address": w.address} for w in args.workers], user=args.ssh_user,
                    key=contract.REQUALIFY_KEY.replace("~/", home),
                    known_hosts=contract.REQUALIFY_KNOWN_HOSTS.replace("~/", home))
    return json.dumps(plan, indent=1) + "\n"


def requalify_files(args: FabricRequalifyArgs, node: RequalifyNode) -> list[ManagedFile]:
    plan = pulumi.Output.from_input(node.nccl_flags).apply(lambda flags: render_plan(args, node, flags))
    files = [ManagedFile("script", f"{contract.SERVING_GUARD_DIR}/{contract.REQUALIFY_SCRIPT}",
                         launch_file(contract.REQUALIFY_SCRIPT), mode="0755"),
             ManagedFile("plan", PLAN_PATH, plan)]
    # as run by hand: each script sources the prelude beside it
    files += [ManagedFile(step, f"{contract.REQUALIFY_DIR}/{name}", launch_file(name), mode="0755")
              for step, name in CHECK_FILES.items()]
    return files


class FabricRequalify(pulumi.ComponentResource):
    def __init__(self, name: str, args: FabricRequalifyArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:fabric_requalify:FabricRequalify", name, None, opts)
        self.commands: list[pulumi_remote.Command] = []
        installed = {n.name: managed_file_commands(n.name, "requalify", n.connection, requalify_files(args, n),
                                                   parent=self)
                     for n in (args.head, *args.workers)}
        for files in installed.values():
            self.commands += files
        head = args.head
        key_flags = ["--key", contract.REQUALIFY_KEY, "--comment", contract.REQUALIFY_KEY_COMMENT,
                     "--owner", f"{head.name}-requalify-key"]
        key = node_command(f"{head.name}-requalify-key", head.connection,
                           NodeScript(KEY_SCRIPT, ["create", *key_flags], delete_args=["remove", *key_flags]),
                           parent=self)
        self.commands.append(key)
        for worker in args.workers:
            self.commands.append(node_command(
                f"{worker.name}-requalify-host-key", head.connection,
                NodeScript(HOST_KEY_SCRIPT, ["--node", head.name, "--peer", worker.name,
                                             "--known-hosts", contract.REQUALIFY_KNOWN_HOSTS,
                                             "--address", worker.address, "--host-key", worker.host_key]),
                parent=self))
            owner = f"{worker.name}-requalify-authorize"
            flags = ["--comment", contract.REQUALIFY_KEY_COMMENT, "--owner", owner]
            # mypy cannot type a lambda whose default binds the loop's worker
            line = key.stdout.apply(lambda public, w=worker: render_authorized_key_line(  # type: ignore[misc]
                w.source_address, public, FORCED_COMMAND))
            self.commands.append(node_command(
                owner, worker.connection,
                NodeScript(AUTHORIZE_SCRIPT, ["add", *flags], delete_args=["remove", *flags], payload=line),
                parent=self, depends_on=installed[worker.name]))
        self.register_outputs({})
