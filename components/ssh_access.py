"""How the operator's machine reaches the nodes over SSH, decided once before any resource
exists: with which credentials, and which host key each node must show. A problem is a
RunError naming the key.

Two clients connect: pulumi-command (Go's x/crypto/ssh inside the provider process) and
pulumi-docker (the system `ssh`, with the options built here). One rule serves both:

- credentials: `ssh.privateKeyPath` without a passphrase -> both use the file. With a
  passphrase -> ssh-agent must hold the key (the docker provider's ssh runs in batch mode and
  cannot ask for it); the remote commands decrypt the file with `ssh.privateKeyPassphrase` when
  it is set, else they too ask the agent. No key path -> both use the agent. An SSH_AUTH_SOCK
  that is set but where no agent answers stops the program in every case: pulumi-command
  connects to it whenever it is set, even beside a key file.
- host keys: a node's pinned `hostKey`; else, only with `ssh.trustOnFirstUse`, the key recorded
  at the first contact (`known_hosts_dir()/<node>`). The remote commands get it as
  connection.hostKey (FixedHostKey), the docker provider as the only entry of that node's own
  known_hosts file with StrictHostKeyChecking=yes (host_keys.pinned_ssh_options, which the
  day-2 tools use too, with the keys exported in the `nodes` output). A node with neither stops
  the program.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import pulumi
from pulumi.runtime.config import is_config_secret
from pulumi_command import remote as pulumi_remote

from core import host_keys

from .config import NAMESPACE, Node, StackConfig
from .remote import ssh_url

KEY_PATH = f"{NAMESPACE}:ssh.privateKeyPath"
PASSPHRASE = f"{NAMESPACE}:ssh.privateKeyPassphrase"
OPENSSH_BEGIN, OPENSSH_END = "-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"
PEM_BEGIN = re.compile(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----")


def known_hosts_dir() -> Path:
    """Per-node known_hosts files (pinned keys, and first-contact records): operator-local."""
    return Path(os.environ.get("TWINSPARK_KNOWN_HOSTS_DIR") or Path(".twinspark") / "known_hosts.d")


# ---- credentials ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PrivateKey:
    path: Path
    text: str
    encrypted: bool
    public: Optional[str]  # "type base64": what ssh-agent lists for it


def _read_string(blob: bytes, at: int) -> tuple[bytes, int]:
    (length,) = struct.unpack(">I", blob[at:at + 4])
    end = at + 4 + length
    if end > len(blob):
        raise ValueError("truncated")
    return blob[at + 4:end], end


def _openssh_header(text: str) -> tuple[bool, str]:
    """(encrypted, public key) from an openssh-key-v1 file: both sit before the encrypted part
    (OpenSSH PROTOCOL.key: magic, ciphername, kdfname, kdfoptions, count, public keys, ...)."""
    body = text.split(OPENSSH_BEGIN, 1)[1].split(OPENSSH_END, 1)[0]
    blob = base64.b64decode("".join(body.split()), validate=True)
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic):
        raise ValueError("no openssh-key-v1 header")
    cipher, at = _read_string(blob, len(magic))
    _kdf, at = _read_string(blob, at)
    _kdf_options, at = _read_string(blob, at)
    at += 4  # number of keys: always 1
    public, _ = _read_string(blob, at)
    key_type, _ = _read_string(public, 0)
    return cipher != b"none", f"{key_type.decode()} {base64.b64encode(public).decode()}"


def _public_file(path: Path) -> Optional[str]:
    try:
        fields = path.with_name(path.name + ".pub").read_text().split()
    except OSError:
        return None
    return " ".join(fields[:2]) if len(fields) >= 2 else None


def read_private_key(path_text: str) -> PrivateKey:
    path = Path(os.path.expanduser(path_text))
    try:
        text = path.read_text()
    except OSError as err:
        raise pulumi.RunError(
            f"{KEY_PATH}: {path_text!r} is not a readable file ({err.strerror}) — expected the private key "
            "that logs in to every node (or omit it to use ssh-agent)") from None
    except UnicodeDecodeError:
        text = ""
    if OPENSSH_BEGIN in text:
        try:
            encrypted, public = _openssh_header(text)
        except (ValueError, binascii.Error, struct.error, UnicodeDecodeError):
            raise pulumi.RunError(f"{KEY_PATH}: {path_text!r} is a damaged OpenSSH private key") from None
        return PrivateKey(path, text, encrypted, public)
    match = PEM_BEGIN.search(text)
    if match is None:
        raise pulumi.RunError(
            f"{KEY_PATH}: {path_text!r} is not a private key — expected an OpenSSH or PEM private key "
            "(the file without .pub)")
    encrypted = "ENCRYPTED" in match.group(1) or "Proc-Type: 4,ENCRYPTED" in text
    return PrivateKey(path, text, encrypted, _public_file(path))


def passphrase_opens(key: PrivateKey, passphrase: str) -> bool:
    """Does the passphrase decrypt the key? Asks `ssh-keygen -y`, which reads it from an askpass
    helper that prints it from the environment: never in argv, never on a terminal."""
    with tempfile.TemporaryDirectory() as tmp:
        askpass = Path(tmp) / "askpass"
        askpass.write_text('#!/bin/sh\nprintf "%s\\n" "$TWINSPARK_ASKPASS_VALUE"\n')
        askpass.chmod(0o700)
        # SSH_ASKPASS_REQUIRE=force from OpenSSH 8.4; older ones use askpass only with a DISPLAY
        env = {**os.environ, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
               "DISPLAY": os.environ.get("DISPLAY") or ":0", "TWINSPARK_ASKPASS_VALUE": passphrase}
        try:
            proc = subprocess.run(["ssh-keygen", "-y", "-f", str(key.path)], env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=30, start_new_session=True)
        except OSError as err:
            raise pulumi.RunError(f"{PASSPHRASE}: cannot check it: ssh-keygen did not run ({err.strerror}) — "
                                  "install the OpenSSH client") from None
    return proc.returncode == 0


@dataclass(frozen=True)
class Credentials:
    key: Optional[PrivateKey]  # the configured file; docker's ssh names it with -i
    key_to_commands: bool  # pulumi-command gets the key's content; otherwise it asks ssh-agent
    passphrase: Optional[str]  # for pulumi-command's privateKeyPassword (wrapped as a secret there)


def resolve_credentials(cfg: StackConfig, env: Mapping[str, str], passphrase_is_secret: bool) -> Credentials:
    ssh = cfg.ssh
    passphrase = ssh.private_key_passphrase.get_secret_value() if ssh.private_key_passphrase else None
    if passphrase is not None and not passphrase_is_secret:
        raise pulumi.RunError(
            f"{PASSPHRASE}: stored in plain text — set it as a secret: "
            "`pulumi config set --secret --path ssh.privateKeyPassphrase` (it prompts for the value)")
    agent = host_keys.agent_state(env)
    if ssh.private_key_path is None:
        if passphrase is not None:
            raise pulumi.RunError(f"{PASSPHRASE}: set without {KEY_PATH} — name the key it opens, or remove it")
        if not agent.keys:
            why = ("SSH_AUTH_SOCK is not set" if agent.socket is None else agent.describe() if agent.dead
                   else f"the agent at SSH_AUTH_SOCK={agent.socket} has no keys")
            raise pulumi.RunError(
                f"{KEY_PATH}: not set, so ssh-agent is used, but {why} — set ssh.privateKeyPath to the key that logs "
                "in to every node, or start ssh-agent and `ssh-add` that key")
        return Credentials(None, False, None)
    key = read_private_key(ssh.private_key_path)
    if not key.encrypted:
        if passphrase is not None:
            raise pulumi.RunError(f"{PASSPHRASE}: set, but {ssh.private_key_path!r} has no passphrase — remove it")
        if agent.dead:
            # pulumi-command dials SSH_AUTH_SOCK whenever it is set, key file or not, and a dial
            # that fails fails the command (provider/pkg/provider/remote/connection.go, SShConfig);
            # a connection cannot leave it out (agentSocketPath only names another socket).
            raise pulumi.RunError(
                f"{KEY_PATH}: {ssh.private_key_path!r} needs no agent, but {agent.describe()}, and the remote "
                "commands (pulumi-command) connect to SSH_AUTH_SOCK whenever it is set — start the agent again, "
                "or `unset SSH_AUTH_SOCK` before `pulumi up`")
        return Credentials(key, True, None)
    if passphrase is not None and not passphrase_opens(key, passphrase):
        raise pulumi.RunError(f"{PASSPHRASE}: does not open {ssh.private_key_path!r} — set the right one")
    if key.public is None:
        raise pulumi.RunError(
            f"{KEY_PATH}: {ssh.private_key_path!r} is passphrase-protected and its public key is unknown — put it "
            f"next to it: `ssh-keygen -y -f {ssh.private_key_path} > {ssh.private_key_path}.pub`")
    if agent.keys is None or key.public not in agent.keys:
        where = ("your ssh-agent does not hold it" if agent.keys is not None else agent.describe() if agent.dead
                 else "no ssh-agent answers (SSH_AUTH_SOCK is not set)")
        raise pulumi.RunError(
            f"{KEY_PATH}: {ssh.private_key_path!r} is passphrase-protected and {where} — "
            f"{'run' if agent.keys is not None else 'start ssh-agent, then run'} "
            f"`ssh-add {ssh.private_key_path}` (the docker provider's ssh runs in batch mode and cannot ask for a "
            f"passphrase{'' if passphrase else '; without ssh.privateKeyPassphrase the remote commands need the agent too'})")
    return Credentials(key, passphrase is not None, passphrase)


# ---- host keys -----------------------------------------------------------------------------
def resolve_host_keys(
    cfg: StackConfig, records: Path, scan: Callable[[str], str] = host_keys.scan
) -> dict[str, str]:
    """The key each node must show: pinned, or (trust on first use) recorded at first contact."""
    keys, unpinned = {}, []
    for i, node in enumerate(cfg.nodes):
        key = node.host_key
        if key is None and cfg.ssh.trust_on_first_use:
            key = host_keys.recorded_key(records / node.name, node.host)
            if key is None:
                try:
                    key = scan(node.host)
                except host_keys.HostKeyError as err:
                    raise pulumi.RunError(
                        f"{NAMESPACE}:nodes[{i}].hostKey: not pinned, and its first contact failed: {err}") from None
        if key is None:
            unpinned.append(i)
        else:
            keys[node.name] = key
    if unpinned:
        stack_file = f"Pulumi.{pulumi.get_stack()}.yaml"
        raise pulumi.RunError("\n".join(
            f"{NAMESPACE}:nodes[{i}].hostKey: not pinned — run `twinspark pin-host-keys --stack-file "
            f"{stack_file}`, compare each fingerprint with the node's own (`ssh-keygen -lf {host_keys.NODE_KEY_FILE}` "
            "on its console) and run the `pulumi config set` lines it prints; or accept keys unseen at first "
            "contact: `pulumi config set --path ssh.trustOnFirstUse true` (docs/security.md)"
            for i in unpinned))
    return keys


KEY_CHECK_TIMEOUT_S = 5


def refuse_changed_host_keys(cfg: StackConfig, keys: Mapping[str, str]) -> None:
    """Every run, before any resource: a node that answers ssh-keyscan with another key than the
    one it is held to is refused, naming both fingerprints. Without this a reinstalled node goes
    unnoticed whenever no step of it changes (pulumi up connects only to run a step), or shows
    only OpenSSH's advice to edit a known_hosts file. The scan only ever refuses, never trusts;
    a node that does not answer is left to the steps that need it, which name it."""
    refused = []
    for node in cfg.nodes:
        try:
            shown = host_keys.scan(node.host, timeout_s=KEY_CHECK_TIMEOUT_S)
        except (host_keys.HostKeyError, OSError, subprocess.SubprocessError):
            continue
        if shown != keys[node.name]:
            refused.append(host_keys.refusal(node.name, node.host, keys[node.name], host_keys.fingerprint(shown),
                                             f"Pulumi.{pulumi.get_stack()}.yaml"))
    if refused:
        raise pulumi.RunError("\n".join(refused))


def write_known_hosts(nodes: list[Node], keys: Mapping[str, str], records: Path) -> dict[str, Path]:
    """One known_hosts file per node, holding only its key: what docker's ssh may accept."""
    records.mkdir(parents=True, exist_ok=True)
    return {node.name: host_keys.write_known_hosts((records / node.name).resolve(), node.host, keys[node.name])
            for node in nodes}


