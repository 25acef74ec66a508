"""ServingGuard: the head's guard over serving, a systemd service on the head's host.

Creates on the head (managed files, launch/managed-file.sh):
- /usr/local/lib/twinspark/serving-guard.py   launch/serving-guard.py: the canary (a known
  answer, a streamed tool call as agents make one through the recipe's canaryToolParser where
  it names one, a completion with a deadline, through the API gateway with the key), the restart
  after repeated failures of an engine that makes no
  progress, the crash-loop hold (its count on disk), and its metrics for the textfile collector;
- /usr/local/lib/twinspark/fabric_watch.py   launch/fabric_watch.py, which the guard imports: the
  head's rails and NCCL's network read each look; on a rail down or throttled or NCCL on Socket
  the guard drains the gateway (contract.DRAIN_FILE), stops serving and runs
  components/fabric_requalify.py's checks, serving again when they pass, holding when not;
- /etc/systemd/system/twinspark-serving-guard.service   runs it, restarted (action `service`)
  whenever the unit or the script changes, stopped and disabled on delete.
On the host, not in a container: it must outlive the vLLM it restarts, and it drives docker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote as pulumi_remote

from core import contract

from .config import ServingGuard as GuardConfig
from .remote import ManagedFile, launch_file, managed_file_commands, render_service_unit, sha256_text

UNIT_PATH = f"/etc/systemd/system/{contract.SERVING_GUARD_UNIT}"
SCRIPT_PATH = f"{contract.SERVING_GUARD_DIR}/{contract.SERVING_GUARD_SCRIPT}"
FABRIC_WATCH_PATH = f"{contract.SERVING_GUARD_DIR}/{contract.FABRIC_WATCH_MODULE}"


@dataclass(frozen=True)
class ServingGuardArgs:
    head_name: str
    connection: pulumi_remote.ConnectionArgs
    port: int  # the API gateway's, serving.port
    node_names: Sequence[str]  # what the hold tells the owner to reboot
    config: GuardConfig
    tool_parser: Optional[str] = None  # the recipe's canaryToolParser: None, no tool call in the canary
    # the fabric while serving: the head's rails (iface, hca) at fabric.linkSpeedMbps and fabric.mtu,
    # re-qualified by components/fabric_requalify.py's plan; no rails, no fabric watch
    rails: Sequence[tuple[str, str]] = ()
    rail_speed_mbps: int = 0
    rail_mtu: int = 0


def guard_argv(args: ServingGuardArgs) -> list[str]:
    c = args.config
    return [
        "/usr/bin/python3", SCRIPT_PATH,
        "--endpoint", f"http://127.0.0.1:{args.port}",
        "--secrets-file", f"{contract.BUNDLE_DIR}/{contract.SECRETS_FILE}",
        # the API gateway's loopback listener: vLLM's /metrics alone
        "--metrics-url", f"http://127.0.0.1:{contract.metrics_loopback_port(args.port)}/metrics",
        "--container", contract.SERVING_CONTAINER,
        "--restart-policy", contract.SERVING_RESTART_POLICY,
        "--status-file", contract.SERVING_GUARD_STATUS,
        "--restarts-file", contract.SERVING_GUARD_RESTARTS,
        "--textfile", contract.SERVING_GUARD_TEXTFILE,
        "--hold-file", contract.SERVING_HOLD,
        "--held-mark", contract.SERVING_GUARD_HELD_MARK,
        "--nodes", " and ".join(args.node_names),
        "--vllm-log", f"{contract.LOG_DIR}/{contract.VLLM_LOG}",
        "--interval", str(c.interval_seconds),
        "--retry-interval", str(c.retry_seconds),
        "--deadline", str(c.deadline_seconds),
        "--failures", str(c.failures_before_restart),
        "--restart-limit", str(c.restart_limit),
        "--window", str(c.restart_window_minutes * 60),
        *(["--tool-parser", args.tool_parser] if args.tool_parser else []),
        *fabric_flags(args),
    ]


def fabric_flags(args: ServingGuardArgs) -> list[str]:
    if not args.rails:
        return []
    flags = [a for iface, hca in args.rails for a in ("--rail", f"{iface}:{hca}")]
    return flags + ["--rail-speed-mbps", str(args.rail_speed_mbps), "--rail-mtu", str(args.rail_mtu),
                    "--nccl-debug-dir", contract.NCCL_DEBUG_DIR, "--drain-file", contract.DRAIN_FILE,
                    "--drain-seconds", str(args.config.drain_seconds), "--requalify-plan", contract.REQUALIFY_PLAN,
                    "--requalify-interval", str(args.config.requalify_seconds),
                    "--unclean-boot-hold", contract.UNCLEAN_BOOT_HOLD]


def render_guard_unit(args: ServingGuardArgs) -> str:
    log = f"{contract.LOG_DIR}/{contract.SERVING_GUARD_LOG}"
    # the script's hash is part of the unit: a new script restarts the service as a new unit would
    script_hash = sha256_text(launch_file(contract.SERVING_GUARD_SCRIPT), launch_file(contract.FABRIC_WATCH_MODULE))
    return render_service_unit(
        f"# twinspark: the serving guard on the head (canary, wedge, crash-loop hold)\n"
        f"# {contract.SERVING_GUARD_SCRIPT} and {contract.FABRIC_WATCH_MODULE} sha256 {script_hash}",
        "twinspark serving guard: known-answer canary, wedge detection, crash-loop hold",
        ["After=docker.service network-online.target", "Wants=docker.service"], guard_argv(args), log)


def guard_files(args: ServingGuardArgs) -> list[ManagedFile]:
    return [
        ManagedFile("script", SCRIPT_PATH, launch_file(contract.SERVING_GUARD_SCRIPT), mode="0755"),
        ManagedFile("fabric-watch", FABRIC_WATCH_PATH, launch_file(contract.FABRIC_WATCH_MODULE)),
        ManagedFile("unit", UNIT_PATH, render_guard_unit(args), action="service"),
    ]


class ServingGuard(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingGuardArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:serving_guard:ServingGuard", name, None, opts)
        self.commands = managed_file_commands(args.head_name, "guard", args.connection, guard_files(args), parent=self)
        self.register_outputs({})
