"""ModelWeights: the model on every node, downloaded once and copied over the cable.

Creates:
- on the head: `{head}-weights-revision` (launch/fetch-weights.sh resolve: the commit of
  `model.repo` to serve (StackConfig.model_revision: `model.revision`, the recipe's, or the hub's
  current one), resolved once and kept:
  its output is the stack's record of it), `{head}-weights-fetch` (fetch-weights.sh download:
  the shape check on the hub's listing and the head's MemTotal first, so a model that cannot
  load costs no download; then that commit, resumable, inside the serving base image, HF token
  as a stdin secret, every file checked against the hub's hashes) and `{head}-weights-sync-key` (launch/sync-key.sh: a
  dedicated ed25519 key for the copy's control connection);
- per worker: `{worker}-weights-forced-command` and `-forced-command-weights` (root-owned
  launch/sync-key-command.py and the weights.py it runs: all a sync key may do there),
  `{worker}-weights-host-key` (launch/peer-host-key.sh on the head: the worker's
  pinned host key for its rail addresses, in the known_hosts the copy and the image ship
  read), `{worker}-weights-memory` (model-shape-check.sh memory: its MemTotal, read on the worker
  itself, no key needed) and `{worker}-weights-authorize` (launch/authorize-key.sh: that key, restricted to
  the head's rail address and to the forced command bound to the model directory, the
  revision and the copy's rails, in the worker's authorized_keys; opened only when a step
  that uses it runs (the image ship and the copy: steps that exist exactly while the worker is a
  worker, so a failed `up` can never leave one run without its authorization), and taken back by
  `{worker}-weights-revoke` once they are done: revoke_after);
- on the head: `{head}-weights-shape-check` (launch/model-shape-check.sh with model-shape.py: config.json's heads
  must split over TP, its layers over PP, and the weights and one sequence of maxModelLen fit
  gpuMemoryUtilization x each node's MemTotal, the workers' from their memory steps), so a model that cannot
  load stops `pulumi up` before the copy;
- per worker: `{worker}-weights-sync` (launch/sync-weights.sh on the worker's source: rsync
  daemons on the worker's rail addresses for the copy only, many streams over every rail, a
  secret of the copy's own; then every file's sha256 checked on the worker, naming any
  mismatch), made again when the worker is reinstalled (it follows `{worker}-installation`).
  The source is the head, or where Topology.weight_copies fans out (a switch of four) a worker
  whose own copy is complete: that worker's `{source}-weights-sync-key`, and per relayed worker
  `{worker}-weights-relay-host-key` (on the source), `{worker}-weights-relay-authorize` and
  `-relay-revoke`, as the head's; a copy queued behind another through the same port waits for it.
launch/weights.py (the hub calls, hashing, records, the stream plan) and launch/model-shape.py
(vLLM's shape rules and the memory fit) ride on the steps' stdin: the fetch carries both. No step
does anything when its part is already complete; unchanged files are not
hashed again.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

import pulumi
from pulumi_command import remote as pulumi_remote

from core.contract import (CONTAINER_SLICE, FIREWALL_TABLE, SERVING_IMAGE_REPOSITORY, SYNC_KEY, SYNC_KEY_COMMAND_DIR,
                           SYNC_KEY_COMMENT, SYNC_KNOWN_HOSTS, WEIGHT_COPY_SET, WEIGHTS_MANIFEST, WEIGHTS_RECORD,
                           USER_STATE_DIR, WEIGHTS_SYNC_HOURS, WEIGHTS_SYNC_PORT)

from .config import DEFAULT_HUB_ENDPOINT, CopyRail
from .remote import (ManagedFile, NodeHandle, NodeScript, launch_file, managed_file_commands, node_command, payloads,
                     render_authorized_key_line, step_fingerprint)

FETCH_SCRIPT = "fetch-weights.sh"
SYNC_SCRIPT = "sync-weights.sh"
SHAPE_SCRIPT = "model-shape-check.sh"
SYNC_KEY_SCRIPT = "sync-key.sh"
AUTHORIZE_SCRIPT = "authorize-key.sh"
PEER_HOST_KEY_SCRIPT = "peer-host-key.sh"
WEIGHTS_PROGRAM = "weights.py"
SHAPE_PROGRAM = "model-shape.py"
FORCED_COMMAND = "sync-key-command.py"
# At most this many streams per rail (fewer where the cores are fewer: sync-weights.sh). One
# rsync stream is bound by a core or two (its copy loop and checksums), far below a 100G
# rail or the NVMe; four per rail keep both rails and the disk busy on a 20-core Spark.
MAX_STREAMS_PER_RAIL = 4


@dataclass(frozen=True)
class NodeAccess(NodeHandle):
    # a worker's: the rails of its link to the head (Topology.copy_rails: every rail, or in a ring
    # those of its cable to the head), the first carrying the control connection — the image ship
    # and, unless it has a relay, the weight copy cross them; the head's: none
    copy_rails: Sequence[CopyRail] = ()
    installation: Optional[pulumi.Resource] = None  # a worker as installed: a reinstall copies again

    @property
    def copy_ip(self) -> str:
        """The worker's end of the control connection (ssh with the sync key; the image ship too)."""
        return self.copy_rails[0].worker_ip


