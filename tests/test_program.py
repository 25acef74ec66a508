"""The real __main__.py under Pulumi mocks with Pulumi.spark.yaml: graph, inputs, outputs."""

import json
import re
import shlex

import pytest
from program_harness import config_blocks, flag_value, flag_values, plain_occurrences, runner_call, stack_config, unwrap
from toolbox import HANG_GUARD_S

from core import contract
from components.config import parse_stack_config
from components.remote import launch_file

COMMAND = "command:remote:Command"
CONTAINER = "docker:index/container:Container"
IMAGE = "docker:index/image:Image"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
DOCKER_PROVIDER = "pulumi:providers:docker"
NODES = ("spark1", "spark2")

# The recipe's launch command (§4), verbatim.
RECIPE_VLLM_ARGV = shlex.split(
    """serve /models/DeepSeek-V4-Flash-0731 --served-model-name ds-0731 --uds /run/twinspark-vllm/vllm.sock
    --tensor-parallel-size 2 --distributed-executor-backend ray --trust-remote-code
    --tokenizer-mode deepseek_v4 --tool-call-parser deepseek_v4 --reasoning-parser deepseek_v4
    --enable-auto-tool-choice --kv-cache-dtype fp8_ds_mla --moe-backend flashinfer_b12x
    --block-size 256 --max-model-len 1048576 --gpu-memory-utilization 0.85 --max-num-seqs 6
    --max-num-batched-tokens 8192 --max-cudagraph-capture-size 24 --generation-config vllm
    --async-scheduling --enable-chunked-prefill --enable-prefix-caching
    --speculative-config '{"method":"dspark","num_speculative_tokens":7,"draft_sample_method":"probabilistic"}'"""
)

# The recipe's environment (§4), verbatim, for spark1.
RECIPE_ENV = {
    "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0",
    "NCCL_NET_GDR_LEVEL": "5",
    "NCCL_SOCKET_IFNAME": "enP7s7",
    "GLOO_SOCKET_IFNAME": "enP7s7",
    "RAY_memory_monitor_refresh_ms": "0",
    "RAY_DISABLE_MEMORY_MONITOR": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
    "VLLM_USE_B12X_MOE": "1",
    "VLLM_USE_B12X_WO_PROJECTION": "1",
    "VLLM_DSPARK_GPU_REJECTED_CONTEXT_MASK": "1",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "DEFAULT_THINKING": "low",
    "HF_HUB_OFFLINE": "1",
}


def stdin_of(run, name):
    """What the step hands its script after the script itself: a managed file's content."""
    return runner_call(run.named(name)).payload


def args_of(run, name):
    return runner_call(run.named(name)).args


def env_file(run, node):
    text = stdin_of(run, f"{node}-bundle-twinspark-env")
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def launch_argv(run, node="spark1"):
    script = stdin_of(run, f"{node}-bundle-launch-vllm-sh")
    command = script[script.index("exec vllm ") + len("exec vllm "):]
    return shlex.split(command.replace("\\\n", " "))


def test_every_node_gets_each_capability(recipe_run):
    for node in NODES:
        for component in ("hostprep", "fabric", "image", "bundle"):
            assert f"{node}-{component}" in recipe_run.by_name
        assert f"{node}-docker" in recipe_run.by_name
    observability = {f"{n}-observability-{c}" for n in NODES for c in ("node-exporter", "gpu-exporter")}
    observability |= {"spark1-observability-prometheus", "spark1-observability-grafana"}  # no webhook: no Alertmanager
    assert {r.name for r in recipe_run.of_type(CONTAINER)} == {
        "spark1-serving-container", "spark2-serving-container", "spark1-serving-gateway", *observability}
    assert {r.name for r in recipe_run.of_type(IMAGE)} == {"spark1-image-build"}  # one build, on the head
    assert "spark2-image-ship" in recipe_run.by_name and "spark1-image-ship" not in recipe_run.by_name
    assert {r.name for r in recipe_run.of_type(REMOTE_IMAGE)} == {f"{c}-image" for c in observability}
    # head-only and worker-only pieces
    assert "spark1-hostprep-userns-sysctl" in recipe_run.by_name
    assert "spark2-hostprep-userns-sysctl" not in recipe_run.by_name
    assert "spark1-bundle-secrets-env" in recipe_run.by_name
    assert "spark2-bundle-secrets-env" not in recipe_run.by_name
    assert {"spark1-bundle-ray-token", "spark2-bundle-ray-token"} <= set(recipe_run.by_name)
    assert "spark1-bundle-api-gateway-conf" in recipe_run.by_name
    assert "spark2-bundle-api-gateway-conf" not in recipe_run.by_name
    assert {"spark1-weights-fetch", "spark1-weights-shape-check", "spark1-weights-sync-key", "spark2-weights-authorize",
            "spark2-weights-sync"} <= set(recipe_run.by_name)
    assert "spark2-weights-shape-check" not in recipe_run.by_name


def test_component_type_tokens(recipe_run):
    tokens = {r.type for r in recipe_run.resources if r.type.startswith("twinspark:")}
    assert tokens == {
        "twinspark:host_prep:HostPrep",
        "twinspark:fabric_check:FabricCheck",
        "twinspark:nccl_check:NcclCheck",
        "twinspark:model_weights:ModelWeights",
        "twinspark:serving_image:ServingImage",
        "twinspark:launch_bundle:LaunchBundle",
        "twinspark:serving_cluster:ServingCluster",
        "twinspark:readiness:Readiness",
        "twinspark:observability:Observability",
        "twinspark:serving_image:BaseImagePin",
        "twinspark:platform_facts:PlatformFacts",
        "twinspark:serving_guard:ServingGuard",
        "twinspark:fabric_requalify:FabricRequalify",
        "twinspark:box_recovery:BoxRecovery",
    }


