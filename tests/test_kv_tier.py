"""The KV tier (serving.kvTier, issue 42 item 3): vLLM's file tier on a lane of one node, its place in the
memory budget, its hash seed, its bound on the disk, and the simulator's stand-in of it."""

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pulumi
import pytest
from openai_standin import Behaviour
from program_harness import config_blocks, plain_occurrences
from test_config_errors import assert_refused
from toolbox import HANG_GUARD_S
from test_lanes_config import lanes_stack_config, two_lanes
from test_memory_guard import check, first_status, meminfo

from components import launch_bundle
from components.config import Serving, Topology, parse_stack_config, resolve_node_addresses
from core import contract, kv_tier

LAUNCH = Path(__file__).resolve().parent.parent / "launch"
TIER = {"memoryGiB": 8, "diskGiB": 200}


def fast_lane_bundle(cfg):
    """The fast lane's (spark2's) launch bundle arguments, as the program makes them."""
    fast = cfg.served_lanes[1]
    view = cfg.lane_view(fast)
    vllm = launch_bundle.VllmServe(view.serving, view.model, view.tensor_parallel_size, lane=fast.name)
    fabric = Topology(view, resolve_node_addresses(view.nodes)).node_fabric(view.head)
    return launch_bundle.LaunchBundleArgs(view.head, None, vllm, fabric, "token", "label-key", None,
                                          kv_tier_seed="1234")


