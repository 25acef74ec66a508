"""ServingImage: one serving image for the whole cluster, built once on the head from one pinned base.

BaseImagePin resolves serving.image to a digest once for the whole stack: a tag is pulled on
the head by the `image-pin-resolve` step (launch/resolve-image.sh), whose stdout — the digest
— the stack keeps; a reference that names a digest is used as it is.

Creates, per node, a docker provider over `ssh://user@host`; on the head, a `docker.Image`
built from launch/serving-image/ (FROM the pinned base, then locked-install.sh: Ray from
ray-requirements.lock with its hashes, serving.aptPackages at their exact versions) for
serving.platform (linux/arm64 on a Spark), never pushed; on each worker, that very image,
handed over by the `{worker}-image-ship` step (launch/ship-image.sh on the head: `docker save |
ssh worker docker load` over the rail, with the weight copy's sync key and the worker's pinned
host key), so every node runs one image ID. Building on every node would not give that: a build
is not reproducible (timestamps, whatever the package indexes serve that minute).

The image rebuilds only when the build context or its build args change; containers take the
image by id, so a rebuild replaces them and a no-op does not. Old images stay on the nodes, so a
rollback (`ops upgrade`) finds the previous one: the provider's Delete of an Image is a no-op
(pulumi-docker provider/provider.go), a ship step deletes nothing, and each build's tag names its
inputs (`image_name`), so a new build never takes the previous one's tag and leaves it
dangling, where `docker image prune` would remove it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pulumi
import pulumi_docker as docker
from pulumi_command import remote as pulumi_remote

from core import contract
from core.contract import SERVING_IMAGE_REPOSITORY

from .remote import NodeScript, node_command

# Relative to the project directory (where Pulumi runs the program): state stays the same
# whichever directory the project is checked out in.
BUILD_CONTEXT = Path("launch") / "serving-image"
RESOLVE_SCRIPT = "resolve-image.sh"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# The pin keeps its digest whatever else changes: which node is head, its host key, the
# operator's credentials, the script's text. Only its arguments (the tag) re-run it, or an
# explicit `pulumi up --replace` of it. pulumi-command has no Read, so a refresh keeps the
# stored digest too (pulumi-go-provider infer/resource.go: without CustomRead, Read returns
# the state as it is) — unlike docker.RemoteImage, whose Read re-inspects the node's image
# by name and forgets it when it is gone, so the next `up` pulls the registry's tag again.
PIN_KEEPS_ACROSS = ["connection", "triggers", "stdin"]


def repository(image: str) -> str:
    """The reference without its tag or digest: the tag follows the last ':' after the last '/'."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":", 1)[0]


def pinned_reference(image: str, digest: str) -> str:
    return f"{repository(image)}@{digest}"


def printed_digest(stdout: str, what: str) -> str:
    """The step's last stdout line, sha256:<64 hex>; else a RunError naming `what` it should have printed."""
    lines = stdout.strip().splitlines()
    if not lines or not DIGEST.fullmatch(lines[-1].strip()):
        raise pulumi.RunError(f"{what} (last line: {lines[-1][:200] if lines else 'none'!r}) — expected "
                              "sha256:<64 hex>")
    return lines[-1].strip()


@dataclass(frozen=True)
class BaseImagePinArgs:
    image: str  # serving.image (or a monitoring image): a tag, or a reference naming a digest
    platform: str  # serving.platform: the tag is resolved to this platform's image
    connection: pulumi_remote.ConnectionArgs  # where a tag is resolved: the head


