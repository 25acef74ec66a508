"""client-setup — point Codex and Claude Code at the endpoint, from the stack outputs.

- ~/.codex/twinspark.config.toml: the stack's codexConfig (model, provider block, catalog path,
  compaction fence) as Codex's profile, `codex -p twinspark`; the user's config.toml and its
  default model are left alone. With --codex-default it is merged into config.toml too, with
  tomlkit, keeping every other key, table and comment, in the style it is written in (tables,
  inline tables, dotted keys). A previous file is kept as NAME.bak-<UTC time>[-N], never
  overwriting an earlier backup; unchanged content is not rewritten.
- the model catalog JSON, where model_catalog_json points;
- a Claude Code env file (mode 600 from its creation: it holds the API key) to `source`;
- Claude Code's settings.json: the stack's claudeCodeSettings merged in (its `env` key by key),
  every other setting of the user's kept; backed up as config.toml is, and left as it is
  written when it already holds them.
- the endpoint's env file (mode 600 from its creation): OPENAI_BASE_URL and OPENAI_API_KEY for
  OpenAI's clients and Open WebUI, and the key for Codex's profile (openaiEnv).

Every file is written whole or not at all (a temporary file renamed over it). A config.toml
that is not valid TOML, or a path that is a directory, stops it before anything is written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tomlkit
from tomlkit.exceptions import TOMLKitError
from rich.text import Text
from tomlkit.items import InlineTable

from .output import add_json_argument, human_console, print_json
from .inputs import InputError, ToolError
from .target import add_target_arguments, resolve_target

SECRET_MODE = 0o600


def codex_profile(generated) -> str:
    """The profile's name: the stack's provider id (`twinspark`). Codex 0.171's profiles are files of
    their own beside config.toml, NAME.config.toml (a [profiles.NAME] table in config.toml is
    refused with --profile), which `codex -p NAME` reads over the user's config."""
    return str(generated["model_provider"])


@dataclass
class WrittenFile:
    path: Path
    action: str  # created | updated | unchanged
    backup: Optional[Path] = None


def inline(table) -> InlineTable:
    copy = tomlkit.inline_table()
    copy.update(table.unwrap())
    return copy


def merge_codex_config(existing: str, generated: str) -> str:
    """`existing` with every key and table of `generated` set; all else (and comments) kept.

    A generated table one level down (model_providers.twinspark) replaces the user's whole and
    is written the way its parent is: inside an inline table, as a dotted key, or as a [table].
    """
    doc = tomlkit.parse(existing)
    new = tomlkit.parse(generated)
    for key, value in new.items():  # scalars first, so no table added below can end up above them
        if not isinstance(value, dict):
            doc[key] = value
    for key, value in new.items():
        if not isinstance(value, dict):
            continue
        if not isinstance(doc.get(key), dict):
            doc[key] = value
            continue
        for sub_key, sub_value in value.items():
            parent = doc[key]
            if isinstance(parent, InlineTable):  # model_providers = { openrouter = {...} }
                parent[sub_key] = inline(sub_value)
            elif any(k is not None and k.key == key and k.is_dotted() for k, _ in doc.body):
                # model_providers.openrouter.name = "..." at the top level: tomlkit would put a
                # [table] between those lines, and the ones below it would move into it
                if sub_key in parent:
                    del parent[sub_key]
                doc.append(tomlkit.key([key, sub_key]), inline(sub_value))
            else:
                parent[sub_key] = sub_value
    return tomlkit.dumps(doc)


def default_mode() -> int:
    """What open() would give a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def keep_backup(path: Path, old: bytes, mode: int) -> Path:  # type: ignore[return]  # itertools.count() ends only by the return
    """A new file beside `path` holding `old`; an existing backup is never overwritten."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in itertools.count():
        backup = path.with_name(f"{path.name}.bak-{stamp}" + (f"-{n}" if n else ""))
        try:
            fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(old)
        return backup


