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

from ssh_fixtures import OTHER_HOST_KEY, Sshd, new_key

ROOT = Path(__file__).resolve().parent.parent
SECRET_SIG = "4dabf18193072939515e22adb298388d"  # the engine's mark of a secret value

PROGRAM = r'''
import json, os
import pulumi
import pulumi_random as random
from pulumi_command import local, remote

spec = json.load(open(os.environ["ENGINE_TEST_SPEC"]))
for name, args in spec.get("passwords", {}).items():
    pulumi.export(name, random.RandomPassword(name, **args).result)
for name, args in spec.get("ids", {}).items():
    rid = random.RandomId(name, **args)
    pulumi.export(name, {"id": rid.id, "hex": rid.hex, "b64Std": rid.b64_std, "b64Url": rid.b64_url, "dec": rid.dec})
for name, args in spec.get("local", {}).items():
    pulumi.export(name, local.Command(name, **args).stdout)
for name, args in spec.get("remote", {}).items():
    opts = pulumi.ResourceOptions(ignore_changes=args.pop("ignore_changes", None))
    args = dict(args, connection=remote.ConnectionArgs(**args["connection"]))
    pulumi.export(name, remote.Command(name, **args, opts=opts).stdout)
'''


class Stack:
    """A file-backend stack of PROGRAM, whose resources come from a spec rewritten between runs."""

    def __init__(self, tmp: Path, env: dict[str, str]):
        self.dir = tmp / "project"
        self.dir.mkdir()
        (tmp / "state").mkdir()
        self.spec_file = tmp / "spec.json"
        (self.dir / "Pulumi.yaml").write_text(
            "name: engine-providers\nruntime:\n  name: python\n  options:\n    toolchain: pip\n"
            f"    virtualenv: {ROOT / '.venv'}\n")
        (self.dir / "__main__.py").write_text(PROGRAM)
        self.env = {**env, "PULUMI_BACKEND_URL": f"file://{tmp / 'state'}", "PULUMI_CONFIG_PASSPHRASE": "test",
                    "ENGINE_TEST_SPEC": str(self.spec_file)}
        self.pulumi("stack", "init", "test")

    def pulumi(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["pulumi", *args, "--non-interactive"], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def set(self, spec: dict) -> None:
        self.spec_file.write_text(json.dumps(spec))

    def up(self, *extra: str) -> dict[str, int]:
        """The engine's own count of each kind of step (its summary event)."""
        proc = self.pulumi("up", "--yes", "--skip-preview", "--json", *extra)
        summary = None
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                summary = json.loads(line).get("summaryEvent", summary)
        assert summary is not None, proc.stdout
        return summary["resourceChanges"]

    def preview_ops(self) -> dict[str, str]:
        """name -> the step the engine plans for it."""
        steps = json.loads(self.pulumi("preview", "--json").stdout)["steps"]
        return {s["urn"].rsplit("::", 1)[1]: s["op"] for s in steps}

    def outputs(self, secrets: bool = False) -> dict:
        return json.loads(self.pulumi("stack", "output", "--json", *(["--show-secrets"] if secrets else [])).stdout)

    def export(self, secrets: bool = False) -> str:
        return self.pulumi("stack", "export", *(["--show-secrets"] if secrets else [])).stdout


@pytest.fixture
def stack(tmp_path, engine_env):
    return Stack(tmp_path, engine_env)


def resources_of(export: str, type_: str) -> list[dict]:
    return [r for r in json.loads(export)["deployment"]["resources"] if r["type"] == type_]


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


def test_triggers_replace_a_command_and_create_updates_it(stack, tmp_path):
    """Triggers added replace by the provider's own diff (pulumi-command tags `triggers`
    replaceOnChanges); a changed element replaces by the SDK's replace_on_changes=["triggers[*]"]
    too. Any other change is an update, which runs `create` again when there is no `update`.
    A replacement runs the old one's `delete`, PULUMI_COMMAND_STDOUT set to its stdout."""
    log = tmp_path / "runs.log"

    def command(version: str, *triggers: str) -> dict:
        args = {"create": f"echo run >> {log}; echo {version}",
                "delete": f'echo "deleted $PULUMI_COMMAND_STDOUT" >> {log}'}
        return {"local": {"c": {**args, "triggers": list(triggers)} if triggers else args}}

    def runs() -> int:
        return log.read_text().count("run")

    stack.set(command("v1"))
    assert stack.up() == {"create": 2}
    assert stack.outputs()["c"] == "v1" and runs() == 1

    stack.set(command("v1", "a"))
    assert stack.preview_ops()["c"] == "replace"
    assert stack.up() == {"replace": 1, "same": 1}
    assert runs() == 2
    # the replaced one's delete ran, with its previous stdout in the environment
    assert log.read_text().splitlines() == ["run", "run", "deleted v1"]

    stack.set(command("v1", "b"))
    assert stack.preview_ops()["c"] == "replace"
    assert stack.up() == {"replace": 1, "same": 1}
    assert runs() == 3

    stack.set(command("v2", "b"))
    assert stack.preview_ops()["c"] == "update"
    assert stack.up() == {"update": 1, "same": 1}
    assert stack.outputs()["c"] == "v2"  # the update ran `create` again
    assert runs() == 4

    assert stack.up("--expect-no-changes") == {"same": 2}
    assert runs() == 4 and log.read_text().count("deleted") == 2


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
