#!/usr/bin/env python3
"""platform-facts.py — what a node runs, as one JSON line, for the platform gate.

  python3 platform-facts.py --node spark1 [--image IMAGE | --container NAME] [--base REF]

Host: DGX OS release, kernel, NVIDIA driver and the CUDA it supports, GPU name, BIOS
version and date, CMA size, the ConnectX firmware of each RDMA device. Image (--image, or the
image of the running --container): its ID (the `image` fact: the cluster's one build, the same
on every node), and vLLM, torch, NCCL (what torch loads, and the nvidia-nccl wheel), CUDA and
Ray read in a throwaway container of it (no network, no GPU). With --base (where the image was
built: the head), the image must start with the base's layers (pulled by digest if absent); if
it does not, exit 1 naming both. A fact that cannot be read is null, with the reason under
"errors".

Only reads (and, with --base, pulls that one digest). Fed on stdin by platform-facts.sh (the
`{node}-platform-facts` step) and by `python -m ops status`.
"""

import argparse
import json
import os
import re
import subprocess
import sys

# Runs inside the serving image with its own python3: versions only, nothing imported that
# needs a GPU.
IMAGE_PROBE = r"""
import importlib.metadata as md, json
out = {}
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
for key, dist in (("vllm", "vllm"), ("torch", "torch"), ("ray", "ray")):
    out[key] = version(dist)
out["nccl_pip"] = next((d.version for d in md.distributions()
                        if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl")), None)
try:
    import torch
    n = torch.cuda.nccl.version()
    out["nccl"] = ".".join(map(str, n)) if isinstance(n, tuple) else f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    out["image_cuda"] = torch.version.cuda
except Exception as err:
    out["error"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


def run(*argv, stdin=None, timeout=60):
    """(stdout, None) or (None, why)."""
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    if proc.returncode != 0:
        return None, (proc.stderr or proc.stdout).strip()[-300:] or f"exit {proc.returncode}"
    return proc.stdout, None


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def key_values(text):
    """KEY=VALUE lines (os-release, dgx-release), quotes removed."""
    return {m.group(1): m.group(2).strip().strip('"') for m in re.finditer(r"^(\w+)=(.*)$", text or "", re.M)}


def os_release():
    dgx = read("/etc/dgx-release")
    if dgx is not None:
        fields = key_values(dgx)
        name = fields.get("DGX_PRETTY_NAME") or fields.get("DGX_NAME") or "DGX OS"
        return f"{name} {fields.get('DGX_SWBUILD_VERSION', '')}".strip()
    return key_values(read("/etc/os-release")).get("PRETTY_NAME")


def bios_date(text):
    """DMI writes MM/DD/YYYY: as YYYY-MM-DD, which compares as text."""
    match = re.fullmatch(r"(\d{2})/(\d{2})/(\d{4})", (text or "").strip())
    return f"{match.group(3)}-{match.group(1)}-{match.group(2)}" if match else None


def meminfo_kb(key):
    match = re.search(rf"^{key}:\s+(\d+) kB", read("/proc/meminfo") or "", re.M)
    return match.group(1) if match else None


def host_facts(facts, errors):
    facts["os"] = os_release()
    out, err = run("uname", "-r")
    facts["kernel"] = out.strip() if out else None
    out, err = run("nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader")
    if out:
        driver, _, name = out.strip().splitlines()[0].partition(",")
        facts["driver"], facts["gpu"] = driver.strip(), name.strip() or None
    else:
        errors["driver"] = err
        version = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", read("/proc/driver/nvidia/version") or "")
        facts["driver"], facts["gpu"] = (version.group(1) if version else None), None
    out, err = run("nvidia-smi")
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", out or "")
    facts["cuda"] = cuda.group(1) if cuda else None
    if not cuda:
        errors["cuda"] = err or "nvidia-smi shows no CUDA version"
    facts["bios_version"] = (read("/sys/class/dmi/id/bios_version") or "").strip() or None
    facts["bios_date"] = bios_date(read("/sys/class/dmi/id/bios_date"))
    facts["cma_total_kb"] = meminfo_kb("CmaTotal")
    facts["cma_free_kb"] = meminfo_kb("CmaFree")
    facts["cx_firmware"] = cx_firmware(errors)


def cx_firmware(errors, root="/sys/class/infiniband"):
    """NAME=VERSION for every RDMA device, by name: the ConnectX firmware the rails run on."""
    try:
        devices = sorted(os.listdir(root))
    except OSError as err:
        errors["cx_firmware"] = str(err)
        return None
    found = [f"{d}={(read(os.path.join(root, d, 'fw_ver')) or '').strip() or 'unreadable'}" for d in devices]
    return ",".join(found) or None


def layers(ref):
    out, err = run("docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref)
    return (json.loads(out), None) if out else (None, err)


def image_facts(node, image, base, facts, errors):
    out, err = run("docker", "image", "inspect", "--format", "{{.Id}}", image)
    if out is None:
        errors["image"] = err
        if base:
            fail(f"{node}: the serving image {image} is not on this node: {err}")
        return
    facts["image"] = out.strip()
    if base:
        base_layers, err = layers(base)
        if base_layers is None:  # BuildKit keeps the base it built from out of the image list
            # by its digest, which names one image (the pin resolved it for serving.platform): no
            # --platform, which would be a second copy of that setting here
            _, pull_err = run("docker", "pull", "--quiet", base, timeout=1800)
            base_layers, err = layers(base)
            if base_layers is None:
                fail(f"{node}: the base image {base} cannot be read: {pull_err or err}")
        own_layers, err = layers(image)
        if own_layers is None or own_layers[:len(base_layers)] != base_layers:
            fail(f"{node}: the serving image {facts['image']} was not built from {base}: its first "
                 f"{len(base_layers)} layers are not the base's ({err or 'they differ'})")
        facts["image_base"] = base
    out, err = run("docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", image, "-",
                   stdin=IMAGE_PROBE, timeout=300)
    try:
        found = json.loads(out.strip().splitlines()[-1]) if out else {}
    except ValueError:
        found, err = {}, f"unreadable: {out.strip()[-200:]}"
    if not out or "error" in found:
        errors["image_versions"] = found.get("error") or err
    for key in ("vllm", "torch", "nccl", "nccl_pip", "image_cuda", "ray"):
        facts[key] = found.get(key)


def fail(message):
    print(f"platform-facts: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--image", help="the serving image (an ID or reference)")
    source.add_argument("--container", help="the serving image is this running container's")
    parser.add_argument("--base", help="the pinned base REPO@sha256:...: the image must start with its layers")
    args = parser.parse_args()
    if args.base and not (args.image or args.container):
        parser.error("--base needs --image or --container")
    facts, errors = {}, {}
    host_facts(facts, errors)
    image = args.image
    if args.container:
        out, err = run("docker", "inspect", "--format", "{{.Image}}", args.container)
        image = out.strip() if out else None
        if image is None:
            errors["image"] = err
            if args.base:
                fail(f"{args.node}: no serving container {args.container} to check against {args.base}: {err}")
    if image:
        image_facts(args.node, image, args.base, facts, errors)
    print(json.dumps({"node": args.node, "facts": facts, "errors": errors}, sort_keys=True))


if __name__ == "__main__":
    main()
