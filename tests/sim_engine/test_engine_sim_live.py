"""The deployed cluster as an owner and the LAN meet it (conftest.py's `deployed`, the real
engine's `pulumi up`): the host files it left, a boot that waits for every GPU, the gateway and
its key, what the LAN can reach, Ray's token, the day-2 tools over SSH, and no secret in any
step's output, log or state."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from core import contract
from cluster import can_raise_memlock
from components import firewall, host_prep
from components.launch_bundle import WRONG_KEY_BURST, VllmServe, vllm_argv
from toolbox import agent_cli, install_twinspark
from scenario_kit import (HEAD, ROOT, WORKER, completion_status, file_state, guard_verdict, node_processes,
                          ops_access, pause, readiness_s, run_ops, sshd_throttled_lines, wait_for)

SERVING = contract.SERVING_CONTAINER
VLLM_ARGV = f"{contract.LOG_DIR}/vllm-argv.json"  # the vLLM stand-in's record of its start


@pytest.fixture
def serving(cluster, stack, deployed) -> dict:
    """The stack's outputs, once serving answers and the guard has had its first round."""
    outputs = stack.outputs()
    wait_for(lambda: completion_status(outputs, outputs["apiKey"]) == 200, "serving", readiness_s(stack))
    wait_for(lambda: guard_verdict(cluster), "the guard's first verdict", 120)
    return outputs


# ---- what `pulumi up` left on the hosts ------------------------------------------------------------
def test_the_host_files_are_the_programs_render_and_a_fresh_login_gets_them(cluster, serving, report):
    cfg = cluster.cfg
    for node in cluster.nodes.values():
        policy = firewall.firewall_policy(node.spec, cluster.topology)
        for f in host_prep.managed_files(node.spec, cfg.fabric.mtu, policy, cfg.serving.gpu_clock_cap_mhz,
                                         cfg.serving.cotenant_memory_percent):
            assert cluster.node_exec(node.name, "cat", f.path).stdout == f.content, (node.name, f.path)
            assert (file_state(cluster, node.name, f.path) or [])[:3] == [f"{int(f.mode, 8):o}", "root", "root"], f.path
        tables = cluster.node_exec(node.name, "nft", "list", "tables").stdout.splitlines()
        assert tables == [f"table inet {contract.FIREWALL_TABLE}"], tables
    generated = cluster.node_exec(HEAD, "netplan", "generate", check=False)
    assert generated.returncode == 0, generated.stderr
    assert "Address=10.0.1.1/24" in cluster.node_exec(HEAD, "cat", "/run/systemd/network/10-netplan-rail1.network").stdout
    # memlock unlimited in a fresh OpenSSH login (gotchas 1-2), where this machine lets pam_limits raise it
    report["memlock_raisable_here"] = can_raise_memlock()
    if can_raise_memlock():
        assert cluster.ssh(WORKER, "ulimit -l").stdout.strip() == "unlimited"


# ---- boot: every GPU first, then vLLM with the key kept from it ----------------------------------
def docker(cluster, node: str, *args: str) -> str:
    done = cluster.ssh(node, " ".join(["docker", *args]))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_head_serves_only_with_every_gpu_and_vllm_never_sees_the_key(cluster, stack, serving, report):
    docker(cluster, WORKER, "stop", SERVING)  # stays down: stopped by hand under "unless-stopped"
    try:
        cluster.node_exec(HEAD, "rm", "-f", VLLM_ARGV)
        docker(cluster, HEAD, "restart", SERVING)
        boot_log = f"{contract.LOG_DIR}/{contract.boot_log('head')}"
        wait_for(lambda: "1/2 nodes with a GPU; waiting for 10.0.0.2" in
                 cluster.node_exec(HEAD, "tail", "-n", "20", boot_log).stdout, "the head waiting for the worker's GPU", 120)
        pause(5, "the head holding vLLM back while one GPU is missing")
        assert cluster.node_exec(HEAD, "test", "-e", VLLM_ARGV, check=False).returncode != 0, "vLLM started with one GPU"
    finally:
        started = time.monotonic()
        docker(cluster, WORKER, "start", SERVING)
    wait_for(lambda: completion_status(serving, serving["apiKey"]) == 200, "serving after the worker joined", 240)
    report["worker_join_to_serving_s"] = round(time.monotonic() - started, 1)
    recorded = json.loads(cluster.node_exec(HEAD, "cat", VLLM_ARGV).stdout)
    assert recorded["argv"] == vllm_argv(VllmServe(cluster.cfg.serving, cluster.cfg.model, cluster.cfg.tensor_parallel_size,
                                                           cluster.cfg.pipeline_parallel_size))
    assert recorded["api_key_from_env"] is False  # the gateway holds it; vLLM listens on its socket only
    assert serving["apiKey"] not in cluster.node_exec(HEAD, "cat", f"/proc/{recorded['pid']}/cmdline", check=False).stdout
    # a co-tenant session on the head cannot open vLLM's socket: the gateway is the way in
    cotenant = cluster.node_exec(HEAD, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 "-c", "import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])",
                                 contract.VLLM_SOCKET, check=False)
    assert cotenant.returncode != 0 and "PermissionError" in cotenant.stderr, cotenant


