"""BoxRecovery: a box that stops answering, power-cycled and explained (GB10 has no BMC).

Creates on every node (managed files, root-owned):
- /usr/local/lib/twinspark/node-recorder.py and twinspark-node-recorder.service (ordered before
  docker): the memory picture on disk every contract.RECORDER_INTERVAL_S, and at boot, when the
  previous boot did not end cleanly, its report (kernel log, pstore, Xid lines, the last memory
  picture) under contract.FORENSICS_DIR; with the serving guard on, the node then waits out of
  serving until the guard's re-qualification releases it (launch/requalify.py).
On each node that watches a node with a `power` plug (Topology.power_watcher: the next node):
- /usr/local/lib/twinspark/power-watch.py, its plan (the watched node's addresses and plug's
  kind, powerWatch's timings), the plug's URL (a secret, 0600) and twinspark-power-watch.service.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Mapping, Optional, Sequence

import pulumi
from pydantic import SecretStr
from pulumi_command import remote as pulumi_remote

from core import contract

from .config import PowerWatch, StackConfig, Topology
from .remote import ManagedFile, launch_file, managed_file_commands, render_service_unit, sha256_text

WATCH_PATH = f"{contract.SERVING_GUARD_DIR}/{contract.POWER_WATCH_SCRIPT}"
WATCH_INTERVAL_S = 5
PLUG_URL_PATH = f"{contract.POWER_WATCH_DIR}/plug.url"  # the watched node's plug's URL: a secret, root-only


@dataclass(frozen=True)
class WatchedNode:
    name: str
    address: str  # its LAN address: the SSH banner
    plug_kind: str
    plug_url: SecretStr  # the config's: made a Pulumi secret where it becomes a file
    exporter_url: str = ""  # with observability: its node exporter, over the rail
    guard_textfile: str = ""  # the head with its guard: the guard's metrics file, as the exporter names it


@dataclass(frozen=True)
class RecoveryNode:
    name: str
    connection: pulumi_remote.ConnectionArgs
    # the node whose plug this one switches (Topology.power_watcher: each node has one watcher, so
    # each watcher at most one such node)
    watched: Optional[WatchedNode] = None


@dataclass(frozen=True)
class BoxRecoveryArgs:
    nodes: Sequence[RecoveryNode]
    timings: PowerWatch
    hold_until_requalified: bool  # the serving guard is on: it re-qualifies and releases
    metrics: bool  # observability: the watch's series for the textfile collector


def box_recovery_args(cfg: StackConfig, topology: Topology,
                      conns: Mapping[str, pulumi_remote.ConnectionArgs]) -> BoxRecoveryArgs:
    observed, guarded = cfg.observability.enabled, cfg.serving.guard.enabled
    watched: dict[str, WatchedNode] = {}
    for node in cfg.nodes:
        watcher = topology.power_watcher(node)
        if node.power is None or watcher is None:
            continue
        watched[watcher.name] = WatchedNode(
            node.name, topology.lan[node.name][0], node.power.kind, node.power.url,
            exporter_url=f"http://{topology.ray_ip(node)}:{contract.NODE_EXPORTER_PORT}/metrics" if observed else "",
            guard_textfile=PurePosixPath(contract.SERVING_GUARD_TEXTFILE).name
            if observed and guarded and node.role == "head" else "")
    return BoxRecoveryArgs([RecoveryNode(n.name, conns[n.name], watched.get(n.name)) for n in cfg.nodes],
                           cfg.power_watch, hold_until_requalified=guarded, metrics=observed)


def recorder_flags(node: str, hold: bool) -> list[str]:
    return ["--dir", contract.FORENSICS_DIR, "--node", node, "--pending", contract.UNCLEAN_BOOT_PENDING,
            *(["--hold", contract.UNCLEAN_BOOT_HOLD] if hold else [])]


def release_argv(node: str) -> list[str]:
    """What the re-qualification runs (as root) on each node once every check passed."""
    return ["/usr/bin/python3", contract.NODE_RECORDER, "release", *recorder_flags(node, hold=True)]


def render_recorder_unit(node: str, hold: bool) -> str:
    python = ["/usr/bin/python3", contract.NODE_RECORDER]
    log = f"{contract.LOG_DIR}/{contract.NODE_RECORDER_LOG}"
    script_hash = sha256_text(launch_file(contract.NODE_RECORDER_SCRIPT))  # a new script restarts the service
    return render_service_unit(
        f"# twinspark: the node recorder ({contract.NODE_RECORDER_SCRIPT} sha256 {script_hash})",
        "twinspark node recorder: the memory picture on disk, and what an unclean end of the last boot left",
        ["After=local-fs.target",
         "# its boot step decides, before any serving container starts, whether this node waits for re-qualification;",
         "# at shutdown it stops after docker, and its stop is the clean end's mark",
         "Before=docker.service"],
        [*python, "record", *recorder_flags(node, hold), "--interval", str(contract.RECORDER_INTERVAL_S)], log,
        exec_start_pre=[*python, "boot", *recorder_flags(node, hold)])


def render_watch_plan(w: WatchedNode, timings: PowerWatch) -> str:
    """Named by no node's name in a path or a step: renaming the watched node updates the plan in place."""
    return json.dumps({
        "nodes": [{"node": w.name, "host": w.address, "plug_kind": w.plug_kind, "plug_url_file": PLUG_URL_PATH,
                   "exporter_url": w.exporter_url, "guard_textfile": w.guard_textfile}],
        "miss_seconds": timings.miss_seconds, "off_seconds": timings.off_seconds,
        "window_seconds": timings.window_seconds, "interval": WATCH_INTERVAL_S}, indent=1) + "\n"


