"""ops client-setup: the Codex and Claude Code configs merged from the stack outputs, backed up,
private, idempotent."""

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from ops.__main__ import main as ops_main
from ops.client_setup import merge_codex_config, setup_clients
from ops_helpers import run_ops
from toolbox import agent_cli, one_clear_line
from program_harness import config_blocks


def rendered_client_outputs(views, api_key: str) -> dict:
    """The client outputs as the program renders them from the stack's client views."""
    from components.client_outputs import (render_claude_code_env, render_claude_code_settings, render_codex_config,
                                           render_codex_model_catalog, render_openai_env)

    return {"codexConfig": render_codex_config(views), "codexModelCatalog": render_codex_model_catalog(views),
            "claudeCodeEnv": render_claude_code_env(views, api_key), "claudeCodeSettings": render_claude_code_settings(),
            "openaiEnv": render_openai_env(views[0], api_key)}


def stack_outputs_for_tests():
    from components.config import parse_stack_config

    cfg = parse_stack_config(config_blocks())
    return {**rendered_client_outputs(cfg.client_views, "sk-outputs-key"), "model": "ds-0731",
            "endpoint": "http://192.168.1.10:8000/v1"}


# A guard against a client that hangs, not its pace: beside the simulator these tests yield the cores
# (scripts/test.sh `yielding`), where CI's run of 71b5d20 saw `import openai` and one answer take over 60 s.
CLIENT_HANG_GUARD_S = 600
EXISTING_CONFIG = """# my codex settings
model = "gpt-5.5"          # the cloud default
approval_policy = "on-request"

[model_providers.openrouter]
name = "OpenRouter"
base_url = "https://openrouter.ai/api/v1"
env_key = "OPENROUTER_API_KEY"

[profiles.cloud]
model = "gpt-5.5"
model_provider = "openai"
"""


def test_codex_merge_keeps_everything_else():
    merged = merge_codex_config(EXISTING_CONFIG, stack_outputs_for_tests()["codexConfig"])
    import tomllib

    doc = tomllib.loads(merged)
    assert doc["model"] == "ds-0731" and doc["model_provider"] == "twinspark"
    assert doc["model_auto_compact_token_limit"] == 150000
    assert doc["approval_policy"] == "on-request"
    assert doc["model_providers"]["openrouter"]["env_key"] == "OPENROUTER_API_KEY"
    assert doc["model_providers"]["twinspark"]["wire_api"] == "responses"
    assert doc["profiles"]["cloud"]["model"] == "gpt-5.5"
    assert "# my codex settings" in merged


