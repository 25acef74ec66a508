"""A corpus of bad configs: each stops with a RunError naming the key path, value and expectation."""

import copy

import pulumi
import pytest
from program_harness import config_blocks

from components.config import Topology, format_key_path, parse_stack_config, resolve_node_addresses

BASE = config_blocks()


def set_path(cfg, path, value):
    *parents, last = path
    target = cfg
    for p in parents:
        target = target[p]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value


DELETE = object()

# (mutation path, new value, key path the message must name, fragments it must also contain)
CASES = [
    (("nodes", 1, "rails", 0, "address"), "10.0.0.300/24", "twinspark:nodes[1].rails[0].address", ["10.0.0.300/24", "IPv4"]),
    (("nodes", 1, "rails", 0, "address"), "10.0.0.2", "twinspark:nodes[1].rails[0].address", ["prefix length"]),
    (("nodes", 1, "rails", 0, "address"), "10.9.0.2/24", "twinspark:nodes[1].rails[0].address", ["10.0.0.0/24"]),
    (("nodes", 1, "rails", 1, "address"), "10.0.1.1/24", "twinspark:nodes[1].rails[1].address",
     ["already used", "nodes[0].rails[1]"]),
    (("nodes", 1, "role"), "head", "twinspark:nodes", ["exactly one", "2 nodes"]),
    (("nodes", 0, "role"), "worker", "twinspark:nodes", ["exactly one", "0 nodes"]),
    (("nodes", 1, "role"), "leader", "twinspark:nodes[1].role", ["'head' or 'worker'", "leader"]),
    (("nodes", 1, "host"), "192.168.1.10", "twinspark:nodes[1].host", ["nodes[0].host"]),
    (("nodes", 1, "name"), "spark1", "twinspark:nodes[1].name", ["nodes[0].name"]),
    (("nodes", 1, "name"), "", "twinspark:nodes[1].name", ["lowercase letters, digits or '-'"]),
    (("nodes", 1, "name"), "Spark 2", "twinspark:nodes[1].name", ["Spark 2"]),
    (("nodes", 0, "rails", 0, "iface"), "", "twinspark:nodes[0].rails[0].iface", []),
    (("nodes", 0, "rails", 0, "hca"), "", "twinspark:nodes[0].rails[0].hca", []),
    (("nodes", 0, "rails"), [], "twinspark:nodes[0].rails", ["at least 1"]),
    (("nodes", 1, "rails"), [{"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.2/24"}], "twinspark:nodes",
     ["same number of rails"]),
    (("nodes", 0, "hostKey"), "not-a-key", "twinspark:nodes[0].hostKey", ["not-a-key"]),
    (("nodes", 0, "colour"), "green", "twinspark:nodes[0].colour", ["Extra inputs"]),
    (("nodes",), [], "twinspark:nodes", ["at least 1"]),
    (("ssh", "user"), "", "twinspark:ssh.user", []),
    (("ssh", "user"), "Root User", "twinspark:ssh.user", ["Root User"]),
    (("ssh", "user"), DELETE, "twinspark:ssh.user", ["Field required"]),
    (("fabric", "mtu"), 100000, "twinspark:fabric.mtu", ["9216", "100000"]),
    (("fabric", "mtu"), 576, "twinspark:fabric.mtu", ["1280"]),
    (("fabric", "mtu"), "jumbo", "twinspark:fabric.mtu", ["jumbo"]),
    (("fabric", "linkSpeedMbps"), 0, "twinspark:fabric.linkSpeedMbps", ["greater than 0"]),
    (("fabric", "bootstrapIface"), "", "twinspark:fabric.bootstrapIface", []),
    (("fabric", "minBusBandwidthGBps"), -1, "twinspark:fabric.minBusBandwidthGBps", ["greater than or equal to 0"]),
    (("model", "repo"), "DeepSeek-V4-Flash", "twinspark:model.repo", ["DeepSeek-V4-Flash"]),
    (("model", "revision"), "main", "twinspark:model.revision", ["'main'", "40 lowercase hex digits", "not a branch"]),
    (("model", "revision"), "A" * 40, "twinspark:model.revision", ["full commit sha"]),
    (("serving", "port"), 8873, "twinspark:serving.port", ["8873 is the weight copy's rsync daemons'"]),
    (("model", "dir"), "models/ds", "twinspark:model.dir", ["models/ds"]),
    (("model", "dir"), "/home/nvidia/my models", "twinspark:model.dir", []),
    # issue 37: a worker's copy would delete what else is there
    (("model", "dir"), "/var/lib/docker", "twinspark:model.dir", ["/var/lib/docker", "deleted"]),
    (("model", "dir"), "/var/lib/docker/volumes/m", "twinspark:model.dir", ["inside /var/lib/docker"]),
    (("model", "dir"), "/var/lib/ollama", "twinspark:model.dir", ["a directory of /var/lib"]),
    (("model", "servedName"), "", "twinspark:model.servedName", []),
    (("serving", "profile"), "fast", "twinspark:serving.profile", ["'default' or 'multiagent'", "fast"]),
    (("serving", "port"), 70000, "twinspark:serving.port", ["65535"]),
    (("serving", "port"), 0, "twinspark:serving.port", ["greater than or equal to 1"]),
    (("serving", "gpuMemoryUtilization"), 1.2, "twinspark:serving.gpuMemoryUtilization", ["0.95", "1.2"]),
    (("serving", "gpuMemoryUtilization"), 0, "twinspark:serving.gpuMemoryUtilization", ["greater than 0"]),
    (("serving", "maxModelLen"), -1, "twinspark:serving.maxModelLen", []),
    # issue 37: it was rendered into the launch script as given
    (("serving", "maxModelLen"), 99999999999999999999999, "twinspark:serving.maxModelLen", ["16777216"]),
    (("serving", "maxModelLen"), 2**24 + 1, "twinspark:serving.maxModelLen", ["16777216"]),
    (("serving", "kvCacheDtype"), "fp8 ds", "twinspark:serving.kvCacheDtype", []),
    (("serving", "extraArgs"), ["max-num-seqs=4"], "twinspark:serving.extraArgs[0]", ["'--flag'"]),
    (("serving", "extraArgs"), ["--enforce-eager", "--port", "9000"], "twinspark:serving.extraArgs[1]", ["serving.port"]),
    (("serving", "extraArgs"), ["--api-key=x"], "twinspark:serving.extraArgs[0]", ["twinspark:apiKey"]),
    (("serving", "extraArgs"), ["--max-log-len", "4", "5"], "twinspark:serving.extraArgs[2]", ["'5'"]),
    # argparse (and so vLLM) takes any unambiguous prefix of a flag, and '_' for '-'
    (("serving", "extraArgs"), ["--api-ke=X"], "twinspark:serving.extraArgs[0]", ["--api-key", "twinspark:apiKey"]),
    (("serving", "extraArgs"), ["--api_key", "X"], "twinspark:serving.extraArgs[0]", ["--api-key"]),
    (("serving", "extraArgs"), ["--enforce-eager", "--tensor-parallel", "1"], "twinspark:serving.extraArgs[1]",
     ["--tensor-parallel-size", "set serving.tensorParallel"]),
    (("serving", "extraArgs"), ["--hos=127.0.0.1"], "twinspark:serving.extraArgs[0]", ["--host"]),
    (("serving", "extraArgs"), ["--gpu-memory-util", "0.5"], "twinspark:serving.extraArgs[0]",
     ["serving.gpuMemoryUtilization"]),
    (("serving", "extraArgs"), ["--port.x=1"], "twinspark:serving.extraArgs[0]", ["serving.port"]),
    (("serving", "extraArgs"), ["--config", "/etc/vllm.yaml"], "twinspark:serving.extraArgs[0]", ["--config", "file"]),
    (("serving", "extraArgs"), ["--conf=/etc/vllm.yaml"], "twinspark:serving.extraArgs[0]", ["--config"]),
    # issue 37: vLLM imports any callable named there, as root on every node
    (("serving", "extraArgs"), ["--middleware", "os.system"], "twinspark:serving.extraArgs[0]",
     ["--middleware", "imports the code it names"]),
    (("serving", "extraArgs"), ["--worker-extension-cls=x.Y"], "twinspark:serving.extraArgs[0]", ["imports"]),
    (("serving", "extraArgs"), ["--tool-parser-plug", "/tmp/p.py"], "twinspark:serving.extraArgs[0]",
     ["--tool-parser-plugin", "imports"]),
    (("serving", "extraArgs"), ["--logits_processors", "a.B"], "twinspark:serving.extraArgs[0]", ["imports"]),
    # the profile's flags: a profile is a measured pair, not a default to override
    (("serving", "extraArgs"), ["--max-num-seqs", "4"], "twinspark:serving.extraArgs[0]",
     ["serving.profile", "not meant to be overridden"]),
    (("serving", "extraArgs"), ["--speculative-config.num_speculative_tokens=2"], "twinspark:serving.extraArgs[0]",
     ["serving.profile"]),
    (("serving", "extraArgs"), ["--speculative_config", "{}"], "twinspark:serving.extraArgs[0]", ["serving.profile"]),
    (("serving", "extraArgs"), ["-tp", "1"], "twinspark:serving.extraArgs[0]",
     ["-tp is --tensor-parallel-size", "set serving.tensorParallel"]),
    (("serving", "readinessTimeoutMinutes"), 0, "twinspark:serving.readinessTimeoutMinutes", []),
    (("serving", "image"), "", "twinspark:serving.image", []),
]


