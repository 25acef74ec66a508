"""serving.executor mp: the config, the rendered launch files, the program's resources, the rank
watch (launch/mp-membership.py) and the simulator's vLLM stand-in in mp mode, on loopback."""

import copy
import os
import socket
import subprocess
import sys
import time

import pytest
from program_harness import ROOT, config_blocks, runner_call, stack_config

from core import contract
from components import launch_bundle
from components.config import Topology, parse_stack_config, resolve_node_addresses
from toolbox import free_port, load_file, wait_for

STANDIN = ROOT / "tests" / "sim" / "bin" / "vllm"
MEMBERSHIP = ROOT / "launch" / contract.MP_MEMBERSHIP_SCRIPT


def mp_blocks(**serving):
    blocks = copy.deepcopy(config_blocks())
    blocks["serving"] = {**blocks["serving"], "executor": "mp", **serving}
    return blocks


def refusal(blocks) -> str:
    with pytest.raises(Exception) as err:
        parse_stack_config(blocks)
    return str(err.value)


def bundle_args(cfg, node):
    topology = Topology(cfg, resolve_node_addresses(cfg.nodes))
    vllm = launch_bundle.VllmServe(cfg.serving, cfg.model, cfg.tensor_parallel_size, cfg.pipeline_parallel_size)
    return launch_bundle.LaunchBundleArgs(node=node, connection=None, vllm=vllm, fabric=topology.node_fabric(node),
                                          ray_token="t", label_key="k", api_key=None)


# ---- config ------------------------------------------------------------------------------

def test_the_executor_defaults_to_ray_and_takes_mp():
    assert parse_stack_config(config_blocks()).serving.executor == "ray"
    assert parse_stack_config(mp_blocks()).serving.executor == "mp"


def test_an_unknown_executor_is_refused_with_the_choices():
    message = refusal(mp_blocks(executor="torchrun"))
    assert "serving.executor" in message and "'ray'" in message and "'mp'" in message


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank=1", "--master-addr", "--master-port", "--headless",
                                  "-n", "-r", "--data-parallel-backend", "--distributed-executor-backend"])
def test_the_node_rank_flags_are_twinspark_s(flag):
    message = refusal(mp_blocks(extraArgs=[flag, "2"] if "=" not in flag else [flag]))
    assert "serving.extraArgs[0]" in message and "twinspark does not own" in message


def test_a_ray_only_flag_is_refused_with_mp_and_only_with_mp():
    message = refusal(mp_blocks(extraArgs=["--ray-workers-use-nsight"]))
    assert "serving.extraArgs[0]" in message and "unless the workers run on Ray" in message
    ray = copy.deepcopy(config_blocks())
    ray["serving"] = {**ray["serving"], "extraArgs": ["--ray-workers-use-nsight"]}
    assert parse_stack_config(ray).serving.extra_args == ["--ray-workers-use-nsight"]


def test_the_master_port_is_taken_for_every_configured_port():
    message = refusal(mp_blocks(port=contract.MP_MASTER_PORT))
    assert "serving.port" in message and "vLLM's master port" in message


# ---- rendered launch files ----------------------------------------------------------------

def test_the_head_serves_as_node_rank_0_and_each_worker_runs_headless_with_its_rank():
    cfg = parse_stack_config(mp_blocks())
    head_ip = bundle_args(cfg, cfg.head).fabric.head_ray_ip
    argv = {n.name: launch_bundle.vllm_argv(bundle_args(cfg, n).vllm, launch_bundle.mp_rank(bundle_args(cfg, n).fabric))
            for n in cfg.nodes}
    head, worker = argv[cfg.head.name], argv[cfg.workers[0].name]
    common = ["--distributed-executor-backend", "mp", "--nnodes", "2"]
    for ranked, rank in ((head, "0"), (worker, "1")):
        assert " ".join(common) in " ".join(ranked)
        assert ranked[ranked.index("--node-rank") + 1] == rank
        assert ranked[ranked.index("--master-addr") + 1] == head_ip
        assert ranked[ranked.index("--master-port") + 1] == str(contract.MP_MASTER_PORT)
        assert "ray" not in ranked
    assert "--headless" not in head and "--headless" in worker

    def unranked(argv):
        at = argv.index("--node-rank")
        return [t for t in argv[:at + 1] + argv[at + 2:] if t != "--headless"]

    # every rank builds the same engine: the argv differ only in the rank and --headless
    assert unranked(head) == unranked(worker)


def test_the_ray_stack_renders_as_before():
    cfg = parse_stack_config(config_blocks())
    argv = launch_bundle.vllm_argv(bundle_args(cfg, cfg.head).vllm)
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in argv and "--headless" not in argv