@dataclass(frozen=True)
class CopySource:
    """A worker another copies the weights from in place of the head (Topology.weight_relays),
    and the rails between the two (Topology.copy_rails, the receiver's end first)."""

    node: NodeAccess
    rails: Sequence[CopyRail]


@dataclass(frozen=True)
class ModelWeightsArgs:
    repo: str
    revision: Optional[str]  # StackConfig.model_revision; None: the hub's current commit, resolved once
    dir: str
    downloader_image: pulumi.Input[str]  # has huggingface_hub: the serving base image, by digest (BaseImagePin)
    ssh_user: str
    head: NodeAccess
    workers: Sequence[NodeAccess]
    hf_token: Optional[pulumi.Input[str]]
    tensor_parallel_size: int
    gpu_memory_utilization: float
    hub_endpoint: str = DEFAULT_HUB_ENDPOINT  # model.hubEndpoint
    memory_fit: Sequence[str] = ()  # the shape check's memory-fit flags (memory_fit_args)
    pipeline_parallel_size: int = 1
    # by worker name, where its copy leaves from a worker that holds the weights (a switch of four);
    # every other worker copies from the head (Topology.weight_relays)
    relays: Mapping[str, CopySource] = field(default_factory=dict)
    # by worker name, the worker whose copy from the same source over the same rails goes first
    # (Topology.weight_copy_queue: one copy at a time through a port)
    copy_after: Mapping[str, str] = field(default_factory=dict)
    # by worker name, the image ship's run on the head (serving_image.ShipFrom.run): the sync key's
    # other user, for which the worker's authorization opens too
    image_ships: Mapping[str, NodeScript] = field(default_factory=dict)


def hub_args(args: ModelWeightsArgs) -> list[str]:
    """Only for another hub: a stack on the default keeps its command lines (no update on upgrade)."""
    return [] if args.hub_endpoint == DEFAULT_HUB_ENDPOINT else ["--hub-endpoint", args.hub_endpoint]


def revision_args(args: ModelWeightsArgs, owner: str) -> list[str]:
    assert isinstance(args.downloader_image, str)  # resolved: ModelWeights passes the digest itself
    return ["resolve", "--repo", args.repo, "--revision", args.revision or "", "--image", args.downloader_image,
            "--owner", owner, *hub_args(args)]


def shape_args(args: ModelWeightsArgs) -> list[str]:
    """What the shape check judges, before the download (the fetch) and after it: one list for both.
    In the fetch's command line, so a new maxModelLen re-runs it: with the weights verified
    that is one stat of each file, no download and no hub call (fetch-weights.sh)."""
    # PP only where it is used: a stack without it keeps its command lines (no update on upgrade)
    pipeline = ["--pipeline-parallel-size", str(args.pipeline_parallel_size)] if args.pipeline_parallel_size > 1 else []
    return ["--tensor-parallel-size", str(args.tensor_parallel_size), *pipeline,
            "--gpu-memory-utilization", f"{args.gpu_memory_utilization:g}", *args.memory_fit]


