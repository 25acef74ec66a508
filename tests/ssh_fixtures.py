"""Real OpenSSH pieces for the tests: an ssh-agent, and an sshd on loopback."""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

from toolbox import HANG_GUARD_S, free_port, wait_for

# Host keys the tests pin for the recipe's nodes (public keys of throwaway key pairs): the
# shipped stack file leaves them for the user to pin, and `pulumi up` refuses unpinned nodes.
TEST_HOST_KEYS = {
    "spark1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINdV4pdiqGY7pMis6v4kNDyXRxI7Rjmg01vZ9lSTzlaB",
    "spark2": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOht1g6bv1QKIUm6YMbEqPRHfV3XCh8QatW64FJSvgCp",
    "spark3": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII665kzRLz0ac7j88/Z/HQc8WYeLoS0B5bC8E/VUOf9g",
}
OTHER_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAX7YOV0hhi0nGrPlT2oyR0/e/7z/T1+RKQojDyq2pGr"


def pinned(config):
    """The stack config with a test host key pinned on every node that has none."""
    config = copy.deepcopy(config)
    for node in config["twinspark:nodes"]:
        node["hostKey"] = node.get("hostKey") or TEST_HOST_KEYS.get(node["name"], OTHER_HOST_KEY)
    return config


def new_key(path: Path, passphrase: str = "") -> Path:
    """A fresh ed25519 key pair at `path` (and path.pub)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "twinspark-test", "-f", str(path)],
                   check=True)
    return path


ASKPASS = '#!/bin/sh\nprintf "%s\\n" "$TEST_ASKPASS_VALUE"\n'


class AgentSocket:
    """An SSH_AUTH_SOCK at `self.sock`."""

    sock: Path

    def accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(self.sock))
                return True
            except OSError:
                return False

    @property
    def env(self) -> dict[str, str]:
        return {"SSH_AUTH_SOCK": str(self.sock)}


class Agent(AgentSocket):
    """ssh-agent on a socket of its own (a short path: unix sockets allow ~100 bytes)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="ts-agent-", dir="/tmp"))
        self.sock = self.dir / "s"
        self.proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(self.sock)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # listening, not just bound: the socket file appears at bind(), before listen(), and an
        # ssh-add in that window cannot connect (exit 2: CI of 1439229)
        wait_for(self.accepts, "ssh-agent listening")
        askpass = self.dir / "askpass"
        askpass.write_text(ASKPASS)
        askpass.chmod(0o700)
        self.askpass = askpass

    def add(self, key: Path, passphrase: str = "") -> None:
        env = {**os.environ, **self.env, "SSH_ASKPASS": str(self.askpass), "SSH_ASKPASS_REQUIRE": "force",
               "TEST_ASKPASS_VALUE": passphrase}
        subprocess.run(["ssh-add", "-q", str(key)], env=env, stdin=subprocess.DEVNULL, check=True,
                       capture_output=True, start_new_session=True)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=HANG_GUARD_S)
        shutil.rmtree(self.dir, ignore_errors=True)


def sshd_argv(workdir: Path, port: int, authorized_key: Path) -> list[str]:
    """sshd on 127.0.0.1:port with a host key of its own, accepting `authorized_key` for any user."""
    host_key = workdir / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(host_key)], check=True)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    return ["/usr/sbin/sshd", "-D", "-e", "-f", "/dev/null", "-o", f"Port={port}", "-o", "ListenAddress=127.0.0.1",
            "-o", f"HostKey={host_key}", "-o", f"AuthorizedKeysFile={authorized_key}", "-o", "StrictModes=no",
            "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no", "-o", "UsePAM=no",
            "-o", "PidFile=none"]


class Sshd:
    """A loopback sshd for the length of a test."""

    def __init__(self, workdir: Path, authorized_key: Path):
        self.workdir = workdir
        self.port = free_port()
        self.log = open(workdir / "sshd.log", "w")
        self.proc = subprocess.Popen(sshd_argv(workdir, self.port, authorized_key), stdout=self.log,
                                     stderr=subprocess.STDOUT)

        def listening():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(listening, "sshd listening")

    @property
    def host_key(self) -> str:
        """The key as ssh-keyscan prints it, without the host."""
        return " ".join((self.workdir / "ssh_host_ed25519_key.pub").read_text().split()[:2])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=HANG_GUARD_S)
        self.log.close()


DEAD_AGENT_KINDS = ("nobody listens", "closes at once")


class DeadAgent(AgentSocket):
    """An SSH_AUTH_SOCK where no agent answers: a socket file nobody listens on (an agent that
    died), or a listener that closes every connection at once."""

    def __init__(self, kind: str):
        assert kind in DEAD_AGENT_KINDS, kind
        self.dir = Path(tempfile.mkdtemp(prefix="ts-dead-agent-", dir="/tmp"))
        self.sock = self.dir / "s"
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(str(self.sock))
        if kind == "nobody listens":
            self.server.close()
        else:
            self.server.listen(16)
            threading.Thread(target=self._close_each, daemon=True).start()

    def _close_each(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            conn.close()

    def stop(self) -> None:
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()
        shutil.rmtree(self.dir, ignore_errors=True)
