"""ServingImage: the serving image built on each node's own docker daemon.

Creates, per node, a docker provider over `ssh://user@host` and a `docker.Image` built from
launch/serving-image/Dockerfile (FROM serving.image + pinned ray[default]) for linux/arm64,
never pushed. It rebuilds only when the Dockerfile or its build args change; containers
take the image by id (`repo_digest`), so a rebuild replaces them and a no-op does not.

Old images stay on the node, so a rollback (`ops upgrade`) finds the previous one: the
provider's Delete of an Image is a no-op (pulumi-docker provider/provider.go), and each
build's tag names its inputs (`image_name`), so a new build never takes the previous one's
tag and leaves it dangling, where `docker image prune` would remove it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker

from node_contract import SERVING_IMAGE_REPOSITORY

# Relative to the project directory (where Pulumi runs the program): state stays the same
# whichever directory the project is checked out in.
BUILD_CONTEXT = Path("launch") / "serving-image"
PLATFORM = "linux/arm64"  # docker.Image defaults to the operator's arch otherwise


@dataclass(frozen=True)
class ServingImageArgs:
    node_name: str
    docker_host: str  # ssh://user@host
    ssh_opts: Sequence[str]  # for the local `ssh` the docker provider runs
    base_image: str
    ray_version: str


def build_args(args: ServingImageArgs) -> dict[str, str]:
    return {"BASE_IMAGE": args.base_image, "RAY_VERSION": args.ray_version}


def image_name(args: ServingImageArgs, dockerfile: str) -> str:
    """`twinspark-vllm:ray-<12 hex>`, a hash of the Dockerfile and the build args: one tag per build."""
    inputs = json.dumps({"dockerfile": dockerfile, "args": build_args(args)}, sort_keys=True)
    return f"{SERVING_IMAGE_REPOSITORY}:ray-{hashlib.sha256(inputs.encode()).hexdigest()[:12]}"


class ServingImage(pulumi.ComponentResource):
    def __init__(self, name: str, args: ServingImageArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:serving_image:ServingImage", name, None, opts)
        # ssh_opts carry operator-local details (key path, known_hosts path): a change there is
        # a provider update, which touches no image or container (pulumi-docker's DiffConfig is
        # the bridge's: no config key forces replacement). Another user@host is another daemon:
        # replacing the provider replaces its image and containers, as the commands' identity
        # trigger replaces them (remote.node_identity).
        self.provider = docker.Provider(
            f"{args.node_name}-docker",
            host=args.docker_host,
            ssh_opts=list(args.ssh_opts),
            opts=pulumi.ResourceOptions(parent=self, replace_on_changes=["host"]),
        )
        self.image = docker.Image(
            f"{args.node_name}-image-build",
            image_name=image_name(args, (BUILD_CONTEXT / "Dockerfile").read_text()),
            build=docker.DockerBuildArgs(
                context=str(BUILD_CONTEXT),
                dockerfile=str(BUILD_CONTEXT / "Dockerfile"),
                platform=PLATFORM,
                args=build_args(args),
            ),
            skip_push=True,
            opts=pulumi.ResourceOptions(parent=self, provider=self.provider),
        )
        self.image_id = self.image.repo_digest
        self.register_outputs({"imageId": self.image_id})