@pytest.mark.parametrize(
    "resource, must_wait_for",
    [
        ("spark1-fabric-check", ["spark1-hostprep-netplan", "spark2-hostprep-netplan", "spark2-hostprep-memlock-limits"]),
        ("spark2-fabric-check", ["spark1-hostprep-netplan", "spark2-hostprep-netplan"]),
        ("spark1-weights-fetch", ["spark1-fabric-check", "spark2-fabric-check"]),
        # the shape check reads the fetched config.json and every node's memory (each worker's from its own step)
        ("spark1-weights-shape-check", ["spark1-weights-fetch", "spark2-weights-memory"]),
        # no 167 GB copy of a model that cannot load
        ("spark2-weights-sync", ["spark1-weights-fetch", "spark2-weights-authorize", "spark1-weights-shape-check"]),
        ("spark1-image-build", ["spark1-fabric-check"]),
        ("spark2-bundle-launch-vllm-sh", ["spark2-fabric-check"]),
        ("spark1-nccl-check", ["spark1-image-build", "spark1-bundle-twinspark-env", "spark2-fabric-check"]),
        ("spark2-image-ship", ["spark1-image-build", "spark2-weights-host-key", "spark2-weights-authorize"]),
        # the sync key runs only its forced command, installed first; taken back once its steps are done
        ("spark2-weights-authorize", ["spark2-weights-forced-command", "spark2-weights-forced-command-weights"]),
        ("spark2-weights-revoke", ["spark2-weights-sync", "spark2-image-ship"]),
        ("spark2-nccl-check", ["spark2-image-ship", "spark2-bundle-twinspark-env"]),
        ("spark2-serving-container", ["spark2-image-ship", "spark2-bundle-launch-vllm-sh", "spark2-bundle-twinspark-env",
                                      "spark2-weights-sync", "spark1-weights-shape-check", "spark1-nccl-check",
                                      "spark2-nccl-check"]),
        ("spark1-serving-container", ["spark1-image-build", "spark1-bundle-ray-token", "spark1-weights-fetch",
                                      "spark1-weights-shape-check", "spark2-serving-container", "spark2-nccl-check"]),
        ("spark1-serving-gateway", ["spark1-image-build", "spark1-bundle-secrets-env", "spark1-bundle-api-gateway-conf"]),
        ("spark1-readiness-wait", ["spark1-serving-container", "spark1-serving-gateway"]),
        # the exporters bind first-rail addresses, which exist once the fabric is checked
        ("spark2-observability-node-exporter", ["spark2-observability-dirs", "spark2-fabric-check"]),
        ("spark2-observability-gpu-exporter", ["spark2-observability-dirs", "spark2-fabric-check"]),
        ("spark1-observability-prometheus", ["spark1-observability-dirs", "spark1-observability-prometheus-config",
                                             "spark1-observability-alert-rules", "spark1-fabric-check"]),
        ("spark1-observability-grafana", ["spark1-observability-dirs", "spark1-observability-grafana-password",
                                          "spark1-observability-grafana-datasource",
                                          "spark1-observability-dashboard-overview"]),
        ("spark1-observability-grafana-admin", ["spark1-observability-grafana"]),
    ],
)
def test_dependencies(recipe_run, resource, must_wait_for):
    for target in must_wait_for:
        assert recipe_run.depends_on(recipe_run.named(resource), target), f"{resource} does not wait for {target}"


def ray_token_keepers(run) -> dict:
    return unwrap(run.named("ray-token").inputs)["keepers"]


def test_rays_token_is_new_for_a_new_set_of_machines_only(program, recipe_config, recipe_run):
    """The engine deletes a removed node's containers last, after the rest restarted with the new
    layout: with the old token that node's raylet would rejoin them and take a rank. A role swap
    or a profile change keeps the token (and restarts nothing for it)."""
    kept = ray_token_keepers(recipe_run)
    swapped = json.loads(json.dumps(recipe_config))
    for node in swapped["twinspark:nodes"]:
        node["role"] = "worker" if node["role"] == "head" else "head"
    swapped["twinspark:serving"]["profile"] = "multiagent"
    swapped_run = program(swapped)
    assert ray_token_keepers(swapped_run) == kept
    # the new head's NCCL rank is rank 0, which holds the roll call at its own rail address (the
    # rehearsal of 5b1ada3 failed here: ranks in `nodes` order made spark1 rank 0 at spark2's address)
    for node, rank in (("spark2", "0"), ("spark1", "1")):
        argv = runner_call(swapped_run.named(f"{node}-nccl-check")).args
        check = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--check-arg"]  # the rank program's own
        assert check[check.index("--rank") + 1] == rank, (node, check)
    grown = three_node_config(json.loads(json.dumps(recipe_config)))
    grown["twinspark:serving"]["pipelineParallel"] = 3
    assert ray_token_keepers(program(grown)) != kept


def test_a_replaced_worker_replaces_the_head(recipe_run):
    head, worker = recipe_run.named("spark1-serving-container"), recipe_run.named("spark2-serving-container")
    # and each follows its own node's installation (tests/test_nccl_ranks.py: a reinstalled node)
    assert head.replace_with == [recipe_run.named("spark1-installation").urn, worker.urn]
    assert worker.replace_with == [recipe_run.named("spark2-installation").urn]


def test_worker_does_not_wait_for_head(recipe_run):
    assert not recipe_run.depends_on(recipe_run.named("spark2-serving-container"), "spark1-serving-container")


def test_containers_carry_every_recipe_docker_option(recipe_run):
    for name, role in (("spark1-serving-container", "head"), ("spark2-serving-container", "worker")):
        c = recipe_run.named(name)
        inputs = unwrap(c.inputs)
        # one name whatever the role: a role change replaces the node's container in place
        assert inputs["name"] == "twinspark-serving"
        assert inputs["entrypoints"] == ["/bin/bash", f"/twinspark/boot-{role}.sh"]
        assert set(inputs["envs"]) == {"RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/twinspark/ray-token"}
        assert inputs["networkMode"] == "host"
        assert inputs["ipcMode"] == "host"
        assert inputs["gpus"] == "all"
        assert inputs["restart"] == "unless-stopped"
        assert {u["name"]: (u["soft"], u["hard"]) for u in inputs["ulimits"]} == {
            "memlock": (-1, -1),
            "stack": (67108864, 67108864),
        }
        assert inputs["capabilities"] == {"adds": ["IPC_LOCK"]}
        assert inputs["devices"] == [{"hostPath": "/dev/infiniband", "containerPath": "/dev/infiniband"}]
        mounts = {m["target"]: m for m in inputs["mounts"]}
        assert mounts["/models/DeepSeek-V4-Flash-0731"]["source"] == "/home/nvidia/models/DeepSeek-V4-Flash-0731"
        assert mounts["/models/DeepSeek-V4-Flash-0731"]["readOnly"] is True
        assert mounts["/twinspark"] == {"target": "/twinspark", "source": "/opt/twinspark", "readOnly": True, "type": "bind"}
        # the memory check reads what each slice holds in the host's cgroup tree
        assert mounts[contract.HOST_CGROUP_DIR] == {"target": contract.HOST_CGROUP_DIR, "source": "/sys/fs/cgroup",
                                                    "readOnly": True, "type": "bind"}
        socket = [{"hostPath": "/run/twinspark-vllm", "containerPath": "/run/twinspark-vllm"}] if role == "head" else []
        assert inputs["volumes"] == [{"hostPath": "/var/log/twinspark", "containerPath": "/var/log/twinspark"},
                                     {"hostPath": "/var/cache/twinspark", "containerPath": "/var/cache/twinspark"},
                                     {"hostPath": "/run/twinspark", "containerPath": "/run/twinspark"}, *socket]
        # apart from the co-tenants' slices, which HostPrep caps
        assert inputs["cgroupParent"] == "twinspark.slice"
        assert inputs["entrypoints"] == ["/bin/bash", f"/twinspark/boot-{role}.sh"]
        assert c.delete_before_replace
        assert [item["label"] for item in inputs["labels"]] == ["twinspark.bundle-hmac"]