def test_the_gateway_wants_the_key_everywhere_but_health_and_streams_through(serving):
    base = serving["endpoint"].removesuffix("/v1")
    key = {"Authorization": f"Bearer {serving['apiKey']}"}
    models = httpx.get(f"{base}/v1/models", headers=key, timeout=10)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == serving["model"]
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    # every path vLLM serves that runs the model or tells something about it: 401, and once the
    # wrong keys' limit per address holds (a burst of WRONG_KEY_BURST), 429
    refused = []
    for path in MODEL_PATHS:
        for headers in ({}, {"Authorization": "Bearer sk-wrong-key-0123456789"}):
            answer = httpx.post(f"{base}{path}", headers=headers, timeout=10,
                                json={"model": serving["model"], "prompt": "x", "max_tokens": 1})
            refused.append((path, bool(headers), answer.status_code))
    assert {status for _, _, status in refused} <= {401, 429}, refused
    assert all(status == 401 for _, _, status in refused[:WRONG_KEY_BURST]), refused
    streamed = httpx.post(f"{base}/v1/chat/completions", headers=key, timeout=30,
                          json={"model": serving["model"], "stream": True, "max_tokens": 3,
                                "messages": [{"role": "user", "content": "hi"}]})
    assert streamed.status_code == 200, streamed.text
    # as vLLM streams: a role-only chunk, one chunk per token, [DONE]
    events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert len(events) == 5 and events[-1] == "[DONE]", streamed.text
    assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}, events[0]


# ---- the README's walk-through, as an owner runs it ------------------------------------------------
def readme_commands(step: str) -> list[str]:
    """The command lines of the README's step that opens with `step`: its indented code block."""
    lines: list[str] = []
    for line in (ROOT / "README.md").read_text().split(step, 1)[1].splitlines()[1:]:
        if line.startswith("       ") and line.strip():
            lines.append(line.strip())
        elif lines and line.strip():
            return lines
    return lines


def test_the_readmes_client_steps_answer_through_the_gateway(cluster, stack, serving, tmp_path, report):
    """README step 6, its own lines, run as an owner runs them after step 1 (`twinspark` installed into a
    fresh venv) and step 2 (the stack selected), in the checkout, with a fresh HOME: client-setup reads the
    stack's outputs through the Pulumi CLI, then the real Claude Code and the real Codex each ask the
    endpoint once, with the key from the files client-setup wrote, through the head's nginx gateway (the
    only listener on the endpoint's port; the vLLM stand-in behind it)."""
    commands = readme_commands("6. Point your agents at it")
    assert [c.split()[:2] for c in commands][0] == ["twinspark", "client-setup"] and len(commands) == 3, commands
    home = tmp_path / "home"
    home.mkdir()
    path = [install_twinspark(tmp_path / "venv"), *(os.path.dirname(agent_cli(name)) for name in ("claude", "codex"))]
    env = {name: value for name, value in stack.env.items() if "API_KEY" not in name}
    env.update(HOME=str(home), PATH=":".join(map(str, [*path, stack.env.get("PATH", os.environ["PATH"])])),
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1")  # this box reaches no vendor
    stack.cli("stack", "select")  # README step 2's `pulumi stack init` selects the stack it makes
    ran = []
    for command in commands:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=stack.project, env=env,
                              capture_output=True, text=True, timeout=180)
        ran.append({"command": command, "exit": done.returncode, "stdout": done.stdout[-600:], "stderr": done.stderr[-600:]})
        assert done.returncode == 0, ran[-1]
    report["readme_client_steps"] = ran
    assert "created" in ran[0]["stdout"] and str(home / ".config/twinspark/openai.env") in ran[0]["stdout"], ran[0]
    assert "813" in ran[1]["stdout"], ran[1]  # Claude Code, through /v1/messages
    assert "813" in ran[2]["stdout"] + ran[2]["stderr"], ran[2]  # Codex, through /v1/responses
    assert "provider: twinspark" in ran[2]["stdout"] + ran[2]["stderr"], ran[2]