def test_client_setup_writes_backs_up_and_is_idempotent(tmp_path):
    codex_home, env_file = tmp_path / "codex", tmp_path / "cfg" / "claude-code.env"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(EXISTING_CONFIG)
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(stack_outputs_for_tests()))
    openai_env = tmp_path / "cfg" / "openai.env"
    args = ["client-setup", "--outputs-file", str(outputs_file), "--codex-home", str(codex_home),
            "--claude-env-file", str(env_file), "--claude-settings", str(tmp_path / "claude" / "settings.json"),
            "--openai-env-file", str(openai_env)]
    assert ops_main(args) == 0
    # the user's config.toml and its default model are left alone: the stack's is a profile of its own
    assert (codex_home / "config.toml").read_text() == EXISTING_CONFIG and not list(codex_home.glob("config.toml.bak-*"))
    catalog = codex_home / "ds-0731-model-catalog.json"
    profile = (codex_home / "twinspark.config.toml").read_text()
    assert 'model = "ds-0731"' in profile and f'model_catalog_json = "{catalog}"' in profile
    assert json.loads(catalog.read_text())["models"][0]["context_window"] == 1048576
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert "ANTHROPIC_AUTH_TOKEN=sk-outputs-key" in env_file.read_text()
    assert stat.S_IMODE(openai_env.stat().st_mode) == 0o600
    assert "OPENAI_API_KEY=sk-outputs-key\nVLLM_API_KEY=sk-outputs-key\n" in openai_env.read_text()
    before = {p.name: p.read_text() for p in codex_home.iterdir()}
    assert ops_main(args) == 0  # a second run changes nothing and keeps no backup
    assert {p.name: p.read_text() for p in codex_home.iterdir()} == before
    # asked to, it is the default too: merged into config.toml, the old one kept
    assert ops_main([*args, "--codex-default"]) == 0
    backups = list(codex_home.glob("config.toml.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == EXISTING_CONFIG
    assert f'model_catalog_json = "{catalog}"' in (codex_home / "config.toml").read_text()
    merged = {p.name: p.read_text() for p in codex_home.iterdir()}
    assert ops_main([*args, "--codex-default"]) == 0
    assert {p.name: p.read_text() for p in codex_home.iterdir()} == merged


def test_codex_keeps_its_default_and_the_profile_asks_the_endpoint(endpoint, tmp_path):
    """The real Codex CLI: without -p its own catalog and default model, as before client-setup;
    `codex exec -p twinspark` asks the stand-in for the stack's model with the key. Asked to be the
    default (--codex-default), the stack's catalog replaces Codex's own."""
    behaviour, target = endpoint
    behaviour.model, behaviour.api_key = "ds-0731", "sk-outputs-key"
    codex = agent_cli("codex")
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(EXISTING_CONFIG)
    outputs = stack_outputs_for_tests()
    outputs["codexConfig"] = outputs["codexConfig"].replace("http://192.168.1.10:8000/v1", target.endpoint)
    openai_env = tmp_path / "openai.env"
    setup_clients(outputs, codex_home, tmp_path / "claude.env", tmp_path / "settings.json", openai_env)
    env = {**os.environ, "CODEX_HOME": str(codex_home)}
    env.pop("VLLM_API_KEY", None)  # the key comes from client-setup's env file, as the README runs it
    models = subprocess.run([codex, "debug", "models"], capture_output=True, text=True, timeout=CLIENT_HANG_GUARD_S, env=env)
    assert models.returncode == 0, models.stderr[-2000:]
    slugs = [m["slug"] for m in json.loads(models.stdout)["models"]]
    assert "ds-0731" not in slugs and slugs, slugs  # Codex's own catalog
    asked = subprocess.run(["bash", "-c", 'set -a && . "$1" && set +a && exec "$2" exec --skip-git-repo-check -p twinspark '
                            '"What is 512 + 301?"', "ask", openai_env, codex],
                           capture_output=True, text=True, timeout=CLIENT_HANG_GUARD_S, env=env, cwd=tmp_path)
    assert asked.returncode == 0, (asked.stdout + asked.stderr)[-2000:]
    assert "model: ds-0731\nprovider: twinspark\n" in asked.stderr and "813" in asked.stdout, asked
    calls = [r for r in behaviour.requests if r.path == "/v1/responses"]
    assert calls and all(r.authorized and r.body["model"] == "ds-0731" for r in calls), calls

    setup_clients(outputs, codex_home, tmp_path / "claude.env", tmp_path / "settings.json", openai_env, codex_default=True)
    models = subprocess.run([codex, "debug", "models"], capture_output=True, text=True, timeout=CLIENT_HANG_GUARD_S, env=env)
    assert models.returncode == 0, models.stderr[-2000:]
    listed = json.loads(models.stdout)["models"]
    assert [m["slug"] for m in listed] == ["ds-0731"] and listed[0]["context_window"] == 1048576


def test_missing_outputs_are_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="stack output 'codexConfig' is missing"):
        setup_clients({}, tmp_path, tmp_path / "env", tmp_path / "settings.json", tmp_path / "openai.env")


# The user's providers in each way TOML allows, without and with an older twinspark provider of theirs.
PROVIDER_STYLES = {
    "inline table": ('model_providers = { openrouter = { name = "OR", base_url = "https://or/v1" }{} }\n',
                     ', twinspark = { name = "old", x = 1 }'),
    "dotted keys": ('model_providers.openrouter.name = "OR"\nmodel_providers.openrouter.base_url = "https://or/v1"\n{}',
                    'model_providers.twinspark.name = "old"\nmodel_providers.twinspark.x = 1\n'),
    "dotted inline": ('model_providers.openrouter = { name = "OR", base_url = "https://or/v1" }\n{}',
                      'model_providers.twinspark = { name = "old", x = 1 }\n'),
    "inline in a table": ('[model_providers]\nopenrouter = { name = "OR", base_url = "https://or/v1" }\n{}',
                          'twinspark = { name = "old", x = 1 }\n'),
    "dotted in a table": ('[model_providers]\nopenrouter.name = "OR"\nopenrouter.base_url = "https://or/v1"\n{}',
                          'twinspark.name = "old"\ntwinspark.x = 1\n'),
    "split tables": ('[model_providers.openrouter]\nname = "OR"\n[profiles.a]\nmodel = "m"\n'
                     '[model_providers.other]\nname = "O"\n{}', '[model_providers.twinspark]\nname = "old"\nx = 1\n'),
}


@pytest.mark.parametrize("style", PROVIDER_STYLES)
@pytest.mark.parametrize("with_old_twinspark", [False, True])
def test_codex_merge_keeps_providers_in_any_toml_style(style, with_old_twinspark):
    """Whatever way the user wrote their providers, they are all still there, and ours replaces only ours."""
    import tomllib

    template, old_twinspark = PROVIDER_STYLES[style]
    existing = template.replace("{}", old_twinspark if with_old_twinspark else "")
    user = tomllib.loads(existing)
    assert ("twinspark" in user["model_providers"]) == with_old_twinspark
    generated = stack_outputs_for_tests()["codexConfig"]
    merged = tomllib.loads(merge_codex_config(existing, generated))
    ours = tomllib.loads(generated)
    assert merged["model_providers"] == {**user["model_providers"], "twinspark": ours["model_providers"]["twinspark"]}
    assert merged["model"] == "ds-0731" and merged["model_provider"] == "twinspark"
    assert merged.get("profiles") == user.get("profiles")


def client_setup_args(tmp_path, outputs):
    codex_home, env_file = tmp_path / "codex", tmp_path / "cfg" / "claude-code.env"
    codex_home.mkdir(exist_ok=True)
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(outputs))
    return codex_home, env_file, ["client-setup", "--outputs-file", str(outputs_file), "--codex-home", str(codex_home),
                                  "--claude-env-file", str(env_file), "--claude-settings", str(claude_settings(tmp_path)),
                                  "--openai-env-file", str(env_file.with_name("openai.env"))]