@pytest.mark.parametrize("path, value, key, fragments", CASES, ids=[c[2] + "=" + repr(c[1])[:20] for c in CASES])
def test_bad_config_names_the_key(path, value, key, fragments):
    cfg = copy.deepcopy(BASE)
    set_path(cfg, path, value)
    assert_refused(cfg, key, fragments)


def assert_refused(cfg, key, fragments):
    """The config stops with a RunError naming `key` and saying `fragments`, in words."""
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    message = str(err.value)
    assert f"{key}:" in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert "pattern" not in message and "^" not in message, f"say what is allowed in words: {message}"


@pytest.mark.parametrize("block", ["ssh", "nodes", "fabric", "model", "serving"])
def test_missing_block_is_named(block):
    cfg = copy.deepcopy(BASE)
    del cfg[block]
    with pytest.raises(pulumi.RunError, match=f"twinspark:{block}: missing"):
        parse_stack_config(cfg)


def test_extra_args_that_own_nothing_pass():
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["extraArgs"] = ["--enable-log-requests", "--max-log-len", "100", "--compilation-config.mode=3",
                                   "--max_num_partial_prefills=2", "--port-x", "--configx"]
    assert parse_stack_config(cfg).serving.extra_args[0] == "--enable-log-requests"


@pytest.mark.parametrize("flag", ["--block-size=128", "--moe-backend", "--max-cudagraph-capture-size=8",
                                  "--generation_config=auto", "--tokenizer-mode"])
def test_extra_args_refuse_what_the_recipe_sets_and_only_that(flag):
    """DeepSeek's recipe renders these flags, gpt-oss's does not: refused for one, passed for the other."""
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["extraArgs"] = [flag, "x"] if "=" not in flag else [flag]
    with pytest.raises(pulumi.RunError, match=r"serving.extraArgs\[0\]: .*set by serving.recipe DeepSeek-V4-Flash-0731"):
        parse_stack_config(cfg)
    cfg["serving"]["recipe"] = "gpt-oss-120b"
    assert parse_stack_config(cfg).serving.extra_args[0] == flag


def test_a_refused_flag_never_shows_its_value():
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["extraArgs"] = ["--api-k=sk-secret-in-the-wrong-place"]
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    assert "--api-k=(value not shown)" in str(err.value) and "sk-secret" not in str(err.value)


