#!/usr/bin/env python3
"""node-status.py — one node's serving state as JSON, for `python -m ops status` (fed over ssh).

  python3 node-status.py --name spark1 --container twinspark-serving \
      --rail enp1s0f0np0:rocep1s0f0 --rail enP2p1s0f0np0:roceP2p1s0f0 \
      [--ray-head 10.0.0.1 --membership /twinspark/ray-membership.py --dashboard-port 8265] \
      [--guard-status /run/twinspark/serving-guard/status.json]

Reports the serving container (state, restart count), each rail (link, speed, MTU, RoCE
port state and active MTU), the GPU's temperature and power, and on the head (--ray-head)
the Ray nodes alive with their GPUs; with --guard-status, the serving guard's latest verdict
and this node's clock (`ops upgrade` judges a verdict's age by it). Only reads; needs docker
access, nvidia-smi, ibv_devinfo.
"""

import argparse
import json
import re
import subprocess
import time


def run(*argv, timeout=20):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, str(err)
    return (proc.stdout, None) if proc.returncode == 0 else (None, (proc.stderr or proc.stdout).strip()[-300:])


def container_state(name):
    out, err = run("docker", "inspect", "--format", "{{json .State}}|{{.RestartCount}}", name)
    if out is None:
        return {"name": name, "present": False, "error": err}
    state_json, restarts = out.strip().rsplit("|", 1)
    state = json.loads(state_json)
    return {"name": name, "present": True, "status": state.get("Status"), "restarting": bool(state.get("Restarting")),
            "restart_count": int(restarts), "started_at": state.get("StartedAt"), "exit_code": state.get("ExitCode")}


def read_sys(iface, key):
    try:
        with open(f"/sys/class/net/{iface}/{key}") as f:
            return f.read().strip()
    except OSError:
        return None


def rail_state(iface, hca):
    speed = read_sys(iface, "speed")
    mtu = read_sys(iface, "mtu")
    rail = {"iface": iface, "hca": hca, "operstate": read_sys(iface, "operstate"),
            "speed_mbps": int(speed) if speed and speed.lstrip("-").isdigit() else None,
            "mtu": int(mtu) if mtu else None, "roce_state": None, "roce_active_mtu": None}
    out, err = run("ibv_devinfo", "-d", hca, "-i", "1")
    if out is None:
        rail["roce_error"] = err
    else:
        state = re.search(r"^\s*state:\s*(\S+)", out, re.M)
        active = re.search(r"^\s*active_mtu:\s*(\d+)", out, re.M)
        rail["roce_state"] = state.group(1) if state else None
        rail["roce_active_mtu"] = int(active.group(1)) if active else None
    return rail


def gpu_state():
    out, err = run("nvidia-smi", "--query-gpu=temperature.gpu,power.draw", "--format=csv,noheader,nounits")
    if out is None:
        return {"error": err}
    first = out.strip().splitlines()[0].split(",")
    as_float = lambda v: float(v) if re.fullmatch(r"[\d.]+", v.strip()) else None  # noqa: E731  "[N/A]"
    return {"temperature_c": as_float(first[0]), "power_w": as_float(first[1])}


def ray_nodes(container, head_ip, membership, dashboard_port):
    out, err = run("docker", "exec", container, "python3", membership, "alive", "--head", head_ip,
                   "--dashboard-port", str(dashboard_port))
    return {"error": err} if out is None else {"nodes": json.loads(out)}


def guard_status(path):
    """The verdict file as it is, with this node's time; read with sudo when the guard keeps it private."""
    reading = {"now": time.time()}
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        reading["error"] = f"{path}: no such file (is the serving guard running?)"
        return reading
    except PermissionError:
        text, err = run("sudo", "-n", "cat", path)
        if text is None:
            reading["error"] = f"{path}: not readable ({err})"
            return reading
    try:
        reading["status"] = json.loads(text)
    except ValueError as err:
        reading["error"] = f"{path}: not JSON ({err})"
    return reading


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--container", required=True)
    parser.add_argument("--rail", action="append", default=[], help="IFACE:HCA")
    parser.add_argument("--ray-head", help="this node is the head: list Ray nodes via its state API")
    parser.add_argument("--membership", help="ray-membership.py inside the container (with --ray-head)")
    parser.add_argument("--dashboard-port", type=int, help="the head's Ray dashboard port (with --ray-head)")
    parser.add_argument("--guard-status", help="the serving guard's verdict file: report it")
    args = parser.parse_args()
    if args.ray_head and not (args.membership and args.dashboard_port):
        parser.error("--ray-head needs --membership and --dashboard-port")
    status = {
        "node": args.name,
        "container": container_state(args.container),
        "rails": [rail_state(*r.split(":", 1)) for r in args.rail],
        "gpu": gpu_state(),
    }
    if args.ray_head:
        status["ray"] = ray_nodes(args.container, args.ray_head, args.membership, args.dashboard_port)
    if args.guard_status:
        status["serving_guard"] = guard_status(args.guard_status)
    print(json.dumps(status))


if __name__ == "__main__":
    main()