# every path vLLM 0.25 serves that runs the model or tells something about it
MODEL_PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/invocations", "/generative_scoring",
               "/tokenize", "/detokenize", "/metrics", "/version", "/ping", "/load", "/v2/models", "/pooling"]


# ---- what the LAN reaches --------------------------------------------------------------------------
def listening_tcp_ports(cluster, node: str) -> list[int]:
    out = cluster.in_netns(node, "ss", "-Hltn").stdout
    return sorted({int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines()})


def lan_can_connect(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def test_the_lan_reaches_ssh_and_the_head_ports_only(cluster, serving, report):
    """From a LAN address (this machine, on each node's management link) every port Ray, vLLM,
    Prometheus and the rest listen on is closed but SSH and the head's public ports."""
    reachable = {}
    for name, node in cluster.nodes.items():
        ports = listening_tcp_ports(cluster, name)
        assert contract.RAY_PORT in ports or name != HEAD, ports
        with ThreadPoolExecutor(max_workers=len(ports)) as pool:  # a dropped port costs its timeout: at once
            reachable[name] = [p for p, ok in zip(ports, pool.map(lambda p, host=node.spec.host: lan_can_connect(host, p), ports))
                               if ok]
    report["lan_reachable_ports"] = reachable
    assert reachable == {HEAD: sorted({22, *cluster.cfg.head_public_ports}), WORKER: [22]}, reachable


# OpenSSH's defaults, which a DGX OS node's sshd runs with (Ubuntu 24.04 sets none of them)
STOCK_SSHD = {"maxstartups": "10:30:100", "maxsessions": "10", "logingracetime": "120"}


def test_every_node_runs_a_stock_sshd(cluster, serving, report):
    """The nodes' sshd takes what a Spark's takes (the real command provider keeps a connection per
    command open to the end of an `up`; MaxStartups refuses the 11th unauthenticated one at random):
    its effective settings, with the running listener's own -o options, are OpenSSH's defaults. The
    lines where it throttled go to the report (the scenarios' `up`s passing is the proof they got through)."""
    throttled = {}
    for name in cluster.nodes:
        # its title: "sshd: /usr/sbin/sshd -D -e -o ... [listener] 0 of 10-100 startups"
        listener = [title for title in node_processes(cluster, name, "sshd -D").values() if "[listener]" in title]
        assert len(listener) == 1, listener
        argv = listener[0].split("/usr/sbin/sshd", 1)[1].split(" [listener]", 1)[0].split()
        options = [arg for arg in argv if arg not in ("-D", "-e")]
        effective = dict(line.split(" ", 1) for line in
                         cluster.node_exec(name, "/usr/sbin/sshd", "-T", *options).stdout.splitlines() if " " in line)
        assert {key: effective.get(key) for key in STOCK_SSHD} == STOCK_SSHD, (name, options)
        throttled[name] = sshd_throttled_lines(cluster, name)
    report["sshd_throttled_lines"] = throttled


RAY_CLIENT = """
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
try:
    infos = GcsClient(address="{head}:{port}").get_all_node_info(timeout=10)
    print("listed", sum(info.state == GcsNodeInfo.GcsNodeState.ALIVE for info in infos.values()))
except Exception as err:
    print("refused", type(err).__name__, str(err).splitlines()[0][:120])
"""


def test_ray_refuses_a_client_without_the_clusters_token(cluster, serving):
    """Past the firewall (on the head itself), Ray's GCS still wants the cluster's token; and the
    head serves no dashboard (no HTTP API on its port, none of its module processes)."""
    head_ip = cluster.topology.head_ray_ip
    code = RAY_CLIENT.format(head=head_ip, port=contract.RAY_PORT)
    token_path = f"{contract.BUNDLE_DIR}/{contract.RAY_TOKEN_FILE}"
    without = cluster.node_exec(HEAD, "env", "-u", "RAY_AUTH_MODE", sys.executable, "-c", code)
    with_token = cluster.node_exec(HEAD, "env", "RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={token_path}",
                                   sys.executable, "-c", code)
    assert without.stdout.startswith("refused AuthenticationError"), without.stdout + without.stderr
    assert with_token.stdout.strip() == "listed 2", with_token.stdout + with_token.stderr
    assert file_state(cluster, WORKER, token_path)[0] == "600"
    dashboard = cluster.node_exec(HEAD, "curl", "-s", "-o", "/dev/null", "-m", "5",
                                  f"http://{head_ip}:{contract.RAY_DASHBOARD_PORT}/api/v0/nodes", check=False)
    assert dashboard.returncode == 7, f"the head's dashboard port answers (curl exit {dashboard.returncode})"
    modules = node_processes(cluster, HEAD, "ray-dashboard-")
    assert not modules, modules


# ---- the day-2 tools against the live cluster --------------------------------------------------------
def test_ops_status_over_ssh_sees_every_node_and_names_a_rail_down(cluster, serving, operator_home):
    proc = run_ops("status", "--json", *ops_access(cluster, serving, operator_home))
    status = json.loads(proc.stdout)
    assert proc.returncode == 0, (status["problems"], proc.stderr)
    nodes = {n["node"]: n for n in status["nodes"]}
    assert nodes[HEAD]["container"]["status"] == "running" and nodes[WORKER]["container"]["name"] == SERVING
    for node in nodes.values():
        assert [(r["iface"], r["operstate"], r["mtu"], r["roce_state"]) for r in node["rails"]] == [
            ("rail0", "up", 9000, "PORT_ACTIVE"), ("rail1", "up", 9000, "PORT_ACTIVE")]
        memory = node["memory_check"]  # ran before Ray, the model's page cache released first
        assert memory["ok"] is True and memory["model_files_released"] > 0, memory
    assert sorted((n["node_ip"], n["gpus"]) for n in nodes[HEAD]["ray"]["nodes"]) == [("10.0.0.1", 1.0), ("10.0.0.2", 1.0)]
    assert status["endpoint"]["health"] == 200 and status["endpoint"]["model"] == serving["model"]
    assert nodes[HEAD]["hold"] is None
    cluster.in_netns(WORKER, "ip", "link", "set", "rail1", "down")
    try:
        sick = run_ops("status", "--json", *ops_access(cluster, serving, operator_home))
    finally:
        cluster.in_netns(WORKER, "ip", "link", "set", "rail1", "up")
    assert sick.returncode == 1
    assert "sim2 rail rail1: link down" in json.loads(sick.stdout)["problems"]


def test_ops_bench_against_the_live_cluster(serving, tmp_path):
    proc = run_ops("bench", "--endpoint", serving["endpoint"], "--api-key", serving["apiKey"], "--model", serving["model"],
                   "--runs", "2", "--max-tokens", "8", "--concurrency", "2", "--long-prompt-tokens", "200",
                   "--sweep", "1,2", "--sweep-requests", "1", "--sweep-input-tokens", "50", "--sweep-output-tokens", "4",
                   "-o", str(tmp_path / "bench.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["errors"] == [] and result["single_stream"]["decode_tok_s"] > 0
    repeats = result["plan"]["sweep_repeats"]
    assert [row["requests"] for row in result["sweep"]] == [repeats * 1, repeats * 2]


# ---- no secret in a step's output, a log or the state ------------------------------------------------
def private_key_body(pem: str) -> str:
    """The longest base64 line of a private key: any leak of the key contains part of it."""
    return max((line for line in pem.splitlines() if not line.startswith("-----")), key=len)


def test_no_step_output_log_or_plain_state_holds_a_secret(cluster, stack, serving):
    config = stack.stack_file()["config"]
    secrets = {
        "apiKey": serving["apiKey"],
        "hfToken": json.loads(stack.cli("config", "get", "twinspark:hfToken", "--json").stdout)["value"],
        "ray token": cluster.node_exec(HEAD, "cat", f"{contract.BUNDLE_DIR}/{contract.RAY_TOKEN_FILE}").stdout.strip(),
        "operator private key": private_key_body(cluster.key.read_text()),
        "sync private key": private_key_body(cluster.node_exec(HEAD, "cat", "/home/nvidia/.ssh/twinspark_weights").stdout),
    }
    assert "secure" in config["twinspark:hfToken"], "the stack file holds the HF token in the clear"
    deployment = json.loads(stack.cli("stack", "export", "--show-secrets").stdout)["deployment"]
    step_outputs = {r["urn"].rsplit("::", 1)[-1]: f"{r.get('outputs', {}).get('stdout', '')}"
                                                  f"{r.get('outputs', {}).get('stderr', '')}"
                    for r in deployment["resources"] if r["type"] == "command:remote:Command"}
    plain_state = stack.cli("stack", "export").stdout  # what the backend stores: secrets encrypted
    logs = "".join(cluster.node_exec(node, "bash", "-c", f"cat {contract.LOG_DIR}/*.log").stdout for node in cluster.nodes)
    assert step_outputs
    for what, value in secrets.items():
        assert len(value) >= 16, what
        assert [name for name, out in step_outputs.items() if value in out] == [], f"{what} printed by a step"
        assert value not in logs, f"{what} in {contract.LOG_DIR}"
        assert value not in plain_state, f"{what} in the stack's state in the clear"
