"""ServingImage: the serving image built on each node's own docker daemon.

Creates, per node, a docker provider over `ssh://user@host` and a `docker.Image` built from
launch/serving-image/Dockerfile (FROM serving.image + pinned ray[default]) for linux/arm64,
never pushed. It rebuilds only when the Dockerfile or its build args change; containers
take the image by id (`repo_digest`), so a rebuild replaces them and a no-op does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pulumi
import pulumi_docker as docker

from .config import Node, StackConfig
from .remote import private_key_file

IMAGE_NAME = "twinspark-vllm:ray"
# Relative to the project directory (where Pulumi runs the program): state stays the same
# whichever directory the project is checked out in.
BUILD_CONTEXT = Path("launch") / "serving-image"
PLATFORM = "linux/arm64"  # docker.Image defaults to the operator's arch otherwise


def docker_host(cfg: StackConfig, node: Node) -> str:
    return f"ssh://{cfg.ssh.user}@{node.host}"


def docker_ssh_opts(cfg: StackConfig, known_hosts: Optional[str]) -> list[str]:
    """Options for the local `ssh` the docker provider runs: non-interactive, key as configured."""
    opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
    key_file = private_key_file(cfg.ssh)
    if key_file is not None:
        opts += ["-i", str(key_file), "-o", "IdentitiesOnly=yes"]
    if known_hosts:
        opts += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]
    else:
        opts += ["-o", "StrictHostKeyChecking=accept-new"]
    return opts


def build_args(cfg: StackConfig) -> dict[str, str]:
    return {"BASE_IMAGE": cfg.serving.image, "RAY_VERSION": cfg.serving.ray_version}


class ServingImage(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        node: Node,
        known_hosts: Optional[str] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        super().__init__("twinspark:serving_image:ServingImage", name, None, opts)
        self.provider = docker.Provider(
            f"{name}-docker",
            host=docker_host(cfg, node),
            ssh_opts=docker_ssh_opts(cfg, known_hosts),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.image = docker.Image(
            f"{name}-image",
            image_name=IMAGE_NAME,
            build=docker.DockerBuildArgs(
                context=str(BUILD_CONTEXT),
                dockerfile=str(BUILD_CONTEXT / "Dockerfile"),
                platform=PLATFORM,
                args=build_args(cfg),
            ),
            skip_push=True,
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider),
        )
        self.image_id = self.image.repo_digest
        self.register_outputs({"imageId": self.image_id})


KNOWN_HOSTS_FILE = Path(".twinspark") / "known_hosts"


def render_known_hosts(cfg: StackConfig) -> str:
    return "".join(f"{n.host} {n.host_key}\n" for n in cfg.nodes if n.host_key)


def write_pinned_known_hosts(cfg: StackConfig) -> Optional[str]:
    """The docker provider runs the local `ssh`: give it the pinned host keys, if any."""
    text = render_known_hosts(cfg)
    if not text:
        return None
    KNOWN_HOSTS_FILE.parent.mkdir(exist_ok=True)
    KNOWN_HOSTS_FILE.write_text(text)
    return str(KNOWN_HOSTS_FILE.resolve())
