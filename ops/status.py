"""status — the cluster at a glance: nodes, rails, Ray, GPUs, guard, the endpoint, spec decode.

Per node (over SSH, launch/node-status.py fed on stdin): serving container up or
restarting (restart count), rails (link, speed, MTU, RoCE state), GPU temperature, power,
clocks and throttle reasons, the memory check before load, the host firewall (its boot unit
failed or not, its nftables table loaded or not); on the head, the Ray nodes alive
with their GPUs and the serving guard (last canary, restarts in its window, any hold). Per
node too, its platform (launch/platform-facts.py: OS, kernel, driver, CUDA, BIOS, CMA, vLLM
and NCCL in the running serving image), judged now by the platform gate with the stack's
acknowledgements: a node updated since the last `pulumi up` shows here first. For the
endpoint: /health, the model from /v1/models, and from /metrics the spec-decode acceptance
(overall and per draft position) and the requests running and waiting. Exit code 1 when
anything is unhealthy.

Nodes are reached through ops/nodes.py (each held to its pinned host key).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence

import httpx
from rich.console import Console
from rich.table import Table
from rich.text import Text

from core import contract
from core import platform_gate

from .output import add_json_argument, tool_console
from .api import served_models
from .inputs import positive_int
from .nodes import FACTS_PROBE, NodeRunner, add_ssh_arguments, check_pinned, ssh_runner
from .target import add_target_arguments, resolve_target, status_expectations

MEMBERSHIP_IN_CONTAINER = f"{contract.CONTAINER_BUNDLE_DIR}/{contract.MEMBERSHIP_SCRIPT}"
MP_MEMBERSHIP_IN_CONTAINER = f"{contract.CONTAINER_BUNDLE_DIR}/{contract.MP_MEMBERSHIP_SCRIPT}"
# the flags that together stand in for the stack (resolve_target)
STANDS_IN = ("endpoint", "api_key", "nodes", "ssh_user", "expect_mtu", "expect_speed_mbps")
METRIC_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, nodes=True)
    add_ssh_arguments(parser)
    parser.add_argument("--expect-mtu", type=positive_int, help="default: the stack's fabric.mtu")
    parser.add_argument("--expect-speed-mbps", type=positive_int, help="default: the stack's fabric.linkSpeedMbps")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, STANDS_IN)
    check_pinned(target.nodes)
    expect = status_expectations(args, target)
    return run_status(target, ssh_runner(expect.ssh_user, args.ssh_key, args.ssh_option), args.json, expect.mtu,
                      expect.speed_mbps, tool_console())


def probe_args(node: dict, executor: str = "ray", worker_ips: Sequence[str] = ()) -> list[str]:
    args = ["--name", node["name"], "--container", contract.SERVING_CONTAINER,
            "--memory-status", contract.MEMORY_CHECK_STATUS,
            "--firewall-unit", contract.FIREWALL_UNIT, "--firewall-table", contract.FIREWALL_TABLE,
            "--recorder", contract.NODE_RECORDER,
            "--forensics-dir", contract.FORENSICS_DIR, "--power-watch-status", contract.POWER_WATCH_STATUS]
    for rail in node.get("rails", []):
        args += ["--rail", f"{rail['iface']}:{rail['hca']}"]
    if node["role"] == "head" and executor == "mp":
        args += ["--mp-head", node["rayIp"], "--mp-membership", MP_MEMBERSHIP_IN_CONTAINER,
                 "--master-port", str(contract.MP_MASTER_PORT), "--workers", ",".join(worker_ips)]
    elif node["role"] == "head":
        args += ["--ray-head", node["rayIp"], "--membership", MEMBERSHIP_IN_CONTAINER,
                 "--gcs-port", str(contract.RAY_PORT)]
    if node["role"] == "head":
        args += ["--guard-status", contract.SERVING_GUARD_STATUS, "--hold", contract.SERVING_HOLD]
    return args


def facts_args(node: dict, base_image: Optional[str]) -> list[str]:
    """The facts of the node and of its running serving container's image (on the head, where it
    was built, checked against the stack's pinned base when the outputs name it; a worker holds
    the head's image, not the base)."""
    checked = base_image and node.get("role") == "head"
    return ["--node", node["name"], "--container", contract.SERVING_CONTAINER] + (["--base", base_image] if checked else [])


def stack_platform(outputs: dict) -> tuple[Optional[str], list[str]]:
    """The pinned base and the acknowledgements, from the outputs of `pulumi up` (if any)."""
    serving_image, platform = outputs.get("servingImage"), outputs.get("platform")
    base = serving_image.get("reference") if isinstance(serving_image, dict) else None
    acknowledged = platform.get("acknowledge") if isinstance(platform, dict) else None
    return (base if isinstance(base, str) else None,
            [a for a in acknowledged if isinstance(a, str)] if isinstance(acknowledged, list) else [])