def render_watch_unit(metrics: bool, plan: str) -> str:
    """The script's and the plan's hashes in the unit: a new one restarts the watch (it reads both at start)."""
    argv = ["/usr/bin/python3", WATCH_PATH, "--plan", contract.POWER_WATCH_PLAN, "--status", contract.POWER_WATCH_STATUS,
            *(["--textfile", contract.POWER_WATCH_TEXTFILE] if metrics else [])]
    log = f"{contract.LOG_DIR}/{contract.POWER_WATCH_LOG}"
    digest = sha256_text(launch_file(contract.POWER_WATCH_SCRIPT), plan)
    return render_service_unit(
        f"# twinspark: the power watch ({contract.POWER_WATCH_SCRIPT} and its plan: sha256 {digest})",
        "twinspark power watch: power-cycles a peer that stopped answering, through its plug",
        ["After=network-online.target", "Wants=network-online.target"], argv, log)


def recovery_files(args: BoxRecoveryArgs, node: RecoveryNode) -> list[ManagedFile]:
    files = [ManagedFile("recorder-script", contract.NODE_RECORDER, launch_file(contract.NODE_RECORDER_SCRIPT), mode="0755"),
             ManagedFile("recorder-unit", f"/etc/systemd/system/{contract.NODE_RECORDER_UNIT}",
                         render_recorder_unit(node.name, args.hold_until_requalified), action="service")]
    if node.watched:
        files.append(ManagedFile("plug-url", PLUG_URL_PATH,
                                 pulumi.Output.secret(node.watched.plug_url.get_secret_value() + "\n"), mode="0600"))
        plan = render_watch_plan(node.watched, args.timings)
        files += [ManagedFile("watch-script", WATCH_PATH, launch_file(contract.POWER_WATCH_SCRIPT), mode="0755"),
                  ManagedFile("watch-plan", contract.POWER_WATCH_PLAN, plan),
                  ManagedFile("watch-unit", f"/etc/systemd/system/{contract.POWER_WATCH_UNIT}",
                              render_watch_unit(args.metrics, plan), action="service")]
    return files


class BoxRecovery(pulumi.ComponentResource):
    def __init__(self, name: str, args: BoxRecoveryArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:box_recovery:BoxRecovery", name, None, opts)
        self.commands: list[pulumi_remote.Command] = []
        for node in args.nodes:
            files = recovery_files(args, node)
            # each unit after the files it runs (its script, the watch's plan and plug URL): started before them it
            # would exit at once and be restarted 5 s later
            installed = managed_file_commands(node.name, "recovery", node.connection,
                                              [f for f in files if f.action != "service"], parent=self)
            self.commands += installed + managed_file_commands(
                node.name, "recovery", node.connection, [f for f in files if f.action == "service"], parent=self,
                depends_on=installed)
        self.register_outputs({})
