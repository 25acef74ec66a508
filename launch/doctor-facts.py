#!/usr/bin/env python3
"""doctor-facts.py — what `twinspark doctor` needs of one node beyond `status`'s probe, as JSON (fed
over ssh, read-only, the standard library only).

  python3 doctor-facts.py --hca rocep1s0f0 --hca roceP2p1s0f0 --container twinspark-serving \
      --manifest /home/nvidia/models/DeepSeek-V4-Flash-0731/.twinspark-manifest

Reports: the kernel, the driver (nvidia-smi), the host's NCCL package and the NCCL the serving
processes loaded (NCCL's INFO files in the container), the BIOS version, the HCAs' firmware, the
power mode (ACPI platform profile, CPU governor), the page cache's size, the GID index the last
serving start gave NCCL (its boot log), each HCA's PCIe link (speed and width, and the card's
capability), whether deep CPU idle states are enabled, swap, earlyoom, the serving container's
image ID, and two hashes the doctor compares between nodes and with the recipe: the weights as
the pin's manifest records them, and the drafter's files (any file whose path names a draft
model) as their bytes are on this disk. A fact that cannot be read is null, with the reason
under "errors".
"""

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import subprocess

DRAFTER_PATH = re.compile(r"draft|dspark|eagle|mtp", re.I)


def run(*argv, timeout=20):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    return (proc.stdout.strip(), None) if proc.returncode == 0 else (None, (proc.stderr or proc.stdout).strip()[-300:])


