"""How twinspark acts on a node over SSH: one connection rule, one script runner, one command
factory and one shape for files on a node. Shared by the components; imports none of them.

- `node_command`'s connection comes from `ssh_access` (credentials, host keys); here it is
  fixed which of it counts: who the node is (user@host) replaces a step, a new host key
  updates it, and the operator's credentials count for nothing.
- `script_command` + `script_stdin`: run a launch/ script fed on stdin behind the shared
  prelude. Secrets come first on stdin, one base64 line each, so no value can end its line
  early and become script; a payload (a file's content, or several framed by `payloads`) comes
  after the script, which reads it from its own stdin. Nothing secret is ever in the command line.
- `node_command`: the one factory for a `pulumi_remote.Command` running such a script.
- `node_installation`: what a reinstalled node needs again, beyond its own steps, follows it.
- `ManagedFile` + `managed_file_commands`: a list of root-owned files -> one idempotent
  install/remove command each (launch/managed-file.sh) and one content hash.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_random as random
from pulumi._types import input_type_to_dict
from pulumi_command import remote as pulumi_remote

from core.contract import APPLIED_STATE_DIR, PRELUDE, STEP_PRELUDE

LAUNCH_DIR = Path(__file__).resolve().parent.parent / "launch"
MANAGED_FILE_SCRIPT = "managed-file.sh"


def launch_file(name: str) -> str:
    """The text of a file shipped from launch/."""
    return (LAUNCH_DIR / name).read_text()


def sha256_text(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()


# ---- the script runner ---------------------------------------------------------------------
def script_command(name: str, args: Sequence[str], secret_env: Sequence[str] = ()) -> str:
    """The command line running launch/<name> from stdin (see `script_stdin`) with `args`.

    This one line is the only shell kept in Python: the bootstrap that reads the secrets
    (one base64 line each, decoded into the environment) and hands the rest of stdin to bash.
    """
    reads = "".join(
        f'IFS= read -r {var}; {var}=$(printf %s "${var}" | base64 -d); export {var}; ' for var in secret_env
    )
    inner = f"set -euo pipefail; {reads}TWINSPARK_SCRIPT={shlex.quote(name)} exec bash -s -- \"$@\""
    return "bash -c " + shlex.quote(inner) + " " + shlex.quote(name) + "".join(" " + shlex.quote(a) for a in args)


def script_text(name: str) -> str:
    """What the runner feeds bash: the prelude, then the script, as one block.

    bash parses a { ... } block whole before running it, so the script cannot read its own
    text as payload, and the `exit` inside it ends the run before bash would read the
    payload that follows as commands.
    """
    script = launch_file(name)
    # the step prelude goes where the script sources it (as it does when run by hand)
    preludes = [PRELUDE] + ([STEP_PRELUDE] if f"source={STEP_PRELUDE}" in script else [])
    return "{\n" + "".join(launch_file(p) + "\n" for p in preludes) + script + "\nexit\n}\n"


def encode_secret(value: str) -> str:
    return base64.b64encode(value.encode()).decode() + "\n"


def script_stdin(
    name: str, secrets: Sequence[pulumi.Input[str]] = (), payload: Optional[pulumi.Input[str]] = None
) -> pulumi.Input[str]:
    """stdin for `script_command`: the secrets, the prelude and script, then the payload.

    Secret if any secret or the payload is.
    """
    text = script_text(name)
    if not secrets and payload is None:
        return text
    return pulumi.Output.all(pulumi.Output.all(*secrets), pulumi.Output.from_input(payload or "")).apply(
        lambda parts: runner_stdin(parts[0], text, parts[1])
    )


def payloads(*texts: str) -> str:
    """Several files as one payload: each its size in bytes on a line, then its bytes, in order
    (fetch-weights.sh's read_payloads splits them)."""
    return "".join(f"{len(text.encode())}\n{text}" for text in texts)


def runner_stdin(secret_values: Sequence[str], text: str, payload: str = "") -> str:
    """The runner's stdin from plain values: one base64 line per secret, the script, the payload."""
    return "".join(encode_secret(v) for v in secret_values) + text + payload


@dataclass(frozen=True)
class NodeHandle:
    """One node as a component reaches it: its name (the `{node}-` of its steps) and the SSH
    connection its steps run over. The per-component node types extend it with what they add."""

    name: str
    connection: pulumi_remote.ConnectionArgs


@dataclass(frozen=True)
class NodeScript:
    """A launch/ script to run on a node: create args, and delete args when it undoes itself."""

    script: str
    args: pulumi.Input[Sequence[str]]  # an Output when an argument is known only after another step
    delete_args: Optional[Sequence[str]] = None
    secrets: Optional[Mapping[str, pulumi.Input[str]]] = None  # env name -> value
    payload: Optional[pulumi.Input[str]] = None


# What of a connection counts between runs (issue 8 item 6). The credentials are the operator's:
# another key path, the agent instead of the file, or a passphrase must not re-run every step, so
# the engine keeps the stored value in the diff (pulumi/pulumi step_generator.go,
# processIgnoreChanges -> PropertyPath.Reset). The price: pulumi-command runs an update and a
# delete with the connection in state, so a step keeps the credentials of the run that created
# it — the key's content, not its path — until it is replaced. TWINSPARK_UPDATE_CREDENTIALS=1
# lifts this for one run: every step then takes the current credentials and re-runs once.
CREDENTIAL_FIELDS = ["connection.privateKey", "connection.privateKeyPassword"]


def credential_fields_ignored() -> list[str]:
    return [] if os.environ.get("TWINSPARK_UPDATE_CREDENTIALS") == "1" else CREDENTIAL_FIELDS


def ssh_url(user: str, host: str) -> str:
    """Who a node is: the docker provider's host, and the first trigger of each of its steps, so
    another machine or login replaces them. This form is in every step's state: keep it."""
    return f"ssh://{user}@{host}"


def node_identity(conn: pulumi_remote.ConnectionArgs) -> str:
    assert isinstance(conn.user, str) and isinstance(conn.host, str)  # SshAccess.connection's: plain strings
    return ssh_url(conn.user, conn.host)


def compared_connection(conn: pulumi_remote.ConnectionArgs) -> str:
    """The connection as a step compares it between runs (as JSON, by the names the engine sees):
    all but the credentials. A change in it re-runs each of that node's steps, and only those.
    The credentials stay out even when TWINSPARK_UPDATE_CREDENTIALS compares them: every node has
    the same ones, so they re-run every node's steps at once."""
    credentials = {field.split(".", 1)[1] for field in CREDENTIAL_FIELDS}
    # the SDK's own serialisation of an input type: the names and defaults it registers
    fields = {k: v for k, v in input_type_to_dict(conn).items() if k not in credentials}
    return json.dumps(fields, sort_keys=True)


def node_installation(node_name: str, conn: pulumi_remote.ConnectionArgs) -> random.RandomId:
    """A node as installed: which machine and login (its identity) and which OS install (its
    pinned host key: a reinstall makes a new one). Pinning a new key replaces it.

    The node's own steps re-run by themselves with a new key (an update, above). What lives on
    the node but is made from elsewhere — its image and containers (its docker daemon), its copy
    of the weights (sent by the head) — names this in `replace_with`, so it is made again too.
    A random id, because it only has to be replaced: it touches no node.
    """
    assert conn.host_key is not None  # SshAccess.connection pins every node's key
    return random.RandomId(
        f"{node_name}-installation", byte_length=8,
        keepers={"node": node_identity(conn), "hostKey": conn.host_key},
    )


def node_command(
    resource_name: str,
    conn: pulumi_remote.ConnectionArgs,
    run: NodeScript,
    *,
    parent: pulumi.Resource,
    triggers: Optional[Sequence[pulumi.Input]] = None,
    depends_on: Sequence[pulumi.Resource] = (),
    delete_before_replace: bool = False,
    ignore_changes: Sequence[str] = (),
    replace_with: Sequence[pulumi.Resource] = (),
) -> pulumi_remote.Command:
    """The one way a component runs something on a node.

    The delete command gets the same stdin as create: pulumi-command runs a delete with the
    inputs stored in state (provider/pkg/provider/remote/commandController.go, Delete ->
    props.run), stdin included, so the script and its secrets are there again.

    A step re-runs when its script, arguments, stdin or triggers change (pulumi-command's
    Update runs `create` again), or when its node's host key does (an update: the step runs
    once more, verified with the new key). The node's identity leads the triggers, which
    pulumi-command replaces on (common/inputs.go: triggers are replaceOnChanges).
    `ignore_changes` keeps more inputs from the state, for a step whose output must outlive them;
    `replace_with` replaces the step whenever one of those resources is replaced.
    """
    secrets = run.secrets or {}
    create = pulumi.Output.from_input(run.args).apply(lambda args: script_command(run.script, args, list(secrets)))
    delete = script_command(run.script, run.delete_args, list(secrets)) if run.delete_args is not None else None
    # A step that undoes itself on delete is replaced delete-first: pulumi-command would
    # otherwise create the new one, then run the old delete, which removes what the new one
    # just installed (pulumi/pulumi pkg/resource/deploy/step_generator.go, continueStepsFromDiff:
    # create-before-delete unless the deleteBeforeReplace option is set; `--replace` never
    # asks the provider, so only this option makes it delete-first).
    delete_before_replace = delete_before_replace or delete is not None
    return pulumi_remote.Command(
        resource_name,
        connection=conn,
        create=create,
        delete=delete,
        stdin=script_stdin(run.script, list(secrets.values()), run.payload),
        triggers=[node_identity(conn), *(triggers or [])],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent, depends_on=list(depends_on), delete_before_replace=delete_before_replace,
            ignore_changes=[*credential_fields_ignored(), *ignore_changes], replace_with=list(replace_with) or None,
        ),
    )