def fetch_args(args: ModelWeightsArgs, revision: str) -> list[str]:
    assert isinstance(args.downloader_image, str)  # resolved: ModelWeights passes the digest itself
    return ["download", "--repo", args.repo, "--revision", revision, "--dir", args.dir,
            "--image", args.downloader_image, "--manifest", WEIGHTS_MANIFEST, "--record", WEIGHTS_RECORD,
            "--node", args.head.name, "--cgroup-parent", CONTAINER_SLICE, *hub_args(args), *shape_args(args)]


def copy_source(args: ModelWeightsArgs, worker: NodeAccess) -> CopySource:
    """Where `worker`'s copy leaves from: its relay, or the head over the worker's rails to it."""
    return args.relays.get(worker.name) or CopySource(args.head, worker.copy_rails)


def rail_flags(source: CopySource) -> list[str]:
    return [a for rail in source.rails for a in ("--rail", f"{rail.worker_ip}={rail.source_ip}")]


def sync_args(args: ModelWeightsArgs, worker: NodeAccess, revision: str,
              max_streams_per_rail: int = MAX_STREAMS_PER_RAIL) -> list[str]:
    """The revision is there for the trigger: a new one copies again."""
    source = copy_source(args, worker)
    return ["--node", source.node.name, "--peer", worker.name, "--dir", args.dir, "--manifest", WEIGHTS_MANIFEST,
            "--record", WEIGHTS_RECORD, "--revision", revision, "--to", f"{args.ssh_user}@{source.rails[0].worker_ip}",
            *rail_flags(source), "--port", str(WEIGHTS_SYNC_PORT), "--max-streams-per-rail", str(max_streams_per_rail),
            "--key", SYNC_KEY, "--known-hosts", SYNC_KNOWN_HOSTS]


def forced_command(args: ModelWeightsArgs, worker: NodeAccess, source: CopySource, revision: str) -> list[str]:
    """What `source`'s sync key may do on `worker` (launch/sync-key-command.py): bound to the
    model directory and this revision, the copy's rails, port and firewall set."""
    return ["python3", f"{SYNC_KEY_COMMAND_DIR}/{FORCED_COMMAND}", "--node", worker.name, "--dir", args.dir,
            "--manifest", WEIGHTS_MANIFEST, "--record", WEIGHTS_RECORD, "--revision", revision,
            "--port", str(WEIGHTS_SYNC_PORT), "--hours", str(WEIGHTS_SYNC_HOURS),
            "--firewall-set", f"inet {FIREWALL_TABLE} {WEIGHT_COPY_SET}", *rail_flags(source),
            "--image-repository", SERVING_IMAGE_REPOSITORY, "--state-dir", f"{USER_STATE_DIR}/weights-sync"]


def forced_command_files() -> list[ManagedFile]:
    """The forced command and the weights.py it runs, root-owned on each worker."""
    return [ManagedFile("forced-command", f"{SYNC_KEY_COMMAND_DIR}/{FORCED_COMMAND}", launch_file(FORCED_COMMAND)),
            ManagedFile("forced-command-weights", f"{SYNC_KEY_COMMAND_DIR}/{WEIGHTS_PROGRAM}",
                        launch_file(WEIGHTS_PROGRAM))]


def peer_host_key_args(source: CopySource, worker: NodeAccess) -> list[str]:
    """The worker's key as the stack pins it, for every address `source` reaches it at over the
    cable: the source's ssh checks the worker against the same key as `pulumi up`."""
    assert isinstance(worker.connection.host_key, str)  # SshAccess.connection's: the pinned key itself
    return ["--node", source.node.name, "--peer", worker.name, "--known-hosts", SYNC_KNOWN_HOSTS,
            *(a for rail in source.rails for a in ("--address", rail.worker_ip)),
            "--host-key", worker.connection.host_key]