def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def link_speed(text):
    """'32.0 GT/s PCIe' -> 32.0; None when unreadable."""
    match = re.match(r"([0-9.]+)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


def pcie_link(hca, sysfs="/sys/class/infiniband"):
    device = os.path.join(sysfs, hca, "device")
    speed, width = read(os.path.join(device, "current_link_speed")), read(os.path.join(device, "current_link_width"))
    max_speed, max_width = read(os.path.join(device, "max_link_speed")), read(os.path.join(device, "max_link_width"))
    if None in (speed, width, max_speed, max_width):
        return None
    return {"speed_gts": link_speed(speed), "width": int(width), "max_speed_gts": link_speed(max_speed),
            "max_width": int(max_width)}


def deep_cstates_enabled(cpus="/sys/devices/system/cpu"):
    """True when any CPU may enter an idle state beyond state0 (polling); None without cpuidle."""
    flags = [read(path) for path in glob.glob(os.path.join(cpus, "cpu[0-9]*", "cpuidle", "state[1-9]*", "disable"))]
    flags = [f for f in flags if f is not None]
    return None if not flags else any(f == "0" for f in flags)


def nccl_in_use(container, debug_dir):
    """The NCCL the serving processes loaded (the image's, not the host's package): "NCCL version X"
    in the newest of NCCL's INFO files (NCCL_DEBUG_FILE, one a process), without its "+cudaY". Read
    inside the serving container: the files are root's and not world-readable (vLLM's umask)."""
    newest_first = ('cd "$1" && for f in $(ls -t); do grep -h -m 1 -o "NCCL INFO NCCL version [^ ]*" "$f" && break; '
                    'done')
    said, _ = run("docker", "exec", container, "sh", "-c", newest_first, "sh", debug_dir)
    return said.rsplit(" ", 1)[-1].split("+")[0] if said else None


def power_mode(sysfs="/sys"):
    """The ACPI platform profile and cpu0's frequency governor and driver; each None where absent."""
    cpufreq = os.path.join(sysfs, "devices/system/cpu/cpu0/cpufreq")
    return {"platform_profile": read(os.path.join(sysfs, "firmware/acpi/platform_profile")),
            "governor": read(os.path.join(cpufreq, "scaling_governor")),
            "cpufreq_driver": read(os.path.join(cpufreq, "scaling_driver"))}


def page_cache_gib(meminfo="/proc/meminfo"):
    """Cached + Buffers in GiB: on a Spark's unified memory what the page cache holds is not the GPU's."""
    fields = dict(line.split(":", 1) for line in (read(meminfo) or "").splitlines() if ":" in line)
    try:
        kib = sum(int(fields[name].split()[0]) for name in ("Cached", "Buffers"))
    except (KeyError, ValueError, IndexError):
        return None
    return round(kib / 2**20, 1)


def swap_enabled(swaps="/proc/swaps"):
    text = read(swaps)
    return None if text is None else len(text.splitlines()) > 1


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_hashes(manifest):
    """(all files, the drafter's files) as sha256 over sorted (path, sha256) pairs: the weights as the
    pin recorded them (reading every byte would take minutes), the drafter's files as they are on
    this disk (small; a drafter of other bytes costs a third of the decode speed, so it is read)."""
    text = read(manifest)
    if text is None:
        return None, None
    files = json.loads(text).get("files") or {}
    folder = os.path.dirname(manifest)

    def recorded(path):
        return files[path].get("sha256") if isinstance(files[path], dict) else files[path]

    def on_disk(path):
        try:
            return file_sha256(os.path.join(folder, path))
        except OSError as err:
            return f"unreadable ({err.strerror})"

    def digest(paths, sha256_of):
        pairs = [f"{p}\t{sha256_of(p)}" for p in sorted(paths)]
        return hashlib.sha256("\n".join(pairs).encode()).hexdigest() if pairs else None

    return digest(files, recorded), digest([p for p in files if DRAFTER_PATH.search(p)], on_disk)


def hca_firmware(hcas, sysfs="/sys/class/infiniband"):
    """The rails' HCAs' firmware versions, the distinct ones sorted (the ports of one card share one)."""
    versions = sorted({v for hca in hcas if (v := read(os.path.join(sysfs, hca, "fw_ver")))})
    return ", ".join(versions) or None


def gid_index_in_use(log_dir="/var/log/twinspark"):
    """NCCL_IB_GID_INDEX as the boot script of the last serving start logged it (boot-common.sh)."""
    found = []
    for log in glob.glob(os.path.join(log_dir, "boot-*.log")):
        found += re.findall(r"NCCL_IB_GID_INDEX=(\d+)", read(log) or "")
    return int(found[-1]) if found else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hca", action="append", default=[])
    parser.add_argument("--container", required=True)
    parser.add_argument("--manifest", required=True, help="the pin's manifest in model.dir")
    parser.add_argument("--nccl-debug-dir", required=True, help="where the serving processes write NCCL's INFO lines")
    args = parser.parse_args()
    errors = {}
    facts = {"kernel": platform.release()}
    driver, errors["driver"] = run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    facts["driver"] = driver.splitlines()[0].strip() if driver else None
    nccl, errors["nccl"] = run("dpkg-query", "-W", "-f", "${Version}", "libnccl2")
    facts["nccl"] = nccl.split("-")[0].split("+")[0] if nccl else None
    facts["nccl_image"] = nccl_in_use(args.container, args.nccl_debug_dir)
    facts["power"] = power_mode()
    facts["page_cache_gib"] = page_cache_gib()
    facts["pcie"] = {hca: link for hca in args.hca if (link := pcie_link(hca)) is not None}
    facts["bios"] = read("/sys/class/dmi/id/bios_version")
    facts["hca_firmware"] = hca_firmware(args.hca)
    facts["gid_index"] = gid_index_in_use()
    facts["cstates_enabled"] = deep_cstates_enabled()
    facts["swap_enabled"] = swap_enabled()
    earlyoom, state = run("systemctl", "is-active", "earlyoom")  # `inactive`/`failed` exit 3; no systemctl: unknown
    facts["earlyoom_active"] = True if earlyoom == "active" else False if state in ("inactive", "failed") else None
    image, errors["image"] = run("docker", "inspect", "--format", "{{.Image}}", args.container)
    facts["image_digest"] = image or None
    try:
        facts["model_sha256"], facts["drafter_sha256"] = manifest_hashes(args.manifest)
    except (ValueError, AttributeError) as err:
        facts["model_sha256"] = facts["drafter_sha256"] = None
        errors["manifest"] = str(err)
    facts["errors"] = {k: v for k, v in errors.items() if v}
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
