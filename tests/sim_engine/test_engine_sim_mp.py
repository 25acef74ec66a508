"""serving.executor mp on the real engine's simulated nodes: deploy, serve, lose a worker, lose the
head, and the figures beside Ray's (test_engine_sim_healing.py's worker_restart_to_serving_s and
head_restart_to_serving_s). The vLLM stand-in's mp mode (tests/sim/bin/vllm) is what runs: the head
serves only with every node rank joined, dies when a rank's connection ends; a headless worker
never leaves by itself, so what brings it back is the rank watch (launch/mp-membership.py).

NOT RUN by the session that wrote it (the lead runs the simulator)."""

from __future__ import annotations

import json
import time

import pytest

import node_contract as contract
from conftest import HEAD, WORKER, completion_status, flag, readiness_s, vllm_argv, wait_for

SERVING = contract.SERVING_CONTAINER
BOOT_WORKER_LOG = f"{contract.LOG_DIR}/{contract.boot_log('worker')}"


def serving_events(cluster, node: str, since: float, action: str) -> list[float]:
    out = cluster.ssh(node, f"docker events --since {since:.3f} --until \"$(date +%s.%N)\" --filter type=container "
                            f"--filter container={SERVING} --filter event={action} --format '{{{{.TimeNano}}}}'")
    assert out.returncode == 0, out.stderr
    return [int(t) / 1e9 for t in out.stdout.split()]


def serves(stack) -> bool:
    outputs = stack.outputs()
    return completion_status(outputs, outputs["apiKey"]) == 200


def worker_argv(cluster) -> list[str]:
    out = cluster.node_exec(WORKER, "cat", f"{contract.LOG_DIR}/vllm-argv.json").stdout
    return json.loads(out)["argv"]


@pytest.fixture(scope="module")
def mp_deployed(cluster, stack, deployed, report):
    """The default deployment switched to mp by `pulumi up`, and back to Ray after the module."""
    stack.set_config("serving.executor", "mp")
    try:
        run = stack.up()
        report["mp_switch_up_s"] = run.seconds
        yield run
    finally:
        stack.set_config("serving.executor", "ray")
        back = stack.up()
        report["mp_back_to_ray_up_s"] = back.seconds


def test_mp_deploys_and_serves_with_no_ray(cluster, stack, mp_deployed, report):
    head, worker = vllm_argv(cluster), worker_argv(cluster)
    assert flag(head, "--distributed-executor-backend") == "mp" and flag(head, "--node-rank") == "0"
    assert flag(worker, "--node-rank") == "1" and "--headless" in worker and "--headless" not in head
    assert serves(stack)
    for node in (HEAD, WORKER):  # no Ray process anywhere
        assert cluster.node_exec(node, "pgrep", "-f", "raylet|gcs_server", check=False).stdout.strip() == ""
    again = stack.up()  # a no-op up restarts nothing with mp either
    assert [m for m in again.steps() if m["op"] != "same"] == []


def test_mp_a_restarted_worker_restarts_the_head_and_serving_resumes(cluster, stack, mp_deployed, report):
    since = time.time()
    cluster.ssh(WORKER, f"docker restart {SERVING}")
    wait_for(lambda: serving_events(cluster, HEAD, since, "die"), readiness_s(stack),
             "the head's engine ending with node rank 1 gone")
    wait_for(lambda: serves(stack), readiness_s(stack), "serving after the worker's restart")
    report["mp_worker_restart_to_serving_s"] = round(time.time() - since, 1)  # beside worker_restart_to_serving_s


def test_mp_a_killed_head_makes_the_worker_leave_and_rejoin(cluster, stack, mp_deployed, report):
    since = time.time()
    pid = cluster.ssh(HEAD, f"docker inspect --format '{{{{.State.Pid}}}}' {SERVING}").stdout.strip()
    cluster.node_exec(HEAD, "kill", "-9", pid)
    left = wait_for(lambda: serving_events(cluster, WORKER, since, "die"), readiness_s(stack),
                    "the worker leaving the dead head's process group")
    report["mp_worker_detects_head_restart_s"] = round(left[0] - since, 1)
    log = cluster.node_exec(WORKER, "tail", "-n", "40", BOOT_WORKER_LOG, check=False).stdout
    assert "closed this rank's connection" in log or "accepted nothing" in log, log
    wait_for(lambda: serves(stack), readiness_s(stack), "serving after the head's restart")
    report["mp_head_restart_to_serving_s"] = round(time.time() - since, 1)  # beside head_restart_to_serving_s
