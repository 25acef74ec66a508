"""The known-issues list and the matcher (core/platform_gate.py), without Pulumi."""

import pytest

from core import platform_gate as gate

RECIPE = {"os": "DGX OS 7.2.3", "kernel": "6.17.0-1029-nvidia", "driver": "580.173.02", "cuda": "13.0",
          "gpu": "NVIDIA GB10", "bios_date": "2026-05-20", "cma_total_kb": "0", "cma_free_kb": "0",
          "image": "sha256:" + "1" * 64, "nccl": "2.30.7", "nccl_pip": None}


def keys(facts_by_node, acknowledged=()):
    return [f.key for f in gate.evaluate(facts_by_node, list(acknowledged))]


def test_the_recipes_platform_passes():
    assert keys({"spark1": RECIPE, "spark2": dict(RECIPE)}) == []


def test_the_shipped_list_is_valid_and_sourced():
    issues = gate.known_issues()
    assert len(issues) >= 4
    assert all(i.source.startswith("https://") and i.match for i in issues)


@pytest.mark.parametrize("facts, expected", [
    ({"driver": "589.99.01"}, []),
    ({"driver": "590.44.01"}, ["driver-590-cudagraph-deadlock"]),
    ({"driver": "590"}, ["driver-590-cudagraph-deadlock"]),
    ({"driver": "591.10"}, []),
    ({"driver": None}, []),  # unreadable matches nothing
    # the KHO signature: CmaTotal 0 with CmaFree above it, on Linux 7
    ({"kernel": "7.0.0-1019-nvidia", "cma_free_kb": "940604"}, ["kernel-7.0-kho-cma-enomem"]),
    # the HWE kernel with a CMA pool of its own (MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259)
    ({"kernel": "7.0.0-31-generic", "cma_total_kb": "32768", "cma_free_kb": "940604"}, ["kernel-7.0-kho-cma-enomem"]),
    ({"kernel": "7.0.0-1019-nvidia", "cma_free_kb": "0"}, []),  # booted with kho=off
    ({"kernel": "6.17.0-1029-nvidia", "cma_free_kb": "940604"}, []),
    ({"nccl_pip": "2.28.9"}, ["nccl-pip-2.28.9-hang"]),
    ({"nccl_pip": "2.28.90"}, []),
    ({"nccl": "2.30.4"}, ["nccl-2.30.4-nvls-hang"]),
    ({"bios_date": "2026-03-31"}, ["bios-before-2026-04-cx7-gen5x2"]),
    ({"bios_date": "2026-04-01"}, []),
    ({"bios_date": "2026-03-31", "gpu": "NVIDIA H200"}, []),
])
def test_known_issues_match_what_was_published_and_nothing_else(facts, expected):
    assert keys({"spark1": {**RECIPE, **facts}}) == expected


def test_a_finding_carries_the_entrys_text_and_the_nodes_values():
    [finding] = gate.evaluate({"a": RECIPE, "b": {**RECIPE, "nccl_pip": "2.28.9"}})
    issue = next(i for i in gate.known_issues() if i.id == "nccl-pip-2.28.9-hang")
    assert finding.text.startswith("known issue nccl-pip-2.28.9-hang on b: nccl_pip '2.28.9'. ")
    for text in (issue.breaks, issue.symptom, issue.fix, issue.source):
        assert text in finding.text
    assert gate.refusal([finding]).startswith("platform gate: ")


def test_differences_name_the_nodes_and_their_values():
    three = {"a": RECIPE, "b": RECIPE, "c": {**RECIPE, "kernel": "6.17.0-1030-nvidia"}}
    [finding] = gate.evaluate(three)
    assert finding.key == "mismatch:kernel"
    assert "a has '6.17.0-1029-nvidia', c has '6.17.0-1030-nvidia'" in finding.text
    assert "(a has '6.17.0-1029-nvidia', b has '6.17.0-1029-nvidia', c has '6.17.0-1030-nvidia')" in finding.text
    assert keys(three, ["mismatch:kernel"]) == []
    one_unreadable = {"a": RECIPE, "b": {**RECIPE, "driver": None}}
    assert "b has unreadable" in gate.evaluate(one_unreadable)[0].text


def test_nothing_acknowledges_two_images():
    facts = {"a": RECIPE, "b": {**RECIPE, "image": "sha256:" + "2" * 64}}
    assert keys(facts, ["mismatch:image"]) == ["mismatch:image"]
    assert "mismatch:image" not in gate.acknowledgeable()


def test_each_lanes_engine_has_one_build_and_lanes_may_differ_but_not_in_the_driver():
    """Several lanes (issue 41): two engines, each on its own node, each built on its own head."""
    other_build = {**RECIPE, "image": "sha256:" + "2" * 64, "torch": "2.99.0"}
    lanes = [["a"], ["b"]]
    assert [f.key for f in gate.evaluate({"a": RECIPE, "b": other_build}, groups=lanes)] == []
    assert [f.key for f in gate.evaluate({"a": RECIPE, "b": {**other_build, "driver": "1.0"}}, groups=lanes)] == [
        "mismatch:driver"]
    # one engine over two nodes is still one build, whatever other lanes run
    three = {"a": RECIPE, "b": other_build, "c": RECIPE}
    assert [f.key for f in gate.evaluate(three, groups=[["a", "b"], ["c"]])] == ["mismatch:image", "mismatch:torch"]


ENTRY = """
[[issue]]
id = "x"
breaks = "b"
symptom = "s"
fix = "f"
source = "https://example.org/x"
[issue.match.driver]
equals = "1"
"""


@pytest.mark.parametrize("edit, expected", [
    (lambda t: t.replace("[issue.match.driver]", "[issue.match.drivers]"), "unknown fact 'drivers'"),
    (lambda t: t.replace('source = "https://example.org/x"\n', ""), "source"),
    (lambda t: t.replace("https://", "http://"), "source"),
    (lambda t: t + t, "ids must be distinct: x"),
    (lambda t: t.replace('equals = "1"', ""), "expected at least one of"),
    (lambda t: t.replace('equals = "1"', 'regex = "("'), "regex"),
    (lambda t: t.replace('equals = "1"', 'date_before = "April 2026"'), "date_before"),
    (lambda t: t.replace("[[issue]]", "[[issues]]"), "issue"),
])
def test_a_broken_known_issues_file_is_refused_saying_why(edit, expected):
    assert [i.id for i in gate.parse_known_issues(ENTRY)] == ["x"]
    with pytest.raises(gate.KnownIssuesError) as err:
        gate.parse_known_issues(edit(ENTRY), "known-issues.toml")
    assert str(err.value).startswith("known-issues.toml: ") and expected in str(err.value)


def test_a_node_report_is_its_last_stdout_line():
    out = '12:00:01 platform-facts spark1: started\n{"node": "spark1", "facts": {"kernel": "6.17", "x": 1}}\n'
    facts = gate.parse_report(out, "spark1")
    assert facts["kernel"] == "6.17" and facts["driver"] is None and "x" not in facts
    with pytest.raises(ValueError, match="spark1: the platform-facts step printed no report"):
        gate.parse_report("Traceback ...\n", "spark1")
