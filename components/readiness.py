"""Readiness: `pulumi up` ends only when the endpoint really serves.

Creates one remote command on the head (`{head}-readiness-wait`) running launch/wait-ready.sh
with the API key as a stdin secret: /health, then one real 1-token completion with the key,
through the API gateway, bounded by serving.readinessTimeoutMinutes, failing with the tail of
the head's logs. It re-runs whenever the head's serving or gateway container is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker
from pulumi_command import remote as pulumi_remote

from core import contract

from .remote import NodeScript, node_command

SCRIPT = "wait-ready.sh"


@dataclass(frozen=True)
class ReadinessArgs:
    head_name: str
    connection: pulumi_remote.ConnectionArgs
    port: int
    served_name: str
    timeout_minutes: int
    api_key: pulumi.Input[str]
    serving: Sequence[docker.Container]  # the head's serving and API gateway containers
    after: Sequence[pulumi.Resource] = ()  # several lanes: the lane's gateway opened again after a swap
    lane_gateway: bool = False  # several lanes: the gateway whose state a timeout reports is the lane's


def wait_ready_args(args: ReadinessArgs) -> list[str]:
    return [
        "--url", f"http://127.0.0.1:{args.port}",
        "--model", args.served_name,
        "--timeout-s", str(args.timeout_minutes * 60),
        "--container", contract.SERVING_CONTAINER,
        "--container", contract.LANE_GATEWAY_CONTAINER if args.lane_gateway else contract.API_GATEWAY_CONTAINER,
        "--log", f"{contract.LOG_DIR}/{contract.boot_log('head')}",
        "--log", f"{contract.LOG_DIR}/{contract.VLLM_LOG}",
        "--log", f"{contract.LOG_DIR}/{contract.API_GATEWAY_LOG}",
        "--log", f"{contract.LOG_DIR}/{contract.SERVING_GUARD_LOG}",
        "--hold", contract.SERVING_HOLD,
        "--memory-status", contract.MEMORY_CHECK_STATUS,
    ]


class Readiness(pulumi.ComponentResource):
    def __init__(self, name: str, args: ReadinessArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:readiness:Readiness", name, None, opts)
        self.command = node_command(
            f"{args.head_name}-readiness-wait", args.connection,
            NodeScript(SCRIPT, wait_ready_args(args), secrets={"VLLM_API_KEY": args.api_key}),
            parent=self, triggers=[c.id for c in args.serving], depends_on=[*args.serving, *args.after],
        )
        self.register_outputs({})
