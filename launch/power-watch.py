#!/usr/bin/env python3
"""power-watch.py — power-cycle a peer that stopped answering, through its plug (stdlib only, root).

    power-watch.py --plan /var/lib/twinspark/power-watch/plan.json [--textfile FILE] [--status FILE]

GB10 has no BMC: a box frozen by unified-memory exhaustion or a driver fault answers nothing,
and only its power switch brings it back. This runs on the node that watches it (the next node
of the stack's list; on a pair each watches the other) and, every `interval` seconds, looks for
three signs of life of each watched node: the SSH banner on its management address (sshd answering,
not only the kernel's handshake), its node exporter answering, and — on the head — the serving
guard's heartbeat (its metrics file's age in that exporter's output). When none has come for
`miss_seconds` the plug is switched off, `off_seconds` later on again; never a second time within
`window_seconds`: a node still silent after its cycle is held (logged, in the status and the
metrics; it ends when the node answers again), for a person to look at.

The plan (non-secret; components/box_recovery.py renders it) names each watched node, its addresses,
its plug's kind (shelly: Gen1 `/relay/0?turn=`, shelly-rpc: Gen2+ `/rpc/Switch.Set`, tasmota:
`/cm?cmnd=Power`) and the file holding the plug's URL (a secret, root-only; credentials in it go
as HTTP basic/digest auth, or Tasmota's user/password parameters). The URL is never printed.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PROBE_TIMEOUT_S = 5
GUARD_FRESH_S = 120  # the guard writes its metrics every look (seconds apart); minutes old is a dead guard
PLUG_KINDS = ("shelly", "shelly-rpc", "tasmota")


def log(message: str) -> None:
    print(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + " " + message, flush=True)


# ---- signs of life ---------------------------------------------------------------------------
def ssh_banner(host: str, port: int = 22, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """sshd's own answer: a frozen box's kernel may still complete the handshake, its sshd says nothing."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def exporter_text(url: str, timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def guard_fresh(metrics: Optional[str], textfile_name: str, now: float) -> bool:
    """The guard's metrics file, as the textfile collector reports its mtime, written within GUARD_FRESH_S."""
    if not metrics:
        return False
    pattern = re.compile(r'^node_textfile_mtime_seconds\{file="[^"]*' + re.escape(textfile_name) + r'"\}\s+(\S+)$', re.M)
    found = pattern.search(metrics)
    try:
        return bool(found) and now - float(found[1]) < GUARD_FRESH_S  # type: ignore[index]
    except ValueError:
        return False


# ---- the plug --------------------------------------------------------------------------------
def plug_request(kind: str, url: str, on: bool) -> tuple[str, Optional[tuple[str, str]]]:
    """(the request URL without credentials, (user, password) or None) for switching the plug."""
    parts = urllib.parse.urlsplit(url)
    credentials = (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")) \
        if parts.username else None
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else parts.netloc
    base = parts.path.rstrip("/")
    if kind == "shelly":
        path, query = f"{base}/relay/0", {"turn": "on" if on else "off"}
    elif kind == "shelly-rpc":
        path, query = f"{base}/rpc/Switch.Set", {"id": "0", "on": "true" if on else "false"}
    elif kind == "tasmota":
        path, query = f"{base}/cm", {"cmnd": "Power On" if on else "Power Off"}
        if credentials:  # Tasmota's web API takes them as parameters, not as HTTP auth
            query.update(user=credentials[0], password=credentials[1])
            credentials = None
    else:
        raise ValueError(f"unknown plug kind {kind!r}: expected one of {', '.join(PLUG_KINDS)}")
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, urllib.parse.urlencode(query), "")), credentials


