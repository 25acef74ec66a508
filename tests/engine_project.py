"""A tiny Pulumi project under the real engine (the CLI and language host scripts/engine.sh builds)
whose resources, from the stand-in command and random providers, come from a spec rewritten between
runs: what tests/test_engine_providers.py and tests/test_engine_command_triggers.py drive (two files,
so the stage's processes share their minutes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

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


def resources_of(export: str, type_: str) -> list[dict]:
    return [r for r in json.loads(export)["deployment"]["resources"] if r["type"] == type_]