def test_only_the_heads_serving_container_and_the_gateway_mount_vllms_socket(recipe_config, program):
    """vLLM reachable by the gateway alone: no other container (Grafana, Prometheus, the
    exporters, the workers) can even see the socket's directory."""
    recipe_config["twinspark:alertWebhookUrl"] = "https://hooks.example.test/x"
    run_ = program(recipe_config)
    containers = [r for r in run_.resources if r.type == "docker:index/container:Container"]
    assert len(containers) > 6, [c.name for c in containers]

    def sees_socket(c):
        inputs = unwrap(c.inputs)
        paths = [v.get("hostPath") for v in inputs.get("volumes") or []] + [m.get("source") for m in inputs.get("mounts") or []]
        return any(p and (p == contract.VLLM_SOCKET_DIR or p.startswith(contract.VLLM_SOCKET_DIR + "/")
                          or contract.VLLM_SOCKET_DIR.startswith(p.rstrip("/") + "/") or p == "/")
                   for p in paths)

    seeing = {c.name: unwrap(c.inputs) for c in containers if sees_socket(c)}
    # the node exporters read the host's whole root (read-only): they run as the image's own
    # unprivileged user, whom the socket directory's mode (2750 root:API_SOCKET_GROUP) keeps out
    exporters = {name for name in seeing if name.endswith("-observability-node-exporter")}
    assert all(not seeing[name].get("user") and not seeing[name].get("groupAdds") for name in exporters)
    assert set(seeing) - exporters == {"spark1-serving-container", "spark1-serving-gateway"}


def bundle_label(run, container="spark1-serving-container"):
    return unwrap(run.named(container).inputs["labels"])[0]["value"]


def test_bundle_label_follows_the_key_but_cannot_be_checked_against_a_guess(program, recipe_config, recipe_run):
    """Issue 9: anyone reading container labels must not be able to test API-key guesses offline."""
    from components.remote import sha256_text

    files = [r for r in recipe_run.of_type(COMMAND) if r.name.startswith("spark1-bundle-")]
    calls = {r.name: runner_call(r) for r in files}
    plain = sha256_text(*(f"{flag_value(c.args, '--path')}\0{flag_value(c.args, '--mode')}\0{c.payload}"
                          for name, c in calls.items() if "gateway" not in name and "secrets" not in name))
    assert bundle_label(recipe_run) != plain
    recipe_config["twinspark:apiKey"] = "sk-another-key-0123456789"
    rekeyed = program(recipe_config)
    assert bundle_label(rekeyed, "spark1-serving-gateway") != bundle_label(recipe_run, "spark1-serving-gateway")


def test_a_key_rotation_changes_nothing_but_the_key(program, recipe_config, recipe_run):
    """Issue 21: a new apiKey rewrites secrets.env and replaces the gateway (its label follows the
    key) — the engine, the workers and the guard (which reads the key every round) stay."""
    recipe_config["twinspark:apiKey"] = "sk-rotated-key-0123456789abcdef"
    rotated = program(recipe_config, secret_keys=["twinspark:apiKey"])
    assert rotated.error is None, rotated.error
    before = {r.name: unwrap(r.inputs) for r in recipe_run.resources}
    changed = sorted(r.name for r in rotated.resources if before.get(r.name) != unwrap(r.inputs))
    # and the readiness wait checks the new gateway with the new key (it restarts nothing)
    assert changed == ["spark1-bundle-secrets-env", "spark1-readiness-wait", "spark1-serving-gateway"], changed


def test_containers_use_the_one_image_id_on_their_nodes_daemon(recipe_run):
    built = recipe_run.named("spark1-image-build")
    assert built.provider.startswith(recipe_run.named("spark1-docker").urn)
    for node, container in (("spark1", "spark1-serving-container"), ("spark2", "spark2-serving-container")):
        c = recipe_run.named(container)
        assert c.inputs["image"] == built.outputs["repoDigest"]  # the built image's id, never the tag
        assert c.inputs["image"].startswith("sha256:")
        assert c.provider.startswith(recipe_run.named(f"{node}-docker").urn)


def test_serving_image_build(recipe_run):
    image = recipe_run.named("spark1-image-build").inputs
    assert re.fullmatch(r"twinspark-vllm:ray-[0-9a-f]{12}", image["imageName"])
    assert image["skipPush"] is True
    build = image["build"]
    assert build["platform"] == "linux/arm64"
    assert build["context"] == "launch/serving-image"
    # FROM the digest the head resolved the tag to, never the tag itself (test_image_pin.py); Ray
    # from the lock in the context, nginx at the version the config names
    pin = recipe_run.named("image-pin-resolve").outputs["stdout"]
    assert build["args"] == {"BASE_IMAGE": f"ghcr.io/anemll/dspark-vllm-gx10@{pin}",
                             "APT_PACKAGES": "nginx=1.18.0-6ubuntu14",
                             "API_SOCKET_GROUP": "twinspark-api", "API_SOCKET_GID": "64180"}
    for node, host in (("spark1", "192.168.1.10"), ("spark2", "192.168.1.11")):
        provider = recipe_run.named(f"{node}-docker").inputs
        assert provider["host"] == f"ssh://nvidia@{host}"
        assert "StrictHostKeyChecking=yes" in json.loads(provider["sshOpts"])  # tests/test_ssh_access.py: the rest


def test_each_serving_image_build_keeps_a_tag_of_its_own(program, recipe_config, recipe_run):
    """An upgrade's build must not take the previous build's tag: the previous image would be left
    dangling, and `docker image prune` would remove what a rollback needs (issue 12 item 4)."""
    before = recipe_run.named("spark1-image-build").inputs["imageName"]
    assert program(recipe_config).named("spark1-image-build").inputs["imageName"] == before  # deterministic
    recipe_config["twinspark:serving"]["image"] = "ghcr.io/anemll/dspark-vllm-gx10:0.1.2"
    upgraded = program(recipe_config)
    assert upgraded.named("spark1-image-build").inputs["imageName"] != before
    # the worker gets the same tag (docker load keeps it): not dangling there either
    ship = runner_call(upgraded.named("spark2-image-ship"))
    assert flag_value(ship.args, "--image") == upgraded.named("spark1-image-build").inputs["imageName"]


def test_the_whole_build_context_names_the_images_tag():
    """A new lock or install script rebuilds (contextDigest): it must get a tag of its own too."""
    from components.serving_image import build_context, build_tag

    context = build_context()
    assert {"Dockerfile", "ray-requirements.lock", "loader-requirements.lock", "locked-install.sh"} <= set(context)
    tag = build_tag(context, {"BASE_IMAGE": "b"})
    for name in ("ray-requirements.lock", "loader-requirements.lock", "locked-install.sh", "Dockerfile"):
        assert build_tag({**context, name: context[name] + "\n"}, {"BASE_IMAGE": "b"}) != tag, name
    assert build_tag(context, {"BASE_IMAGE": "c"}) != tag


