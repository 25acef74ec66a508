"""Where the simulator's time goes (issue 35): every pulumi command, wait, pause, node power
operation, ssh login and day-2 tool a scenario runs, with its seconds (and a wait's bound), kept
in build/sim-engine-timeline.json by the sim's conftest. Nested spans (the ssh logins a wait polls
with) carry their depth; a scenario's figures count only the outermost (by time), so nothing
counts twice, but spans run side by side (a copy in rounds, one login per node) each count.

    python tests/sim_engine/timeline.py build/sim-engine-timeline.json   # the table per scenario
    python tests/sim_engine/timeline.py FILE --spans NAME-PART           # one scenario's spans in order
    python tests/sim_engine/timeline.py FILE --by-file                   # seconds per test file and worker
    python tests/sim_engine/timeline.py FILE --against OTHER             # like with like: the scenarios both ran
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

KINDS = ("pulumi", "cli", "wait", "pause", "node", "ssh", "ops", "images")


class Timeline:
    """The session's spans, in the order they ended; `phase` is the pytest phase running now."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.phase = "session"
        self.local = threading.local()  # each thread's depth: a scenario's parallel logins nest apart
        self.spans: list[dict] = []

    @contextmanager
    def span(self, kind: str, what: str, bound: float | None = None):
        """Yields a dict the caller may fill with details (a pulumi run's slowest steps)."""
        start, depth, details = time.monotonic(), getattr(self.local, "depth", 0), {}
        self.local.depth = depth + 1
        try:
            yield details
        finally:
            self.local.depth = depth
            entry = {"phase": self.phase, "kind": kind, "what": what[:160], "depth": depth,
                     "at": round(start - self.started, 2), "s": round(time.monotonic() - start, 2), **details}
            if bound is not None:
                entry["bound"] = round(bound, 1)
            self.spans.append(entry)

    def wrap(self, obj, method: str, kind: str, describe=lambda *a, **k: "") -> None:
        """obj.method timed as `kind` on this instance only (what: describe(*args))."""
        original = getattr(obj, method)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.span(kind, f"{method} {describe(*args, **kwargs)}".strip()):
                return original(*args, **kwargs)
        setattr(obj, method, timed)

    def write(self, path: Path, scenarios: dict[str, dict[str, float]]) -> None:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"scenarios": scenarios, "spans": self.spans}, indent=1) + "\n")


TIMELINE = Timeline()  # one pytest session, one process


def engine_steps(events: list[dict]) -> list[tuple[int, str, int, int, str]]:
    """A run's steps as the engine stamps them (resourcePreEvent to resOutputsEvent, whole
    seconds), in the order they ended: (the order the engine began it, "resource op", seconds
    after the run's first event it began, seconds it took, op: "same" where the event names none)."""
    stamps = [e["timestamp"] for e in events if "timestamp" in e]
    began, steps = {}, []
    for event in events:
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            if kind in event and "timestamp" in event:
                meta = event[kind]["metadata"]
                if kind == "resourcePreEvent":
                    began[meta["urn"]] = (event["timestamp"], len(began))
                elif meta["urn"] in began:
                    start, order = began[meta["urn"]]
                    label = f"{meta['urn'].rsplit('::', 1)[-1]} {meta.get('op', '')}".strip()
                    steps.append((order, label, start - stamps[0], event["timestamp"] - start, meta.get("op", "same")))
    return steps


def deleted_twice(events: list[dict]) -> list[str]:
    """Resources a run deleted more than once for their replacement: a second provider delete of the
    same container can return while the first still removes it, and the replacement's create then
    finds the name taken (components/serving_cluster.py, ServingCluster)."""
    ops = Counter(e["resOutputsEvent"]["metadata"]["urn"].rsplit("::", 1)[-1] for e in events
                  if e.get("resOutputsEvent", {}).get("metadata", {}).get("op") == "delete-replaced")
    return sorted(name for name, count in ops.items() if count > 1)


def slowest_steps(events: list[dict], count: int = 6) -> dict[str, int]:
    """The engine's own step times in a run's events: the `count` slowest, by resource name."""
    took = {label: seconds for _, label, _, seconds, _ in engine_steps(events)}
    return dict(sorted(took.items(), key=lambda kv: -kv[1])[:count])