def switch_plug(kind: str, url: str, on: bool, timeout: float = 10) -> Optional[str]:
    """None when the plug said yes; else why not, in words that hold nothing of the URL."""
    request_url, credentials = plug_request(kind, url, on)
    handlers: list = []
    if credentials:
        passwords = urllib.request.HTTPPasswordMgrWithDefaultRealm()
        passwords.add_password(None, request_url, *credentials)
        handlers = [urllib.request.HTTPBasicAuthHandler(passwords), urllib.request.HTTPDigestAuthHandler(passwords)]
    try:
        with urllib.request.build_opener(*handlers).open(request_url, timeout=timeout) as reply:
            reply.read(65536)
            return None
    except urllib.error.HTTPError as err:
        return f"the plug answered HTTP {err.code}"
    except (OSError, ValueError) as err:
        return f"the plug did not answer ({type(err).__name__})"


# ---- what it writes ----------------------------------------------------------------------------
def write_atomically(path: Path, text: str) -> None:
    """Whole or not at all; a name starting with a dot and not ending in .prom (the textfile
    collector skips it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    part.replace(path)


def textfile_text(series: dict[str, float]) -> str:
    """The text format: a family's series together, one TYPE line before them (counters end in _total)."""
    text, typed = "", set()
    for name_and_labels, value in sorted(series.items(), key=lambda item: item[0].split("{")[0]):
        name = name_and_labels.split("{")[0]
        if name not in typed:
            typed.add(name)
            text += f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}\n"
        text += f"{name_and_labels} {value}\n"
    return text


# ---- the watch -------------------------------------------------------------------------------
@dataclass
class Watched:
    node: str
    host: str
    plug_kind: str
    plug_url_file: str
    exporter_url: str = ""
    guard_textfile: str = ""  # the head: the guard's metrics file's name
    missing_since: Optional[float] = None
    signs: dict = field(default_factory=dict)
    cycles: list = field(default_factory=list)  # when the plug cycled it (on disk: a restart keeps the window)
    held: Optional[dict] = None