@pytest.fixture
def event_loop_for_outputs():
    """pulumi.Output.secret outside a program run wants an event loop (a process's first test has none)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    asyncio.set_event_loop(None)
    loop.close()


def test_a_lane_of_one_node_renders_vllms_file_tier_its_environment_and_its_seed(event_loop_for_outputs):
    cfg = parse_stack_config(two_lanes(**{"1.serving.kvTier": TIER}))
    args = fast_lane_bundle(cfg)
    argv = launch_bundle.vllm_argv(args.vllm)
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8 * 1024**3,
        "secondary_tiers": [{"type": "fs", "root_dir": "/var/cache/twinspark/kv-tier/fast",
                             "n_read_threads": 16, "n_write_threads": 16}]}}
    env = dict(line.split("=", 1) for line in launch_bundle.render_env_file(args).splitlines() if "=" in line)
    assert (env["TWINSPARK_KV_TIER_DIR"], env["TWINSPARK_KV_TIER_DISK_BYTES"]) == (
        f"{contract.CACHE_DIR}/kv-tier/fast", str(200 * 1024**3))
    assert env["TWINSPARK_KV_TIER_MEMORY_BYTES"] == str(8 * 1024**3)  # the memory check waits for it too
    files = {f.path.rsplit("/", 1)[-1]: f for f in launch_bundle.bundle_files(args)}
    assert files[contract.KV_TIER_SEED_FILE].mode == "0600" and files[contract.KV_TIER_BOUND_SCRIPT].mode == "0755"
    assert isinstance(files[contract.KV_TIER_SEED_FILE].content, pulumi.Output)  # Output.secret: never plain state
    # the other lane and the default stack: no tier, nothing of it rendered
    coder = cfg.served_lanes[0]
    plain = launch_bundle.VllmServe(coder.serving, coder.model, 1, lane=coder.name)
    assert "--kv-transfer-config" not in launch_bundle.vllm_argv(plain)
    default = parse_stack_config(config_blocks())
    assert default.serving.kv_tier is None and not any("KV_TIER" in k for k, _ in default.serving.memory_budget.env_entries())


def test_the_program_makes_the_seed_only_for_a_stack_with_a_tier_and_keeps_it_a_secret_file(program, recipe_run):
    config = lanes_stack_config()
    config["twinspark:lanes"][1]["serving"]["kvTier"] = TIER
    tiered = program(config)
    assert tiered.error is None, tiered.error
    [seed] = [r for r in tiered.of_type("random:index/randomId:RandomId") if r.name == "kv-tier-hash-seed"]
    assert seed.inputs["byteLength"] == 4  # PYTHONHASHSEED: an integer in [0, 2^32 - 1]
    seed_files = [r.name for r in tiered.resources if f"bundle-{contract.KV_TIER_SEED_FILE}" in r.name]
    assert seed_files and all(name.startswith("spark2-") for name in seed_files), seed_files
    assert not plain_occurrences(tiered.named(seed_files[0]).inputs, seed.outputs["dec"])  # secret in state
    assert "kv-tier-hash-seed" not in recipe_run.by_name  # the default stack: no tier, no seed


def test_a_lane_over_several_nodes_is_refused_a_tier_naming_why():
    cfg = config_blocks()
    cfg["serving"]["kvTier"] = {"memoryGiB": 1, "diskGiB": 200}  # 0.83% of a Spark: the budget adds up
    assert_refused(cfg, "twinspark:serving.kvTier",
                   ["served by 2 nodes", "keeps the head's ranks' blocks only", "a lane of one node"])


def test_the_tier_counts_in_the_nodes_memory_budget():
    def serving(utilization, cotenants, tier_gib=None):
        return Serving(image="ghcr.io/x/vllm:1.0.0", gpu_memory_utilization=utilization, cotenant_memory_max=cotenants,
                       kv_tier={"memory_gib": tier_gib, "disk_gib": 200} if tier_gib else None)

    # 8 GiB of a Spark's 121 is 6.62%: at 0.80 the co-tenants' auto caps go from 7% to 4% each
    assert (serving(0.80, "auto").cotenant_memory_percent, serving(0.80, "auto", 8).cotenant_memory_percent) == (7, 4)
    assert serving(0.80, "auto", 8).memory_budget.total_percent == 80 + 6.62 + 5 + 2 * 4
    for utilization, cotenants, fragment in ((0.85, "auto", "lower gpuMemoryUtilization to 0.8238"),
                                             (0.85, "5%", "= 106.62% of the node's memory")):
        with pytest.raises(ValueError) as refused:
            serving(utilization, cotenants, 8)
        assert "kvTier.memoryGiB 8 (6.62% of a Spark's memory)" in str(refused.value), refused.value
        assert fragment in str(refused.value), refused.value
    # a lane's tier in its node's budget (gpt-oss-120b's 0.70 + 30 GiB = 24.8% + 5% headroom: over 100%)
    with pytest.raises(Exception) as refused:
        parse_stack_config(two_lanes(**{"1.serving.kvTier": {"memoryGiB": 30, "diskGiB": 10}}))
    assert "lanes[1].serving" in str(refused.value) and "kvTier.memoryGiB 30" in str(refused.value), refused.value


def test_the_memory_check_waits_for_the_tiers_bytes_beside_the_models_share(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "meminfo").write_text(meminfo(119.7, 105.0, 60.0))  # 101.7 GiB for the model alone would fit
    proc = check(tmp_path, "--kv-tier-bytes", str(8 * 1024**3))
    waiting = first_status(tmp_path)
    assert proc.poll() is None, "started without the tier's 8 GiB"
    assert waiting["ok"] is False and waiting["need_gib"] == pytest.approx(109.74, abs=0.01)
    (tmp_path / "meminfo").write_text(meminfo(119.7, 110.0, 60.0))
    out, _ = proc.communicate(timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and "(0.85 x 119.7 GiB + 8.0 GiB for its KV tier)" in out, out


def bound(root, max_bytes, *extra):
    return subprocess.run([sys.executable, str(LAUNCH / contract.KV_TIER_BOUND_SCRIPT), "--dir", str(root),
                           "--max-bytes", str(max_bytes), "--once", *extra], capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


def test_the_bound_removes_the_least_recently_used_blocks_down_to_its_low_water(tmp_path):
    blocks = tmp_path / "tier" / "abc_r0" / "123" / "45_g0"
    blocks.mkdir(parents=True)
    now = time.time()
    for i in range(10):  # 10 blocks of 1000 bytes, block 0 the least recently used
        path = blocks / f"{i:02d}.bin"
        path.write_bytes(b"k" * 1000)
        os.utime(path, (now - 1000 + i, now - 1000 + i))
    os.utime(blocks / "00.bin", (now, now - 2000))  # read just now: kept (access time is use)
    (blocks / "09.bin_77.tmp").write_bytes(b"t" * 5000)  # being written: neither counted nor removed
    (tmp_path / "tier" / "abc_r0" / "config.json").write_text("{}")
    done = bound(tmp_path / "tier", 8000)
    assert done.returncode == 0, done.stderr
    left = sorted(p.name for p in blocks.iterdir())
    # 10000 > 8000: down to 0.9 x 8000 = 7200, so 3 go: the oldest by use, 01 02 03 (00 was read)
    assert left == ["00.bin", "04.bin", "05.bin", "06.bin", "07.bin", "08.bin", "09.bin", "09.bin_77.tmp"], left
    assert "removed 3 least recently used blocks (3000 bytes), 7000 bytes left" in done.stdout, done.stdout
    assert (tmp_path / "tier" / "abc_r0" / "config.json").exists()
    assert bound(tmp_path / "tier", 8000).stdout == ""  # under the bound: nothing removed, nothing said
    refused = bound(tmp_path / "tier", 0)
    assert refused.returncode == 2 and "--max-bytes must be above 0" in refused.stderr


class DirTier:
    """The simulator's vLLM stand-in's file tier (tests/sim/bin/vllm FileTier), as a BlockStore here."""

    def __init__(self, root: Path):
        self.root = root

    def has(self, digest: bytes) -> bool:
        return (self.root / digest.hex()).exists()

    def put(self, digest: bytes) -> None:
        (self.root / digest.hex()).write_bytes(b"")


@pytest.mark.parametrize("seed_after, hit", [(b"1234", True), (b"other", False)])
def test_the_stand_ins_blocks_outlive_its_engine_when_the_hash_chain_starts_the_same(tmp_path, seed_after, hit):
    prompt = "x" * 200
    first = Behaviour(prefix_cache=True, kv_tier=DirTier(tmp_path), hash_seed=b"1234")
    assert first.lookup_and_fill_cache(prompt, "") == 0 and len(list(tmp_path.iterdir())) == 200 // 16
    again = Behaviour(prefix_cache=True, kv_tier=DirTier(tmp_path), hash_seed=seed_after)  # a restarted engine
    assert again.lookup_and_fill_cache(prompt, "") == (192 if hit else 0)
    assert again.tier_hit_chars == (192 if hit else 0)


def test_the_tiers_share_of_a_spark_rounds_up_to_the_budgets_basis_points():
    assert (kv_tier.memory_share(8), kv_tier.memory_share(1), kv_tier.memory_share(121)) == (0.0662, 0.0083, 1.0)