def step_trace(events: list[dict]) -> list[list]:
    """Every step of a run that did something or took a second, in the order the engine began
    them: [resource op, seconds after the run's first event it began, seconds it took]: a
    restarting `up`'s critical path read off its events."""
    return [[label, start, seconds] for _, label, start, seconds, op in sorted(engine_steps(events))
            if op != "same" or seconds >= 1]


def scenario_of(nodeid: str) -> str:
    """FILE::NAME of a pytest node id or of a phase (NODEID::setup|call|teardown); "session" stays."""
    if nodeid.rsplit("::", 1)[-1] in ("setup", "call", "teardown"):
        nodeid = nodeid.rsplit("::", 1)[0]
    return nodeid.rsplit("/", 1)[-1]


def outermost(spans: list[dict]) -> list[dict]:
    """The spans no other span contains (by their times, not their recorded depth: a file written
    before the depth was kept per thread has parallel logins that left it one too deep)."""
    kept, reach = [], float("-inf")
    for span in sorted(spans, key=lambda s: (s["at"], -s["s"])):
        end = span["at"] + span["s"]
        if end > reach + 0.01:  # not inside one that started earlier and ends later
            kept.append(span)
        reach = max(reach, end)
    return kept


def table(document: dict) -> str:
    """Per scenario: pytest's own seconds (setup + call + teardown), then the outermost spans' seconds
    by kind (with their count), and what is left (Python, asserts, small reads)."""
    spent: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_scenario: dict[str, list[dict]] = defaultdict(list)  # apart: two workers' scenarios overlap in time
    for span in document["spans"]:
        by_scenario[scenario_of(span["phase"])].append(span)
    for name, spans in by_scenario.items():
        for span in outermost(spans):
            spent[name][span["kind"]].append(span["s"])
    rows = ["| scenario | total s | " + " | ".join(KINDS) + " | rest |", "|---" * (len(KINDS) + 3) + "|"]
    total_all = 0.0
    for name, phases in document["scenarios"].items():
        total = sum(phases.values())
        total_all += total
        kinds = spent.get(name, {})
        cells = [f"{sum(kinds[k]):.0f} ({len(kinds[k])})" if kinds.get(k) else "" for k in KINDS]
        rest = total - sum(sum(v) for v in kinds.values())
        rows.append(f"| {name} | {total:.0f} | " + " | ".join(cells) + f" | {rest:.0f} |")
    rows.append(f"| **all** | **{total_all:.0f}** |" + " |" * (len(KINDS) + 1))
    return "\n".join(rows)


def by_file(document: dict) -> str:
    """Seconds per test file (pytest's own, setup + call + teardown), slowest first."""
    files: dict[str, float] = defaultdict(float)
    for name, phases in document["scenarios"].items():
        files[name.split("::", 1)[0]] += sum(phases.values())
    rows = ["| file | scenarios | s |", "|---|---|---|"]
    count = defaultdict(int)
    for name in document["scenarios"]:
        count[name.split("::", 1)[0]] += 1
    for name, seconds in sorted(files.items(), key=lambda kv: -kv[1]):
        rows.append(f"| {name} | {count[name]} | {seconds:.0f} |")
    # the simulator's stage lasts as long as its longer cluster: each worker's seconds (two side by side)
    workers = workers_of(document)
    for worker in sorted(set(workers.values())):
        mine = [name for name, w in workers.items() if w == worker]
        rows.append(f"| worker {worker} | {len(mine)} | {sum(sum(document['scenarios'][n].values()) for n in mine):.0f} |")
    return "\n".join(rows)


def workers_of(document: dict) -> dict[str, str]:
    """Each scenario's worker, as its spans name it (a merged timeline of two; a scenario without a
    span is named by no worker); none in one process."""
    workers = {scenario_of(span["phase"]): span["worker"] for span in document["spans"] if "worker" in span}
    if not workers:
        return {}
    return {name: workers.get(name, "unknown (no span)") for name in document["scenarios"]}