def step_fingerprint(conn: pulumi_remote.ConnectionArgs, run: NodeScript,
                     triggers: Sequence[pulumi.Input] = ()) -> pulumi.Output[str]:
    """A digest of what makes a `node_command` step run again (its connection, command line, stdin
    and triggers; `replace_with` aside): another step whose work the step needs, opened only for
    it (ModelWeights' key authorization), re-runs with it. No secrets: a digest of one would let
    whoever reads it (the state, a preview) test guesses offline."""
    if run.secrets:
        raise ValueError(f"{run.script}: a step with secrets has no fingerprint")
    parts = [compared_connection(conn), pulumi.Output.from_input(run.args).apply(lambda a: script_command(run.script, a)),
             script_stdin(run.script, (), run.payload), *triggers]
    return pulumi.Output.all(*parts).apply(lambda values: sha256_text(json.dumps(values)))


# ---- files on a node -----------------------------------------------------------------------
@dataclass(frozen=True)
class ManagedFile:
    """A root-owned file on a node; `action` applies it and undoes it (managed-file.sh)."""

    step: str  # the last part of the resource name: {node}-{capability}-{step}
    path: str
    content: pulumi.Input[str]
    mode: str = "0644"
    action: str = "none"  # none | systemd | netplan | sysctl | nftables | unit | service
    # what remove restores: KEY=VALUE for sysctl, the table ("inet NAME") for nftables
    undo: Optional[str] = None