def test_nccl_check_runs_in_the_serving_image_with_the_serving_flags(recipe_run):
    for node, rank, container in (("spark1", "0", "spark1-serving-container"), ("spark2", "1", "spark2-serving-container")):
        call = runner_call(recipe_run.named(f"{node}-nccl-check"))
        image = recipe_run.named(container).inputs["image"]
        assert call.script == "nccl-check.sh"
        assert flag_value(call.args, "--image") == image  # the node's own built image
        assert flag_value(call.args, "--env-file") == "/opt/twinspark/twinspark.env"
        args = flag_values(call.args, "--check-arg")
        assert args[args.index("--rank") + 1] == rank
        assert args[args.index("--world-size") + 1] == "2"
        assert args[args.index("--master") + 1] == "10.0.0.1:29555"
        assert args[args.index("--min-busbw-gbps") + 1] == "10"
        assert args[args.index("--require-network") + 1] == "IB"
        # the same docker options the serving containers get (recipe §4)
        flags = " ".join(flag_values(call.args, "--docker-flag"))
        for flag in ("--network host", "--ipc host", "--gpus all", "--ulimit memlock=-1", "--ulimit stack=67108864",
                     "--cap-add IPC_LOCK", "--device /dev/infiniband"):
            assert flag in flags
        assert call.payload.startswith("#!/usr/bin/env python3\n\"\"\"nccl-allreduce-check.py")
        rank = recipe_run.named(f"{node}-nccl-check")
        assert rank.inputs["triggers"] == [recipe_run.named(f"{node}-docker").inputs["host"]]
        # every rank re-runs together (tests/test_nccl_ranks.py)
        assert rank.replace_with == [recipe_run.named("nccl-run").urn]


def test_nccl_check_can_be_switched_off(program, recipe_config):
    recipe_config["twinspark:fabric"]["minBusBandwidthGBps"] = 0
    run = program(recipe_config)
    assert run.error is None, run.error
    assert "spark1-serving-container" in run.by_name
    assert not [r for r in run.of_type(COMMAND) if r.name.endswith("-nccl-check")]


def test_launch_script_is_the_recipe_command(recipe_run):
    assert launch_argv(recipe_run) == RECIPE_VLLM_ARGV
    assert launch_argv(recipe_run, "spark2") == RECIPE_VLLM_ARGV


def test_multiagent_profile(program, recipe_config):
    recipe_config["twinspark:serving"]["profile"] = "multiagent"
    run = program(recipe_config)
    argv = launch_argv(run)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    assert argv[argv.index("--max-num-seqs") + 1] == "8"


def test_extra_args_are_appended_last(program, recipe_config):
    recipe_config["twinspark:serving"]["extraArgs"] = ["--max-log-len", "100", "--enable-log-requests"]
    argv = launch_argv(program(recipe_config))
    assert argv[-3:] == ["--max-log-len", "100", "--enable-log-requests"]


def test_env_file_holds_the_recipe_environment(recipe_run):
    for node in NODES:
        env = env_file(recipe_run, node)
        for key, value in RECIPE_ENV.items():
            assert env[key] == value, (node, key)
        assert env["RAY_worker_oom_score_adjustment"] == "0"
        assert env["RAY_prestart_worker_first_driver"] == "0"  # no idle worker beside vLLM's actors
    head, worker = env_file(recipe_run, "spark1"), env_file(recipe_run, "spark2")
    assert (head["TWINSPARK_ROLE"], worker["TWINSPARK_ROLE"]) == ("head", "worker")
    assert head["TWINSPARK_NODE_IP"] == head["VLLM_HOST_IP"] == worker["TWINSPARK_HEAD_IP"] == "10.0.0.1"
    assert worker["TWINSPARK_NODE_IP"] == worker["VLLM_HOST_IP"] == "10.0.0.2"
    assert head["TWINSPARK_NODE_IPS"] == "10.0.0.1,10.0.0.2"


def test_host_prep_files(recipe_run):
    limits = stdin_of(recipe_run, "spark1-hostprep-memlock-limits")
    assert "* soft memlock unlimited" in limits and "* hard memlock unlimited" in limits
    assert "DefaultLimitMEMLOCK=infinity" in stdin_of(recipe_run, "spark2-hostprep-systemd-memlock")
    assert "kernel.apparmor_restrict_unprivileged_userns = 0" in stdin_of(recipe_run, "spark1-hostprep-userns-sysctl")
    # issue 10 item 6: a hard-locked node reboots itself instead of waiting for a power cycle
    hang = runner_call(recipe_run.named("spark2-hostprep-hang-recovery"))
    assert hang.payload.splitlines()[1:] == ["kernel.softlockup_panic = 1", "kernel.hardlockup_panic = 1", "kernel.panic = 30"]
    assert flag_value(hang.args, "--undo") == "kernel.softlockup_panic=0 kernel.hardlockup_panic=0 kernel.panic=0"
    assert "RuntimeWatchdogSec=60s" in stdin_of(recipe_run, "spark1-hostprep-watchdog")
    netplan = runner_call(recipe_run.named("spark2-hostprep-netplan"))
    assert netplan.script == "managed-file.sh" and netplan.args[0] == "install"
    assert flag_value(netplan.args, "--path") == "/etc/netplan/99-qsfp.yaml" and flag_value(netplan.args, "--mode") == "0600"
    assert flag_value(netplan.args, "--action") == "netplan"
    assert "10.0.0.2/24" in netplan.payload and "10.0.1.2/24" in netplan.payload
    for r in recipe_run.of_type(COMMAND):
        if r.name.startswith(("spark1-hostprep", "spark2-hostprep")):
            create, delete = runner_call(r), runner_call(r, "delete")
            assert (create.args[0], delete.args[0]) == ("install", "remove") and create.args[1:] == delete.args[1:]
            assert flag_value(create.args, "--owner") == r.name
            assert r.inputs["addPreviousOutputInEnv"] is False


def test_steps_that_undo_themselves_are_replaced_delete_first(recipe_run):
    """`pulumi up --replace` on a file, the sync key or its authorization must not end with
    the old delete removing what the new create just installed (issue 8, item 1)."""
    undoing = [r for r in recipe_run.of_type(COMMAND) if r.inputs.get("delete")]
    # host files (11 + 11 + userns: the rails' ARP sysctl among them), head bundle (+ gateway), worker bundle
    # (each with roce-gid.py), sync key, authorize,
    # the worker's forced command and its weights.py, the kept model revision, observability
    # files on the head (prometheus.yml, rules, datasource, dashboard provider, 3 dashboards,
    # Grafana password), the guard's script, fabric watch and unit; the re-qualification's files on
    # each node (requalify.py, the plan, four checks' files, fabric_watch.py), the head's key and its authorization;
    # each node's recorder (its script and unit; no plug in the recipe stack: no power watch)
    assert len(undoing) == 23 + 13 + 10 + 1 + 1 + 2 + 1 + 8 + 3 + 2 * 7 + 1 + 1 + 2 * 2
    assert [r.name for r in undoing if not r.delete_before_replace] == []


def test_containers_get_a_stop_grace(recipe_run):
    for r in recipe_run.of_type(CONTAINER):
        assert r.inputs["destroyGraceSeconds"] == (30 if "-observability-" in r.name else 60), r.name


def test_compile_caches_live_on_the_host(recipe_run):
    """Issue 10 item 7: vLLM, Inductor, Triton and FlashInfer write under the host's cache
    directory, which every serving container mounts: a replaced container starts warm."""
    for node in ("spark1", "spark2"):
        env = env_file(recipe_run, node)
        assert {k: env[k] for k in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                                    "FLASHINFER_WORKSPACE_BASE")} == {
            "VLLM_CACHE_ROOT": "/var/cache/twinspark/vllm", "TORCHINDUCTOR_CACHE_DIR": "/var/cache/twinspark/torchinductor",
            "TRITON_CACHE_DIR": "/var/cache/twinspark/triton", "FLASHINFER_WORKSPACE_BASE": "/var/cache/twinspark/flashinfer"}