def test_the_mp_env_file_names_the_rank_watch_and_no_ray():
    cfg = parse_stack_config(mp_blocks())
    env = launch_bundle.render_env_file(bundle_args(cfg, cfg.workers[0]))
    assert f"TWINSPARK_MP_MASTER_PORT={contract.MP_MASTER_PORT}" in env
    assert f"TWINSPARK_MP_MEMBERSHIP_SCRIPT={contract.MP_MEMBERSHIP_SCRIPT}" in env
    assert "VLLM_HOST_IP=" in env and "NCCL_SOCKET_IFNAME=" in env and "GLOO_SOCKET_IFNAME=" in env
    assert [line for line in env.splitlines() if line.startswith("RAY")] == []


# ---- the program's resources ---------------------------------------------------------------

def test_the_program_runs_no_ray_with_mp(program):
    config = stack_config()
    config["twinspark:serving"] = {**config["twinspark:serving"], "executor": "mp"}
    run = program(config)
    assert run.error is None, run.error
    for node, role in (("spark1", "head"), ("spark2", "worker")):
        container = run.named(f"{node}-serving-container").inputs
        assert container["entrypoints"] == ["/bin/bash", f"/twinspark/boot-{role}-mp.sh"]
        assert not container.get("envs")
        assert f"{node}-bundle-ray-token" not in run.by_name
        assert f"{node}-bundle-ray-membership-py" not in run.by_name
        assert f"{node}-bundle-mp-membership-py" in run.by_name
        launch = runner_call(run.named(f"{node}-bundle-launch-vllm-sh")).payload
        assert f"--node-rank {0 if role == 'head' else 1}" in launch and ("--headless" in launch) == (role == "worker")
    # the restart order is kept: the head's container is replaced with (and after) the worker's
    head = run.named("spark1-serving-container")
    assert run.named("spark2-serving-container").urn in head.replace_with


# ---- the rank watch ------------------------------------------------------------------------

def membership():
    return load_file(MEMBERSHIP)


def test_proc_net_tcp_addresses_parse_as_the_kernel_writes_them(tmp_path):
    tcp = tmp_path / "tcp"
    tcp.write_text("  sl  local_address rem_address   st\n"
                   "   0: 0100007F:7339 0200007F:A000 01 0\n"  # 127.0.0.1:29497 <- 127.0.0.2, established
                   "   1: 0100007F:7339 0300007F:A001 08 0\n")  # CLOSE_WAIT: not established
    tcp6 = tmp_path / "tcp6"
    tcp6.write_text("  sl  local_address rem_address st\n"
                    "   0: 0000000000000000FFFF00000100000A:7339 0000000000000000FFFF00000200000A:B000 01 0\n")
    m = membership()
    assert m.established([tcp, tcp6]) == [(("127.0.0.1", 29497), ("127.0.0.2", 40960)),
                                          (("10.0.0.1", 29497), ("10.0.0.2", 45056))]
    assert m.workers_connected(29497, ["127.0.0.2", "127.0.0.3", "10.0.0.2"], [tcp, tcp6]) == {"127.0.0.2",
                                                                                             "10.0.0.2"}