def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    metrics: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line)
        if not match or line.startswith("#"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        try:
            metrics.setdefault(match.group(1), []).append((labels, float(match.group(3))))
        except ValueError:
            continue
    return metrics


def metric_sum(metrics, name) -> Optional[float]:
    values = metrics.get(name)
    return sum(v for _, v in values) if values else None


def spec_decode(metrics) -> Optional[dict]:
    draft = metric_sum(metrics, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric_sum(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    if not draft:
        return None
    per_pos: dict[int, float] = {}
    for labels, value in metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", []):
        pos = int(labels.get("position", -1))
        per_pos[pos] = per_pos.get(pos, 0) + value
    drafts = metric_sum(metrics, "vllm:spec_decode_num_drafts_total") or (draft / len(per_pos) if per_pos else None)
    return {
        "acceptance": (accepted or 0) / draft,
        "per_position": [per_pos[p] / drafts for p in sorted(per_pos)] if drafts else [],
        "mean_accepted_length": 1 + (accepted or 0) / drafts if drafts else None,
    }


def endpoint_status(base_url: str, api_key: str, expected_model: str = "") -> dict:
    out: dict = {"url": base_url, "expected_model": expected_model or None}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=10, headers=headers) as http:
        try:
            out["health"] = http.get(f"{base_url}/health").status_code
        except httpx.HTTPError as err:
            out["health"], out["error"] = None, f"{type(err).__name__}: {err}"
            return out
        try:
            models = http.get(f"{base_url}/v1/models")
            out["models_status"] = models.status_code
            if models.status_code == 200:
                try:  # a 200 proves nothing by itself: the body must list the model
                    out["models"] = list(served_models(models.content))
                    out["model"] = expected_model if expected_model in out["models"] else out["models"][0]
                except ValueError as err:
                    out["models_error"] = str(err)
            metrics = parse_metrics(http.get(f"{base_url}/metrics").text)
        except httpx.HTTPError as err:
            out["error"] = f"{type(err).__name__}: {err}"
            return out
    out["requests_running"] = metric_sum(metrics, "vllm:num_requests_running")
    out["requests_waiting"] = metric_sum(metrics, "vllm:num_requests_waiting")
    out["spec_decode"] = spec_decode(metrics)
    return out


def problems(report: dict, expect_mtu: int, expect_speed: int) -> list[str]:
    """Everything unhealthy, one line each."""
    found = []
    ep = report["endpoint"]
    if ep.get("health") != 200:
        found.append(f"endpoint {ep['url']}: /health {ep.get('health') or ep.get('error')}")
    elif ep.get("models_status") != 200:
        found.append(f"endpoint {ep['url']}: /v1/models answered {ep.get('models_status') or ep.get('error')}"
                     + (" (API key?)" if ep.get("models_status") in (401, 403) else ""))
    elif ep.get("models_error"):
        found.append(f"endpoint {ep['url']}: /v1/models answered {ep['models_error']}")
    elif ep.get("expected_model") and ep["expected_model"] not in ep["models"]:
        found.append(f"endpoint {ep['url']}: serves {', '.join(ep['models'])}, not the stack's model "
                     f"{ep['expected_model']}")
    elif ep.get("error"):
        found.append(f"endpoint {ep['url']}: /metrics {ep['error']}")
    for name, lane in (report.get("lanes") or {}).items():  # each lane's model served (its router's answer)
        if "models" in ep and lane["model"] not in ep["models"] and lane["model"] != ep.get("expected_model"):
            found.append(f"lane {name} ({', '.join(lane['nodes'])}): {ep['url']} does not serve its model {lane['model']}")
    platforms = {n["node"]: n.get("platform", {}).get("facts") for n in report["nodes"]}
    if platforms and all(platforms.values()):
        found += [f"platform: {f.text}" for f in platform_gate.evaluate(platforms, report.get("acknowledged", []))]
    for node in report["nodes"]:
        if "error" in node.get("platform", {}):
            found.append(f"{node['node']}: platform facts: {node['platform']['error']}")
    gpu_nodes = len(report["nodes"])
    for node in report["nodes"]:
        name = node["node"]
        if "error" in node:
            error = str(node["error"])
            found.append(error if error.startswith(f"{name} (") else f"{name}: {error}")  # a refusal names it
            continue
        c = node["container"]
        if not c.get("present"):
            found.append(f"{name}: container {c['name']} missing")
        elif c.get("status") != "running" or c.get("restarting"):
            found.append(f"{name}: container {c['name']} {c.get('status')} (restarts: {c.get('restart_count')})")
        for rail in node["rails"]:
            where = f"{name} rail {rail['iface']}"
            if rail["operstate"] != "up":
                found.append(f"{where}: link {rail['operstate']}")
            if rail["speed_mbps"] != expect_speed:
                found.append(f"{where}: speed {rail['speed_mbps']} Mb/s, expected {expect_speed}")
            if rail["mtu"] != expect_mtu:
                found.append(f"{where}: MTU {rail['mtu']}, expected {expect_mtu}")
            if rail["roce_state"] != "PORT_ACTIVE":
                found.append(f"{where}: RoCE {rail['hca']} {rail['roce_state'] or rail.get('roce_error')}")
        found += guard_problems(node) + firewall_problems(node) + recovery_problems(node)
        ray = node.get("ray")
        if ray is not None:
            alive = [n for n in ray.get("nodes", []) if n["gpus"] >= 1]
            if "error" in ray or len(alive) < gpu_nodes:
                found.append(f"{name}: Ray has {len(alive)} of {gpu_nodes} GPU nodes alive {ray.get('error', '')}".rstrip())
        ranks = node.get("ranks")
        if ranks is not None and ("error" in ranks or len(ranks.get("nodes", [])) < gpu_nodes):
            found.append(f"{name}: {len(ranks.get('nodes', []))} of {gpu_nodes} node ranks joined rank 0 "
                         f"{ranks.get('error', '')}".rstrip())
    return found


def as_object(value) -> dict:
    """A state file's JSON as an object ({} when it is something else: shown, never a traceback)."""
    return value if isinstance(value, dict) else {}


def guard_problems(node: dict) -> list[str]:
    """The memory check waiting, serving held, the canary failing: each in its own words."""
    found, name = [], node["node"]
    memory = as_object(node.get("memory_check"))
    if memory.get("ok") is False or "error" in memory:
        found.append(f"{name}: memory check before load: {memory.get('message') or memory.get('error')}")
    hold = node.get("hold")
    if hold:
        found.append(f"{name}: serving held: {as_object(hold).get('reason') or as_object(hold).get('error') or hold}")
    guard = node.get("guard")
    if guard is not None and not isinstance(guard, dict):
        found.append(f"{name}: the serving guard's verdict is not a JSON object")
    elif "guard" in node and guard is None:
        found.append(f"{name}: the serving guard has written no verdict ({contract.SERVING_GUARD_UNIT} not running?)")
    elif guard and guard.get("ok") is False:
        found.append(f"{name}: canary failing ({guard.get('consecutive_failures')} rounds in a row): "
                     + "; ".join(guard.get("failures") or []))
    elif guard and guard.get("not_counted") == "key refused":  # clients with the stack's key are refused too
        found.append(f"{name}: {guard.get('note')}")
    return found


def recovery_problems(node: dict) -> list[str]:
    """Held out of serving since an unclean boot; a peer the power watch finds silent, or holds
    because it stayed silent after its cycle: one line each. Unclean boots already re-qualified are
    history (recovery_text shows them), no problem now."""
    found, name = [], node["node"]
    recovery = as_object(node.get("recovery"))
    if recovery.get("pending_requalification"):
        found.append(f"{name}: held out of serving since the unclean boot {recovery['pending_requalification']}, "
                     f"until the fabric and NCCL checks pass (the head's guard runs them; `twinspark forensics {name}`)")
    for peer, watch in as_object(as_object(node.get("power_watch")).get("nodes")).items():
        watch = as_object(watch)
        if watch.get("held"):
            found.append(f"{name}: power watch: {as_object(watch['held']).get('reason')}")
        elif isinstance(watch.get("silent_s"), (int, float)) and watch["silent_s"] > 0:
            found.append(f"{name}: power watch: {peer} silent for {watch['silent_s']:.0f} s")
    return found


def firewall_problems(node: dict) -> list[str]:
    """The firewall's table not loaded (the node open to the LAN), or its boot unit failed (the
    next boot leaves it open), or no way to tell: one line."""
    if "firewall" not in node:
        return []
    fw = as_object(node.get("firewall"))
    unit, table, state = fw.get("unit"), fw.get("table"), fw.get("unit_state")
    journal = f"`journalctl -u {unit}` on it"
    if fw.get("loaded") is False:
        return [f"{node['node']}: firewall: table {table} is not loaded, so every port is open to the LAN ({unit} "
                f"{state or 'state unknown'}): see {journal}, then `sudo systemctl restart {unit}`"]
    if fw.get("loaded") is not True:
        return [f"{node['node']}: firewall: cannot tell whether table {table} is loaded: "
                f"{fw.get('error') or 'the probe did not say'}"]
    if state == "failed":
        return [f"{node['node']}: firewall: {unit} failed, so the next boot leaves the node open (table {table} "
                f"is loaded now): see {journal}"]
    return []


def firewall_text(node: dict) -> Text:
    fw = as_object(node.get("firewall"))
    if not fw:
        return Text("")
    # any JSON value as the key (typeshed wants a bool): anything but true or false is unknown
    loaded = {True: "loaded", False: "NOT LOADED"}.get(fw.get("loaded"), "unknown")  # type: ignore[arg-type]
    state = fw.get("unit_state") or "unknown"
    bad = fw.get("loaded") is not True or state == "failed"
    return Text(f"table {loaded}\nunit {state}", style="red" if bad else "")


def shown(value) -> str:
    """A value as a person reads it: unknown as '-'."""
    return "-" if value is None else str(value)


def count(value) -> str:
    """A count that came as a float (Prometheus' samples are) as the whole number it is."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else shown(value)


def gpu_text(gpu: dict) -> str:
    if gpu.get("error"):
        return gpu["error"]
    text = (f"{shown(gpu.get('temperature_c'))} °C {shown(gpu.get('power_w'))} W "
            f"{count(gpu.get('sm_clock_mhz'))}/{count(gpu.get('max_sm_clock_mhz'))} MHz")
    throttled = [r for r in gpu.get("throttle") or [] if r != "idle"]
    return text + (f"\nthrottled: {', '.join(throttled)}" if throttled else "")


RECENT_UNCLEAN_BOOT_S = 7 * 86400


def recovery_text(node: dict) -> str:
    """This week's unclean boots, the last one's cause: what `twinspark forensics NODE` shows whole."""
    reports = [as_object(r) for r in as_object(node.get("recovery")).get("reports") or []]
    now = node.get("now") if isinstance(node.get("now"), (int, float)) else time.time()
    recent = [r for r in reports if isinstance(r.get("found_at"), (int, float)) and now - r["found_at"] < RECENT_UNCLEAN_BOOT_S]
    return f"unclean boots this week: {len(recent)} (last: {recent[0].get('name')})" if recent else ""


def guard_text(node: dict) -> str:
    parts = [text] if (text := recovery_text(node)) else []
    memory = as_object(node.get("memory_check"))
    if "message" in memory:
        parts.append(f"memory: {'ok' if memory.get('ok') else 'WAITING'} ({shown(memory.get('available_gib'))} GiB "
                     f"available, {shown(memory.get('need_gib'))} GiB needed)")
    guard = as_object(node.get("guard"))
    if guard and "error" not in guard:
        checked = guard.get("checked_at")
        when = time.strftime("%H:%M:%S", time.localtime(checked)) if isinstance(checked, (int, float)) else "not yet"
        # any JSON values as the keys (typeshed wants a bool, a str): another gets the default
        verdict = {True: "ok", False: "FAILING"}.get(guard.get("ok")) or {  # type: ignore[arg-type]
            "busy": "busy (late, tokens flowing)",
            "key refused": "KEY REFUSED"}.get(guard.get("not_counted"), "-")  # type: ignore[arg-type]
        window = guard.get("window_s")
        parts.append(f"canary: {verdict} at {when}; restarts {shown(guard.get('restarts_in_window'))}/"
                     f"{shown(guard.get('restart_limit'))} in "
                     f"{int(window) // 60 if isinstance(window, (int, float)) else '?'} min")
    if node.get("hold"):
        parts.append("HELD")
    return "\n".join(parts)


def collect(target, runner: NodeRunner) -> dict:
    base_image, acknowledged = stack_platform(target.outputs)
    executor = target.outputs.get("executor") or "ray"  # stacks deployed before the output: Ray's
    worker_ips = [n["rayIp"] for n in target.nodes if n["role"] != "head"]

    def one(node):
        try:
            status = json.loads(runner(node, probe_args(node, executor, worker_ips)))
        except Exception as err:  # one unreachable node must not hide the others
            return {"node": node["name"], "error": str(err)}
        try:
            out = runner(node, facts_args(node, base_image), probe=FACTS_PROBE)
            status["platform"] = {"facts": platform_gate.parse_report(out, node["name"]),
                                  "errors": json.loads(out.strip().splitlines()[-1]).get("errors", {})}
        except Exception as err:
            status["platform"] = {"error": str(err)}
        return status

    with ThreadPoolExecutor(max_workers=max(1, len(target.nodes))) as pool:
        nodes = list(pool.map(one, target.nodes))
    return {"endpoint": endpoint_status(target.base_url, target.api_key, target.model), "nodes": nodes,
            "acknowledged": acknowledged, "lanes": target.outputs.get("lanes") or {}}


def render(report: dict, found: list[str], console: Console) -> None:
    """Every cell is a Text: what nodes and servers say is printed as it is, never read as markup."""
    nodes = Table(title="nodes")
    for col in ("node", "container", "rails (link speed MTU RoCE)", "GPU", "Ray (mp: ranks)", "memory, guard", "firewall"):
        nodes.add_column(col)
    red = "red"
    for node in report["nodes"]:
        if "error" in node:
            nodes.add_row(Text(node["node"]), Text(node["error"], style=red))
            continue
        c = node["container"]
        container = (Text(f"{c['status']}{' (restarting)' if c.get('restarting') else ''}, {c['restart_count']} restarts")
                     if c.get("present") else Text("missing", style=red))
        rails = "\n".join(f"{r['iface']}: {r['operstate']} {shown(r['speed_mbps'])} {shown(r['mtu'])} {shown(r['roce_state'])}"
                          for r in node["rails"])
        ray = node.get("ray", node.get("ranks"))
        ray_text = "" if ray is None else (ray.get("error") or ", ".join(
            f"{n['node_ip']} ({n['gpus']:g} GPU)" for n in ray.get("nodes", [])))
        nodes.add_row(Text(node["node"]), container, Text(rails), Text(gpu_text(node.get("gpu") or {})), Text(ray_text),
                      Text(guard_text(node)), firewall_text(node))
    console.print(nodes)
    platform = Table(title="platform")
    for col in ("node", "OS", "kernel", "driver / CUDA", "BIOS", "CMA total / free kB", "vLLM", "NCCL (wheel)"):
        platform.add_column(col, overflow="fold")  # versions are read and compared whole: never cut
    for node in report["nodes"]:
        facts = node.get("platform", {}).get("facts")
        if facts is None:
            platform.add_row(Text(node["node"]), Text(node.get("platform", {}).get("error") or "", style=red))
            continue
        def facts_of(*names: str, facts: dict = facts) -> str:
            return " / ".join(shown(facts.get(n)) for n in names)

        platform.add_row(*(Text(v) for v in (
            node["node"], facts_of("os"), facts_of("kernel"), facts_of("driver", "cuda"),
            facts_of("bios_version", "bios_date"), facts_of("cma_total_kb", "cma_free_kb"), facts_of("vllm"),
            f"{shown(facts.get('nccl'))} ({shown(facts.get('nccl_pip'))})")))
    console.print(platform)
    ep = report["endpoint"]
    endpoint = Table(title="endpoint")
    endpoint.add_column("")
    endpoint.add_column("")
    endpoint.add_row("url", Text(ep["url"]))
    endpoint.add_row("/health", Text(shown(ep.get("health") or ep.get("error"))))
    endpoint.add_row("model", Text(shown(ep.get("model"))))
    endpoint.add_row("requests running / waiting", f"{count(ep.get('requests_running'))} / {count(ep.get('requests_waiting'))}")
    sd = ep.get("spec_decode")
    if sd:
        endpoint.add_row("spec-decode acceptance", f"{sd['acceptance']:.0%}")
        endpoint.add_row("per draft position", " ".join(f"{p:.0%}" for p in sd["per_position"]))
    console.print(endpoint)
    if report.get("lanes"):
        lanes = Table(title="lanes (one model each, behind the endpoint)")
        for col in ("lane", "model", "recipe", "nodes", "served"):
            lanes.add_column(col)
        for name, lane in report["lanes"].items():
            served = lane["model"] in (ep.get("models") or [])
            lanes.add_row(*(Text(v) for v in (name, lane["model"], lane["recipe"], ", ".join(lane["nodes"]))),
                          Text("yes") if served else Text("NOT SERVED", style=red))
        console.print(lanes)
    for line in found:
        console.print(Text("UNHEALTHY ", style=red) + Text(line))
    if not found:
        console.print(Text("healthy", style="green"))


def run_status(target, runner: NodeRunner, as_json: bool, expect_mtu: int, expect_speed: int, console: Console) -> int:
    report = collect(target, runner)
    found = problems(report, expect_mtu, expect_speed)
    if as_json:
        console.print_json(json.dumps({**report, "problems": found, "healthy": not found}))
    else:
        render(report, found, console)
    return 1 if found else 0
