"""The stack `ops upgrade` changes: a small interface, its implementation over Pulumi's
Automation API, and how the Pulumi CLI writes a config value at a path.

`UpgradeStack` is all the upgrade needs of a stack; tests inject a fake that behaves like the
Automation API (its errors included: `pulumi.automation.CommandError` and its subclasses, made
by the API's own `create_command_error` from the CLI's output). `AutomationStack` is the real one
over `pulumi.automation` and the Pulumi CLI; the unit tests have no CLI, so it runs for real
only in the simulator under the real engine (tests/sim_engine; docs/testing.md says so).
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import yaml

NAMESPACE = "twinspark"


@dataclass(frozen=True)
class Writes:
    """Config writes at paths (`serving.maxModelLen`), as `pulumi config rm-all/set-all --path`:
    removes first, then sets in order; each set value is the text the CLI is given."""
    removes: tuple[str, ...] = ()
    sets: tuple[tuple[str, str], ...] = ()


@dataclass
class PreviewReport:
    change_summary: dict[str, int]  # operation -> count, as PreviewResult.change_summary
    text: str  # the preview's own output, the diff included


class UpgradeStack(Protocol):
    """What `ops upgrade` does to a stack. Errors are pulumi.automation's: CommandError, and
    ConcurrentUpdateError when another update holds the stack."""
    name: str

    def config(self) -> dict[str, Any]:
        """The `twinspark:` blocks (serving, model, ...) as parsed objects, keys without namespace."""

    def write_config(self, writes: Writes) -> None:
        """remove_all_config then set_all_config, both with path=True."""

    def preview(self, writes: Writes) -> PreviewReport:
        """What `up` would change with these writes applied, changing nothing."""

    def up(self, on_output: Callable[[str], None]) -> None:
        """Deploy the current config; raises CommandError when the update fails."""

    def outputs(self) -> dict[str, Any]:
        """The stack outputs, secrets in plain text."""


# ---- how the CLI writes a value at a path ----------------------------------------------------------
# `pulumi config set --path KEY TEXT` stores "true"/"false" as booleans and a whole number (not
# starting with 0) as an integer; anything else, 0.85 included, as a string
# (sdk/go/common/resource/config/map.go, adjustObjectValue).
_INTEGER = re.compile(r"[+-]?[0-9]+")


def cli_value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if not (len(text) > 1 and text[0] == "0") and _INTEGER.fullmatch(text) and -2**63 <= int(text) < 2**63:
        return int(text)
    return text


def cli_text(value: Any) -> str:
    """The text that makes the CLI store `value` (or the string closest to it: a float's text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def path_parts(key: str) -> list[Any]:
    """'serving.extraArgs[1]' -> ['serving', 'extraArgs', 1]."""
    return [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", key)]


def value_at(objects: dict[str, Any], key: str, missing: Any = None) -> Any:
    node: Any = objects
    for part in path_parts(key):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return missing
    return node


def apply_writes(objects: dict[str, Any], writes: Writes) -> dict[str, Any]:
    """`objects` (block -> object) after the writes, as the CLI would leave them; a copy."""
    result = copy.deepcopy(objects)
    for key in writes.removes:
        *parents, last = path_parts(key)
        container = value_at(result, ".".join(str(p) for p in parents)) if parents else result
        if isinstance(container, dict):
            container.pop(last, None)
        elif isinstance(container, list) and isinstance(last, int) and last < len(container):
            del container[last]
    for key, text in writes.sets:
        parts = path_parts(key)
        node: Any = result
        for part, following in zip(parts, parts[1:]):
            empty: Any = [] if isinstance(following, int) else {}
            if isinstance(node, dict):
                node = node.setdefault(part, empty)
            else:  # a list: the CLI appends at index len
                if part == len(node):
                    node.append(empty)
                node = node[part]
        last = parts[-1]
        if isinstance(node, list) and last == len(node):
            node.append(cli_value(text))
        else:
            node[last] = cli_value(text)
    return result


# ---- the real stack ----------------------------------------------------------------------------------
class AutomationStack:
    """UpgradeStack over pulumi.automation: the project in work_dir, deployed by the Pulumi CLI."""

    def __init__(self, name: str, work_dir: Path):
        from pulumi import automation as auto

        self.name, self._work_dir, self._auto = name, Path(work_dir), auto
        # `pulumi stack select`: raises StackNotFoundError for a stack that does not exist
        self._stack = auto.select_stack(stack_name=name, work_dir=str(work_dir))

    def config(self) -> dict[str, Any]:
        blocks = {}
        for key, value in self._stack.get_all_config().items():
            namespace, _, name = key.partition(":")
            if namespace != NAMESPACE:
                continue
            try:  # `pulumi config --json` gives a structured value as its JSON text
                blocks[name] = json.loads(value.value)
            except ValueError:
                blocks[name] = value.value
        return blocks

    def write_config(self, writes: Writes) -> None:
        if writes.removes:
            self._stack.remove_all_config([f"{NAMESPACE}:{k}" for k in writes.removes], path=True)
        if writes.sets:  # one `config set-all`: its pairs are applied in order
            self._stack.set_all_config({f"{NAMESPACE}:{k}": self._auto.ConfigValue(value=v, secret=False)
                                        for k, v in writes.sets}, path=True)

    def preview(self, writes: Writes) -> PreviewReport:
        # The stack file is not touched: the preview reads a copy with the writes applied
        # (`pulumi preview --config-file`), secrets kept encrypted as they are in the file.
        stack_file = self._work_dir / f"Pulumi.{self.name.rsplit('/', 1)[-1]}.yaml"
        settings = yaml.safe_load(stack_file.read_text()) or {}
        config = settings.setdefault("config", {})
        blocks = {k.partition(":")[2]: v for k, v in config.items() if k.startswith(NAMESPACE + ":")}
        for name, value in apply_writes(blocks, writes).items():
            config[f"{NAMESPACE}:{name}"] = value
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=".upgrade-preview-", dir=self._work_dir) as copy_:
            yaml.safe_dump(settings, copy_, sort_keys=False)
            copy_.flush()
            result = self._stack.preview(diff=True, config_file=copy_.name, color="never")
        return PreviewReport({str(op): count for op, count in result.change_summary.items()}, result.stdout)

    def up(self, on_output: Callable[[str], None]) -> None:
        self._stack.up(on_output=on_output, color="never", show_secrets=False)

    def outputs(self) -> dict[str, Any]:
        return {key: output.value for key, output in self._stack.outputs().items()}


def one_line_error(err: Exception, limit: int = 400) -> str:
    """The last meaningful lines of a CommandError (the CLI's stderr), in one line."""
    text = str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("code:")]
    interesting = [line for line in lines if "error" in line.lower()] or lines
    joined = " | ".join(interesting[-3:])
    return joined[-limit:] if joined else type(err).__name__
