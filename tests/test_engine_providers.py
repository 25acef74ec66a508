"""The stand-in providers (dev/engine/providers) under the real engine: the CLI and language
host that scripts/engine.sh builds, a tiny project per test, and what the engine itself reports
(`pulumi preview --json`, `pulumi up --json`, `pulumi stack export`).

The engine must be built first (`scripts/engine.sh build cli langhost command random`): these
tests fail, not skip, when it is not. TWINSPARK_ENGINE_CACHE picks another cache, as for engine.sh.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from engine_project import SECRET_SIG, Stack, resources_of
from ssh_fixtures import OTHER_HOST_KEY, Sshd, new_key


@pytest.fixture
def stack(tmp_path, engine_env):
    return Stack(tmp_path, engine_env)


def test_random_password_is_a_secret_of_its_length_and_random_id_encodes_one_value(stack):
    stack.set({"passwords": {"pw": {"length": 48, "special": False}},
               "ids": {"rid": {"byte_length": 8, "prefix": "p-", "keepers": {"k": "1"}}}})
    assert stack.up() == {"create": 3}

    assert stack.outputs()["pw"] == "[secret]"
    result = stack.outputs(secrets=True)["pw"]
    assert len(result) == 48 and result.isalnum(), result
    plain = stack.export()
    assert result not in plain
    (pw,) = resources_of(plain, "random:index/randomPassword:RandomPassword")
    assert pw["id"] == pw["outputs"]["id"] == "none"
    for name in ("result", "bcryptHash"):
        assert SECRET_SIG in pw["outputs"][name], pw["outputs"][name]
    (shown,) = resources_of(stack.export(secrets=True), "random:index/randomPassword:RandomPassword")
    outs = shown["outputs"]
    assert outs["result"]["plaintext"] == json.dumps(result)
    assert json.loads(outs["bcryptHash"]["plaintext"]).startswith("$2a$10$")
    # the defaults planned into the state, as the bridged provider has them
    assert {k: outs[k] for k in ("length", "upper", "lower", "numeric", "number", "special", "minUpper")} == \
        {"length": 48, "upper": True, "lower": True, "numeric": True, "number": True, "special": False, "minUpper": 0}

    rid = stack.outputs()["rid"]
    raw = base64.urlsafe_b64decode(rid["id"] + "==")
    assert len(raw) == 8
    assert rid["b64Url"] == "p-" + rid["id"]
    assert rid["hex"] == "p-" + raw.hex()
    assert rid["b64Std"] == "p-" + base64.b64encode(raw).decode()
    assert rid["dec"] == "p-" + str(int.from_bytes(raw, "big"))

    # every argument replaces: a keeper, the length
    stack.set({"passwords": {"pw": {"length": 40, "special": False}},
               "ids": {"rid": {"byte_length": 8, "prefix": "p-", "keepers": {"k": "2"}}}})
    assert stack.preview_ops() == {"engine-providers-test": "same", "pw": "replace", "rid": "replace"}
    assert stack.up() == {"replace": 2, "same": 1}
    assert len(stack.outputs(secrets=True)["pw"]) == 40
    assert stack.outputs()["rid"]["id"] != rid["id"]
    assert stack.up("--expect-no-changes") == {"same": 3}


def test_a_failing_command_fails_the_up_with_its_exit_code_and_output(stack):
    stack.set({"local": {"bad": {"create": "echo first-line; echo on-stderr >&2; exit 7"}}})
    proc = stack.pulumi("up", "--yes", "--skip-preview", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "exit status 7: running \"echo first-line; echo on-stderr >&2; exit 7\":" in text, text
    assert "first-line" in text and "on-stderr" in text
    assert "bad" not in stack.outputs()


@pytest.fixture
def sshd(tmp_path):
    """A loopback sshd that accepts two keys; yields it and both private keys."""
    keys = [new_key(tmp_path / "ssh" / name) for name in ("id", "id2")]
    authorized = tmp_path / "ssh" / "authorized_keys"
    authorized.write_text("".join(Path(f"{k}.pub").read_text() for k in keys))
    server = Sshd(tmp_path / "ssh", authorized)
    yield server, *(k.read_text() for k in keys)
    server.stop()


def test_remote_command_over_ssh_with_a_pinned_host_key(stack, sshd):
    server, private_key, other_key = sshd
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    conn = {"host": "127.0.0.1", "port": server.port, "user": user, "private_key": private_key,
            "host_key": server.host_key, "dial_error_limit": 1}
    stack.set({"remote": {"r": {"connection": conn, "create": "cat; echo on-remote", "stdin": "from-stdin\n",
                                "add_previous_output_in_env": False}}})
    assert stack.up() == {"create": 2}
    assert stack.outputs()["r"] == "from-stdin\non-remote"
    (r,) = resources_of(stack.export(), "command:remote:Command")
    assert SECRET_SIG in r["inputs"]["connection"] and private_key not in stack.export()
    assert stack.up("--expect-no-changes") == {"same": 2}

    # another key: an update (the connection is an input), unless the program ignores it, as
    # components/remote.py does for the operator's credentials (CREDENTIAL_FIELDS)
    r = {"connection": conn, "create": "cat; echo on-remote", "stdin": "from-stdin\n",
         "add_previous_output_in_env": False}
    stack.set({"remote": {"r": {**r, "connection": {**conn, "private_key": other_key},
                                "ignore_changes": ["connection.privateKey"]}}})
    assert stack.up("--expect-no-changes") == {"same": 2}
    stack.set({"remote": {"r": {**r, "connection": {**conn, "private_key": other_key}}}})
    assert stack.preview_ops()["r"] == "update"
    assert stack.up() == {"update": 1, "same": 1}
    assert other_key not in stack.export() and private_key not in stack.export()

    # sshd's default refuses SSH "env" requests (no AcceptEnv): `environment` then fails the run
    stack.set({"remote": {"r": {"connection": conn, "create": "echo changed", "environment": {"FOO": "bar"},
                                "add_previous_output_in_env": False}}})
    proc = stack.pulumi("up", "--yes", "--skip-preview", check=False)
    assert proc.returncode != 0
    assert 'could not set environment variable "FOO"' in proc.stdout + proc.stderr

    # another host key: the dial fails after its retries
    stack.set({"remote": {"r2": {"connection": {**conn, "host_key": OTHER_HOST_KEY}, "create": "true"}}})
    proc = stack.pulumi("up", "--yes", "--skip-preview", check=False)
    assert proc.returncode != 0
    assert "after 1 failed attempts: ssh: handshake failed: ssh: host key mismatch" in proc.stdout + proc.stderr
