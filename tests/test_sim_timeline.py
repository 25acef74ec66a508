"""The simulator's timeline (tests/sim_engine/timeline.py): nested spans count once, a run's
slowest steps come from the engine's own event stamps, and the table adds up per scenario."""

from __future__ import annotations

import json

import timeline
from toolbox import HANG_GUARD_S


def test_nested_spans_count_once_and_the_rest_is_what_no_span_covers():
    line = timeline.Timeline()
    line.phase = "tests/sim_engine/test_x.py::test_a::call"
    with line.span("wait", "serving", bound=180):
        with line.span("ssh", "sim1: curl"):
            pass
    with line.span("pulumi", "up"):
        pass
    document = {"scenarios": {"test_x.py::test_a": {"setup": 1.0, "call": 9.0, "teardown": 0.0}},
                "spans": line.spans}
    for span, at, seconds in zip(document["spans"], (1.0, 0.5, 4.0), (0.5, 3.0, 4.0)):  # ssh, wait, pulumi
        span["at"], span["s"] = at, seconds
    row = next(r for r in timeline.table(document).splitlines() if r.startswith("| test_x.py::test_a "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    by_kind = dict(zip(("scenario", "total s", *timeline.KINDS, "rest"), cells))
    assert by_kind["total s"] == "10"
    assert by_kind["wait"] == "3 (1)" and by_kind["ssh"] == ""  # the login inside the wait is the wait's
    assert by_kind["pulumi"] == "4 (1)" and by_kind["rest"] == "3"
    assert [s["depth"] for s in line.spans] == [1, 0, 0] and line.spans[1]["bound"] == 180


def test_logins_in_threads_nest_apart_and_leave_the_depth_as_it_was():
    import threading
    line = timeline.Timeline()
    inside = threading.Barrier(2)

    def login():
        with line.span("ssh", "a copy's login"):
            inside.wait(timeout=HANG_GUARD_S)  # both open at once
    threads = [threading.Thread(target=login) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with line.span("pulumi", "up"):
        pass
    assert [s["depth"] for s in line.spans] == [0, 0, 0]
    for span, at in zip(line.spans, (1.0, 1.1, 5.0)):  # two logins side by side, then the up
        span["at"], span["s"] = at, 2.0
    assert len(timeline.outermost(line.spans)) == 3  # side by side, each counts


def test_a_runs_slowest_steps_are_its_engine_stamps():
    def event(kind, name, at, op="create"):
        return {"timestamp": at, kind: {"metadata": {"urn": f"urn:pulumi:sim::twinspark::t::{name}", "op": op}}}
    events = [event("resourcePreEvent", "sim1-readiness-wait", 100), event("resourcePreEvent", "sim1-docker", 100),
              event("resOutputsEvent", "sim1-docker", 101), event("resOutputsEvent", "sim1-readiness-wait", 130),
              {"summaryEvent": {}}]
    assert timeline.slowest_steps(events) == {"sim1-readiness-wait create": 30, "sim1-docker create": 1}
    events[2:2] = [event("resourcePreEvent", "sim1-host", 101, op="same"), event("resOutputsEvent", "sim1-host", 101, op="same")]
    # the trace: in start order, from the run's first stamp; a same step that took no second left out
    assert timeline.step_trace(events) == [["sim1-readiness-wait create", 0, 30], ["sim1-docker create", 0, 1]]


def test_a_resource_deleted_twice_for_one_replacement_is_named():
    """The cold rehearsal of 4ac9c2c: the engine deleted sim1's old serving container twice (the
    second `docker rm` returned early) and its replacement found the name taken."""
    def outputs(name, op):
        return {"timestamp": 1, "resOutputsEvent": {"metadata": {"urn": f"urn:pulumi:sim::twinspark::t::{name}", "op": op}}}
    events = [outputs("sim1-serving-container", "delete-replaced"), outputs("sim2-serving-container", "delete-replaced"),
              outputs("sim1-serving-container", "create-replacement"), outputs("sim2-serving-container", "delete")]
    assert timeline.deleted_twice(events) == []
    events.append(outputs("sim1-serving-container", "delete-replaced"))
    assert timeline.deleted_twice(events) == ["sim1-serving-container"]


def test_the_command_reads_a_written_timeline_and_refuses_a_missing_one(tmp_path, capsys):
    line = timeline.Timeline()
    line.phase = "tests/sim_engine/test_x.py::test_a::call"
    with line.span("node", "reboot sim2"):
        pass
    path = tmp_path / "build" / "timeline.json"
    line.write(path, {"test_x.py::test_a": {"call": 2.0}})
    assert json.loads(path.read_text())["spans"][0]["what"] == "reboot sim2"
    assert timeline.main([str(path)]) == 0 and "| test_x.py::test_a | 2 |" in capsys.readouterr().out
    assert timeline.main([str(path), "--spans", "test_a"]) == 0 and "reboot sim2" in capsys.readouterr().out
    assert timeline.main([str(path), "--by-file"]) == 0 and "| test_x.py | 1 | 2 |" in capsys.readouterr().out
    assert timeline.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_two_workers_scenarios_side_by_side_each_keep_their_spans():
    """The simulator's two workers run at once: a long `up` of one worker's scenario spans the
    other's whole wait, and each still counts in its own scenario."""
    spans = [{"phase": "tests/sim_engine/test_a.py::test_up::call", "kind": "pulumi", "what": "up",
              "depth": 0, "at": 0.0, "s": 60.0, "worker": "gw0"},
             {"phase": "tests/sim_engine/test_b.py::test_wait::call", "kind": "wait", "what": "serving",
              "depth": 0, "at": 10.0, "s": 20.0, "worker": "gw1"}]
    document = {"scenarios": {"test_a.py::test_up": {"call": 61.0}, "test_b.py::test_wait": {"call": 21.0}},
                "spans": spans}
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")]
            for r in timeline.table(document).splitlines() if r.startswith("| test_")}
    kinds = ("scenario", "total s", *timeline.KINDS, "rest")
    assert dict(zip(kinds, rows["test_a.py::test_up"]))["pulumi"] == "60 (1)"
    assert dict(zip(kinds, rows["test_b.py::test_wait"]))["wait"] == "20 (1)"


def test_two_workers_files_merge_into_one_report_and_one_timeline_and_go(tmp_path):
    """The simulator's two workers each write their copy; the controller merges them: a figure
    both clusters made (each its fresh `up`) is kept per worker, one made once as it is."""
    report = tmp_path / "sim-engine-report.json"
    (tmp_path / "sim-engine-report.gw0.json").write_text(json.dumps({"fresh_up_s": 81.1, "ring_up_s": 40.0}))
    (tmp_path / "sim-engine-report.gw1.json").write_text(json.dumps({"fresh_up_s": 84.4, "crash_loop_s": 90.0}))
    timeline.merge_worker_files(report, timeline.merge_reports)
    assert json.loads(report.read_text()) == {"fresh_up_s": {"gw0": 81.1, "gw1": 84.4}, "ring_up_s": 40.0,
                                              "crash_loop_s": 90.0}
    spans = tmp_path / "sim-engine-timeline.json"
    for worker, name in (("gw0", "test_a.py::test_up"), ("gw1", "test_b.py::test_wait")):
        (tmp_path / f"sim-engine-timeline.{worker}.json").write_text(json.dumps(
            {"scenarios": {name: {"call": 1.0}}, "spans": [{"phase": f"tests/{name}::call", "at": 0.0}]}))
    timeline.merge_worker_files(spans, timeline.merge_timelines)
    merged = json.loads(spans.read_text())
    assert set(merged["scenarios"]) == {"test_a.py::test_up", "test_b.py::test_wait"}
    assert [s["worker"] for s in merged["spans"]] == ["gw0", "gw1"]
    assert timeline.worker_files(report) == [] and timeline.worker_files(spans) == []


def two_workers_document() -> dict:
    scenarios = {"test_a.py::test_one": {"setup": 100.0, "call": 20.0}, "test_a.py::test_two": {"call": 30.0},
                 "test_b.py::test_three": {"call": 70.0}, "test_b.py::test_quiet": {"call": 1.0}}
    spans = [{"at": 0.0, "s": 1.0, "depth": 0, "kind": "ssh", "what": "x", "phase": f"tests/sim_engine/{name}::call",
              "worker": worker} for name, worker in (("test_a.py::test_one", "gw0"), ("test_a.py::test_two", "gw0"),
                                                     ("test_b.py::test_three", "gw1"))]
    return {"scenarios": scenarios, "spans": spans}


def test_the_files_table_gives_each_workers_seconds_and_names_a_scenario_no_span_placed():
    rows = timeline.by_file(two_workers_document()).splitlines()
    assert "| worker gw0 | 2 | 150 |" in rows and "| worker gw1 | 1 | 70 |" in rows, rows
    assert "| worker unknown (no span) | 1 | 1 |" in rows, rows


def test_against_another_run_sums_the_scenarios_both_ran_and_lists_the_rest():
    here = two_workers_document()
    there = {"scenarios": {"test_a.py::test_one": {"call": 60.0}, "test_a.py::test_two": {"call": 20.0},
                           "test_c.py::test_gone": {"call": 40.0}}, "spans": []}
    lines = timeline.against(here, there).splitlines()
    assert lines[0] == "2 scenarios in both: 150 s here, 80 s there (1.88x)", lines
    assert lines[1] == "2 only here: 71 s" and lines[-2] == "1 only there: 40 s", lines
    assert lines[-1].split() == ["40", "test_c.py::test_gone"], lines