def parse_revision(stdout: str) -> str:
    """The resolve step's last line: the commit."""
    lines = stdout.strip().splitlines()
    if not lines or not re.fullmatch(r"[0-9a-f]{40}", lines[-1]):
        raise ValueError(f"the revision step printed no commit sha as its last line: {stdout[-200:]!r}")
    return lines[-1]


def shape_check_args(args: ModelWeightsArgs, workers_memory: Sequence[str]) -> list[str]:
    """`workers_memory`: each worker's NODE=KB, as its memory step printed it (parse_memory_kb)."""
    flags = ["check", "--node", args.head.name, "--dir", args.dir, "--manifest", WEIGHTS_MANIFEST]
    flags += [a for kb in workers_memory for a in ("--memory-kb", kb)]
    return flags + shape_args(args)


def parse_memory_kb(stdout: str, node: str) -> str:
    """A worker's memory step's `memory-kb NODE=KB` line, as NODE=KB."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(f"memory-kb {node}="):
            return line.split(" ", 1)[1]
    raise ValueError(f"{node}: the memory step printed no 'memory-kb {node}=KB' line: {stdout[-300:]!r}")


def memory_fit_args(serving) -> list[str]:
    """The memory-fit estimate's inputs: the config's values over the recipe's, its KV facts."""
    recipe = serving.recipe_spec
    return ["--kv-cache-dtype", serving.kv_cache_dtype, "--max-model-len", str(serving.max_model_len),
            "--kv-bytes-per-token", str(recipe.memory.kv_bytes_per_token or 0),
            "--overhead-gib", f"{recipe.memory.overhead_gib:g}"]


def parse_memory_fit(stdout: str) -> dict:
    """The shape check's `memory-fit {json}` line, or {} where it printed none."""
    for line in reversed(stdout.splitlines()):
        if "memory-fit {" in line:
            return json.loads(line[line.index("{"):])
    return {}


KEY_FLAGS = ["--key", SYNC_KEY, "--comment", SYNC_KEY_COMMENT]


def fetch_payload() -> str:
    """The download's two programs (fetch-weights.sh read_payloads): the shape check on the hub's
    listing first, so a model that cannot load costs no download, then the download and pin."""
    return payloads(launch_file(SHAPE_PROGRAM), launch_file(WEIGHTS_PROGRAM))