class BaseImagePin(pulumi.ComponentResource):
    """One digest for every node: `reference` (REPO@sha256:...), `digest`, `tag`. `image-pin`:
    serving.image, every node's FROM and the weight download; `observability-<capability>-image-pin`
    (through ObservabilityArgs.pin_image): each monitoring image, pulled by it on every node."""

    def __init__(self, name: str, args: BaseImagePinArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("twinspark:serving_image:BaseImagePin", name, None, opts)
        self.tag = args.image
        self.command: Optional[pulumi_remote.Command] = None
        if "@" in args.image:  # the user pinned it: nothing to resolve
            self.digest: pulumi.Output[str] = pulumi.Output.from_input(args.image.split("@", 1)[1])
        else:
            self.command = node_command(
                f"{name}-resolve", args.connection,
                NodeScript(RESOLVE_SCRIPT, ["--image", args.image, "--platform", args.platform]),
                parent=self, ignore_changes=PIN_KEEPS_ACROSS,
            )
            self.digest = self.command.stdout.apply(
                lambda out: printed_digest(out, f"{name}-resolve printed no digest for {args.image}"))
        self.reference = self.digest.apply(lambda digest: pinned_reference(args.image, digest))
        self.register_outputs({"digest": self.digest, "reference": self.reference})

    def output(self) -> pulumi.Output[dict]:
        """The stack output: what serving.image says, the digest every node builds from, and how
        to move a tag's pin on purpose."""
        repin = (self.command.urn.apply(lambda urn: f"pulumi up --replace '{urn}'") if self.command
                 else "set serving.image to another reference")
        return pulumi.Output.all(self.digest, self.reference, repin).apply(
            lambda v: {"tag": self.tag, "digest": v[0], "reference": v[1], "repin": v[2]})


SHIP_SCRIPT = "ship-image.sh"


@dataclass(frozen=True)
class ShipFrom:
    """Where a worker's image comes from: the head's build, over the first rail."""
    head_name: str
    head_connection: pulumi_remote.ConnectionArgs
    image_name: pulumi.Input[str]  # the build's tag
    image_id: pulumi.Input[str]  # the build's ID
    to: str  # user@worker-first-rail-address, as the weight copy reaches it
    # what lets the head in: the worker's pinned host key on the head, the sync key on the worker
    # (whose authorization opens for `run`: ModelWeightsArgs.image_ships)
    peer_trust: Sequence[pulumi.Resource] = ()

    def run(self, node_name: str) -> NodeScript:
        """The ship step's script and arguments, for `node_name`."""
        return NodeScript(SHIP_SCRIPT, pulumi.Output.all(self.image_name, self.image_id).apply(
            lambda v: ship_args(node_name, self, v[0], v[1])))


@dataclass(frozen=True)
class ServingImageArgs:
    node_name: str
    docker_host: str  # ssh://user@host
    ssh_opts: Sequence[str]  # for the local `ssh` the docker provider runs
    base_image: pulumi.Input[str]  # the pinned REPO@sha256:... (BaseImagePin.reference)
    apt_packages: Sequence[str]  # serving.aptPackages: NAME=VERSION
    platform: str  # serving.platform: docker.Image would build for the operator's arch otherwise
    installation: pulumi.Resource  # the node as installed (remote.node_installation): a reinstall rebuilds
    ship_from: Optional[ShipFrom] = None  # a worker: the head's image, not a build of its own


def build_args(args: ServingImageArgs) -> dict[str, pulumi.Input[str]]:
    return {"BASE_IMAGE": args.base_image, "APT_PACKAGES": " ".join(args.apt_packages),
            "API_SOCKET_GROUP": contract.API_SOCKET_GROUP, "API_SOCKET_GID": str(contract.API_SOCKET_GID)}


def build_context() -> dict[str, str]:
    """Every file of the build context by name: the Dockerfile, the lock, the install script."""
    return {p.name: p.read_text() for p in sorted(BUILD_CONTEXT.iterdir()) if p.is_file()}


def build_tag(context: dict[str, str], args: dict[str, str]) -> str:
    """`twinspark-vllm:ray-<12 hex>`, a hash of the build context and the build args: one tag per build."""
    inputs = json.dumps({"context": context, "args": args}, sort_keys=True)
    return f"{SERVING_IMAGE_REPOSITORY}:ray-{hashlib.sha256(inputs.encode()).hexdigest()[:12]}"


def image_name(args: ServingImageArgs, context: dict[str, str]) -> pulumi.Output[str]:
    # of the build args only BASE_IMAGE may be an Output, and its resolved value replaces it
    return pulumi.Output.from_input(args.base_image).apply(
        lambda base: build_tag(context, {**build_args(args), "BASE_IMAGE": base}))  # type: ignore[dict-item]


def ship_args(node_name: str, ship: ShipFrom, image: str, image_id: str) -> list[str]:
    return ["--node", ship.head_name, "--peer", node_name, "--image", image, "--id", image_id, "--to", ship.to,
            "--key", contract.SYNC_KEY, "--known-hosts", contract.SYNC_KNOWN_HOSTS]


def shipped_id(stdout: str, node_name: str) -> str:
    return printed_digest(stdout, f"{node_name}-image-ship printed no image ID")


class ServingImage(pulumi.ComponentResource):
    """The node's docker provider and the cluster's serving image on it: `image_id`, `image_name`."""

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
        ship = args.ship_from
        if ship is None:
            self.image_name = image_name(args, build_context())
            self.image = docker.Image(
                f"{args.node_name}-image-build",
                image_name=self.image_name,
                build=docker.DockerBuildArgs(
                    context=str(BUILD_CONTEXT),
                    dockerfile=str(BUILD_CONTEXT / "Dockerfile"),
                    platform=args.platform,
                    args=build_args(args),
                ),
                skip_push=True,
                opts=pulumi.ResourceOptions(parent=self, provider=self.provider, replace_with=[args.installation]),
            )
            self.image_id: pulumi.Output[str] = self.image.repo_digest  # skipPush: the local image ID
        else:
            # Runs on the head; a reinstalled worker re-runs none of it, so it follows the worker's
            # installation and is made again when that is (as the weight copy does).
            self.image_name = pulumi.Output.from_input(ship.image_name)
            self.ship = node_command(
                f"{args.node_name}-image-ship", ship.head_connection, ship.run(args.node_name), parent=self,
                depends_on=list(ship.peer_trust), replace_with=[args.installation],
            )
            self.image_id = self.ship.stdout.apply(lambda out: shipped_id(out, args.node_name))
        self.register_outputs({"imageId": self.image_id})