def claude_settings(tmp_path):
    return tmp_path / "claude" / "settings.json"


USER_SETTINGS = """{
    "model": "opus",
    "env": {"DISABLE_TELEMETRY": "1"},
    "permissions": {"allow": ["Bash(ls:*)"]}
}
"""


def test_claude_settings_get_the_switch_and_keep_the_users_own(tmp_path, capsys):
    """settings.json gains CLAUDE_CODE_ATTRIBUTION_HEADER=0 in its env (vLLM's prefix cache), every
    other setting of the user's stays, the old file is kept; a second run writes nothing."""
    _, _, args = client_setup_args(tmp_path, stack_outputs_for_tests())
    settings = claude_settings(tmp_path)
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    assert run_ops(capsys, *args)[0] == 0
    merged = json.loads(settings.read_text())
    assert merged == {"model": "opus", "env": {"DISABLE_TELEMETRY": "1", "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"},
                      "permissions": {"allow": ["Bash(ls:*)"]}}
    backups = list(settings.parent.glob("settings.json.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == USER_SETTINGS
    written = settings.read_text()
    assert run_ops(capsys, *args)[0] == 0 and settings.read_text() == written
    assert len(list(settings.parent.glob("settings.json.bak-*"))) == 1
    # one that already holds the switch is left as it is written, its layout too
    settings.write_text('{"env": {"CLAUDE_CODE_ATTRIBUTION_HEADER": "0"},   "model": "opus"}')
    assert run_ops(capsys, *args)[0] == 0
    assert settings.read_text() == '{"env": {"CLAUDE_CODE_ATTRIBUTION_HEADER": "0"},   "model": "opus"}'


@pytest.mark.parametrize("content, words", [("{not json", "not JSON ("), ('["a list"]', "not a JSON object")])
def test_claude_settings_that_are_not_an_object_stop_it_before_anything_is_written(tmp_path, capsys, content, words):
    codex_home, env_file, args = client_setup_args(tmp_path, stack_outputs_for_tests())
    settings = claude_settings(tmp_path)
    settings.parent.mkdir()
    settings.write_text(content)
    code, err, _ = run_ops(capsys, *args)
    assert code == 2
    one_clear_line(err, f"ops client-setup: {settings}: {words}", "nothing was written")
    assert list(codex_home.iterdir()) == [] and not env_file.exists() and settings.read_text() == content


def test_client_setup_twice_in_one_second_keeps_every_backup(tmp_path, monkeypatch):
    import ops.client_setup

    moment = time.gmtime(1_800_000_000)
    monkeypatch.setattr(ops.client_setup.time, "gmtime", lambda *_: moment)  # both runs in one second
    outputs = stack_outputs_for_tests()
    codex_home, _, args = client_setup_args(tmp_path, outputs)
    args.append("--codex-default")  # config.toml merged, and backed up each time
    (codex_home / "config.toml").write_text(EXISTING_CONFIG)
    assert ops_main(args) == 0
    first = (codex_home / "config.toml").read_text()
    outputs["codexConfig"] = outputs["codexConfig"].replace("150000", "140000")  # the stack changed meanwhile
    _, _, args = client_setup_args(tmp_path, outputs)
    assert ops_main([*args, "--codex-default"]) == 0
    backups = sorted(codex_home.glob("config.toml.bak-*"))
    assert [b.name for b in backups] == ["config.toml.bak-20270115T080000Z", "config.toml.bak-20270115T080000Z-1"]
    assert [b.read_text() for b in backups] == [EXISTING_CONFIG, first]  # the user's own file is still there


@pytest.mark.parametrize("broken", ["config.toml is a directory", "config.toml is not TOML", "catalog is a directory",
                                    "the profile is a directory"])
def test_client_setup_refuses_what_it_cannot_merge_and_writes_nothing(tmp_path, capsys, broken):
    codex_home, env_file, args = client_setup_args(tmp_path, stack_outputs_for_tests())
    if broken == "config.toml is a directory":
        (codex_home / "config.toml").mkdir()
    elif broken == "config.toml is not TOML":
        (codex_home / "config.toml").write_text("model = [unclosed\n")
    elif broken == "catalog is a directory":
        (codex_home / "ds-0731-model-catalog.json").mkdir()
    else:
        (codex_home / "twinspark.config.toml").mkdir()
    if broken.startswith("config.toml"):  # read and written only when asked to be the default
        args.append("--codex-default")
    before = sorted(p.name for p in codex_home.iterdir())
    code, err, _ = run_ops(capsys, *args)
    assert code == 2
    one_clear_line(err, "ops client-setup: ", "nothing was written")
    assert sorted(p.name for p in codex_home.iterdir()) == before and not env_file.exists()
    if broken == "config.toml is not TOML":
        assert (codex_home / "config.toml").read_text() == "model = [unclosed\n"


def test_claude_env_file_is_private_from_its_creation(tmp_path, monkeypatch):
    """With a permissive umask and every chmod a no-op, the key's file and its backup are still 0600:
    they were created that way, never written under a wider mode and narrowed afterwards."""
    import pathlib

    for module, name in ((os, "chmod"), (os, "fchmod"), (pathlib.Path, "chmod")):
        monkeypatch.setattr(module, name, lambda *a, **k: None)
    old_umask = os.umask(0)
    try:
        outputs = stack_outputs_for_tests()
        _, env_file, args = client_setup_args(tmp_path, outputs)
        assert ops_main(args) == 0
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        for key in ("claudeCodeEnv", "openaiEnv"):
            outputs[key] = outputs[key].replace("sk-outputs-key", "sk-rotated")
        _, _, args = client_setup_args(tmp_path, outputs)
        assert ops_main(args) == 0
        for path in env_file.parent.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
        assert len(list(env_file.parent.iterdir())) == 4  # the two files and their backups, no temporary left
    finally:
        os.umask(old_umask)


def ask_claude_code(env_file, home, question):
    """The real Claude Code, non-interactive, with what client-setup wrote: the env file sourced,
    its settings under HOME; nothing but the stand-in to talk to."""
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1"}
    return subprocess.run(["bash", "-c", 'source "$1" && exec "$2" -p "$3"', "ask", str(env_file), agent_cli("claude"),
                           question], capture_output=True, text=True, timeout=CLIENT_HANG_GUARD_S, env=env)


def test_claude_code_answers_with_what_client_setup_wrote(endpoint, tmp_path, capsys):
    """Claude Code 2.1.197 from its npm package asks /v1/messages with the key, every tier naming the
    served model; with client-setup's settings its system prompt carries no attribution header (the
    per-request hash that defeats vLLM's prefix cache), without them it does."""
    behaviour, target = endpoint
    behaviour.model, behaviour.api_key = "ds-0731", "sk-outputs-key"  # as the stack's outputs name them
    outputs = stack_outputs_for_tests()
    outputs["claudeCodeEnv"] = outputs["claudeCodeEnv"].replace("http://192.168.1.10:8000", target.base_url)
    home = tmp_path / "home"
    codex_home, env_file, args = client_setup_args(tmp_path, outputs)
    args[args.index("--claude-settings") + 1] = str(home / ".claude" / "settings.json")
    assert run_ops(capsys, *args)[0] == 0

    answered = ask_claude_code(env_file, home, "What is 512 + 301?")
    assert answered.returncode == 0, answered.stderr[-2000:]
    assert "813" in answered.stdout, answered.stdout
    asked = [r for r in behaviour.requests if r.path == "/v1/messages"]
    assert asked and all(r.authorized and r.body["model"] == "ds-0731" for r in asked), asked
    assert not any("x-anthropic-billing-header" in json.dumps(r.body.get("system")) for r in asked)

    behaviour.requests.clear()
    bare_home = tmp_path / "bare-home"  # the env file alone, no settings.json
    assert ask_claude_code(env_file, bare_home, "What is 512 + 301?").returncode == 0
    assert any("x-anthropic-billing-header" in json.dumps(r.body.get("system")) for r in behaviour.requests)


def test_openai_sdk_answers_with_the_endpoint_env_file(endpoint, tmp_path, capsys):
    """OpenAI's own Python SDK, configured by nothing but client-setup's openai.env sourced as the
    README says (OPENAI_BASE_URL, OPENAI_API_KEY): a chat completion from the served model, with the key."""
    behaviour, target = endpoint
    behaviour.model, behaviour.api_key = "ds-0731", "sk-outputs-key"
    outputs = stack_outputs_for_tests()
    outputs["openaiEnv"] = outputs["openaiEnv"].replace("http://192.168.1.10:8000", target.base_url)
    _, env_file, args = client_setup_args(tmp_path, outputs)
    assert run_ops(capsys, *args)[0] == 0
    program = ("import openai; r = openai.OpenAI().chat.completions.create(model='ds-0731', max_tokens=16, "
               "messages=[{'role': 'user', 'content': 'What is 512 + 301?'}]); print(r.choices[0].message.content)")
    answered = subprocess.run(["bash", "-c", 'set -a && . "$1" && set +a && exec "$2" -c "$3"', "ask",
                               env_file.with_name("openai.env"), sys.executable, program],
                              capture_output=True, text=True, timeout=CLIENT_HANG_GUARD_S, env={"PATH": os.environ["PATH"]})
    assert answered.returncode == 0, answered.stderr[-2000:]
    assert "813" in answered.stdout, answered.stdout
    asked = [r for r in behaviour.requests if r.path == "/v1/chat/completions"]
    assert asked and all(r.authorized for r in asked), asked
