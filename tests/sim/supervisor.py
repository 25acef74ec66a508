"""Stand-in for dockerd running one container (restart policy unless-stopped, changeable).

Runs inside a simulated node. Each "container" is its own pid and mount namespace (so when
its PID 1 — the boot script, later vLLM — exits, every process it started dies with it,
as in docker), with the entrypoint, environment and bind mounts of the program's own
docker.Container: bundle -> /twinspark (ro), model dir -> /models/<name> (ro, serving
containers only), /var/log/twinspark.
Events go to /var/log/twinspark-sim/supervisor-<name>.jsonl; the container's PID 1 (as
the node sees it) to /run/twinspark-sim/<name>.pid. The docker shim drives it as dockerd's
API would, through files beside the pid: <name>.policy (`docker update --restart`),
<name>.stopped (`docker stop`: no restart until `docker start` removes it), <name>.manual
(`docker restart`: the next start is not the restart policy's, so RestartCount stays).
A start event says `restart: true` when the policy restarted it (docker's RestartCount);
the container's id is this supervisor's (one supervisor, one container).
"""

import argparse
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

SIM_LOG_DIR = Path("/var/log/twinspark-sim")
RUN_DIR = Path("/run/twinspark-sim")


def event(name: str, **fields) -> None:
    with open(SIM_LOG_DIR / f"supervisor-{name}.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), **fields}) + "\n")


def container_script(args) -> str:
    binds = [(args.bundle_dir, args.container_bundle_dir, True), (args.log_dir, args.log_dir, False)]
    if args.model_dir:
        binds.append((args.model_dir, args.container_model_dir, True))
    lines = ["set -e"]
    for source, target, read_only in binds:
        lines.append(f"mkdir -p {shlex.quote(source)} {shlex.quote(target)}")
        if source != target:
            lines.append(f"mount --bind {shlex.quote(source)} {shlex.quote(target)}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
    base_env = [f"PATH={args.path}", "HOME=/root", "LANG=C.UTF-8", *args.env]
    env = " ".join(shlex.quote(e) for e in base_env)
    lines.append(f"exec env -i {env} {shlex.join(args.entrypoint)}")
    return "\n".join(lines)


def container_init_pid(unshare_pid: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.05)
    return unshare_pid


def policy(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unless-stopped"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--entrypoint", action="append", required=True, help="one argv element, in order")
    parser.add_argument("--bundle-dir", required=True)
    parser.add_argument("--container-bundle-dir", required=True)
    parser.add_argument("--model-dir", default="")
    parser.add_argument("--container-model-dir", default="")
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--path", required=True, help="PATH inside the container")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the container, as docker -e")
    args = parser.parse_args()
    SIM_LOG_DIR.mkdir(parents=True, exist_ok=True)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    script = container_script(args)
    control = {kind: RUN_DIR / f"{args.name}.{kind}" for kind in ("policy", "stopped", "manual")}
    for path in control.values():
        path.unlink(missing_ok=True)
    container_id = f"sim-{os.getpid()}"
    starts, delay, by_policy = 0, 0.05, False
    while True:
        starts += 1
        started = time.monotonic()
        with open(SIM_LOG_DIR / f"container-{args.name}.log", "a") as out:
            proc = subprocess.Popen(
                ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                 "bash", "-c", script],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
            pid = container_init_pid(proc.pid)
            (RUN_DIR / f"{args.name}.pid").write_text(str(pid))
            event(args.name, event="start", n=starts, pid=pid, id=container_id, restart=by_policy)
            rc = proc.wait()
        event(args.name, event="exit", n=starts, rc=rc)
        if control["manual"].exists():  # docker restart: at once, and not counted
            control["manual"].unlink()
            by_policy = False
            continue
        # docker stop, or restart policy "no": down until `docker start`
        if control["stopped"].exists() or policy(control["policy"]) == "no":
            control["stopped"].touch()
            while control["stopped"].exists():
                time.sleep(0.2)
            by_policy = False
            continue
        # docker's restart delay: 100 ms, doubled after each container that ran under 10 s
        delay = 0.1 if time.monotonic() - started >= 10 else min(delay * 2, 60)
        time.sleep(delay)
        by_policy = True
        if control["stopped"].exists():  # a `docker stop` during the delay: down until `docker start`
            while control["stopped"].exists():
                time.sleep(0.2)
            by_policy = False


if __name__ == "__main__":
    raise SystemExit(main())