def test_gpu_clock_cap_survives_reboots_when_asked_for(program, recipe_config, recipe_run):
    """Issue 10 item 6: `nvidia-smi -lgc` alone is lost at reboot; a unit applies it now and at boot."""
    assert not [r for r in recipe_run.of_type(COMMAND) if r.name.endswith("-hostprep-gpu-clocks")]
    recipe_config["twinspark:serving"]["gpuClockCapMhz"] = 1800
    run = program(recipe_config)
    assert run.error is None, run.error
    for node in ("spark1", "spark2"):
        call = runner_call(run.named(f"{node}-hostprep-gpu-clocks"))
        assert flag_value(call.args, "--action") == "service"
        assert flag_value(call.args, "--path") == "/etc/systemd/system/twinspark-gpu-clocks.service"
        assert "ExecStart=/usr/bin/nvidia-smi -lgc 0,1800\n" in call.payload
        assert "ExecStop=/usr/bin/nvidia-smi -rgc\n" in call.payload


def test_serving_containers_stop_gracefully(recipe_run):
    """Issue 8 item 8: 60 s to drain, whoever stops them (pulumi, docker stop, a reboot)."""
    for name, signal in (("spark1-serving-container", "SIGTERM"), ("spark2-serving-container", "SIGTERM"),
                         ("spark1-serving-gateway", "SIGQUIT")):
        inputs = recipe_run.named(name).inputs
        assert (inputs["destroyGraceSeconds"], inputs["stopTimeout"], inputs["stopSignal"]) == (60, 60, signal)


def test_fabric_check_arguments(recipe_run):
    argv = args_of(recipe_run, "spark1-fabric-check")
    assert flag_value(argv, "--mtu") == "9000"
    assert flag_value(argv, "--speed-mbps") == "200000"
    rails = flag_values(argv, "--rail")
    assert rails == ["enp1s0f0np0:rocep1s0f0:10.0.0.2", "enP2p1s0f0np0:roceP2p1s0f0:10.0.1.2"]


def test_model_shape_check_knows_tp_memory_share_and_every_peer(recipe_run):
    call = runner_call(recipe_run.named("spark1-weights-shape-check"))
    assert call.script == "model-shape-check.sh"
    assert flag_value(call.args, "--dir") == "/home/nvidia/models/DeepSeek-V4-Flash-0731"
    assert flag_value(call.args, "--manifest") == ".twinspark-manifest"
    assert flag_value(call.args, "--tensor-parallel-size") == "2"
    assert flag_value(call.args, "--gpu-memory-utilization") == "0.85"
    assert call.args[0] == "check" and flag_values(call.args, "--memory-kb") == ["spark2=126877696"]  # as spark2 said
    # read on the worker itself, over its own connection: no key of the head's reaches it for the check
    memory = recipe_run.named("spark2-weights-memory")
    assert runner_call(memory).args == ["memory", "--node", "spark2"] and memory.inputs["triggers"] == ["ssh://nvidia@192.168.1.11"]
    assert "--key" not in call.args and "--peer" not in call.args
    assert memory.replace_with == [recipe_run.named("spark2-installation").urn]  # a reinstall reads it again
    assert call.payload == launch_file("model-shape.py")  # its `check`
    # the fetch checks the same on the hub's listing before it downloads: both programs, framed
    shape, weights = launch_file("model-shape.py"), launch_file("weights.py")
    assert stdin_of(recipe_run, "spark1-weights-fetch") == (
        f"{len(shape.encode())}\n{shape}{len(weights.encode())}\n{weights}")
    assert recipe_run.named("spark1-weights-shape-check").inputs["triggers"] == [
        "ssh://nvidia@192.168.1.10", "deepseek-ai/DeepSeek-V4-Flash-0731"]


def test_weights_copy_goes_over_the_first_rail(recipe_run):
    assert flag_value(args_of(recipe_run, "spark2-weights-sync"), "--to") == "nvidia@10.0.0.2"
    authorized = stdin_of(recipe_run, "spark2-weights-authorize")
    assert authorized.startswith('from="10.0.0.1",command="python3 /usr/local/lib/twinspark/sync-key/sync-key-command.py '
                                 '--node spark2 --dir /home/nvidia/models/DeepSeek-V4-Flash-0731 ')
    assert '--rail 10.0.0.2=10.0.0.1 --rail 10.0.1.2=10.0.1.1 ' in authorized  # the copy's rails, bound
    assert f"--revision {RECIPE_REVISION} " in authorized
    assert '",restrict ssh-ed25519 ' in authorized


def key_windows(run) -> tuple[list, list]:
    """The head's key on spark2: the authorization's triggers; the revocation's, less the line, the
    authorization's ID, the IDs of the steps it follows (the copy, the ship: an authorization or a
    step made anew runs it again) and the authorization's output."""
    opened, revoked = (run.named(f"spark2-weights-{step}").inputs["triggers"] for step in ("authorize", "revoke"))
    assert len(revoked) == len(opened) + 5 and revoked[len(opened)] == stdin_of(run, "spark2-weights-authorize"), revoked
    # the opening's stamped output last: an opening after a failed step closes the key again
    assert revoked[-1] == run.named("spark2-weights-authorize").outputs["stdout"], revoked
    return opened, revoked[:len(opened)]


def test_the_sync_keys_authorization_opens_again_exactly_when_a_step_that_uses_it_runs_again(program, recipe_config,
                                                                                              recipe_run):
    """The authorization and its revocation share one trigger per step that uses the key: a change
    that re-runs one of those steps (here the ship's, by the serving image) opens it again; one that
    re-runs none of them (the API key; maxModelLen, which re-runs the shape check: it reads each
    worker's memory from the worker's own step, never with the key) leaves both alone."""
    opened, revoked = key_windows(recipe_run)
    assert opened == revoked and len(opened) == 1 + 2  # the worker's identity; the ship, the copy
    rekeyed = program({**recipe_config, "twinspark:apiKey": "sk-another-key-of-the-users-0123456789"})
    assert rekeyed.error is None, rekeyed.error
    assert key_windows(rekeyed) == (opened, revoked)
    reshaped = program({**recipe_config, "twinspark:serving": {**recipe_config["twinspark:serving"], "maxModelLen": 65536}})
    assert reshaped.error is None, reshaped.error
    assert args_of(reshaped, "spark1-weights-shape-check") != args_of(recipe_run, "spark1-weights-shape-check")
    assert key_windows(reshaped) == (opened, revoked)
    reimaged = program({**recipe_config, "twinspark:serving": {**recipe_config["twinspark:serving"],
                                                               "aptPackages": ["infiniband-diags=44.0-2"]}})
    assert reimaged.error is None, reimaged.error
    again, revoked_again = key_windows(reimaged)
    assert again == revoked_again and sum(a != b for a, b in zip(again, opened)) == 1  # the ship's alone


