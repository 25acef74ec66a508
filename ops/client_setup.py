"""client-setup — point Codex and Claude Code at the endpoint, from the stack outputs.

- ~/.codex/config.toml: merges in the stack's codexConfig (model, provider block, catalog
  path, compaction fence) with tomlkit, keeping every other key, table and comment; the
  previous file is kept as config.toml.bak-<UTC time>. Unchanged content is not rewritten.
- the model catalog JSON, where model_catalog_json points;
- a Claude Code env file (mode 600: it holds the API key) to `source`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tomlkit


@dataclass
class WrittenFile:
    path: Path
    action: str  # created | updated | unchanged
    backup: Optional[Path] = None


def merge_codex_config(existing: str, generated: str) -> str:
    """`existing` with every key and table of `generated` set; all else (and comments) kept."""
    doc = tomlkit.parse(existing)
    new = tomlkit.parse(generated)
    for key, value in new.items():
        if isinstance(value, tomlkit.items.Table) and key in doc and isinstance(doc[key], tomlkit.items.Table):
            for sub_key, sub_value in value.items():
                doc[key][sub_key] = sub_value  # e.g. model_providers.twinspark, replaced whole
        else:
            doc[key] = value
    return tomlkit.dumps(doc)


def write_with_backup(path: Path, content: str, mode: Optional[int] = None) -> WrittenFile:
    if path.exists():
        old = path.read_text()
        if old == content:
            return WrittenFile(path, "unchanged")
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        backup.write_text(old)
        if mode is not None:
            backup.chmod(mode)
        action = "updated"
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        backup, action = None, "created"
    path.write_text(content)
    if mode is not None:
        path.chmod(mode)
    return WrittenFile(path, action, backup)


def setup_clients(outputs: dict, codex_home: Path, claude_env_file: Path) -> list[WrittenFile]:
    for key in ("codexConfig", "codexModelCatalog", "claudeCodeEnv"):
        if not outputs.get(key):
            raise ValueError(f"stack output {key!r} is missing: run `pulumi up` first (or pass --outputs-file)")
    config_path = codex_home / "config.toml"
    generated = tomlkit.parse(outputs["codexConfig"])
    # the catalog lives beside this config.toml, by absolute path (codex_home may not be ~/.codex)
    catalog_path = codex_home / Path(os.path.expanduser(str(generated["model_catalog_json"]))).name
    generated["model_catalog_json"] = str(catalog_path)
    generated_text = tomlkit.dumps(generated)
    merged = merge_codex_config(config_path.read_text(), generated_text) if config_path.exists() else generated_text
    written = [write_with_backup(config_path, merged)]
    written.append(write_with_backup(catalog_path, outputs["codexModelCatalog"]))
    written.append(write_with_backup(claude_env_file, outputs["claudeCodeEnv"], mode=0o600))
    return written