def managed_file_script(node: str, capability: str, f: ManagedFile) -> NodeScript:
    owner = f"{node}-{capability}-{f.step}"
    flags = ["--node", node, "--step", f"{capability}/{f.step}", "--path", f.path, "--mode", f.mode,
             "--owner", owner, "--state-dir", APPLIED_STATE_DIR, "--action", f.action]
    if f.undo:
        flags += ["--undo", f.undo]
    return NodeScript(MANAGED_FILE_SCRIPT, ["install", *flags], delete_args=["remove", *flags], payload=f.content)


def managed_file_commands(
    node: str, capability: str, conn: pulumi_remote.ConnectionArgs, files: Sequence[ManagedFile], parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
) -> list[pulumi_remote.Command]:
    """One idempotent install/remove command per file, named {node}-{capability}-{step}."""
    return [
        node_command(f"{node}-{capability}-{f.step}", conn, managed_file_script(node, capability, f), parent=parent,
                     depends_on=depends_on)
        for f in files
    ]


def files_hash(files: Sequence[ManagedFile], key: Optional[pulumi.Input[str]] = None) -> pulumi.Output[str]:
    """One hash over every file's path, mode and content.

    With `key` (for files holding secrets) it is an HMAC: it still changes whenever a file
    does, but whoever reads it (a container label) cannot test guesses of the secret offline.
    """
    digest = pulumi.Output.all(*(f.content for f in files)).apply(
        lambda contents: sha256_text(*(f"{f.path}\0{f.mode}\0{c}" for f, c in zip(files, contents)))
    )
    if key is None:
        return digest
    return pulumi.Output.all(key, digest).apply(
        lambda kd: hmac.new(kd[0].encode(), kd[1].encode(), hashlib.sha256).hexdigest()
    )


def render_service_unit(header: str, description: str, ordering: Sequence[str], exec_start: Sequence[str],
                        log: str, exec_start_pre: Optional[Sequence[str]] = None) -> str:
    """A twinspark service that runs as long as the host does (restarted 5 s after it exits), its
    output appended to `log`; `header`: the comment lines on top (what it is, its scripts' hash)."""
    pre = f"ExecStartPre={shlex.join(exec_start_pre)}\n" if exec_start_pre else ""
    return f"""{header}
[Unit]
Description={description}
{chr(10).join(ordering)}

[Service]
{pre}ExecStart={shlex.join(exec_start)}
Restart=always
RestartSec=5
StandardOutput=append:{log}
StandardError=append:{log}

[Install]
WantedBy=multi-user.target
"""


def render_authorized_key_line(source_ip: str, public_key: str, command: Sequence[str]) -> str:
    """Only from the source's rail address, only `command` whatever the client asks (sshd runs it
    with the request in SSH_ORIGINAL_COMMAND), no pty, no forwarding."""
    line = shlex.join(command)
    if '"' in line or "\\" in line:  # authorized_keys would need them escaped; no flag of ours has one
        raise ValueError(f"a forced command may hold no double quote or backslash: {line}")
    return f'from="{source_ip}",command="{line}",restrict {public_key.strip()}\n'
