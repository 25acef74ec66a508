#!/usr/bin/env python3
"""node-status.py — one node's serving state as JSON, for `python -m ops status` (fed over ssh).

  python3 node-status.py --name spark1 --container twinspark-serving \
      --rail enp1s0f0np0:rocep1s0f0 --rail enP2p1s0f0np0:roceP2p1s0f0 \
      [--ray-head 10.0.0.1 --membership /twinspark/ray-membership.py --gcs-port 6379] \
      [--mp-head 10.0.0.1 --mp-membership /twinspark/mp-membership.py --master-port 29501 --workers 10.0.0.2] \
      [--memory-status /run/twinspark/memory-check.json] \
      [--guard-status /run/twinspark/serving-guard/status.json --hold /run/twinspark/serving-hold] \
      [--firewall-unit twinspark-firewall.service --firewall-table twinspark]

Reports the serving container (state, restart count), each rail (link, speed, MTU, RoCE
port state and active MTU), the GPU's temperature, power, clocks and throttle reasons, the
memory check before load, the host firewall (its boot unit's state, and whether its nftables
table is loaded now: `sudo -n nft`, as the SSH user has passwordless sudo), and on the head
(--ray-head) the Ray nodes alive with their GPUs (--mp-head: with serving.executor mp, the node
ranks joined to rank 0) and the serving guard's verdict and hold; and
this node's clock; with --recorder its unclean boots' reports (and whether it is held out of
serving until re-qualified), with --power-watch-status the watch over its peer's power. Only reads;
needs docker access, nvidia-smi, ibv_devinfo.
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


# nvidia-smi's clocks_throttle_reasons bits (nvml.h, nvmlClocksThrottleReason*)
THROTTLE_REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown",
                    0x10: "sync boost", 0x20: "thermal (software)", 0x40: "thermal (hardware)",
                    0x80: "power brake", 0x100: "display clocks"}


def throttle_reasons(mask):
    try:
        bits = int(mask.strip(), 16)
    except ValueError:
        return None
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]


def gpu_state():
    out, err = run("nvidia-smi", "--query-gpu=temperature.gpu,power.draw,clocks.sm,clocks.max.sm,"
                   "clocks_throttle_reasons.active", "--format=csv,noheader,nounits")
    if out is None:
        return {"error": err}
    first = [v.strip() for v in out.strip().splitlines()[0].split(",")] + [""] * 5  # a field it lacks: unknown
    as_float = lambda v: float(v) if re.fullmatch(r"[\d.]+", v) else None  # noqa: E731  "[N/A]"
    return {"temperature_c": as_float(first[0]), "power_w": as_float(first[1]), "sm_clock_mhz": as_float(first[2]),
            "max_sm_clock_mhz": as_float(first[3]), "throttle": throttle_reasons(first[4])}


def state_file(path):
    """A JSON state file the guard or the memory check wrote; None when absent."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return {"error": f"{path}: {err}"}