def test_every_flag_the_config_sets_is_refused_in_extra_args():
    """Render vLLM's flags from two configs that differ in every key: each flag whose value
    moved belongs to the config, so extraArgs must not set it."""
    from components.launch_bundle import VllmServe, vllm_argv

    def flags(raw):
        cfg = parse_stack_config(raw)
        argv = vllm_argv(VllmServe(cfg.serving, cfg.model, cfg.tensor_parallel_size, cfg.pipeline_parallel_size))
        return {a: argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
                for i, a in enumerate(argv) if a.startswith("--")}

    other = copy.deepcopy(BASE)
    other["fabric"]["topology"] = "switch"
    other["nodes"].append({"name": "spark3", "role": "worker", "host": "192.168.1.12", "rails": [
        {"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.3/24"},
        {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.3/24"}]})  # 3: the recipe's most
    other["model"]["servedName"] = "other"
    other["serving"].update(profile="multiagent", port=8001, maxModelLen=4096, gpuMemoryUtilization=0.5,
                            kvCacheDtype="auto", pipelineParallel=3)  # TP 1 × PP 3: what 64 heads allow on 3
    before, after = flags(BASE), flags(other)
    moved = {flag for flag in before.keys() | after.keys() if before.get(flag) != after.get(flag)}
    assert moved == {"--served-model-name", "--tensor-parallel-size", "--pipeline-parallel-size", "--max-model-len",
                     "--gpu-memory-utilization", "--kv-cache-dtype", "--max-num-seqs", "--speculative-config"}
    assert moved <= set(parse_stack_config(BASE).serving.refused_flags)


def test_several_errors_are_all_reported():
    cfg = copy.deepcopy(BASE)
    cfg["fabric"]["mtu"] = 1
    cfg["serving"]["port"] = -5
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    assert "twinspark:fabric.mtu" in str(err.value) and "twinspark:serving.port" in str(err.value)


def test_a_single_node_is_tp1_and_valid():
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["recipe"] = "gpt-oss-120b"  # a model that fits one Spark (DeepSeek's needs two)
    cfg["nodes"] = cfg["nodes"][:1]
    cfg["fabric"]["minBusBandwidthGBps"] = 0
    assert parse_stack_config(cfg).tensor_parallel_size == 1


@pytest.mark.parametrize("recipe, count, span", [
    ("DeepSeek-V4-Flash-0731", 1, "2 to 3 nodes"), ("GLM-5.3-Flash-NVFP4", 3, "2 nodes"),
    ("gpt-oss-120b", 3, "1 to 2 nodes"), ("Qwen3.8-Flash-Next", 1, "2 to 4 nodes"),
])
def test_a_node_count_outside_the_recipes_is_refused(recipe, count, span):
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["recipe"] = recipe
    if count == 1:
        cfg["nodes"], cfg["fabric"]["minBusBandwidthGBps"] = cfg["nodes"][:1], 0
    else:
        cfg["fabric"]["topology"] = "switch"
        cfg["nodes"].append({"name": "spark3", "role": "worker", "host": "192.168.1.12", "rails": [
            {"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": "10.0.0.3/24"},
            {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": "10.0.1.3/24"}]})
    assert_refused(cfg, "twinspark:nodes", [f"{count} nodes", f"expected {span}", f"serving.recipe {recipe}"])


# Secrets reach a shell's environment, a curl config line, an env file and an HTTP header: each
# bad value is refused before any resource, naming the key but never showing the value.
SECRET_CASES = [
    ("apiKey", "", ["empty"]),
    ("apiKey", "short-key", ["9 characters", "16 to 256"]),
    ("apiKey", "k" * 257, ["257 characters", "16 to 256"]),
    ("apiKey", "sk-0123456789abcdef\ntouch /tmp/pwned", ["a newline"]),
    ("apiKey", 'sk-0123456789abcdef"quoted"', ["'\"'"]),
    ("apiKey", "sk-0123456789abcdef$(id)", ["'$'", "'('"]),
    ("apiKey", "sk-0123456789 abcdef", ["a space"]),
    ("hfToken", "hf_0123456789\nrm -rf ~", ["a newline"]),
    ("hfToken", "", ["empty"]),
]


@pytest.mark.parametrize("key, value, fragments", SECRET_CASES, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(SECRET_CASES)])
def test_bad_secret_is_refused_before_any_resource(program, recipe_config, key, value, fragments):
    recipe_config[f"twinspark:{key}"] = value
    run = program(recipe_config)
    assert run.error and run.error["kind"] == "RunError", run.error
    message = run.error["message"]
    assert f"twinspark:{key}:" in message and "letter, digit or one of - . _ ~ + / =" in message, message
    for fragment in fragments:
        assert fragment in message, message
    if len(value) > 3:
        assert value not in message and value.split("\n")[-1] not in message, message
    assert run.resources == []


def test_an_hf_token_for_a_plain_http_hub_is_refused_before_any_resource(program, recipe_config):
    """Issue 37: model.hubEndpoint=http://... with an HF token sent the token in the clear, unsaid."""
    recipe_config["twinspark:hfToken"] = "hf_0123456789abcdef"
    recipe_config["twinspark:model"] = {**recipe_config["twinspark:model"], "hubEndpoint": "http://hf-mirror.lan:8080"}
    run = program(recipe_config)
    assert run.error and run.error["kind"] == "RunError", run.error
    message = run.error["message"]
    assert "twinspark:hfToken: set, and twinspark:model.hubEndpoint is http://hf-mirror.lan:8080" in message, message
    assert "expected an https:// model.hubEndpoint" in message and "hf_0123456789abcdef" not in message, message
    assert run.resources == []
    del recipe_config["twinspark:hfToken"]  # a mirror that needs no token may be plain http
    assert program(recipe_config).error is None


def rails(*per_node):
    """Set rail addresses: rails(("10.0.0.1/24", "10.0.1.1/24"), ("10.0.0.2/24", "10.0.1.2/24"))."""
    def mutate(cfg):
        for node, addresses in zip(cfg["nodes"], per_node):
            for rail, address in zip(node["rails"], addresses):
                rail["address"] = address
    return mutate


def at(path, value):
    return lambda cfg: set_path(cfg, path, value)


# Configs that would lock a node out or destroy data: (mutation, key, fragments)
LOCKOUT_CASES = [
    # the LAN/SSH port as a rail: netplan would take its DHCP away
    (at(("nodes", 1, "rails", 0, "iface"), "enP7s7"), "twinspark:nodes[1].rails[0].iface", ["fabric.bootstrapIface"]),
    (rails(("192.168.1.1/24", "10.0.1.1/24"), ("192.168.1.2/24", "10.0.1.2/24")),
     "twinspark:nodes[0].rails[0].address", ["nodes[0].host 192.168.1.10"]),
    (rails(("10.0.0.1/8",), ("10.0.0.2/8",)), "twinspark:nodes[0].rails[0].address", ["/16"]),
    (rails(("10.0.0.1/1",), ("10.0.0.2/1",)), "twinspark:nodes[0].rails[0].address", ["/16"]),
    (rails(("127.0.0.1/24",), ("127.0.0.2/24",)), "twinspark:nodes[0].rails[0].address", ["loopback", "10.0.0.0/8"]),
    (rails(("224.0.0.1/24",), ("224.0.0.2/24",)), "twinspark:nodes[0].rails[0].address", ["multicast"]),
    (rails(("255.255.255.254/24",), ("255.255.255.253/24",)), "twinspark:nodes[0].rails[0].address", ["reserved"]),
    (rails(("169.254.0.1/24",), ("169.254.0.2/24",)), "twinspark:nodes[0].rails[0].address", ["link-local"]),
    (rails(("8.8.8.1/24",), ("8.8.8.2/24",)), "twinspark:nodes[0].rails[0].address", ["public"]),
    (rails((), ("10.0.0.255/24",)), "twinspark:nodes[1].rails[0].address", ["broadcast address of 10.0.0.0/24"]),
    (rails((), ("10.0.0.0/24",)), "twinspark:nodes[1].rails[0].address", ["network address of 10.0.0.0/24"]),
    # each rail is its own cable and subnet: two rails in one subnet, or overlapping ones
    (rails(("10.0.0.1/24", "10.0.0.3/24"), ("10.0.0.2/24", "10.0.0.4/24")),
     "twinspark:nodes[0].rails[1].address", ["nodes[0].rails[0]", "10.0.0.0/24"]),
    (rails(("10.0.0.1/16", "10.0.1.1/24"), ("10.0.0.2/16", "10.0.1.2/24")),
     "twinspark:nodes[0].rails[1].address", ["overlap", "10.0.0.0/16"]),
    (at(("nodes", 1, "rails", 1, "iface"), "enp1s0f0np0"), "twinspark:nodes[1].rails[1].iface",
     ["nodes[1].rails[0].iface"]),
    (at(("nodes", 0, "rails", 1, "hca"), "rocep1s0f0"), "twinspark:nodes[0].rails[1].hca", ["nodes[0].rails[0].hca"]),
    # Linux interface names: at most 15 bytes, no '/', ':' or whitespace, not '.' or '..'
    (at(("nodes", 0, "rails", 0, "iface"), ".."), "twinspark:nodes[0].rails[0].iface", ["'.' or '..'"]),
    (at(("nodes", 0, "rails", 0, "iface"), "."), "twinspark:nodes[0].rails[0].iface", ["'.' or '..'"]),
    (at(("nodes", 0, "rails", 0, "iface"), "enp1s0f0np0:1"), "twinspark:nodes[0].rails[0].iface", ["15"]),
    (at(("nodes", 0, "rails", 0, "iface"), "a/b"), "twinspark:nodes[0].rails[0].iface", ["15"]),
    (at(("nodes", 0, "rails", 0, "iface"), "enp1s0f0np0xxxxx"), "twinspark:nodes[0].rails[0].iface", ["15"]),
    (at(("fabric", "bootstrapIface"), ".."), "twinspark:fabric.bootstrapIface", ["'.' or '..'"]),
    # model.dir is bind-mounted and the worker's copy is rsync --delete'd to mirror the head's
    (at(("model", "dir"), "/home/nvidia"), "twinspark:model.dir", ["home directory"]),
    (at(("model", "dir"), "/root"), "twinspark:model.dir", ["system directory"]),
    (at(("model", "dir"), "/"), "twinspark:model.dir", ["system directory"]),
    (at(("model", "dir"), "/home"), "twinspark:model.dir", ["system directory"]),
    (at(("model", "dir"), "/var"), "twinspark:model.dir", ["system directory"]),
    (at(("model", "dir"), "/etc/models"), "twinspark:model.dir", ["inside /etc"]),
    (at(("model", "dir"), "/usr/share/models"), "twinspark:model.dir", ["inside /usr"]),
    (at(("model", "dir"), "/opt/twinspark/models"), "twinspark:model.dir", ["inside /opt/twinspark"]),
    (at(("model", "dir"), "/var/log/twinspark"), "twinspark:model.dir", ["inside /var/log/twinspark"]),
    (at(("model", "dir"), "/home/nvidia/models/../.ssh"), "twinspark:model.dir", ["'..'"]),
    (at(("model", "dir"), "/home/nvidia/.ssh"), "twinspark:model.dir", ["hidden"]),
    (at(("model", "dir"), "/data/models:/etc"), "twinspark:model.dir", ["':'"]),
    (at(("model", "dir"), "/data//models"), "twinspark:model.dir", ["empty"]),
    # serving.port must not collide with what else listens on the head
    (at(("serving", "port"), 22), "twinspark:serving.port", ["22 is SSH's"]),
    (at(("serving", "port"), 6379), "twinspark:serving.port", ["Ray GCS"]),
    (at(("serving", "port"), 8265), "twinspark:serving.port", ["Ray dashboard"]),
    (at(("serving", "port"), 10001), "twinspark:serving.port", ["Ray client"]),
    (at(("serving", "port"), 12345), "twinspark:serving.port", ["Ray's worker ports"]),
    (at(("serving", "port"), 8100), "twinspark:serving.port", ["the API gateway's, for vLLM's /metrics"]),
    (at(("serving", "port"), 29555), "twinspark:serving.port", ["NCCL"]),
    (at(("serving", "port"), 45000), "twinspark:serving.port", ["ephemeral"]),
    # YAML booleans are no numbers (pydantic would read true as 1)
    (at(("serving", "port"), True), "twinspark:serving.port", ["YAML boolean"]),
    (at(("fabric", "mtu"), True), "twinspark:fabric.mtu", ["YAML boolean"]),
    (at(("fabric", "linkSpeedMbps"), True), "twinspark:fabric.linkSpeedMbps", ["YAML boolean"]),
    (at(("serving", "readinessTimeoutMinutes"), True), "twinspark:serving.readinessTimeoutMinutes", ["YAML boolean"]),
    (at(("serving", "maxModelLen"), True), "twinspark:serving.maxModelLen", ["YAML boolean"]),
    (at(("serving", "gpuMemoryUtilization"), True), "twinspark:serving.gpuMemoryUtilization", ["YAML boolean"]),
    (at(("fabric", "minBusBandwidthGBps"), True), "twinspark:fabric.minBusBandwidthGBps", ["YAML boolean"]),
    # one node has no cable to measure: NcclCheck could never pass
    (lambda cfg: cfg.update(nodes=cfg["nodes"][:1]), "twinspark:fabric.minBusBandwidthGBps", ["single-node", "0"]),
]


@pytest.mark.parametrize("mutate, key, fragments", LOCKOUT_CASES,
                         ids=[f"{c[1].split(':')[1]}-{i}" for i, c in enumerate(LOCKOUT_CASES)])
def test_a_config_that_locks_a_node_out_is_refused(mutate, key, fragments):
    cfg = copy.deepcopy(BASE)
    mutate(cfg)
    assert_refused(cfg, key, fragments)


@pytest.mark.parametrize("value", ["0.8", 0.8, 1])
def test_gpu_memory_utilization_takes_what_pulumi_config_set_path_writes(value):
    """`pulumi config set --path` stores 0.8 as a string and 1 as a number."""
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["gpuMemoryUtilization"] = value
    if value == 1:
        with pytest.raises(pulumi.RunError, match="0.95"):
            parse_stack_config(cfg)
    else:
        assert parse_stack_config(cfg).serving.gpu_memory_utilization == 0.8


@pytest.mark.parametrize("model_dir", ["/home/nvidia/models/DeepSeek-V4-Flash-0731", "/models/ds", "/data/m_1.2",
                                       "/var/lib/models/ds", "/opt/models/x", "/mnt/nvme/ds"])
def test_model_dirs_that_hold_only_a_model_pass(model_dir):
    cfg = copy.deepcopy(BASE)
    cfg["model"]["dir"] = model_dir
    assert parse_stack_config(cfg).model.dir == model_dir


@pytest.mark.parametrize("endpoint", ["https://hf-mirror.com", "http://hub.twinspark-sim:8080", "https://proxy.lan/hf"])
def test_a_hub_mirror_or_proxy_passes_and_the_default_is_the_hub(endpoint):
    cfg = copy.deepcopy(BASE)
    assert parse_stack_config(cfg).model.hub_endpoint == "https://huggingface.co"
    cfg["model"]["hubEndpoint"] = endpoint
    assert parse_stack_config(cfg).model.hub_endpoint == endpoint


@pytest.mark.parametrize("endpoint, fragments", [
    ("https://hf-mirror.com/", ["without the trailing '/': https://hf-mirror.com"]),
    ("hf-mirror.com", ["'hf-mirror.com'", "an http(s) URL"]),
    ("https://hf-mirror.com/?x=1", ["an http(s) URL", "no user, query or fragment"]),
])
def test_a_hub_endpoint_that_is_not_a_plain_url_is_refused(endpoint, fragments):
    cfg = copy.deepcopy(BASE)
    cfg["model"]["hubEndpoint"] = endpoint
    assert_refused(cfg, "twinspark:model.hubEndpoint", fragments)


def test_a_hub_endpoint_with_credentials_is_refused_without_showing_them():
    cfg = copy.deepcopy(BASE)
    cfg["model"]["hubEndpoint"] = "https://user:hunter2-pass@proxy.lan"
    assert_refused(cfg, "twinspark:model.hubEndpoint", ["no user", "value not shown"])
    with pytest.raises(pulumi.RunError) as err:
        parse_stack_config(cfg)
    assert "hunter2" not in str(err.value)


def test_a_31_bit_rail_is_point_to_point():
    cfg = copy.deepcopy(BASE)
    rails(("10.0.0.0/31", "10.0.1.0/31"), ("10.0.0.1/31", "10.0.1.1/31"))(cfg)
    parsed = parse_stack_config(cfg)
    assert Topology(parsed, resolve_node_addresses(parsed.nodes)).ray_ip(parsed.nodes[1]) == "10.0.0.1"


def test_unknown_top_level_key_is_refused(program, recipe_config):
    """A typo must not pass silently: twinspark:apikey would leave the key unset and generate one."""
    recipe_config["twinspark:apikey"] = "sk-0123456789abcdef"
    recipe_config["twinspark:servng"] = {"port": 9000}
    run = program(recipe_config)
    assert run.error and run.error["kind"] == "RunError", run.error
    message = run.error["message"]
    assert "twinspark:apikey: unknown key — did you mean twinspark:apiKey?" in message, message
    assert "twinspark:servng: unknown key — did you mean twinspark:serving?" in message, message
    assert "sk-0123456789abcdef" not in message
    assert run.resources == []


def test_config_keys_come_from_the_bag_the_language_host_hands_over(monkeypatch):
    """Under a real engine the keys arrive as PULUMI_CONFIG (pulumi-language-python-exec loads
    them with set_all_config); a host that does not load them still leaves the variable."""
    import json

    from components.config import stack_config_keys

    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({"twinspark:apikey": "x", "twinspark:nodes": "[]", "aws:region": "y"}))
    assert stack_config_keys() == {"apikey", "nodes"}


def test_a_secret_kept_in_plain_text_is_warned_about(capsys):
    """The engine lists the secret keys (PULUMI_CONFIG_SECRET_KEYS); a plain apiKey sits
    readable in the stack file."""
    from pulumi.runtime import config as runtime_config

    from components.config import _checked_secrets

    config = runtime_config.CONFIG.set({"twinspark:apiKey": "sk-0123456789abcdef", "twinspark:hfToken": "hf_01234567"})
    secret_keys = runtime_config._SECRET_KEYS.set({"twinspark:hfToken"})
    try:
        secrets = _checked_secrets(pulumi.Config("twinspark"))
    finally:
        runtime_config.CONFIG.reset(config)
        runtime_config._SECRET_KEYS.reset(secret_keys)
    warnings = capsys.readouterr().err
    assert "twinspark:apiKey is stored in plain text" in warnings and "hfToken" not in warnings, warnings
    assert secrets == {"apiKey": "sk-0123456789abcdef", "hfToken": "hf_01234567", "grafanaAdminPassword": None,
                       "alertWebhookUrl": None, "alertSlackWebhookUrl": None, "alertNtfyUrl": None,
                       "alertEmailPassword": None}


# ---- issue 19: ports as ports, numbers as numbers, one machine once ---------------------------
def put(cfg, path, value):
    """set_path that also creates an omitted block (observability)."""
    target = cfg
    for p in path[:-1]:
        target = target.setdefault(p, {}) if isinstance(p, str) else target[p]
    target[path[-1]] = value


PORT_KEYS = [("serving", "port"), ("observability", "grafanaPort")]
# What listens on the nodes besides the configured ports, and what the refusal must call it.
TAKEN_PORTS = [
    (22, "SSH"), (6379, "Ray GCS"), (8265, "Ray dashboard"), (10001, "Ray client server"),
    (10002, "Ray's worker ports"), (15000, "Ray's worker ports"), (19999, "Ray's worker ports"),
    (8100, "the API gateway's, for vLLM's /metrics"), (29555, "NCCL"), (8873, "weight copy"), (9090, "Prometheus"),
    (9093, "Alertmanager"),
    (9100, "node exporter"), (9835, "GPU exporter"), (32768, "ephemeral"), (45000, "raylet"), (60999, "ephemeral"),
]


@pytest.mark.parametrize("path", PORT_KEYS, ids=".".join)
@pytest.mark.parametrize("port, owner", TAKEN_PORTS, ids=[str(p) for p, _ in TAKEN_PORTS])
def test_every_configured_port_is_refused_where_something_else_listens(path, port, owner):
    cfg = copy.deepcopy(BASE)
    put(cfg, path, port)
    key = f"twinspark:{'.'.join(path)}"
    assert_refused(cfg, key, [f"{key}: {port} — expected a port", owner])


@pytest.mark.parametrize("path", PORT_KEYS, ids=".".join)
@pytest.mark.parametrize("port", [1024, 3001, 8001, 10000, 20000, 32767, 61000, 65535])
def test_a_free_port_passes(path, port):
    cfg = copy.deepcopy(BASE)
    put(cfg, path, port)
    parsed = parse_stack_config(cfg)
    assert port in (parsed.serving.port, parsed.observability.grafana_port)


@pytest.mark.parametrize("serving, grafana, key, other", [
    (None, 8000, "twinspark:observability.grafanaPort", "serving.port"),  # Grafana onto the API's default
    (3000, None, "twinspark:serving.port", "observability.grafanaPort"),  # the API onto Grafana's default
    (9000, 9000, "twinspark:observability.grafanaPort", "serving.port"),
])
def test_two_configured_ports_never_share_a_port(serving, grafana, key, other):
    cfg = copy.deepcopy(BASE)
    if serving is not None:
        put(cfg, ("serving", "port"), serving)
    if grafana is not None:
        put(cfg, ("observability", "grafanaPort"), grafana)
    assert_refused(cfg, key, [other])


def test_grafanas_port_is_free_while_observability_is_off():
    cfg = copy.deepcopy(BASE)
    put(cfg, ("observability", "enabled"), False)
    put(cfg, ("serving", "port"), 3000)
    assert parse_stack_config(cfg).head_public_ports == (3000,)


def as_one_lane(blocks):
    """The same stack written as one entry of `lanes` on both nodes."""
    cfg = copy.deepcopy(blocks)
    cfg["lanes"] = [{"name": "main", "nodes": [n["name"] for n in cfg["nodes"]], "model": cfg.pop("model")}]
    return cfg


def number_fields(model=None, prefix=()):
    """(path, type) of every int and float field of the schema, nested blocks and lists included."""
    from typing import Annotated, Union, get_args, get_origin

    from components.config import ConfigBlock, StackConfig
    from components.config.blocks import LANE_SERVING_KEYS

    for name, field in (model or StackConfig).model_fields.items():
        path = prefix + (field.alias or name,)
        if path[:3] == ("lanes", 0, "serving") and len(path) > 3 and path[3] not in LANE_SERVING_KEYS:
            continue  # the stack's serving key, refused in a lane
        annotation = field.annotation
        if get_origin(annotation) is Union:
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        if get_origin(annotation) is Annotated:  # inside Optional, pydantic leaves the metadata on
            annotation = get_args(annotation)[0]
        if get_origin(annotation) is list:
            annotation, path = get_args(annotation)[0], path + (0,)
        if isinstance(annotation, type) and issubclass(annotation, ConfigBlock):
            yield from number_fields(annotation, path)
        elif annotation in (int, float):  # bool is an int subclass, but not `int` itself
            yield path, annotation


NUMBER_FIELDS = list(number_fields())
FLOAT_FIELDS = [p for p, t in NUMBER_FIELDS if t is float]


def test_the_number_walk_sees_the_plain_fields():
    keys = {".".join(str(p) for p in path) for path, _ in NUMBER_FIELDS}
    assert {"observability.retentionDays", "observability.scrapeIntervalSeconds", "observability.grafanaPort",
            "serving.port", "fabric.mtu", "serving.guard.intervalSeconds", "serving.gpuClockCapMhz",
            "fabric.minBusBandwidthGBps", "observability.gpuTemperatureAlertCelsius"} <= keys, keys
    assert {k for k in keys if k.lower().endswith("port")} == {".".join(p) for p in PORT_KEYS}, "a new port field"


@pytest.mark.parametrize("path", [p for p, _ in NUMBER_FIELDS], ids=lambda p: ".".join(map(str, p)))
def test_a_yaml_boolean_is_no_number_in_any_field(path):
    """YAML `true` must not become 1 (port 1, one day of retention, a 1 s scrape)."""
    cfg = as_one_lane(BASE) if path[0] == "lanes" else copy.deepcopy(BASE)
    put(cfg, path, True)
    assert_refused(cfg, format_key_path(path), ["YAML boolean"])


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), "inf", "NaN"], ids=repr)
@pytest.mark.parametrize("path", FLOAT_FIELDS, ids=lambda p: ".".join(map(str, p)))
def test_a_float_field_takes_finite_numbers_only(path, value):
    """An infinite NcclCheck floor can never be met; `pulumi config set --path` writes 'inf' as a string."""
    cfg = as_one_lane(BASE) if path[0] == "lanes" else copy.deepcopy(BASE)
    put(cfg, path, value)
    assert_refused(cfg, format_key_path(path), ["finite number"])


PP = "set serving.pipelineParallel (tensorParallel × pipelineParallel = the node count)"


@pytest.mark.parametrize("extra_args, index", [
    (["--pipeline-parallel-size", "2"], 0), (["--enforce-eager", "--pipeline-parallel-size=2"], 1),
    (["--pipeline_parallel_size", "2"], 0), (["--pipeline-parallel", "2"], 0), (["-pp", "2"], 0), (["-pp=2"], 0),
    (["--enforce-eager", "-pp", "2"], 1),
])
def test_pipeline_parallelism_in_extra_args_is_refused(extra_args, index):
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["extraArgs"] = extra_args
    assert_refused(cfg, f"twinspark:serving.extraArgs[{index}]", [PP])


@pytest.mark.parametrize("extra_args, fragment", [
    (["--disable-log-stats"], "removes every vllm:* metric"),
    (["--data-parallel-size", "2"], "multiprocess mode"), (["-dp", "2"], "multiprocess mode"),
    (["--api-server-count=2"], "multiprocess mode"),
])
def test_extra_args_that_would_blind_the_monitoring_are_refused(extra_args, fragment):
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["extraArgs"] = extra_args
    assert_refused(cfg, "twinspark:serving.extraArgs[0]", [fragment])


@pytest.mark.parametrize("first, second", [
    ("spark-a.local", "SPARK-A.LOCAL"), ("Spark1.lan", "spark1.LAN"), ("spark-a", "Spark-A"),
])
def test_one_machine_is_not_two_nodes(first, second):
    cfg = copy.deepcopy(BASE)
    cfg["nodes"][0]["host"], cfg["nodes"][1]["host"] = first, second
    assert_refused(cfg, "twinspark:nodes[1].host", ["nodes[0].host"])


# inet_aton (glibc, ssh, nft) reads these as 192.168.1.10 or, with a leading 0, as octal
@pytest.mark.parametrize("host", ["192.168.1.010", "3232235786", "0xc0a8010a", "192.168.266", "0300.0250.1.10",
                                  "192.168.1.10."])
def test_an_address_in_another_spelling_is_refused(host):
    cfg = copy.deepcopy(BASE)
    cfg["nodes"][1]["host"] = host
    assert_refused(cfg, "twinspark:nodes[1].host", [repr(host), "IPv4 address"])


def test_a_host_name_that_does_not_resolve_is_refused_before_any_resource(program, recipe_config):
    """The firewall admits the peers by address, resolved when `pulumi up` runs (at boot no name
    resolves): a name this machine cannot resolve stops the program (.invalid never resolves)."""
    recipe_config["twinspark:nodes"][1]["host"] = "spark2.invalid"
    run = program(recipe_config)
    assert run.error and run.error["kind"] == "RunError", run.error
    message = run.error["message"]
    assert "twinspark:nodes[1].host: 'spark2.invalid' does not resolve" in message, message
    assert run.resources == []


def test_two_names_of_one_address_are_one_machine():
    from components.config import resolve_node_addresses

    cfg = copy.deepcopy(BASE)
    cfg["nodes"][0]["host"], cfg["nodes"][1]["host"] = "spark1.lan", "spark1-alias.lan"
    table = {"spark1.lan": ["192.168.1.10"], "spark1-alias.lan": ["192.168.1.10", "192.168.1.99"]}
    with pytest.raises(pulumi.RunError) as err:
        resolve_node_addresses(parse_stack_config(cfg).nodes, resolve=table.__getitem__)
    message = str(err.value)
    assert "twinspark:nodes[1].host: 'spark1-alias.lan' resolves to 192.168.1.10" in message, message
    assert "nodes[0].host" in message, message


def test_resolved_addresses_are_what_the_firewall_admits():
    from components.config import Topology, resolve_node_addresses
    from components.firewall import LAN_PEERS, firewall_policy

    cfg = copy.deepcopy(BASE)
    cfg["nodes"][1]["host"] = "spark2.lan"
    parsed = parse_stack_config(cfg)
    table = {"spark2.lan": ["192.168.1.11", "192.168.1.7"]}
    addresses = resolve_node_addresses(parsed.nodes, resolve=table.__getitem__)
    # sorted: one name renders one table, whatever order the resolver answers in
    assert addresses == {"spark1": ("192.168.1.10",), "spark2": ("192.168.1.7", "192.168.1.11")}
    policy = firewall_policy(parsed.head, Topology(parsed, addresses))
    (bootstrap,) = [a for a in policy.admits if a.flow == "nccl-bootstrap"]  # LAN_PEERS' flow
    assert bootstrap.sources == ("192.168.1.7", "192.168.1.11"), LAN_PEERS


@pytest.mark.parametrize("value", ["arm64", "linux/riscv", "linux/arm64/v8", "Linux/ARM64", ""])
def test_a_platform_docker_cannot_build_for_the_stack_is_refused(value):
    cfg = copy.deepcopy(BASE)
    cfg["serving"]["platform"] = value
    assert_refused(cfg, "twinspark:serving.platform", [repr(value), "linux/arm64", "linux/amd64"])


def test_the_platform_defaults_to_a_sparks_and_the_sim_sets_its_own():
    from sim_images import sim_stack

    assert parse_stack_config(copy.deepcopy(BASE)).serving.platform == "linux/arm64"
    assert sim_stack().serving.platform == "linux/amd64"


def with_nodes(count):
    """BASE with spark3, spark4, ... added after its two nodes."""
    cfg = copy.deepcopy(BASE)
    if count > 2:
        cfg["fabric"]["topology"] = "switch"  # rail N of every node on one subnet
    for i in range(3, count + 1):
        cfg["nodes"].append({"name": f"spark{i}", "role": "worker", "host": f"192.168.1.{10 + i}", "rails": [
            {"iface": "enp1s0f0np0", "hca": "rocep1s0f0", "address": f"10.0.0.{i}/24"},
            {"iface": "enP2p1s0f0np0", "hca": "roceP2p1s0f0", "address": f"10.0.1.{i}/24"}]})
    return cfg


def test_parallelism_defaults_to_tp_over_every_node_without_pp():
    """Today's behaviour: TP = the node count, PP 1, and no --pipeline-parallel-size in vLLM's argv."""
    from components.launch_bundle import VllmServe, vllm_argv

    cfg = parse_stack_config(copy.deepcopy(BASE))
    assert (cfg.tensor_parallel_size, cfg.pipeline_parallel_size, cfg.world_size) == (2, 1, 2)
    argv = vllm_argv(VllmServe(cfg.serving, cfg.model, cfg.tensor_parallel_size, cfg.pipeline_parallel_size))
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and "--pipeline-parallel-size" not in argv
    assert cfg.warnings == []


@pytest.mark.parametrize("nodes, serving, key, fragments", [
    (2, {"tensorParallel": 3}, "twinspark:serving.tensorParallel",
     ["tensorParallel 3 × pipelineParallel 1 = 3 ranks on 2 nodes", "expected tensorParallel × pipelineParallel = 2",
      "pipelineParallel: 1 (TP=2) or pipelineParallel: 2 (TP=1)"]),
    (2, {"tensorParallel": 2, "pipelineParallel": 2}, "twinspark:serving.pipelineParallel",
     ["tensorParallel 2 × pipelineParallel 2 = 4 ranks on 2 nodes", "= 2, the node count"]),
    (3, {"pipelineParallel": 2}, "twinspark:serving.pipelineParallel",
     ["2 — expected a pipelineParallel that divides the node count 3", "pipelineParallel: 3 (TP=1)"]),
    (2, {"pipelineParallel": 0}, "twinspark:serving.pipelineParallel", ["greater than or equal to 1"]),
])
def test_tp_times_pp_other_than_the_node_count_is_refused_with_both_values(nodes, serving, key, fragments):
    cfg = with_nodes(nodes)
    cfg["serving"].update(serving)
    assert_refused(cfg, key, fragments)


@pytest.mark.parametrize("serving", [{}, {"tensorParallel": 3}, {"tensorParallel": 3, "pipelineParallel": 1}])
def test_tp3_for_the_seeds_model_is_refused_with_the_numbers_and_the_layout_that_works(serving):
    cfg = with_nodes(3)
    cfg["serving"].update(serving)
    assert_refused(cfg, "twinspark:serving.tensorParallel",
                   ["TP=3 × PP=1 on 3 nodes", "attention heads: 64 not divisible by TP 3",
                    "64 attention heads, 1 KV heads, 43 layers", "with 3 nodes set pipelineParallel: 3 (TP=1)"])


def test_pp3_on_three_nodes_serves_the_seeds_model_with_a_warning():
    from components.launch_bundle import VllmServe, vllm_argv

    cfg = with_nodes(3)
    cfg["serving"]["pipelineParallel"] = 3
    stack = parse_stack_config(cfg)
    assert (stack.tensor_parallel_size, stack.pipeline_parallel_size) == (1, 3)
    argv = vllm_argv(VllmServe(stack.serving, stack.model, stack.tensor_parallel_size, stack.pipeline_parallel_size))
    at = argv.index("--tensor-parallel-size")
    assert argv[at:at + 4] == ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "3"]
    assert "recipe DeepSeek-V4-Flash-0731 was proven with tp only" in (stack.served_lanes[0].parallelism_warning or "")


def test_a_layout_check_needs_the_recipes_own_model():
    """Another model.repo under the recipe: its shape is not the recipe's, so the shape check after
    the pin judges it (no refusal here), as for a recipe without a shape."""
    cfg = with_nodes(3)
    cfg["model"]["repo"] = "someone/DeepSeek-V4-Flash-finetune"
    assert parse_stack_config(cfg).tensor_parallel_size == 3


def test_layouts_follow_heads_over_tp_and_layers_over_pp():
    """PP splits layers: a stage without a layer is refused, naming pipelineParallel."""
    from core import recipes
    from components.config import shape_rules

    seed = recipes.recipe_named(recipes.DEFAULT_RECIPE).shape.as_config_json()
    assert shape_rules().workable_layouts(seed, 3) == [(1, 3)]
    assert shape_rules().workable_layouts(seed, 4) == [(4, 1), (2, 2), (1, 4)]
    few = {**seed, "num_hidden_layers": 2}
    assert shape_rules().workable_layouts(few, 3) == []
    assert "FAIL hidden layers: 2 fewer than PP 3 stages" in shape_rules().head_lines(few, 1, 3)[-1]
