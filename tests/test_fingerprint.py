"""The doctor's judgement (core/fingerprint.py, issue 40 part 1): planted differences named in the
order of what they have cost, with their evidence; a healthy pair and facts the recipe does not
record give no finding; the recipes carry the fingerprint their figures were measured on."""

from dataclasses import replace

from core import recipes
from core.fingerprint import CAUSES, Fingerprint, diagnose, unknown_in_baseline

SEED = recipes.recipe_named(recipes.DEFAULT_RECIPE)
BASELINE = SEED.baseline.fingerprint.fingerprint()
RAILS = {"enp1s0f0np0": 9000, "enP2p1s0f0np0": 9000}
HEALTHY = Fingerprint(driver="580.173.02", kernel="6.17.0-1029-nvidia", nccl="2.30.7", image_digest="sha256:aa",
                      model_sha256="m" * 64, drafter_sha256="d" * 64, gpu_clock_mhz=3003, gpu_clock_max_mhz=3003,
                      cstates_enabled=False, rail_mtu=RAILS, roce_active_mtu={r: 4096 for r in RAILS},
                      pcie={"rocep1s0f0": (32.0, 4, 32.0, 4), "roceP2p1s0f0": (32.0, 4, 32.0, 4)},
                      nccl_busbw_gbps=19.8, swap_enabled=False, earlyoom_active=True)


def judged(nodes):
    fp = SEED.baseline.fingerprint
    return [(f.node, f.key) for f in diagnose(nodes, BASELINE, "spark1", fp.rail_mtu, fp.roce_active_mtu)]


def test_the_seed_recipe_records_what_its_figures_were_measured_on_and_says_what_it_does_not():
    fp = SEED.baseline.fingerprint
    assert (fp.driver, fp.kernel, fp.nccl, fp.rail_mtu, fp.roce_active_mtu, fp.nccl_busbw_gbps) == (
        "580.173.02", "6.17.0-1029-nvidia", "2.30.7", 9000, 4096, 21.7)
    assert {"image_digest", "model_sha256", "drafter_sha256", "cstates_enabled"} <= set(unknown_in_baseline(BASELINE))
    assert "not recorded" in fp.source
    other = recipes.recipe_named("gpt-oss-120b").baseline.fingerprint
    assert other.source == "not recorded" and other.fingerprint() == Fingerprint()


def test_a_healthy_pair_has_no_finding():
    assert judged({"spark1": HEALTHY, "spark2": HEALTHY}) == []


def test_planted_differences_are_named_in_the_order_of_what_they_cost():
    """The issue's three: a different drafter file, a rail at MTU 1500 (RoCE then at 1024), a clock cap."""
    worker = replace(HEALTHY, drafter_sha256="e" * 64, gpu_clock_mhz=2000,
                     rail_mtu={**RAILS, "enP2p1s0f0np0": 1500}, roce_active_mtu={**{r: 4096 for r in RAILS},
                                                                                 "enP2p1s0f0np0": 1024})
    found = diagnose({"spark1": HEALTHY, "spark2": worker}, BASELINE, "spark1", 9000, 4096)
    # the MTU and the RoCE MTU it brings cost the same 40 % of prefill: both named, the MTU (the fix) first
    assert [(f.node, f.key) for f in found] == [("spark2", "rail_mtu"), ("spark2", "roce_active_mtu"),
                                                ("spark2", "drafter"), ("spark2", "gpu_clock_cap")]
    costs = [f.cause.cost for f in found]
    assert costs == sorted(costs, reverse=True)
    evidence = {f.key: f.evidence for f in found}
    assert evidence["rail_mtu"] == "MTU enP2p1s0f0np0 1500; the recipe's 9000"
    assert evidence["drafter"] == "drafter sha256 eeeeeeeeeeee, the head spark1's (the recipe records none) dddddddddddd"
    assert evidence["gpu_clock_cap"] == "SM clock capped at 2000 MHz of 3003 MHz"


def test_the_costliest_causes_outrank_the_rest_and_each_says_its_fix():
    broken = replace(HEALTHY, nccl_busbw_gbps=3.0, pcie={"rocep1s0f0": (8.0, 1, 32.0, 4)}, cstates_enabled=True,
                     driver="580.95.05", swap_enabled=True)
    keys = judged({"spark1": broken, "spark2": HEALTHY})
    assert keys == [("spark1", "nccl_busbw"), ("spark1", "pcie_link"), ("spark1", "software"),
                    ("spark1", "memory_pressure")]  # C-states: the recipe records none, so not judged
    assert all(CAUSES[key].fix and CAUSES[key].measured for _, key in keys)


def test_a_fact_the_recipe_records_is_judged_against_it_on_the_head_too():
    head = replace(HEALTHY, kernel="6.8.0-1015-nvidia")
    assert judged({"spark1": head, "spark2": head}) == [("spark1", "software"), ("spark2", "software")]


def test_the_images_nccl_and_a_power_saving_mode_are_judged():
    """The NCCL vLLM loaded is held to the recipe's one NCCL as the host's package is; a power-saving
    platform profile, or a `powersave` governor that really holds the clocks (not intel_pstate's), is named."""
    head = replace(HEALTHY, nccl_image="2.30.7", platform_profile="performance", cpu_governor="schedutil",
                   cpufreq_driver="cppc_cpufreq")
    assert judged({"spark1": head, "spark2": head}) == []
    worker = replace(head, nccl_image="2.27.3", platform_profile="low-power")
    found = diagnose({"spark1": head, "spark2": worker}, BASELINE, "spark1", 9000, 4096)
    assert [(f.node, f.key) for f in found] == [("spark2", "power_mode"), ("spark2", "software")]
    assert {f.key: f.evidence for f in found} == {"power_mode": "platform profile low-power",
                                                  "software": "nccl_image 2.27.3 (the recipe's 2.30.7)"}
    held = replace(head, cpu_governor="powersave")
    assert judged({"spark1": head, "spark2": held}) == [("spark2", "power_mode")]
    assert judged({"spark1": head, "spark2": replace(held, cpufreq_driver="intel_pstate")}) == []
