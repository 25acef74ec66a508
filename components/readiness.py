"""Readiness: `pulumi up` ends only when the endpoint really serves.

Creates one remote command on the head (`{head}-readiness-wait`) running launch/wait-ready.sh
with the API key as a stdin secret: /health, then one real 1-token completion with the key,
bounded by serving.readinessTimeoutMinutes, failing with the tail of the head's logs. It
re-runs whenever the head container is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_command import remote

import node_contract as contract

from .remote import NodeScript, node_command

SCRIPT = "wait-ready.sh"


@dataclass(frozen=True)
class ReadinessArgs:
    head_name: str
    connection: remote.ConnectionArgs
    port: int
    served_name: str
    timeout_minutes: int
    api_key: pulumi.Input[str]
    head_container: pulumi.Resource


def wait_ready_args(args: ReadinessArgs) -> list[str]:
    return [
        "--url", f"http://127.0.0.1:{args.port}",
        "--model", args.served_name,
        "--timeout-s", str(args.timeout_minutes * 60),
        "--container", contract.serving_container_name("head"),
        "--log", f"{contract.LOG_DIR}/{contract.boot_log('head')}",
        "--log", f"{contract.LOG_DIR}/{contract.VLLM_LOG}",
    ]


class Readiness(pulumi.ComponentResource):
    def __init__(self, name: str, args: ReadinessArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:readiness:Readiness", name, None, opts)
        self.command = node_command(
            f"{args.head_name}-readiness-wait", args.connection,
            NodeScript(SCRIPT, wait_ready_args(args), secrets={"VLLM_API_KEY": args.api_key}),
            parent=self, triggers=[args.head_container.id], depends_on=[args.head_container],
        )
        self.register_outputs({})
