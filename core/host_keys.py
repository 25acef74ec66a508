"""SSH as the operator's machine runs it: a node's host key (read over the network, checked,
shown as a fingerprint, written to a known_hosts file, and the `ssh -o` options that hold
OpenSSH to it alone), and whether ssh-agent answers. Shared by the program (the docker
provider's ssh, trust on first use, the credentials check) and the day-2 tools (`ops status`,
`clear-hold`, `upgrade`, `pin-host-keys`); no Pulumi.

A key is written as `ssh-keyscan` prints it, without the host: `ssh-ed25519 AAAA...` — the
form pulumi-command's `connection.hostKey` parses (golang.org/x/crypto/ssh ParseAuthorizedKey)
and the second and third fields of a known_hosts line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from core.contract import SSH_PORT

KEY_TYPE = "ssh-ed25519"  # what DGX OS's sshd offers and what both providers pin
NODE_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"  # the same key, as the node itself holds it
# ssh-rsa is left out: both clients would ask for exactly the key's type, and "ssh-rsa" also
# names the SHA-1 signature that current sshd refuses.
KNOWN_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")


class HostKeyError(ValueError):
    pass


def parse(key: str) -> tuple[str, bytes]:
    """'ssh-ed25519 AAAA...' -> (type, blob); the blob must decode and name the same type."""
    parts = key.split()
    if len(parts) != 2 or parts[0] not in KNOWN_TYPES:
        raise HostKeyError(f"expected a public host key as ssh-keyscan prints it, without the host: "
                           f"'{KEY_TYPE} AAAA...' (one of {', '.join(KNOWN_TYPES)})")
    try:
        blob = base64.b64decode(parts[1], validate=True)
        (length,) = struct.unpack(">I", blob[:4])
        inner = blob[4:4 + length].decode()
    except (binascii.Error, struct.error, UnicodeDecodeError):
        raise HostKeyError(f"the part after {parts[0]} is not a base64 SSH public key") from None
    if inner != parts[0]:
        raise HostKeyError(f"the key says it is {parts[0]} but its base64 part holds a {inner} key")
    return parts[0], blob


def fingerprint(key: str) -> str:
    """The fingerprint `ssh-keygen -lf` shows: SHA256 of the key blob, base64 without padding."""
    _, blob = parse(key)
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def scan(host: str, port: int = SSH_PORT, timeout_s: int = 10, key_type: str = KEY_TYPE) -> str:
    """Read `host`'s key of `key_type` with ssh-keyscan. Raises HostKeyError when none came back."""
    if host.startswith("-"):
        raise HostKeyError(f"{host!r} is not a host name or address")
    short_type = key_type.removeprefix("ssh-").split("-")[0]  # ssh-keyscan -t wants ed25519, ecdsa, rsa
    proc = subprocess.run(
        ["ssh-keyscan", "-T", str(timeout_s), "-p", str(port), "-t", short_type, host],
        capture_output=True, text=True, timeout=timeout_s + 20,
    )
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#") and fields[1] == key_type:
            key = f"{fields[1]} {fields[2]}"
            parse(key)
            return key
    detail = proc.stderr.strip().splitlines()
    raise HostKeyError(f"ssh-keyscan got no {key_type} key from {host} port {port}"
                       + (f": {detail[-1]}" if detail else " (unreachable, or sshd offers no such key)"))


def refusal(name: str, host: str, held_key: str, shown_fingerprint: Optional[str],
            stack_file: str = "Pulumi.<stack>.yaml") -> str:
    """The one line for a node that shows another key than the one it is held to."""
    return (f"{name} ({host}): refused: its SSH host key is not the one `pulumi up` holds it to "
            f"({fingerprint(held_key)}{f'; it shows {shown_fingerprint}' if shown_fingerprint else ''}), nothing ran "
            f"there. Reinstalled? Compare with its console (`ssh-keygen -lf {NODE_KEY_FILE}`), then "
            f"`twinspark pin-host-keys --stack-file {stack_file}`, record the key and `pulumi up`; "
            "if not, something else answers at its address")


