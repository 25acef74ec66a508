"""What the tests share: a free port, a wait on a condition, a command's captured run, a launch/
file loaded as a module, a day-2 tool's one-line error, an agent's CLI, `twinspark` installed as an owner
installs it. One of each, so a fix to one (a wait that
ignores a port not listening yet, a dead process that ends a wait early) reaches every test."""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_DIR = ROOT / "launch"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's pick; free until someone binds it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


# The bound of a wait for something that comes (a process listening, an answer): a hang guard, not
# a pace. Beside the simulator a test at nice 19 gets a sliver of a core (a Python start can take
# tens of seconds); what comes is waited for no longer than it takes.
HANG_GUARD_S = 120


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = HANG_GUARD_S, *, interval_s: float = 0.2,
             ignoring: tuple[type[BaseException], ...] = (), why: Optional[Callable[[], str]] = None,
             process: Optional[subprocess.Popen] = None) -> Any:
    """check()'s first truthy value, asked every interval_s for timeout_s. An exception in `ignoring`
    counts as not yet (a port not listening yet); a `process` that exits ends the wait at once with
    its output. Fails naming `what`, and with `why()` (the log that says why) when given."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if value := check():
                return value
        except ignoring:
            pass
        if process is not None and process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"{what}: the process exited ({process.returncode}) first:\n{output}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s" + (f"\n{why()}" if why else ""))
        time.sleep(interval_s)


def sh(*argv: Any, check: bool = True, timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess:
    """argv (each made a string) run with its output captured as text; a command hung past
    `timeout` fails the test rather than the run."""
    return subprocess.run([str(a) for a in argv], check=check, capture_output=True, text=True, timeout=timeout, **kw)


def install_twinspark(venv: Path) -> Path:
    """A fresh venv with README step 1's `pip install -c requirements.lock .` of this checkout, done by
    uv (from its cache: seconds where pip takes a minute); the bin folder holding `twinspark`."""
    uv = ROOT / ".venv" / "bin" / "uv"
    sh(uv, "venv", "-q", "--python", sys.executable, venv)
    sh(uv, "pip", "install", "-q", "--python", venv / "bin" / "python", "-c", ROOT / "requirements.lock", ROOT)
    return venv / "bin"


def stand_in_pulumi(bin_dir: Path, program: str) -> str:
    """A `pulumi` in bin_dir that runs `program` (Python, this interpreter): the Pulumi CLI as a day-2
    tool meets it, answering what the test needs. The PATH entry to put first."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "pulumi").write_text(f"#!{sys.executable}\n{program}")
    (bin_dir / "pulumi").chmod(0o755)
    return str(bin_dir)


def agent_cli(name: str) -> str:
    """An agent's CLI as scripts/setup.sh installs it from npm (build/NAME), else one on PATH."""
    for candidate in (ROOT / "build" / name / "node_modules" / ".bin" / name, shutil.which(name)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise AssertionError(f"the {name} CLI is missing: scripts/test.sh installs it with npm into build/{name}")


def load_file(path: Path, name: str = "") -> ModuleType:
    """A Python file loaded as a module (a launch/ payload has a dash in its name, no package),
    registered under its name: a dataclass looks its module up in sys.modules."""
    spec = importlib.util.spec_from_file_location(name or path.stem.replace("-", "_"), path)
    assert spec and spec.loader, path
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_launch(name: str) -> ModuleType:
    """launch/<name> as a module."""
    return load_file(LAUNCH_DIR / name)


def one_clear_line(err: str, *words: str) -> str:
    """A day-2 tool's error: one line, no traceback, holding every word."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(word in lines[0] for word in words), err
    return lines[0]