def against(document: dict, other: dict) -> str:
    """Like with like between two runs: the scenarios both ran (their seconds here, there, the ratio),
    and those only one of them ran, by name."""
    mine, theirs = document["scenarios"], other["scenarios"]

    def seconds(scenarios: dict, names) -> float:
        return sum(sum(scenarios[n].values()) for n in names)
    both = [n for n in mine if n in theirs]
    here, there = seconds(mine, both), seconds(theirs, both)
    lines = [f"{len(both)} scenarios in both: {here:.0f} s here, {there:.0f} s there"
             + (f" ({here / there:.2f}x)" if there else "")]
    for label, names, scenarios in (("only here", [n for n in mine if n not in theirs], mine),
                                    ("only there", [n for n in theirs if n not in mine], theirs)):
        lines.append(f"{len(names)} {label}: {seconds(scenarios, names):.0f} s")
        lines += [f"  {sum(scenarios[n].values()):7.0f}  {n}" for n in names]
    return "\n".join(lines)


# ---- the session files of two workers side by side (the simulator's two clusters) --------------
def worker_file(path: Path, worker: str) -> Path:
    """A worker's own copy of a session file (PATH.gwN.SUFFIX); no worker (one process): the file itself."""
    return path.with_name(f"{path.stem}.{worker}{path.suffix}") if worker else path


def worker_files(path: Path) -> list[Path]:
    """The workers' copies of a session file (PATH.gwN.SUFFIX), in worker order."""
    return sorted(path.parent.glob(worker_file(path, "gw*").name))


def merge_worker_files(path: Path, merge) -> None:
    """The workers' copies of a session file merged into it (merge: {worker: document} -> document), and removed."""
    copies = {f.stem.rsplit(".", 1)[-1]: f for f in worker_files(path)}
    if copies:
        path.write_text(json.dumps(merge({w: json.loads(f.read_text()) for w, f in copies.items()}),
                                   indent=1, sort_keys=True) + "\n")
        for f in copies.values():
            f.unlink()


def merge_reports(reports: dict[str, dict]) -> dict:
    """One report: a figure only one worker made as it is; one both made (each cluster's fresh
    `up`, its teardown) by worker."""
    merged: dict = {}
    for worker, figures in reports.items():
        for key, value in figures.items():
            if any(key in other for w, other in reports.items() if w != worker):
                merged.setdefault(key, {})[worker] = value
            else:
                merged[key] = value
    return merged


def merge_timelines(timelines: dict[str, dict]) -> dict:
    """One timeline: every scenario (each ran on one worker), each span marked with its worker."""
    return {"scenarios": {name: phases for t in timelines.values() for name, phases in t["scenarios"].items()},
            "spans": [{**span, "worker": worker} for worker, t in timelines.items() for span in t["spans"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the simulator's timeline, as a table per scenario")
    parser.add_argument("file", type=Path, help="build/sim-engine-timeline.json")
    parser.add_argument("--spans", metavar="NAME-PART", help="list this scenario's spans in order instead")
    parser.add_argument("--trace", action="store_true", help="with --spans: every pulumi run's steps too")
    parser.add_argument("--by-file", action="store_true", help="seconds per test file (and per worker) instead")
    parser.add_argument("--against", type=Path, metavar="OTHER",
                        help="another run's timeline: the scenarios both ran, here and there, and those only one ran")
    args = parser.parse_args(argv)
    documents = []
    for path in [args.file] + ([args.against] if args.against else []):
        try:
            documents.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            print(f"timeline.py: cannot read {path}: {e}", file=sys.stderr)
            return 2
    document = documents[0]
    if args.against:
        print(against(document, documents[1]))
        return 0
    if args.spans:
        for span in sorted(document["spans"], key=lambda s: s["at"]):
            if args.spans in span["phase"]:
                bound = f" (bound {span['bound']:.0f})" if "bound" in span else ""
                steps = f" slowest: {span['steps']}" if span.get("steps") else ""
                print(f"{span['at']:8.1f} {'  ' * span['depth']}{span['kind']:6} {span['s']:7.1f}{bound} {span['what']}{steps}")
                for name, start, took in span.get("trace", []) if args.trace else []:
                    print(f"{'':17}+{start:4d} {took:4d}  {name}")
        return 0
    print(by_file(document) if args.by_file else table(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
