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

from core import contract
from scenario_kit import (HEAD, WORKER, flag, ops_access, readiness_s, run_ops, serves, serving_events, serving_pid,
                          vllm_argv, wait_for)

SERVING = contract.SERVING_CONTAINER
BOOT_WORKER_LOG = f"{contract.LOG_DIR}/{contract.boot_log('worker')}"


def boot_logs(cluster) -> str:
    """Each node's serving container state and the tail of its boot log: what a failure shows."""
    text = []
    for node, role in ((HEAD, "head"), (WORKER, "worker")):
        state = cluster.ssh(node, f"docker inspect --format '{{{{.State.Status}}}} restarts={{{{.RestartCount}}}} "
                                  f"exit={{{{.State.ExitCode}}}}' {SERVING}").stdout.strip()
        log = cluster.node_exec(node, "tail", "-n", "25", f"{contract.LOG_DIR}/{contract.boot_log(role)}",
                                check=False).stdout
        text.append(f"== {node}: {state}\n{log}")
    return "\n".join(text)


def waits(cluster, check, timeout_s: float, what: str):
    """wait_for, and on a timeout each node's serving state and boot log: why it did not happen."""
    try:
        return wait_for(check, what, timeout_s)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}\n{boot_logs(cluster)}") from None


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


def test_mp_deploys_and_serves_with_no_ray(cluster, stack, mp_deployed, operator_home, report):
    head, worker = vllm_argv(cluster), worker_argv(cluster)
    assert flag(head, "--distributed-executor-backend") == "mp" and flag(head, "--node-rank") == "0"
    assert flag(worker, "--node-rank") == "1" and "--headless" in worker and "--headless" not in head
    assert serves(stack.outputs()), boot_logs(cluster)
    for node in (HEAD, WORKER):  # no Ray process anywhere
        assert cluster.node_exec(node, "pgrep", "-f", "raylet|gcs_server", check=False).stdout.strip() == ""
    # ops status reads the node ranks joined to rank 0 in place of Ray's membership
    status = run_ops("status", "--json", *ops_access(cluster, stack.outputs(), operator_home))
    assert status.returncode == 0, status.stdout + status.stderr
    head_status = next(n for n in json.loads(status.stdout)["nodes"] if n["node"] == HEAD)
    assert "ray" not in head_status and [n["node_ip"] for n in head_status["ranks"]["nodes"]] == [
        "10.0.0.1", "10.0.0.2"], head_status
    again = stack.up()  # a no-op up restarts nothing with mp either
    assert [m for m in again.steps() if m["op"] != "same"] == []


def test_mp_a_sigterm_to_the_worker_restarts_the_head_and_serving_resumes(cluster, stack, mp_deployed, report):
    """As Ray's test_a_sigterm_to_the_worker_leaves_ray_at_once_and_it_comes_back: PID 1 signalled."""
    outputs, since = stack.outputs(), time.time()
    cluster.node_exec(WORKER, "kill", "-TERM", serving_pid(cluster, WORKER))
    waits(cluster, lambda: serving_events(cluster, HEAD, since, "die"), readiness_s(stack),
             "the head's engine ending with node rank 1 gone")
    waits(cluster, lambda: serves(outputs), readiness_s(stack), "serving after the worker's restart")
    report["mp_worker_sigterm_to_serving_s"] = round(time.time() - since, 1)  # beside worker_sigterm_to_serving_s


def test_mp_a_killed_head_makes_the_worker_leave_and_rejoin(cluster, stack, mp_deployed, report):
    outputs, since = stack.outputs(), time.time()
    cluster.node_exec(HEAD, "kill", "-9", serving_pid(cluster, HEAD))  # as Ray's test_the_head_killed_...
    left = waits(cluster, lambda: serving_events(cluster, WORKER, since, "die"), readiness_s(stack),
                    "the worker leaving the dead head's process group")
    report["mp_worker_detects_head_restart_s"] = round(left[0] - since, 1)
    log = cluster.node_exec(WORKER, "tail", "-n", "40", BOOT_WORKER_LOG, check=False).stdout
    assert "closed this rank's connection" in log or "accepted nothing" in log, log
    waits(cluster, lambda: serves(outputs), readiness_s(stack), "serving after the head's restart")
    report["mp_head_restart_to_serving_s"] = round(time.time() - since, 1)  # beside head_restart_to_serving_s