def test_secrets_stay_secret(program, recipe_config):
    recipe_config["twinspark:apiKey"] = "sk-user-chosen-key-123"
    recipe_config["twinspark:hfToken"] = "hf_user_token_456"
    recipe_config["twinspark:grafanaAdminPassword"] = "grafana-pw-chosen-789"
    recipe_config["twinspark:alertWebhookUrl"] = "https://hooks.example.test/T0KEN-in-the-path"
    worker = recipe_config["twinspark:nodes"][1]
    recipe_config["twinspark:nodes"] = [recipe_config["twinspark:nodes"][0],
                                        {**worker, "power": {"kind": "shelly", "url": "http://admin:PLUG-pw@192.0.2.60"}}]
    # set_all_config cannot mark values secret; the program must wrap them itself
    run = program(recipe_config)
    assert run.error is None, run.error
    # the plug's URL: a root-only file on the node that watches the plugged one, and nowhere else
    plug = runner_call(run.named("spark1-recovery-plug-url"))
    assert plug.payload == "http://admin:PLUG-pw@192.0.2.60\n" and flag_value(plug.args, "--mode") == "0600"
    for secret in ("sk-user-chosen-key-123", "hf_user_token_456", "grafana-pw-chosen-789", "T0KEN-in-the-path",
                   "PLUG-pw"):
        for r in run.resources:
            assert not plain_occurrences(r.inputs, secret), f"{secret} in plain inputs of {r.name}"
            for field in ("create", "delete", "update", "command", "envs", "labels", "entrypoints", "triggers"):
                assert secret not in json.dumps(unwrap(r.inputs.get(field, ""))), (r.name, field)
    assert run.outputs["apiKey"] == {"value": "sk-user-chosen-key-123", "secret": True}
    assert run.outputs["claudeCodeEnv"]["secret"] is True and run.outputs["openaiEnv"]["secret"] is True
    assert run.outputs["grafanaAdminPassword"] == {"value": "grafana-pw-chosen-789", "secret": True}
    for name, out in run.outputs.items():
        if not out["secret"]:
            for secret in ("sk-user-chosen-key-123", "grafana-pw-chosen-789", "T0KEN-in-the-path"):
                assert secret not in json.dumps(out["value"]), name


def test_generated_key_reaches_vllm_and_readiness_on_stdin(recipe_run):
    key = recipe_run.outputs["apiKey"]["value"]
    assert stdin_of(recipe_run, "spark1-bundle-secrets-env") == f"VLLM_API_KEY={key}\n"
    assert runner_call(recipe_run.named("spark1-readiness-wait")).secrets == {"VLLM_API_KEY": key}


def test_readiness_waits_for_a_real_completion(recipe_run):
    r = recipe_run.named("spark1-readiness-wait").inputs
    argv = args_of(recipe_run, "spark1-readiness-wait")
    assert flag_value(argv, "--timeout-s") == str(20 * 60)
    assert flag_value(argv, "--url") == "http://127.0.0.1:8000"
    assert flag_values(argv, "--container") == ["twinspark-serving", "twinspark-api-gateway"]
    assert r["triggers"] == ["ssh://nvidia@192.168.1.10", "spark1-serving-container_id", "spark1-serving-gateway_id"]


