"""Readiness: `pulumi up` ends only when the endpoint really serves.

Creates one remote command on the head running launch/wait-ready.sh (fed on stdin, the API
key as its first stdin line): /health, then one real 1-token completion with the key,
bounded by serving.readinessTimeoutMinutes, failing with the tail of the head's logs. It
re-runs whenever the head container is replaced.
"""

from __future__ import annotations

from typing import Optional

import pulumi
from pulumi_command import remote

from .config import StackConfig
from .launch_bundle import LOG_DIR
from .remote import connection, script_command, script_stdin
from .serving_cluster import container_name

SCRIPT = "wait-ready.sh"


def wait_ready_args(cfg: StackConfig) -> list[str]:
    return [
        "--url", f"http://127.0.0.1:{cfg.serving.port}",
        "--model", cfg.model.served_name,
        "--timeout-s", str(cfg.serving.readiness_timeout_minutes * 60),
        "--container", container_name(cfg.head.role),
        "--log", f"{LOG_DIR}/vllm.log",
    ]


class Readiness(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        api_key: pulumi.Input[str],
        head_container: pulumi.Resource,
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:readiness:Readiness", name, None, opts)
        self.command = remote.Command(
            f"{name}-wait",
            connection=connection(cfg.ssh, cfg.head),
            create=script_command(SCRIPT, wait_ready_args(cfg), secret_env=["VLLM_API_KEY"]),
            stdin=script_stdin(SCRIPT, [api_key]),
            triggers=[head_container.id],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[head_container]),
        )
        self.register_outputs({})