# ---- the access both providers get ---------------------------------------------------------
@dataclass(frozen=True)
class SshAccess:
    user: str
    credentials: Credentials
    host_keys: Mapping[str, str]  # node name -> the key it must show
    known_hosts: Mapping[str, Path]  # node name -> its own known_hosts file

    def connection(self, node: Node) -> pulumi_remote.ConnectionArgs:
        """pulumi-command's connection. Only host, user and hostKey are compared between runs: the
        credentials are operator-local and ignored in every command's diff (remote.node_command)."""
        creds = self.credentials
        return pulumi_remote.ConnectionArgs(
            host=node.host,
            user=self.user,
            private_key=pulumi.Output.secret(creds.key.text) if creds.key_to_commands and creds.key is not None else None,
            private_key_password=pulumi.Output.secret(creds.passphrase) if creds.passphrase else None,
            host_key=self.host_keys[node.name],
            dial_error_limit=20,
            per_dial_timeout=20,
        )

    def docker_host(self, node: Node) -> str:
        return ssh_url(self.user, node.host)

    def docker_ssh_opts(self, node: Node) -> list[str]:
        """Options for the local `ssh` the docker provider runs: non-interactive, the same key and
        the same pinned host key as the remote commands."""
        opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
        if self.credentials.key is not None:
            # with a passphrase-protected key, ssh signs through the agent holding it
            opts += ["-i", str(self.credentials.key.path).replace("%", "%%"), "-o", "IdentitiesOnly=yes"]
        pinned = host_keys.pinned_ssh_options(self.known_hosts[node.name], self.host_keys[node.name])
        return opts + [a for option in pinned for a in ("-o", option)]


def resolve_ssh_access(cfg: StackConfig, env: Optional[Mapping[str, str]] = None) -> SshAccess:
    """Credentials and host keys, or a RunError — call it before creating any resource."""
    env = os.environ if env is None else env
    credentials = resolve_credentials(cfg, env, is_config_secret(f"{NAMESPACE}:ssh"))
    records = known_hosts_dir()
    keys = resolve_host_keys(cfg, records)
    refuse_changed_host_keys(cfg, keys)
    return SshAccess(cfg.ssh.user, credentials, keys, write_known_hosts(cfg.nodes, keys, records))