class ModelWeights(pulumi.ComponentResource):
    def __init__(self, name: str, args: ModelWeightsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:model_weights:ModelWeights", name, None, opts)
        self._args = args
        head = args.head
        program = launch_file(WEIGHTS_PROGRAM)
        hf_token = {"HF_TOKEN": pulumi.Output.secret(args.hf_token or "")}
        # the download runs the serving base image by its digest, as every other step (never a tag
        # that could move between the pin and the download)
        image = pulumi.Output.from_input(args.downloader_image)
        # Replaced (its delete forgets the kept commit) only when the repo, model.revision or
        # the head changes; an update (new image, script, token or hub endpoint) prints the kept commit.
        revision_name = f"{head.name}-weights-revision"
        resolve = node_command(
            revision_name, head.connection,
            NodeScript(FETCH_SCRIPT, image.apply(lambda ref: revision_args(replace(args, downloader_image=ref),
                                                                         revision_name)),
                       secrets=hf_token, payload=program,
                       delete_args=["forget", "--owner", revision_name]),
            parent=self, triggers=[args.repo, args.revision or ""],
        )
        self.revision: pulumi.Output[str] = resolve.stdout.apply(parse_revision)
        self.fetch = node_command(
            f"{head.name}-weights-fetch", head.connection,
            NodeScript(FETCH_SCRIPT, pulumi.Output.all(self.revision, image).apply(
                lambda v: fetch_args(replace(args, downloader_image=v[1]), v[0])), secrets=hf_token,
                       payload=fetch_payload()),
            parent=self,
        )
        # each node a copy leaves from has its own sync key: the head, and any relay (a switch of four)
        senders = [head, *{r.node.name: r.node for r in args.relays.values()}.values()] if args.workers else []
        sync_keys = {sender.name: self._sync_key(sender, relay=sender is not head) for sender in senders}
        # each worker's MemTotal for the shape check, read on the worker (a reinstall reads it again)
        workers_memory = [node_command(
            f"{w.name}-weights-memory", w.connection, NodeScript(SHAPE_SCRIPT, ["memory", "--node", w.name]),
            parent=self, replace_with=[w.installation] if w.installation else (),
        ).stdout.apply(functools.partial(parse_memory_kb, node=w.name)) for w in args.workers]
        shape_run = NodeScript(SHAPE_SCRIPT, pulumi.Output.all(*workers_memory).apply(
            lambda kbs: shape_check_args(args, kbs)), payload=launch_file(SHAPE_PROGRAM))
        # The steps that reach a worker with a sync key, each run known before any of them is made:
        # a worker's authorization opens for exactly these and is revoked once they are done.
        sync_runs = {w.name: NodeScript(SYNC_SCRIPT, self.revision.apply(functools.partial(sync_args, args, w)),
                                        payload=program)  # no secret of the stack's: the copy draws its own
                     for w in args.workers}
        key_users: dict[tuple[str, str], list[pulumi.Output[str]]] = {}  # (worker, source) -> fingerprints
        for worker in args.workers:
            source = copy_source(args, worker)
            from_head = []
            if worker.name in args.image_ships:
                from_head.append(step_fingerprint(head.connection, args.image_ships[worker.name]))
            copy = step_fingerprint(source.node.connection, sync_runs[worker.name], [args.repo])
            key_users[(worker.name, head.name)] = from_head + ([copy] if source.node is head else [])
            if source.node is not head:
                key_users[(worker.name, source.node.name)] = [copy]
        self._key_users = key_users
        # (name, worker, source, the authorized_keys line, the step): what revoke_after takes back
        self._authorizations: list[tuple[str, NodeAccess, CopySource, pulumi.Output[str], pulumi_remote.Command]] = []
        # per worker, what lets the head in (the image ship, the copy):
        # the worker's pinned key on the head, the head's sync key on the worker
        ways_in: dict[str, list[pulumi_remote.Command]] = {}
        for worker in args.workers:
            programs = managed_file_commands(worker.name, "weights", worker.connection, forced_command_files(), self)
            ways_in[worker.name] = self._way_in(worker, CopySource(head, worker.copy_rails), sync_keys[head.name],
                                                programs)
        # the same ways in carry the serving image to the workers (serving_image.ShipFrom)
        self.peer_trust: dict[str, list[pulumi_remote.Command]] = ways_in
        self.shape_check = node_command(
            f"{head.name}-weights-shape-check", head.connection, shape_run,
            parent=self, triggers=[args.repo], depends_on=[self.fetch],
        )
        self.memory_fit: pulumi.Output[dict] = self.shape_check.stdout.apply(parse_memory_fit)
        # A copy runs on its source: a reinstalled worker's new key re-runs none of it, so the copy
        # follows the worker's installation and is made again when that is. A relayed copy starts
        # once its source's own copy is complete and verified, a queued one once the copy ahead
        # of it through the same port is (config order: both come first).
        syncs: dict[str, pulumi_remote.Command] = {}
        for worker in args.workers:
            source = copy_source(args, worker)
            after = [self.fetch, *ways_in[worker.name], self.shape_check]
            if worker.name in args.copy_after:
                after.append(syncs[args.copy_after[worker.name]])
            if source.node is not head:
                # the forced command is there already: the head's way in to this worker installed it
                after += [syncs[source.node.name],
                          *self._way_in(worker, source, sync_keys[source.node.name], [], relay=True)]
            syncs[worker.name] = node_command(
                f"{worker.name}-weights-sync", source.node.connection, sync_runs[worker.name],
                parent=self, triggers=[args.repo], depends_on=after,
                replace_with=[worker.installation] if worker.installation else (),
            )
        self._syncs = syncs
        self.syncs = list(syncs.values())
        self.register_outputs({"revision": self.revision})

    def revoke_after(self, image_ships: Mapping[str, pulumi_remote.Command]) -> list[pulumi_remote.Command]:
        """Each sync key's authorization taken back once its steps are done: the image ship
        (`image_ships`, by worker) for the head's key, the copy (verified) for the
        key it leaves from. It runs again whenever one of those runs again, and after every
        authorization: it shares the authorization's triggers (what makes each step run again) and
        adds its line, the IDs of the authorization and of the steps (a step made anew, say after an
        interrupted `up`, has a new one) and the authorization's output, stamped at each opening: a
        step that failed leaves the key admitted, and an `up` back to the earlier settings opens it
        again (its triggers changed) and so closes it, where the revoke's own triggers are as before."""
        revokes = []
        for authorize_name, worker, source, line, authorize in self._authorizations:
            users = [self._syncs[worker.name]] if copy_source(self._args, worker).node is source.node else []
            if source.node.name == self._args.head.name and worker.name in image_ships:
                users.append(image_ships[worker.name])
            flags = ["--comment", SYNC_KEY_COMMENT, "--owner", authorize_name]
            revokes.append(node_command(
                authorize_name.removesuffix("authorize") + "revoke", worker.connection,
                NodeScript(AUTHORIZE_SCRIPT, ["revoke", *flags], payload=line), parent=self,
                triggers=[*self._key_users[(worker.name, source.node.name)], line, authorize.id, *(u.id for u in users),
                          authorize.stdout],
                depends_on=users,
            ))
        return revokes

    def _sync_key(self, sender: NodeAccess, relay: bool) -> pulumi_remote.Command:
        """`sender`'s dedicated key for the copies it sends (its stdout: the public half); a relay's
        is made again with its installation (a reinstall took it).
        --owner: a renamed resource's old delete (run after the new create) keeps the key."""
        key_name = f"{sender.name}-weights-sync-key"
        key_flags = [*KEY_FLAGS, "--owner", key_name]
        return node_command(
            key_name, sender.connection,
            NodeScript(SYNC_KEY_SCRIPT, ["create", *key_flags], delete_args=["remove", *key_flags]),
            parent=self, replace_with=[sender.installation] if relay and sender.installation else (),
        )

    def _way_in(self, worker: NodeAccess, source: CopySource, sync_key: pulumi_remote.Command,
                programs: Sequence[pulumi_remote.Command], relay: bool = False) -> list[pulumi_remote.Command]:
        """What lets `source` in to `worker`: the worker's pinned key in the source's known_hosts
        (on the source: a reinstalled worker's new key is pinned there too; a reinstalled relay's
        known_hosts is written again) and the source's sync key in the worker's authorized_keys,
        admitted only from the source's rail address and only to run the forced command (installed
        by `programs`), for as long as the steps that use it run (revoke_after)."""
        kind = "relay-" if relay else ""
        host_key = node_command(
            f"{worker.name}-weights-{kind}host-key", source.node.connection,
            NodeScript(PEER_HOST_KEY_SCRIPT, peer_host_key_args(source, worker)), parent=self,
            replace_with=[source.node.installation] if relay and source.node.installation else (),
        )
        authorize_name = f"{worker.name}-weights-{kind}authorize"
        flags = ["--comment", SYNC_KEY_COMMENT, "--owner", authorize_name]
        line = pulumi.Output.all(sync_key.stdout, self.revision).apply(lambda v: render_authorized_key_line(
            source.rails[0].source_ip, v[0], forced_command(self._args, worker, source, v[1])))
        authorize = node_command(
            authorize_name, worker.connection,
            NodeScript(AUTHORIZE_SCRIPT, ["add", *flags], delete_args=["remove", *flags], payload=line),
            parent=self, triggers=self._key_users[(worker.name, source.node.name)],
            # no replace_with of the worker's installation: a replaced step's delete would run on the
            # reinstalled node with its old host key; the new key's update runs `add` again instead
            depends_on=list(programs),
        )
        self._authorizations.append((authorize_name, worker, source, line, authorize))
        return [host_key, authorize]