def replace_file(path: Path, content: str, mode: int) -> None:
    """Write whole or not at all; the temporary file is private (0600) from its creation."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), mode)  # while empty: nothing is ever readable under a wider mode
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_with_backup(path: Path, content: str, mode: Optional[int] = None) -> WrittenFile:
    """`mode` None: the file keeps its mode (a new one gets the umask's)."""
    if path.exists():
        old = path.read_bytes()
        if old == content.encode():
            return WrittenFile(path, "unchanged")
        file_mode = mode if mode is not None else path.stat().st_mode & 0o7777
        backup = keep_backup(path, old, file_mode)
        action = "updated"
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        file_mode = mode if mode is not None else default_mode()
        backup, action = None, "created"
    replace_file(path, content, file_mode)
    return WrittenFile(path, action, backup)


def merge_claude_settings(existing: str, generated: str) -> str:
    """`existing` (a JSON object) with `generated`'s keys set, a key holding an object (env) merged
    key by key; `existing` itself, as written, when it already holds them. ValueError when it is
    not a JSON object."""
    try:
        current = json.loads(existing)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(current, dict):
        raise ValueError("not a JSON object, as Claude Code's settings are")
    merged = dict(current)
    for key, value in json.loads(generated).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return existing if merged == current else json.dumps(merged, indent=2) + "\n"


def check_writable_file(path: Path) -> None:
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a file: move it away (nothing was written)")


def setup_clients(outputs: dict, codex_home: Path, claude_env_file: Path, claude_settings: Path, openai_env_file: Path,
                  codex_default: bool = False) -> list[WrittenFile]:
    """Codex's profile file (`codex -p twinspark`), leaving config.toml, the user's default, alone
    unless `codex_default`; the catalog; Claude Code's env file and settings; the endpoint's env file."""
    for key in ("codexConfig", "codexModelCatalog", "claudeCodeEnv", "claudeCodeSettings", "openaiEnv"):
        if not outputs.get(key):
            raise InputError(f"stack output {key!r} is missing: run `pulumi up` first (or pass --outputs-file)")
    config_path = codex_home / "config.toml"
    generated = tomlkit.parse(outputs["codexConfig"])
    profile_path = codex_home / f"{codex_profile(generated)}.config.toml"
    # the catalog lives beside the profile, by absolute path (codex_home may not be ~/.codex)
    catalog_path = codex_home / Path(os.path.expanduser(str(generated["model_catalog_json"]))).name
    generated["model_catalog_json"] = str(catalog_path)
    generated_text = tomlkit.dumps(generated)
    for path in (*([config_path] if codex_default else []), profile_path, catalog_path, claude_env_file, claude_settings,
                 openai_env_file):
        check_writable_file(path)
    merged = None  # config.toml as it will be, where asked to be the default
    if codex_default:
        try:
            merged = merge_codex_config(config_path.read_text(), generated_text) if config_path.exists() else generated_text
        except TOMLKitError as err:
            raise InputError(f"{config_path} is not valid TOML ({err}): fix it or move it away (nothing was written)") \
                from None
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"cannot read {config_path} ({err}); nothing was written") from None
    try:
        settings = (merge_claude_settings(claude_settings.read_text(), outputs["claudeCodeSettings"])
                    if claude_settings.exists() else outputs["claudeCodeSettings"])
    except ValueError as err:
        raise InputError(f"{claude_settings}: {err}: fix it or move it away (nothing was written)") from None
    except OSError as err:
        raise InputError(f"cannot read {claude_settings} ({err}); nothing was written") from None
    try:
        return [write_with_backup(profile_path, generated_text),
                *([write_with_backup(config_path, merged)] if merged is not None else []),
                write_with_backup(catalog_path, outputs["codexModelCatalog"]),
                write_with_backup(claude_env_file, outputs["claudeCodeEnv"], mode=SECRET_MODE),
                write_with_backup(claude_settings, settings),
                write_with_backup(openai_env_file, outputs["openaiEnv"], mode=SECRET_MODE)]
    except OSError as err:
        raise ToolError(f"cannot write {err.filename}: {err.strerror}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, endpoint=False)  # the stack's client outputs: nothing stands in for them
    parser.add_argument("--codex-home", type=Path, default=Path(os.environ.get("CODEX_HOME", "~/.codex")).expanduser())
    parser.add_argument("--codex-default", action="store_true",
                        help="also make the endpoint Codex's default: merge the profile into config.toml (else only "
                             "`codex -p twinspark` uses it and your default model stays)")
    parser.add_argument("--claude-env-file", type=Path, default=Path("~/.config/twinspark/claude-code.env").expanduser())
    parser.add_argument("--openai-env-file", type=Path, default=Path("~/.config/twinspark/openai.env").expanduser(),
                        help="the endpoint and key for OpenAI's clients, Open WebUI and Codex's profile")
    parser.add_argument("--claude-settings", type=Path,
                        default=Path(os.environ.get("CLAUDE_CONFIG_DIR", "~/.claude")).expanduser() / "settings.json",
                        help="Claude Code's user settings (default: $CLAUDE_CONFIG_DIR/settings.json, else "
                             "~/.claude/settings.json)")
    add_json_argument(parser)


def run(args: argparse.Namespace) -> int:
    target = resolve_target(args, stands_in=())
    console = human_console(args)
    written = setup_clients(target.outputs, args.codex_home, args.claude_env_file, args.claude_settings,
                            args.openai_env_file, args.codex_default)
    for f in written:
        console.print(Text(f"{f.action:9} {f.path}" + (f"  (previous kept as {f.backup.name})" if f.backup else "")))
    profile = "" if args.codex_default else f" -p {codex_profile(tomlkit.parse(target.outputs['codexConfig']))}"
    start = {"claude_code": f". {args.claude_env_file} && claude",
             "codex": f"set -a && . {args.openai_env_file} && set +a && codex{profile}",
             "open_webui": f"docker run --env-file {args.openai_env_file} ..."}
    console.print(Text.assemble("Claude Code: ", (start["claude_code"], "bold"), "; Codex: ", (start["codex"], "bold"),
                                "; Open WebUI: ", (start["open_webui"], "bold")))
    # several lanes: the other models behind the endpoint (Codex's catalog lists them, Claude Code's Haiku tier asks one)
    others = [lane["model"] for lane in (target.outputs.get("lanes") or {}).values()
              if lane["model"] != target.outputs.get("model")]
    if others:
        console.print(Text(f"Also served: {', '.join(others)} (Codex: add -m NAME; any client: the request's model)"))
    print_json(args, {"files": [{"path": str(f.path), "action": f.action, "backup": str(f.backup) if f.backup else None}
                                for f in written], "start": start, "also_served": others})
    return 0