def firewall_state(unit, table):
    """The boot unit as systemd sees it (active, inactive, failed, ...) and whether `table inet
    TABLE` is loaded now (None: it could not be told, with why)."""
    state = {"unit": unit, "table": f"inet {table}", "unit_state": None, "loaded": None}
    try:
        proc = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, timeout=20)
        state["unit_state"] = proc.stdout.strip() or None  # it prints the state whatever its exit code
        if state["unit_state"] is None and proc.stderr.strip():
            state["unit_error"] = proc.stderr.strip()[-300:]
    except (OSError, subprocess.TimeoutExpired) as err:
        state["unit_error"] = str(err)
    try:
        proc = subprocess.run(["sudo", "-n", "nft", "list", "table", "inet", table], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        state["error"] = str(err)
        return state
    if proc.returncode == 0:
        state["loaded"] = True
    elif "No such file or directory" in proc.stderr:  # nft's answer for a table that does not exist
        state["loaded"] = False
    else:
        state["error"] = " ".join(proc.stderr.split())[-300:] or f"sudo -n nft exited {proc.returncode}"
    return state


def ray_nodes(container, head_ip, membership, gcs_port):
    out, err = run("docker", "exec", container, "python3", membership, "alive", "--head", head_ip,
                   "--gcs-port", str(gcs_port))
    return {"error": err} if out is None else {"nodes": json.loads(out)}


def mp_ranks(container, membership, head_ip, port, workers):
    """serving.executor mp: node rank 0 (listening on the master port) and each worker rank joined to it."""
    out, err = run("docker", "exec", container, "python3", membership, "alive", "--head", head_ip, "--port", str(port),
                   "--workers", workers)
    return {"error": err} if out is None else {"nodes": json.loads(out)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--container", required=True)
    parser.add_argument("--rail", action="append", default=[], help="IFACE:HCA")
    parser.add_argument("--ray-head", help="this node is the head: list Ray nodes from its GCS")
    parser.add_argument("--membership", help="ray-membership.py inside the container (with --ray-head)")
    parser.add_argument("--gcs-port", type=int, help="the head's Ray GCS port (with --ray-head)")
    parser.add_argument("--mp-head", help="this node is rank 0 of serving.executor mp: list the ranks joined to it")
    parser.add_argument("--mp-membership", help="mp-membership.py inside the container (with --mp-head)")
    parser.add_argument("--master-port", type=int, help="rank 0's store port (with --mp-head)")
    parser.add_argument("--workers", default="", help="the worker ranks' addresses, comma-separated (with --mp-head)")
    parser.add_argument("--memory-status", help="the memory check's verdict (JSON)")
    parser.add_argument("--guard-status", help="head: the serving guard's verdict (JSON)")
    parser.add_argument("--hold", help="head: present while serving is held (JSON)")
    parser.add_argument("--recorder", help="the node recorder (its `list`: unclean boots, held until re-qualified)")
    parser.add_argument("--forensics-dir", help="the recorder's folder (with --recorder)")
    parser.add_argument("--power-watch-status", help="the power watch's state, where this node watches another (JSON)")
    parser.add_argument("--firewall-unit", help="the unit that loads the host firewall at boot")
    parser.add_argument("--firewall-table", help="the firewall's nftables table (family inet), with --firewall-unit")
    args = parser.parse_args()
    if args.ray_head and not (args.membership and args.gcs_port):
        parser.error("--ray-head needs --membership and --gcs-port")
    if args.mp_head and not (args.mp_membership and args.master_port):
        parser.error("--mp-head needs --mp-membership and --master-port")
    if bool(args.firewall_unit) != bool(args.firewall_table):
        parser.error("--firewall-unit and --firewall-table go together")
    status = {
        "node": args.name,
        "now": time.time(),  # this node's clock: `ops upgrade` judges the guard verdict's age by it
        "container": container_state(args.container),
        "rails": [rail_state(*r.split(":", 1)) for r in args.rail],
        "gpu": gpu_state(),
        "memory_check": state_file(args.memory_status),
    }
    if args.firewall_unit:
        status["firewall"] = firewall_state(args.firewall_unit, args.firewall_table)
    if args.recorder:
        out, err = run("sudo", "-n", "python3", args.recorder, "list", "--dir", args.forensics_dir)
        try:
            status["recovery"] = json.loads(out) if out is not None else {"error": err}
        except ValueError:
            status["recovery"] = {"error": "the recorder's list is not JSON"}
    if args.power_watch_status:
        status["power_watch"] = state_file(args.power_watch_status)
    if args.guard_status:
        status["guard"] = state_file(args.guard_status)
        status["hold"] = state_file(args.hold)
    if args.ray_head:
        status["ray"] = ray_nodes(args.container, args.ray_head, args.membership, args.gcs_port)
    if args.mp_head:
        status["ranks"] = mp_ranks(args.container, args.mp_membership, args.mp_head, args.master_port, args.workers)
    print(json.dumps(status))


if __name__ == "__main__":
    main()