# ---- holding OpenSSH to one pinned key --------------------------------------------------------
def known_hosts_text(host: str, key: str) -> str:
    """A known_hosts file that holds `key` alone, for `host` as ssh is given it (on SSH_PORT, the
    default, so no [host]:port form)."""
    return f"{host} {key}\n"


def write_known_hosts(path: Path, host: str, key: str) -> Path:
    """`path` holding `key` alone for `host` (rewritten only when it differs)."""
    text = known_hosts_text(host, key)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def recorded_key(path: Path, host: str) -> Optional[str]:
    """The key a known_hosts file written by `write_known_hosts` holds for `host`, if well formed."""
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 3 or fields[0] != host:
        return None
    key = f"{fields[1]} {fields[2]}"
    try:
        parse(key)
    except HostKeyError:
        return None
    return key


def ssh_path(path: Path) -> str:
    """A path as an ssh -o value: quoted (it may hold spaces), % escaped (ssh expands tokens)."""
    return '"' + str(path).replace("%", "%%") + '"'


def pinned_ssh_options(known_hosts: Path, key: str) -> list[str]:
    """`ssh -o` values under which OpenSSH accepts `key` alone (the only entry of `known_hosts`)
    and refuses any other: "Host key verification failed", before authenticating. They go before
    any other -o: for each option ssh keeps the first value it is given."""
    return [
        "StrictHostKeyChecking=yes",
        f"UserKnownHostsFile={ssh_path(known_hosts)}",
        "GlobalKnownHostsFile=/dev/null",  # only the pinned key counts
        f"HostKeyAlgorithms={parse(key)[0]}",  # as pulumi-command, which asks for the pinned type only
        "UpdateHostKeys=no",
    ]


# ---- ssh-agent -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AgentState:
    socket: Optional[str]  # SSH_AUTH_SOCK; None when it is unset or empty
    keys: Optional[frozenset[str]]  # what the agent holds ("type base64" each); None: no agent answers
    problem: str = ""  # why none answers, in ssh-add's words

    @property
    def dead(self) -> bool:
        """SSH_AUTH_SOCK is set, and nothing answers there as an agent."""
        return self.socket is not None and self.keys is None

    def describe(self) -> str:
        return f"SSH_AUTH_SOCK={self.socket}: no ssh-agent answers there ({self.problem})"


def agent_state(env: Mapping[str, str]) -> AgentState:
    """Ask the agent at SSH_AUTH_SOCK what it holds (`ssh-add -L`): a socket nobody listens on,
    or a listener that does not speak the agent protocol, is an agent that does not answer."""
    sock = env.get("SSH_AUTH_SOCK") or None
    if sock is None:
        return AgentState(None, None, "SSH_AUTH_SOCK is not set")
    try:
        proc = subprocess.run(["ssh-add", "-L"], env=dict(env), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return AgentState(sock, None, "ssh-add -L had no answer in 10 s")
    except OSError as err:
        return AgentState(sock, None, f"ssh-add did not run: {err.strerror}")
    if proc.returncode == 0:
        return AgentState(sock, frozenset(" ".join(line.split()[:2]) for line in proc.stdout.splitlines()
                                          if len(line.split()) >= 2))
    if proc.returncode == 1 and "no identities" in proc.stdout:  # an agent holding no key
        return AgentState(sock, frozenset())
    # 1 "error fetching identities: communication with agent failed"; 2 "Error connecting to agent"
    return AgentState(sock, None, " ".join((proc.stderr or proc.stdout).split()) or f"ssh-add exit {proc.returncode}")


def key_file_problem(key_path: str) -> Optional[str]:
    """Why ssh could not use this private key file without asking for a passphrase (None: it can),
    in ssh-keygen's words (`ssh-keygen -y` with an empty passphrase)."""
    try:
        proc = subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", key_path], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"ssh-keygen did not run: {err}"
    return None if proc.returncode == 0 else (" ".join(proc.stderr.split()) or f"ssh-keygen exit {proc.returncode}")
