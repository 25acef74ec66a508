#!/usr/bin/env python3
"""The sim nodes' OCI runtime where the sandbox forces a change: runc itself, with one change.

dockerd on a simulated node runs every container through this wrapper (daemon.json:
default-runtime). On `create` it records what docker asked of the container — rlimits, the
prestart hooks (the GPU hook for `--gpus`), device nodes, capabilities, mounts — to
/var/log/twinspark-sim/runtime.jsonl, then lowers RLIMIT_MEMLOCK to the hard limit this
machine grants (on `exec` too: docker exec's process takes the container's limits): the
sandbox has no CAP_SYS_RESOURCE, so runc's setrlimit of the recipe's `--ulimit memlock=-1`
would fail (`error setting rlimit type 8: operation not permitted`).
Everything else is runc's own, unchanged.
"""
import json
import os
import sys
import time

RUNC = "/usr/sbin/runc"
RECORD = "/var/log/twinspark-sim/runtime.jsonl"


def bundle_of(argv: list[str]) -> str | None:
    if "create" not in argv:
        return None
    for i, arg in enumerate(argv):
        if arg in ("--bundle", "-b") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--bundle="):
            return arg.split("=", 1)[1]
    return os.getcwd()  # runc's default bundle


def kernel_memlock_hard_limit() -> int:
    """The kernel's own (getrlimit in a sim node reports what pam_limits would have granted)."""
    for line in open("/proc/self/limits"):
        if line.startswith("Max locked memory"):
            hard = line.split()[4]
            return 2**64 - 1 if hard == "unlimited" else int(hard)
    raise RuntimeError("no 'Max locked memory' in /proc/self/limits")


def clamp(process: dict, granted: int) -> None:
    for limit in process.get("rlimits", []):
        if limit.get("type") == "RLIMIT_MEMLOCK":
            limit["hard"] = min(limit["hard"], granted)
            limit["soft"] = min(limit["soft"], granted)


def clamp_exec(argv: list[str]) -> None:
    """`runc exec --process FILE`: docker exec's process takes the container's rlimits too."""
    for i, arg in enumerate(argv):
        path = argv[i + 1] if arg in ("--process", "-p") and i + 1 < len(argv) else \
            arg.split("=", 1)[1] if arg.startswith("--process=") else None
        if path:
            with open(path) as f:
                process = json.load(f)
            clamp(process, kernel_memlock_hard_limit())
            with open(path, "w") as f:
                json.dump(process, f)
            return


def clamp_and_record(bundle: str, container_id: str) -> None:
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    process = spec.get("process", {})
    requested = [dict(r) for r in process.get("rlimits", [])]
    granted = kernel_memlock_hard_limit()
    clamp(process, granted)
    with open(path, "w") as f:
        json.dump(spec, f)
    env = dict(e.split("=", 1) for e in process.get("env", []) if "=" in e)
    record = {
        "t": time.time(), "id": container_id,
        "rlimits": requested, "memlock_granted": granted,
        "prestart_hooks": [h.get("path") for h in spec.get("hooks", {}).get("prestart", [])],
        "devices": [d.get("path") for d in spec.get("linux", {}).get("devices", [])],
        "capabilities": sorted(process.get("capabilities", {}).get("effective", [])),
        "mounts": [m.get("destination") for m in spec.get("mounts", [])],
        "nvidia_visible_devices": env.get("NVIDIA_VISIBLE_DEVICES"),
        "args": process.get("args", []),
    }
    with open(RECORD, "a") as f:
        f.write(json.dumps(record) + "\n")


def main() -> None:
    argv = sys.argv[1:]
    bundle = bundle_of(argv)
    if bundle is not None:
        clamp_and_record(bundle, argv[-1])
    elif "exec" in argv:
        clamp_exec(argv)
    os.execv(RUNC, [RUNC, *argv])


if __name__ == "__main__":
    main()
