"""SSH host keys as the operator's machine sees them: read a node's key over the network, check
its form, show its fingerprint. Shared by the program (trust on first use) and
`python -m ops pin-host-keys`; no Pulumi.

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


def scan(host: str, port: int = 22, timeout_s: int = 10, key_type: str = KEY_TYPE) -> str:
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