def watch(*args):
    return subprocess.Popen([sys.executable, str(MEMBERSHIP), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_worker_leaves_when_the_head_closes_its_store_connection():
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    client = socket.create_connection(("127.0.0.1", port))
    server_side, _ = listener.accept()
    vllm = subprocess.Popen(["sleep", "60"])
    watcher = watch("worker", "--head", "127.0.0.1", "--port", str(port), "--pid", str(vllm.pid), "--grace", "30")
    try:
        time.sleep(2.5)
        assert watcher.poll() is None, "it left while the head was there"
        server_side.close()  # the head's rank 0 ends: this rank's connection is closed (CLOSE_WAIT here)
        out, _ = watcher.communicate(timeout=10)
        assert "closed this rank's connection" in out
    finally:
        watcher.kill(), vllm.kill(), client.close(), listener.close()


def test_a_worker_leaves_when_the_head_closed_its_connection_before_the_watch_first_looked():
    """The head died within a second of this rank's join (CI's kill right after serving resumed):
    the watch never saw the connection established, only the CLOSE_WAIT the headless worker holds."""
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    client = socket.create_connection(("127.0.0.1", port))
    server_side, _ = listener.accept()
    server_side.close()
    vllm = subprocess.Popen(["sleep", "60"])
    watcher = watch("worker", "--head", "127.0.0.1", "--port", str(port), "--pid", str(vllm.pid), "--grace", "30")
    try:
        out, _ = watcher.communicate(timeout=10)
        assert "closed this rank's connection" in out
    finally:
        watcher.kill(), vllm.kill(), client.close(), listener.close()


def test_a_worker_leaves_when_its_vllm_exits():
    port = free_port()
    vllm = subprocess.Popen(["sleep", "0.5"])
    watcher = watch("worker", "--head", "127.0.0.1", "--port", str(port), "--pid", str(vllm.pid))
    vllm.wait()
    out, _ = watcher.communicate(timeout=10)
    assert f"vLLM (pid {vllm.pid}) exited" in out


def test_the_head_stops_its_engine_once_a_joined_worker_is_gone():
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    engine = subprocess.Popen(["sleep", "60"])
    watcher = watch("head", "--port", str(port), "--workers", "127.0.0.1", "--target-pid", str(engine.pid),
                    "--grace", "1")
    try:
        time.sleep(2)
        assert watcher.poll() is None and engine.poll() is None, "it acted before every rank joined"
        worker = socket.create_connection(("127.0.0.1", port))
        server_side, _ = listener.accept()
        time.sleep(2)
        assert engine.poll() is None, "it stopped the engine while every rank was in"
        worker.close(), server_side.close()
        out, _ = watcher.communicate(timeout=10)
        assert "left rank 0's store" in out
        assert engine.wait(timeout=5) == -15  # SIGTERM
    finally:
        watcher.kill(), engine.kill(), listener.close()


# ---- the stand-in in mp mode -----------------------------------------------------------------

def standin(tmp_path, port, rank, *extra):
    argv = ["serve", "/models/tiny", "--served-model-name", "tiny", "--distributed-executor-backend", "mp",
            "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--uds", str(tmp_path / "vllm.sock"), *extra]
    env = {**os.environ, "TWINSPARK_LOG_DIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, str(STANDIN), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def completion(sock_path) -> int:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        body = '{"model":"tiny","prompt":"Hi","max_tokens":2}'
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}".encode())
        return int(s.recv(64).split()[1])


def test_the_standin_head_serves_only_with_every_rank_and_dies_with_a_worker(tmp_path):
    port, sock = free_port(), tmp_path / "vllm.sock"
    head = standin(tmp_path, port, 0)
    worker = None
    try:
        time.sleep(3)
        assert head.poll() is None and not sock.exists(), "the API opened before node rank 1 joined"
        worker = standin(tmp_path, port, 1, "--headless")
        wait_for(sock.exists, "the API opening with every rank in", 20)
        wait_for(lambda: completion(sock) == 200, "a completion through the API", 10)
        assert [completion(sock) for _ in range(10)] == [200] * 10
        time.sleep(11)  # past the 10 s the head gives a joining rank to say hello: a served rank is not "dead"
        assert head.poll() is None and completion(sock) == 200, "the engine ended with every rank alive"
        worker.kill()  # a node rank dies: the head's engine winds down and exits
        assert head.wait(timeout=20) == 0
        assert "node rank 1 died" in head.stdout.read()
    finally:
        head.kill()
        if worker:
            worker.kill()


def test_the_standin_worker_tries_again_when_a_winding_down_store_closes_its_hello_unanswered(tmp_path):
    """The old head's store still accepts while its engine winds down, and closes what comes:
    that is no join (torch's client would fail and try again), so the worker must not settle
    into waiting on it as on a head it had joined — it connects again and joins the next."""
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(20)
    worker = standin(tmp_path, port, 1, "--headless")
    try:
        refused, _ = listener.accept()  # the winding-down store: closed unanswered
        refused.close()
        joined, _ = listener.accept()  # the next engine's store
        joined.settimeout(10)
        stream = joined.makefile("rw")
        assert stream.readline() == "rank 1\n"
        stream.write("joined\nforward 2\n")
        stream.flush()
        assert stream.readline() == "ok\n"  # in the group: it answers a forward pass
    finally:
        worker.kill(), listener.close()


def test_the_standin_worker_outlives_its_head_as_vllm_s_headless_worker_does(tmp_path):
    port, sock = free_port(), tmp_path / "vllm.sock"
    head = standin(tmp_path, port, 0)
    worker = standin(tmp_path, port, 1, "--headless")
    try:
        wait_for(sock.exists, "the API opening", 20)
        # the rank watch, as boot-worker-mp.sh runs it beside the worker
        watcher = watch("worker", "--head", "127.0.0.1", "--port", str(port), "--pid", str(worker.pid))
        time.sleep(2)
        head.kill()
        head.wait()
        out, _ = watcher.communicate(timeout=20)
        assert "closed this rank's connection" in out
        assert worker.poll() is None, "vLLM's headless worker does not leave by itself: the watch must"
    finally:
        head.kill(), worker.kill()
