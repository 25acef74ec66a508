"""What `ops upgrade --set` may change and the writes there and back: each setting checked, the whole
config validated with the program's schema before and after, the previous values proven to write
back exactly, and `KnownGood` (what serves now, from the stack's outputs), whose digest and commit
the rollback writes where the program would resolve the previous text again (PINNED_BY). Pure:
nothing here touches the stack or a node."""

from __future__ import annotations

import argparse
import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from pulumi import RunError

from components import config as schema

from .inputs import InputError
from .stack import Writes, apply_writes, cli_text, value_at


class _Unset:
    def __repr__(self) -> str:
        return "(unset)"


UNSET: Any = _Unset()


def upgradable_keys() -> dict[str, bool]:
    """Every key upgrade may set, with whether its value is a list: `serving.*`, and
    `model.revision` where the schema has it."""
    keys = {}
    for block, model, names in (("serving", schema.Serving, None), ("model", schema.ModelConfig, ("revision",))):
        for name, info in model.model_fields.items():
            alias = info.alias or name
            if names is None or alias in names:
                keys[f"{block}.{alias}"] = getattr(info.annotation, "__origin__", None) is list
    return keys


@dataclass(frozen=True)
class Setting:
    key: str
    text: str


def parse_setting(text: str) -> Setting:
    """argparse type for --set KEY=VALUE."""
    key, sep, value = text.partition("=")
    key = key.strip().removeprefix(f"{schema.NAMESPACE}:")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. serving.image=REPO:TAG)")
    keys = upgradable_keys()
    if key not in keys:
        near = difflib.get_close_matches(key, list(keys), n=1)
        hint = f"did you mean {near[0]}?" if near else f"expected one of {', '.join(keys)}"
        raise argparse.ArgumentTypeError(f"{key!r} is not a setting upgrade changes — {hint}")
    return Setting(key, value)


@dataclass(frozen=True)
class Change:
    key: str
    before: Any  # UNSET where the stack did not set it
    after: Any  # as the CLI will store it


@dataclass
class Plan:
    changes: list[Change]
    forward: Writes  # the new settings
    backward: Writes  # the rollback: the previous ones, pinned to what served (KnownGood)
    before: schema.StackConfig  # as the program reads them
    after: schema.StackConfig
    undo: Writes = Writes()  # the previous ones as they were written: when nothing was deployed
    pinned: dict[str, str] = field(default_factory=dict)  # key -> the digest or commit the rollback writes


@dataclass(frozen=True)
class KnownGood:
    """What serves now, from the stack's outputs before anything changes: what a rollback returns to."""
    image_reference: Optional[str]  # REPO@sha256:... every node's image is built FROM (servingImage)
    image_tag: Optional[str]  # serving.image as the config said it
    model_revision: Optional[str]  # the commit every node holds (modelRevision)
    launch_bundles: dict[str, str]  # node -> its launch bundle's hash (keyed: says nothing of its secrets)
    image_ids: dict[str, str]  # node -> the serving image ID it runs (platform facts)

    def record(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"image_reference": self.image_reference, "image_tag": self.image_tag,
                "model_revision": self.model_revision, "launch_bundles": self.launch_bundles,
                "image_ids": self.image_ids, "config": config}


def known_good_from(outputs: dict[str, Any]) -> KnownGood:
    image = outputs["servingImage"] if isinstance(outputs.get("servingImage"), dict) else {}
    platform = outputs["platform"] if isinstance(outputs.get("platform"), dict) else {}
    facts = platform["facts"] if isinstance(platform.get("facts"), dict) else {}
    bundles = outputs["launchBundles"] if isinstance(outputs.get("launchBundles"), dict) else {}
    revision = outputs.get("modelRevision")
    return KnownGood(
        image_reference=image.get("reference") if isinstance(image.get("reference"), str) else None,
        image_tag=image.get("tag") if isinstance(image.get("tag"), str) else None,
        model_revision=revision if isinstance(revision, str) else None,
        launch_bundles={n: h for n, h in bundles.items() if isinstance(h, str)},
        image_ids={n: f["image"] for n, f in facts.items() if isinstance(f, dict) and isinstance(f.get("image"), str)})