class PowerWatch:
    def __init__(self, plan: dict, state_dir: Path, textfile: str = "", status: str = ""):
        self.plan, self.state_dir, self.textfile, self.status = plan, state_dir, textfile, status
        self.watched = [Watched(**{k: n[k] for k in ("node", "host", "plug_kind", "plug_url_file", "exporter_url",
                                                      "guard_textfile") if k in n}) for n in plan["nodes"]]
        for w in self.watched:
            kept = self._load(w)
            w.cycles, w.held = kept.get("cycles", []), kept.get("held")

    def _state_file(self, w: Watched) -> Path:
        return self.state_dir / f"{w.node}.json"

    def _load(self, w: Watched) -> dict:
        try:
            return json.loads(self._state_file(w).read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, w: Watched) -> None:
        write_atomically(self._state_file(w), json.dumps({"cycles": w.cycles, "held": w.held}) + "\n")

    def look(self, w: Watched) -> dict:
        """The signs, asked at once: a silent node's look takes one timeout, not one per sign."""
        with ThreadPoolExecutor(max_workers=2) as pool:
            ssh = pool.submit(ssh_banner, w.host)
            text = pool.submit(exporter_text, w.exporter_url) if w.exporter_url else None
            signs = {"ssh": ssh.result()}
            if text is not None:
                signs["exporter"] = text.result() is not None
                if w.guard_textfile:
                    signs["guard"] = guard_fresh(text.result(), w.guard_textfile, time.time())
        return signs

    def step(self, w: Watched, signs: dict, now: float) -> None:
        """One look's verdict: alive, missing, power-cycled or held."""
        w.signs = signs
        if any(signs.values()):
            if w.missing_since is not None:
                log(f"{w.node}: answers again ({', '.join(s for s, up in signs.items() if up)}) after "
                    f"{now - w.missing_since:.0f} s")
            w.missing_since = None
            if w.held:
                log(f"{w.node}: the hold ends: it answers again")
                w.held = None
                self._save(w)
            return
        if w.missing_since is None:
            w.missing_since = now
            log(f"{w.node}: no sign of life ({', '.join(signs)} all silent)")
        silent = now - w.missing_since
        if w.held or silent < self.plan["miss_seconds"]:
            return
        recent = [t for t in w.cycles if now - t < self.plan["window_seconds"]]
        if recent:
            w.held = {"since": now, "reason": (
                f"{w.node} still silent {silent:.0f} s after the power cycle at "
                f"{time.strftime('%H:%M:%SZ', time.gmtime(recent[-1]))}: no second cycle within "
                f"{self.plan['window_seconds']} s (powerWatch.windowSeconds); look at the box")}
            log(f"HOLD {w.held['reason']}")
            self._save(w)
            return
        self.cycle(w, silent, now)

    def cycle(self, w: Watched, silent: float, now: float) -> None:
        try:
            url = Path(w.plug_url_file).read_text().strip()
        except OSError as err:
            log(f"{w.node}: cannot read its plug's URL file {w.plug_url_file}: {err.strerror}")
            return
        log(f"{w.node}: silent {silent:.0f} s (SSH, exporter{', guard' if w.guard_textfile else ''}): "
            f"power-cycling it through its {w.plug_kind} plug")
        failed = switch_plug(w.plug_kind, url, on=False)
        if failed is None:
            time.sleep(self.plan["off_seconds"])
            failed = switch_plug(w.plug_kind, url, on=True)
        if failed:
            log(f"{w.node}: the power cycle failed: {failed}; trying again at the next look")
            return
        w.cycles = [t for t in w.cycles if now - t < self.plan["window_seconds"]] + [time.time()]
        w.missing_since = time.time()  # its boot gets miss_seconds again before the hold
        self._save(w)
        log(f"{w.node}: power-cycled (off {self.plan['off_seconds']} s, on again)")

    def write_outputs(self, now: float) -> None:
        """The status JSON, and POWER_WATCH_METRICS for the textfile collector (their meaning is in
        components/observability_files/metrics.py, as the guard's is)."""
        status: dict = {"updated_at": now, "nodes": {}}
        series: dict[str, float] = {}
        for w in self.watched:
            silent = round(now - w.missing_since, 1) if w.missing_since else 0
            status["nodes"][w.node] = {"signs": w.signs, "silent_s": silent, "cycles": w.cycles, "held": w.held,
                                       "plug": w.plug_kind}
            label = f'watched="{w.node}"'  # not `node`: the scrape's own `node` label names the watcher
            series.update({f'twinspark_power_watch_sign{{{label},sign="{sign}"}}': int(up) for sign, up in w.signs.items()})
            series.update({f"twinspark_power_watch_silent_seconds{{{label}}}": silent,
                           f"twinspark_power_cycles_total{{{label}}}": len(w.cycles),
                           f"twinspark_power_watch_held{{{label}}}": int(bool(w.held))})
        if self.textfile:
            write_atomically(Path(self.textfile), textfile_text(series))
        if self.status:
            write_atomically(Path(self.status), json.dumps(status) + "\n")

    def run(self) -> None:
        log(f"watching {', '.join(w.node for w in self.watched)}: a power cycle after {self.plan['miss_seconds']} s "
            f"without a sign of life, at most one in {self.plan['window_seconds']} s")
        while True:
            for w in self.watched:
                self.step(w, self.look(w), time.time())
            self.write_outputs(time.time())
            time.sleep(self.plan["interval"])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--textfile", default="", help="the watcher's metrics for the node exporter's textfile collector")
    parser.add_argument("--status", default="", help="the watch's state as JSON, for `twinspark status`")
    args = parser.parse_args(argv)
    try:
        plan = json.loads(Path(args.plan).read_text())
    except (OSError, ValueError) as err:
        print(f"power-watch: cannot read the plan {args.plan}: {err}", file=sys.stderr)
        return 2
    PowerWatch(plan, Path(args.plan).parent, args.textfile, args.status).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