def test_outputs_contract(recipe_run):
    out = recipe_run.outputs
    assert set(out) == {
        "endpoint", "model", "modelRevision", "apiKey", "healthUrl", "metricsUrl", "codexConfig",
        "codexModelCatalog", "claudeCodeEnv", "claudeCodeSettings", "openaiEnv", "nodes", "fabric", "sshUser",
        "servingImage", "platform",
        "launchBundles", "grafanaUrl", "grafanaAdminPassword", "prometheusUrl", "prometheusTunnel", "recipe",
        "memoryFit", "modelDir", "executor",
    }
    assert out["executor"]["value"] == "ray"
    assert out["modelDir"]["value"] == "/home/nvidia/models/DeepSeek-V4-Flash-0731"
    assert out["recipe"]["value"] == "DeepSeek-V4-Flash-0731"
    # what `ops upgrade` checks a rollback against: each node's bundle hash, as its containers' label
    bundles = out["launchBundles"]["value"]
    assert set(bundles) == {"spark1", "spark2"}
    for node, digest in bundles.items():
        assert recipe_run.named(f"{node}-serving-container").inputs["labels"]  # the label carries it too
        assert re.fullmatch(r"[0-9a-f]{64}", digest), digest
    assert out["endpoint"]["value"] == "http://192.168.1.10:8000/v1"
    assert out["model"]["value"] == "ds-0731"
    assert out["healthUrl"]["value"] == "http://192.168.1.10:8000/health"
    assert out["metricsUrl"]["value"] == "http://192.168.1.10:8000/metrics"
    codex = out["codexConfig"]["value"]
    assert 'wire_api = "responses"' in codex and "model_auto_compact_token_limit = 150000" in codex
    assert 'base_url = "http://192.168.1.10:8000/v1"' in codex
    catalog = json.loads(out["codexModelCatalog"]["value"])
    assert catalog["models"][0]["context_window"] == 1048576
    claude = out["claudeCodeEnv"]["value"]
    assert "ANTHROPIC_BASE_URL=http://192.168.1.10:8000\n" in claude and "ANTHROPIC_MODEL=ds-0731" in claude
    assert f"ANTHROPIC_AUTH_TOKEN={shlex.quote(out['apiKey']['value'])}\n" in claude
    for tier in ("OPUS", "SONNET", "HAIKU"):  # every tier Claude Code asks for is the model served
        assert f"ANTHROPIC_DEFAULT_{tier}_MODEL=ds-0731\n" in claude
    assert json.loads(out["claudeCodeSettings"]["value"]) == {"env": {"CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}}
    assert out["claudeCodeSettings"]["secret"] is False
    key = out["apiKey"]["value"]
    assert out["openaiEnv"]["value"].splitlines()[1:] == [
        "OPENAI_BASE_URL=http://192.168.1.10:8000/v1", "OPENAI_API_BASE_URL=http://192.168.1.10:8000/v1",
        f"OPENAI_API_KEY={key}", f"VLLM_API_KEY={key}"]
    nodes = out["nodes"]["value"]
    assert [(n["name"], n["role"], n["host"]) for n in nodes] == [
        ("spark1", "head", "192.168.1.10"),
        ("spark2", "worker", "192.168.1.11"),
    ]
    assert nodes[1]["rails"][1] == {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.2/24"}
    assert [n["rayIp"] for n in nodes] == ["10.0.0.1", "10.0.0.2"]
    assert out["fabric"]["value"] == {"mtu": 9000, "linkSpeedMbps": 200000}
    assert out["sshUser"]["value"] == "nvidia"
    assert out["grafanaUrl"] == {"value": "http://192.168.1.10:3000", "secret": False}
    assert out["grafanaAdminPassword"]["secret"] is True
    assert out["prometheusUrl"]["value"] == "http://127.0.0.1:9090"
    assert out["prometheusTunnel"]["value"] == "ssh -N -L 9090:127.0.0.1:9090 nvidia@192.168.1.10"


@pytest.mark.parametrize("api_key", ["sk-$(touch PWNED)", "sk-`touch PWNED`", "sk-'; touch PWNED; '", 'sk-"x" $HOME'])
def test_claude_code_env_cannot_run_code_when_sourced(tmp_path, api_key):
    """A key with shell syntax in it is only a value: sourcing the file runs nothing and keeps it exact."""
    import subprocess

    from components.client_outputs import render_claude_code_env

    cfg = parse_stack_config(config_blocks())
    env_file = tmp_path / "claude-code.env"
    env_file.write_text(render_claude_code_env([cfg], api_key))
    proc = subprocess.run(["bash", "-c", f'source {shlex.quote(str(env_file))} && printf %s "$ANTHROPIC_AUTH_TOKEN"'],
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == api_key
    assert not (tmp_path / "PWNED").exists()


def test_client_context_follows_max_model_len(program, recipe_config):
    recipe_config["twinspark:serving"]["maxModelLen"] = 131072
    out = program(recipe_config).outputs
    assert json.loads(out["codexModelCatalog"]["value"])["models"][0]["context_window"] == 131072
    # the fences stay under the served context: 90% of it, or the KV dtype's fence if lower
    assert "model_auto_compact_token_limit = 117964" in out["codexConfig"]["value"]
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS=131072" in out["claudeCodeEnv"]["value"]


def test_nvfp4_kv_tightens_the_compaction_fence(program, recipe_config):
    recipe_config["twinspark:serving"]["kvCacheDtype"] = "nvfp4_ds_mla"
    run = program(recipe_config)
    assert "model_auto_compact_token_limit = 110000" in run.outputs["codexConfig"]["value"]
    assert "--kv-cache-dtype" in launch_argv(run) and "nvfp4_ds_mla" in launch_argv(run)


def three_node_config(config):
    config["twinspark:fabric"]["topology"] = "switch"  # rail N of every node on one subnet
    config["twinspark:nodes"].append(
        {
            "name": "spark3",
            "role": "worker",
            "host": "192.168.1.12",
            "rails": [
                {"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.3/24"},
                {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.3/24"},
            ],
        }
    )
    return config


def test_three_nodes_at_tp3_are_refused_before_any_resource_with_the_layout_that_works(program, recipe_config):
    """The default layout of 3 nodes (TP 3) cannot split the seed's 64 heads: the recipe's shape says
    so when the config is read, and names pipelineParallel 3 instead."""
    run = program(three_node_config(recipe_config))
    assert run.error and run.error["kind"] == "RunError", run.error
    message = run.error["message"]
    assert "twinspark:serving.tensorParallel: TP=3 × PP=1 on 3 nodes" in message, message
    assert "attention heads: 64 not divisible by TP 3" in message, message
    assert "with 3 nodes set pipelineParallel: 3 (TP=1)" in message, message
    assert run.resources == []


def test_two_nodes_run_without_pipeline_parallelism(recipe_run):
    assert "--pipeline-parallel-size" not in launch_argv(recipe_run)
    assert "--pipeline-parallel-size" not in args_of(recipe_run, "spark1-weights-shape-check")
    assert "--pipeline-parallel-size" not in runner_call(recipe_run.named("spark1-weights-fetch")).args


def test_three_nodes(program, recipe_config):
    recipe_config = three_node_config(recipe_config)
    recipe_config["twinspark:serving"]["pipelineParallel"] = 3
    run = program(recipe_config)
    assert run.error is None, run.error
    assert any("was proven with tp only, not pipeline parallelism" in w for w in run.warnings), run.warnings
    workers = {r.name for r in run.of_type(CONTAINER) if unwrap(r.inputs).get("entrypoints", [""])[-1].endswith("boot-worker.sh")}
    assert workers == {"spark2-serving-container", "spark3-serving-container"}
    head = run.named("spark1-serving-container")
    for w in workers:
        assert run.depends_on(head, w)
    assert sorted(head.replace_with) == sorted(run.named(n).urn for n in ("spark1-installation", *workers))
    assert {"spark2-weights-sync", "spark3-weights-sync"} <= set(run.by_name)
    for step in ("spark1-weights-shape-check", "spark1-weights-fetch"):  # before the download and after it
        shape = runner_call(run.named(step)).args
        assert (flag_value(shape, "--tensor-parallel-size"), flag_value(shape, "--pipeline-parallel-size")) == ("1", "3")
    peers = flag_values(args_of(run, "spark1-weights-shape-check"), "--memory-kb")
    assert peers == ["spark2=126877696", "spark3=126877696"]
    argv = launch_argv(run)
    assert (flag_value(argv, "--tensor-parallel-size"), flag_value(argv, "--pipeline-parallel-size")) == ("1", "3")
    description = json.loads(run.outputs["codexModelCatalog"]["value"])["models"][0]["description"]
    assert description.endswith("served by vLLM on twinspark, pipeline parallel 3 over 3 DGX Sparks"), description
    rails = [a for a in args_of(run, "spark1-fabric-check") if a.startswith("enp1s0f0np0:")]
    assert rails == ["enp1s0f0np0:rocep1s0f0:10.0.0.2,10.0.0.3"]
    assert env_file(run, "spark3")["TWINSPARK_NODE_IPS"] == "10.0.0.1,10.0.0.2,10.0.0.3"
    ranks = {n: flag_values(args_of(run, f"{n}-nccl-check"), "--check-arg") for n in ("spark1", "spark2", "spark3")}
    assert [(flag_value(a, "--rank"), flag_value(a, "--world-size"))
            for a in ranks.values()] == [("0", "3"), ("1", "3"), ("2", "3")]


def comparable(run):
    return {r.name: (r.type, unwrap(r.inputs), r.parent, sorted(r.dependencies)) for r in run.resources}


def test_deterministic_inputs(program, recipe_run):
    assert comparable(program()) == comparable(recipe_run)


def test_profile_change_touches_only_bundle_and_restarts(program, recipe_config, recipe_run):
    recipe_config["twinspark:serving"]["profile"] = "multiagent"
    changed = program(recipe_config)
    before, after = comparable(recipe_run), comparable(changed)
    assert set(before) == set(after)
    differing = {name for name in before if before[name] != after[name]}
    assert differing == {
        "spark1-bundle-launch-vllm-sh",
        "spark2-bundle-launch-vllm-sh",
        "spark1-serving-container",
        "spark2-serving-container",
    }
    # containers differ only in their bundle label, which docker treats as replace
    for name in ("spark1-serving-container", "spark2-serving-container"):
        b, a = before[name][1], after[name][1]
        assert {k for k in b if b[k] != a[k]} == {"labels"}


def test_config_errors_stop_the_program_before_any_resource(program, recipe_config):
    recipe_config["twinspark:nodes"][1]["rails"][0]["address"] = "10.0.0.300/24"
    run = program(recipe_config)
    assert run.error["kind"] == "RunError"
    assert "twinspark:nodes[1].rails[0].address" in run.error["message"]
    assert "10.0.0.300/24" in run.error["message"]
    assert run.resources == []


def test_recipe_stack_file_is_valid():
    cfg = parse_stack_config(config_blocks())
    assert [n.name for n in cfg.nodes] == ["spark1", "spark2"]


def test_an_engine_without_replace_with_stops_before_any_resource(program):
    """An older Pulumi CLI: the SDK would raise only when the head container registers, after
    every step before it ran (issue 8, item 10)."""
    run = program(withheld_features=("RESOURCE_MONITOR_FEATURE_REPLACE_WITH",))
    assert run.error["kind"] == "RunError", run.error
    assert "upgrade the Pulumi CLI to ≥ 3.207.0" in run.error["message"]
    assert run.resources == []


def test_claude_code_env_gives_back_the_key_when_sourced(program, recipe_config):
    """Every allowed key character survives `source`: an unquoted `~/...` would become $HOME."""
    import subprocess

    key = "~/sk-0123456789abcdef+/="
    recipe_config["twinspark:apiKey"] = key
    run = program(recipe_config)
    assert run.error is None, run.error
    env = run.outputs["claudeCodeEnv"]["value"]
    proc = subprocess.run(["bash", "-c", env + 'printf %s "$ANTHROPIC_AUTH_TOKEN"'], capture_output=True, text=True)
    assert proc.stdout == key, proc


def test_weights_copy_runs_over_every_rail_with_no_secret_of_the_stacks(recipe_run):
    """Issue 37: one secret served every copy of the stack, and a relay node held it; each copy
    now draws its own (sync-weights.sh), so the stack keeps none and no step carries one."""
    sync = runner_call(recipe_run.named("spark2-weights-sync"))
    assert flag_values(sync.args, "--rail") == ["10.0.0.2=10.0.0.1", "10.0.1.2=10.0.1.1"]  # worker=head, per rail
    assert flag_value(sync.args, "--port") == "8873" and flag_value(sync.args, "--to") == "nvidia@10.0.0.2"
    assert sync.secrets == {}
    assert "weights-sync-secret" not in recipe_run.by_name
    assert sync.payload == launch_file("weights.py")


RECIPE_REVISION = "9e165c30e2704aec5d9d593cce3eebd58bbef1cb"  # recipes/deepseek-v4-flash-0731.yaml's


def test_the_recipes_revision_pins_the_fetch_the_copy_and_the_output(recipe_run):
    """Issue 37: the stack on the recipe's own repository serves the commit the recipe was proven
    at (its model code runs: --trust-remote-code), not whatever the hub serves at the first up."""
    resolve = runner_call(recipe_run.named("spark1-weights-revision"))
    assert resolve.args[0] == "resolve" and flag_value(resolve.args, "--revision") == RECIPE_REVISION
    assert runner_call(recipe_run.named("spark1-weights-revision"), "delete").args[0] == "forget"
    assert recipe_run.outputs["modelRevision"]["value"] == RECIPE_REVISION
    assert flag_value(args_of(recipe_run, "spark1-weights-fetch"), "--revision") == RECIPE_REVISION
    assert flag_value(args_of(recipe_run, "spark2-weights-sync"), "--revision") == RECIPE_REVISION
    # replaced (asked again) only for another repo or model.revision, or another head
    assert recipe_run.named("spark1-weights-revision").inputs["triggers"][1:] == [
        "deepseek-ai/DeepSeek-V4-Flash-0731", RECIPE_REVISION]


def test_another_repository_resolves_the_hubs_commit_once_and_is_warned_of_its_code(program):
    config = stack_config()
    config["twinspark:model"] = {**config["twinspark:model"], "repo": "someone/DeepSeek-V4-Flash-0731-finetune"}
    run = program(config)
    assert run.error is None, run.error
    assert flag_value(args_of(run, "spark1-weights-revision"), "--revision") == ""
    revision = run.outputs["modelRevision"]["value"]
    assert len(revision) == 40 and revision != RECIPE_REVISION
    assert flag_value(args_of(run, "spark1-weights-fetch"), "--revision") == revision
    assert any("--trust-remote-code" in w and "model.revision" in w for w in run.warnings), run.warnings


def test_the_weight_download_and_the_monitoring_images_run_by_digest(recipe_run):
    """Issue 37: fetch-weights.sh ran serving.image's tag (with the HF token, writing the hash list
    the nodes verify against); the monitoring images were pulled by tag on each node."""
    pinned = recipe_run.outputs["servingImage"]["value"]["reference"]
    assert "@sha256:" in pinned
    for step in ("spark1-weights-revision", "spark1-weights-fetch"):
        assert flag_value(args_of(recipe_run, step), "--image") == pinned, step
    pulls = [r for r in recipe_run.resources if r.type == "docker:index/remoteImage:RemoteImage"]
    assert pulls
    by_capability = {}
    for pull in pulls:
        name = unwrap(pull.inputs["name"])
        assert "@sha256:" in name, (pull.name, name)
        by_capability.setdefault(pull.name.split("-observability-", 1)[1], set()).add(name)
    assert all(len(names) == 1 for names in by_capability.values()), by_capability  # one digest on every node


def test_a_hub_mirror_reaches_both_hub_steps_and_the_default_changes_no_command_line(program, recipe_run):
    for name in ("spark1-weights-revision", "spark1-weights-fetch"):
        assert "--hub-endpoint" not in args_of(recipe_run, name)  # a stack on the hub: as before the key existed
    config = stack_config()
    config["twinspark:model"] = {**config["twinspark:model"], "hubEndpoint": "https://hf-mirror.com"}
    run = program(config)
    assert run.error is None, run.error
    for name in ("spark1-weights-revision", "spark1-weights-fetch"):
        assert flag_value(args_of(run, name), "--hub-endpoint") == "https://hf-mirror.com"
    # an update, not a replace: the kept commit stays, the verified weights are not fetched again
    assert (run.named("spark1-weights-revision").inputs["triggers"]
            == recipe_run.named("spark1-weights-revision").inputs["triggers"])


SHAPE_FLAGS = ("--tensor-parallel-size", "--gpu-memory-utilization", "--kv-cache-dtype", "--max-model-len",
               "--kv-bytes-per-token", "--overhead-gib")


def test_the_fetch_runs_the_shape_check_first_and_a_new_max_model_len_only_updates_it(program, recipe_run):
    """Before the download it judges what the shape check judges after it, with the same flags;
    a new serving.maxModelLen re-runs the fetch (an update: on verified weights, a stat per file)."""
    fetch, shape = args_of(recipe_run, "spark1-weights-fetch"), args_of(recipe_run, "spark1-weights-shape-check")
    assert [flag_value(fetch, f) for f in SHAPE_FLAGS] == [flag_value(shape, f) for f in SHAPE_FLAGS] == [
        "2", "0.85", "fp8_ds_mla", "1048576", "8206", "4.5"]
    config = stack_config()
    config["twinspark:serving"] = {**config["twinspark:serving"], "maxModelLen": 524288}
    run = program(config)
    assert run.error is None, run.error
    assert flag_value(args_of(run, "spark1-weights-fetch"), "--max-model-len") == "524288"
    assert run.named("spark1-weights-fetch").inputs.get("triggers") == recipe_run.named("spark1-weights-fetch").inputs.get(
        "triggers")


def test_model_revision_pins_every_step(program):
    config = stack_config()
    config["twinspark:model"] = {**config["twinspark:model"], "revision": "a" * 40}
    run = program(config)
    assert run.error is None, run.error
    assert flag_value(args_of(run, "spark1-weights-revision"), "--revision") == "a" * 40
    assert flag_value(args_of(run, "spark1-weights-fetch"), "--revision") == "a" * 40
    assert run.outputs["modelRevision"]["value"] == "a" * 40