# What the program resolves again when these keys change, and the output that says what served:
# serving.image (or its platform) -> image-pin-resolve pulls the tag anew; model.revision -> the
# revision step asks the hub for the branch's head.
PINNED_BY = {"serving.image": ("serving.image", "serving.platform"), "model.revision": ("model.revision",)}


def pins(changes: list[Change], known_good: KnownGood) -> dict[str, str]:
    """The keys the rollback writes as what served (digest, commit), not as they were written."""
    changed = {c.key for c in changes}
    served = {"serving.image": known_good.image_reference, "model.revision": known_good.model_revision}
    what = {"serving.image": "servingImage.reference (the digest that serves)",
            "model.revision": "modelRevision (the commit that serves)"}
    result = {}
    for key, triggers in PINNED_BY.items():
        if changed & set(triggers):
            pin = served[key]
            if not pin:
                raise InputError(f"the stack's outputs name no {what[key]}, so a rollback could not return to it: "
                                 "run `pulumi up` with this version of twinspark first; nothing changed")
            result[key] = pin
    return result


def requested_writes(setting: Setting, is_list: bool) -> tuple[list[str], list[tuple[str, str]]]:
    if not is_list:
        return [], [(setting.key, setting.text)]
    try:
        items = json.loads(setting.text)
    except ValueError:
        items = None
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise InputError(f"--set {setting.key}: {setting.text!r} is not a JSON list of strings "
                         f"(e.g. {setting.key}='[\"--enforce-eager\"]')")
    return [setting.key], [(f"{setting.key}[{i}]", item) for i, item in enumerate(items)]


def restoring_writes(key: str, before: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """What writes `before` back at key: unset is removed, a list element by element."""
    if before is UNSET:
        return [key], []
    if isinstance(before, list):
        return [key], [(f"{key}[{i}]", cli_text(item)) for i, item in enumerate(before)]
    return [], [(key, cli_text(before))]


def combined(parts) -> Writes:
    """One Writes from (removes, sets) pairs: every remove first, then the sets in order."""
    removes, sets = [], []
    for part_removes, part_sets in parts:
        removes += part_removes
        sets += part_sets
    return Writes(tuple(removes), tuple(sets))


def validated(blocks: dict[str, Any], what: str) -> schema.StackConfig:
    structured = {k: v for k, v in blocks.items() if k in schema.STRUCTURED_KEYS + schema.OPTIONAL_STRUCTURED_KEYS}
    try:
        return schema.parse_stack_config(structured)
    except RunError as err:
        problems = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        raise InputError(f"{what}: {'; '.join(problems) or err}") from None


def plan_upgrade(blocks: dict[str, Any], settings: list[Setting], known_good: Optional[KnownGood] = None) -> Plan:
    """The writes there and back, checked before anything changes. InputError on bad input.
    `known_good` (what serves now): the rollback writes its digest and commit where the program
    would resolve the previous text again; without it, the previous text as it was."""
    keys = upgradable_keys()
    seen = [s.key for s in settings]
    twice = sorted({k for k in seen if seen.count(k) > 1})
    if twice:
        raise InputError(f"--set {', '.join(twice)} given more than once")
    before = validated(blocks, "the stack's current config is invalid")
    forward = combined(requested_writes(setting, keys[setting.key]) for setting in settings)
    after_blocks = apply_writes(blocks, forward)
    after = validated(after_blocks, "the new settings are refused")
    changes = [Change(s.key, value_at(blocks, s.key, UNSET), value_at(after_blocks, s.key, UNSET)) for s in settings]
    undo = combined(restoring_writes(change.key, change.before) for change in changes)
    try:
        restored = validated(apply_writes(after_blocks, undo), "")
    except InputError:
        restored = None
    if restored != before:
        raise InputError("the previous values of " + ", ".join(c.key for c in changes) + " cannot be written back "
                         "exactly with `pulumi config set --path` (it stores 'true' and whole numbers as such): "
                         "change them with `pulumi config` and `pulumi up`")
    pinned = pins(changes, known_good) if known_good else {}
    backward = combined([restoring_writes(c.key, pinned.get(c.key, c.before)) for c in changes]
                        + [([], [(key, value)]) for key, value in pinned.items() if key not in seen])
    return Plan(changes, forward, backward, before, after, undo, pinned)
