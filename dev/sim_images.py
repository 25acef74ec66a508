#!/usr/bin/env python3
"""sim_images.py — the simulated Sparks' images, built once and served from a local registry.

  .venv/bin/python dev/sim_images.py build   # build what changed, push it; leaves nothing running
  .venv/bin/python dev/sim_images.py serve   # the registry, read-only, in the foreground (for the sim)
  .venv/bin/python dev/sim_images.py refs    # the references the sim stack pulls, and their digests

What it builds is what Pulumi.sim.yaml names (serving.image, observability.images, for
serving.platform), every reference in REGISTRY:
- the serving base: Debian bookworm (debootstrap minbase) with python3, pip, nginx (at the
  versions serving.aptPackages names, checked), Ray [default] from the serving image's lock
  (launch/serving-image/ray-requirements.lock, with its hashes), the real huggingface_hub (the
  version requirements-dev.txt pins; the sim serves the Hub's API with tests/hub_standin.py),
  the vLLM stand-in (tests/sim/bin/vllm) and a torch stand-in for the NCCL check's ranks
  (tests/sim/images/torch-standin), with no
  apt source and no pip index, so launch/serving-image/Dockerfile
  builds on it offline (its pip and apt-get find everything installed);
- Prometheus, Alertmanager, node exporter: Debian's own binaries, the version the tag names;
- Grafana and the GPU exporter: stand-ins (tests/sim/images/*-standin), no real binary being
  available offline.

The cache (TWINSPARK_SIM_IMAGES_CACHE, default ~/.cache/twinspark-sim-images) holds the
registry's storage, the downloaded .debs and wheels, the base's root filesystem and, per
reference, the key of the inputs it was built from: an unchanged key whose digest the registry
still serves is not rebuilt. Builds run on a private dockerd (never the system's), started and
stopped here.

Python rather than shell: the keys hash the recipes' own source, the stack is read through
components.config (its defaults and validation), and the node side imports the pure pieces
(REGISTRY, serve_registry).

Here: the stack's images and the commands; how each image is built in sim_image_builds.py, the
registry in sim_registry.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.config import StackConfig, stack_file_config  # noqa: E402
from private_dockerd import private_dockerd  # noqa: E402
from sim_image_builds import recipes  # noqa: E402
# tests/sim, tests/sim_engine and tests/test_sim_images.py reach the registry through this module too
from sim_registry import (REGISTRY, REGISTRY_BINARY, REGISTRY_CA, REGISTRY_PORT, Registry,  # noqa: E402,F401
                          log, push_registry, registry_config, registry_tls, serve_registry, sim_certificate,
                          split_reference)

SIM_STACK = ROOT / "Pulumi.sim.yaml"


# ---- the stack: which images, for which platform -----------------------------------------------
def sim_stack() -> StackConfig:
    return stack_file_config(SIM_STACK)


# ---- the commands ----------------------------------------------------------------------------
def build_all(stack: StackConfig) -> dict[str, str]:
    """Every image of the stack in the registry, built where its key changed: {reference: digest}."""
    plan = recipes(stack)
    digests = {}
    with push_registry() as registry:
        todo = []
        for recipe in plan:
            digest = recipe.pushed_digest(registry)
            if digest:
                log(f"{recipe.ref}: up to date ({digest[:19]})")
                digests[recipe.ref] = digest
            else:
                todo.append(recipe)
        if todo:
            with private_dockerd() as docker:
                for recipe in todo:
                    started = time.monotonic()
                    local = f"{registry.addr}/{recipe.path}:{recipe.tag}"
                    log(f"{recipe.ref}: building (key {recipe.key[:12]})")
                    recipe.build(docker, registry, local)
                    docker("push", local)
                    digest = registry.manifest_digest(recipe.path, recipe.tag)
                    size = docker("image", "inspect", "--format", "{{.Size}}", local).stdout.strip()
                    recipe.stamp.parent.mkdir(parents=True, exist_ok=True)
                    recipe.stamp.write_text(json.dumps({"key": recipe.key, "digest": digest, "size": int(size)}))
                    log(f"{recipe.ref}: pushed {digest} ({int(size) / 1e6:.0f} MB, {time.monotonic() - started:.0f}s)")
                    digests[recipe.ref] = digest
    return digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build what changed and push it (starts and stops its own dockerd and registry)")
    serve = sub.add_parser("serve", help="the registry, read-only, in the foreground")
    serve.add_argument("--addr", default=f"0.0.0.0:{REGISTRY_PORT}")
    sub.add_parser("refs", help="the references the sim stack pulls, with the digests last pushed")
    args = parser.parse_args()
    stack = sim_stack()
    if args.command == "build":
        registry_tls()  # before the nodes boot: they trust its CA
        for ref, digest in build_all(stack).items():
            print(f"{ref}@{digest}" if ref == stack.serving.image else f"{ref} {digest}")
    elif args.command == "serve":
        os.execv(REGISTRY_BINARY, [REGISTRY_BINARY, "serve",
                                   str(registry_config(args.addr, read_only=True, tls=registry_tls()))])
    else:
        for recipe in recipes(stack):
            try:
                stamp = json.loads(recipe.stamp.read_text())
            except (OSError, ValueError):
                stamp = {}
            print(recipe.ref, stamp.get("digest", "(not built)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
