"""private_dockerd.py — a dockerd of the sim's own for its image builds (sim_images.py), never the
system's: host network only (no bridge, no iptables), its state in a temporary folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from sim_registry import run, wait_for

DOCKERD, DOCKER = "/usr/sbin/dockerd", "/usr/bin/docker"


@dataclass
class Docker:
    host: str  # unix:///...docker.sock

    def __call__(self, *argv, timeout: float = 1800, **kw) -> subprocess.CompletedProcess:
        return run(DOCKER, "-H", self.host, *argv, timeout=timeout, **kw)


@contextlib.contextmanager
def private_dockerd() -> Iterator[Docker]:
    """A dockerd of our own: host network only (no bridge, no iptables), state in a temporary dir."""
    state = Path(tempfile.mkdtemp(prefix="twinspark-sim-dockerd-", dir=os.environ.get("TMPDIR", "/tmp")))
    sock = state / "docker.sock"
    logfile = open(state / "dockerd.log", "w")
    proc = subprocess.Popen(
        [DOCKERD, "--data-root", state / "root", "--exec-root", state / "exec", "--pidfile", state / "pid",
         "-H", f"unix://{sock}", "--iptables=false", "--ip6tables=false", "--bridge=none",
         "--storage-driver", "overlay2"], stdout=logfile, stderr=subprocess.STDOUT)
    docker = Docker(f"unix://{sock}")
    try:
        wait_for(lambda: proc.poll() is None and run(DOCKER, "-H", docker.host, "version", check=False).returncode == 0,
                 f"the private dockerd (log: {state / 'dockerd.log'})", 60)
        yield docker
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logfile.close()
        shutil.rmtree(state, ignore_errors=True)
