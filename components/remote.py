"""How twinspark acts on a node over SSH: connections and the two command shapes it uses.

- `install_file_command`: a root-owned file whose content arrives on stdin, written and
  applied only when the content (or the last apply) differs: the idempotent unit of HostPrep
  and LaunchBundle.
- `script_command`: a script from `launch/` run from stdin, with secrets read from the
  first stdin lines so they never appear in argv, command strings or Pulumi logs.

Every function here is pure (config -> text); components wire the texts to resources.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path
from typing import Optional, Sequence

import pulumi
from pulumi_command import remote

from .config import Node, SshConfig

LAUNCH_DIR = Path(__file__).resolve().parent.parent / "launch"
# Record of the content whose apply step last succeeded, per managed file: a dropped SSH
# session between "file written" and "applied" must not read as "unchanged" next time.
APPLIED_STATE_DIR = "/var/lib/twinspark/applied"


def launch_file(name: str) -> str:
    """The text of a file shipped from launch/."""
    return (LAUNCH_DIR / name).read_text()


def sha256_text(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


def private_key_file(ssh: SshConfig) -> Optional[Path]:
    return Path(os.path.expanduser(ssh.private_key_path)) if ssh.private_key_path else None


def connection(ssh: SshConfig, node: Node) -> remote.ConnectionArgs:
    """SSH as the configured user; the key file is read as a secret, or the agent is used."""
    key_file = private_key_file(ssh)
    private_key = None
    if key_file is not None:
        if not key_file.is_file():
            raise pulumi.RunError(
                f"twinspark:ssh.privateKeyPath: {ssh.private_key_path!r} is not a readable file — "
                "expected the private key that logs in to every node (or omit it to use ssh-agent)"
            )
        private_key = pulumi.Output.secret(key_file.read_text())
    return remote.ConnectionArgs(
        host=node.host,
        user=ssh.user,
        private_key=private_key,
        host_key=node.host_key,
        dial_error_limit=20,
        per_dial_timeout=20,
    )


def bash(script: str) -> str:
    """One remote command line running `script` in bash, whatever the login shell is."""
    return "bash -c " + shlex.quote(script)


def _state_file(path: str) -> str:
    return f"{APPLIED_STATE_DIR}/{path.strip('/').replace('/', '__')}.sha256"


def install_file_command(
    node: str, step: str, path: str, mode: str = "0644", apply: Optional[str] = None
) -> str:
    """Install stdin as `path` (root-owned, `mode`) and run `apply` when anything changed.

    Prints `unchanged: PATH` and does nothing when file, mode and last successful apply all
    match: running it twice changes nothing the second time.
    """
    quoted, state = shlex.quote(path), shlex.quote(_state_file(path))
    apply_block = f"  {apply}\n" if apply else ""
    return bash(
        f"""set -euo pipefail
trap 'echo "twinspark: node {node}, step {step}: failed (exit $?)" >&2' ERR
staged=$(mktemp); trap 'rm -f "$staged"' EXIT
cat > "$staged"
want=$(sha256sum < "$staged" | cut -d' ' -f1)
if sudo -n test -f {quoted} && sudo -n cmp -s "$staged" {quoted} \\
   && [ "$(sudo -n stat -c %a:%U:%G {quoted})" = "{int(mode, 8):o}:root:root" ] \\
   && [ "$(sudo -n cat {state} 2>/dev/null)" = "$want" ]; then
  echo "unchanged: {path}"
  exit 0
fi
sudo -n install -D -m {mode} -o root -g root "$staged" {quoted}
echo "installed: {path}"
{apply_block}echo "$want" | sudo -n install -D -m 0644 /dev/stdin {state}
"""
    )


def remove_file_command(node: str, step: str, path: str, revert: Optional[str] = None) -> str:
    """Delete what install_file_command wrote, then undo its effect (idempotent)."""
    revert_block = f"{revert}\n" if revert else ""
    return bash(
        f"""set -euo pipefail
trap 'echo "twinspark: node {node}, step {step} (delete): failed (exit $?)" >&2' ERR
if sudo -n test -e {shlex.quote(path)}; then
  sudo -n rm -f {shlex.quote(path)} {shlex.quote(_state_file(path))}
  echo "removed: {path}"
  {revert_block}fi
"""
    )


def script_command(name: str, args: Sequence[str], secret_env: Sequence[str] = ()) -> str:
    """Run launch/<name> fed on stdin; the first len(secret_env) stdin lines become env vars.

    Use with `script_stdin`, which puts the secrets before the script text.
    """
    reads = "".join(f'IFS= read -r {var}; export {var}; ' for var in secret_env)
    inner = f"set -euo pipefail; {reads}exec bash -s -- \"$@\""
    return "bash -c " + shlex.quote(inner) + " " + shlex.quote(name) + "".join(
        " " + shlex.quote(a) for a in args
    )


def script_stdin(name: str, secrets: Sequence[pulumi.Input[str]] = ()) -> pulumi.Input[str]:
    """stdin for `script_command`: one line per secret, then the script. Secret if any is."""
    text = launch_file(name)
    if not secrets:
        return text
    return pulumi.Output.all(*secrets).apply(
        lambda values: "".join(f"{v}\n" for v in values) + text
    )
