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
    before: schema.StackConfig  # as the program reads them; a lane's view where `lane` is set
    after: schema.StackConfig
    undo: Writes = Writes()  # the previous ones as they were written: when nothing was deployed
    pinned: dict[str, str] = field(default_factory=dict)  # key -> the digest or commit the rollback writes
    lane: Optional["LaneChoice"] = None  # `upgrade --model`: the lane whose settings change

    @property
    def model(self) -> Optional[str]:
        """The served model the gates ask for: the lane's, or None for the stack's own."""
        return self.lane.model if self.lane else None


@dataclass(frozen=True)
class LaneChoice:
    """`upgrade --model`: one lane of a stack with several, by its served name."""
    model: str
    name: str
    index: int  # in the stack's `lanes` config


def lane_choice(cfg: schema.StackConfig, model: str) -> LaneChoice:
    """The lane of the stack serving `model` (its served name, or the lane's name); InputError naming every
    lane's model otherwise."""
    if cfg.lanes is None:
        raise InputError(f"--model {model!r}: this stack serves one model, not lanes: drop --model (its --set keys "
                         "are the stack's)")
    for index, lane in enumerate(cfg.served_lanes):  # in the order of the `lanes` config
        if model in (lane.model.served_name, lane.name):
            return LaneChoice(lane.model.served_name, lane.name, index)
    raise InputError(f"--model {model!r}: no lane serves it; the lanes serve "
                     + ", ".join(f"{lane.model.served_name} (lane {lane.name})" for lane in cfg.served_lanes)
                     + ": pass one of them")


def lane_key(key: str, lane: Optional[LaneChoice]) -> str:
    """A --set key as written for the lane: `serving.X` (a lane key) -> `lanes[i].serving.X`, `model.revision` ->
    `lanes[i].model.revision`; another key with --model is the stack's (InputError)."""
    if lane is None:
        return key
    if not lane_key_allowed(key):
        raise InputError(f"--set {key} with --model: {key} is the stack's, one for every lane (a lane has its own "
                         f"{', '.join(schema.LANE_SERVING_KEYS)} and model.revision): drop --model to change it")
    return f"lanes[{lane.index}].{key}"


@dataclass(frozen=True)
class KnownGood:
    """What serves now, from the stack's outputs before anything changes: what a rollback returns to."""
    image_reference: Optional[str]  # REPO@sha256:... every node's image is built FROM (servingImage)
    image_tag: Optional[str]  # serving.image as the config said it
    model_revision: Optional[str]  # the commit every node holds (modelRevision)
    launch_bundles: dict[str, str]  # node -> its launch bundle's hash (keyed: says nothing of its secrets)
    image_ids: dict[str, str]  # node -> the serving image ID it runs (platform facts)
    lane_revisions: dict[str, str] = field(default_factory=dict)  # several lanes: lane -> the commit it holds

    def record(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"image_reference": self.image_reference, "image_tag": self.image_tag,
                "model_revision": self.model_revision, "launch_bundles": self.launch_bundles,
                "image_ids": self.image_ids, "lane_revisions": self.lane_revisions, "config": config}


def known_good_from(outputs: dict[str, Any]) -> KnownGood:
    image = outputs["servingImage"] if isinstance(outputs.get("servingImage"), dict) else {}
    platform = outputs["platform"] if isinstance(outputs.get("platform"), dict) else {}
    facts = platform["facts"] if isinstance(platform.get("facts"), dict) else {}
    bundles = outputs["launchBundles"] if isinstance(outputs.get("launchBundles"), dict) else {}
    revision = outputs.get("modelRevision")
    lanes = outputs["lanes"] if isinstance(outputs.get("lanes"), dict) else {}
    return KnownGood(
        lane_revisions={n: lane["revision"] for n, lane in lanes.items()
                        if isinstance(lane, dict) and isinstance(lane.get("revision"), str)},
        image_reference=image.get("reference") if isinstance(image.get("reference"), str) else None,
        image_tag=image.get("tag") if isinstance(image.get("tag"), str) else None,
        model_revision=revision if isinstance(revision, str) else None,
        launch_bundles={n: h for n, h in bundles.items() if isinstance(h, str)},
        image_ids={n: f["image"] for n, f in facts.items() if isinstance(f, dict) and isinstance(f.get("image"), str)})


# What the program resolves again when these keys change, and the output that says what served:
# serving.image (or its platform) -> image-pin-resolve pulls the tag anew; model.revision -> the
# revision step asks the hub for the branch's head.
PINNED_BY = {"serving.image": ("serving.image", "serving.platform"), "model.revision": ("model.revision",)}


def pins(changes: list[Change], known_good: KnownGood, lane: Optional[LaneChoice] = None) -> dict[str, str]:
    """The keys the rollback writes as what served (digest, commit), not as they were written; a lane's
    commit where `lane` is upgraded (its other keys are resolved by nothing)."""
    changed = {c.key for c in changes}
    if lane:
        key = lane_key("model.revision", lane)
        return {key: served_pin(known_good.lane_revisions.get(lane.name), f"lanes.{lane.name}.revision (the commit "
                                "that serves)")} if key in changed else {}
    served = {"serving.image": (known_good.image_reference, "servingImage.reference (the digest that serves)"),
              "model.revision": (known_good.model_revision, "modelRevision (the commit that serves)")}
    return {key: served_pin(*served[key]) for key, triggers in PINNED_BY.items() if changed & set(triggers)}


def served_pin(pin: Optional[str], what: str) -> str:
    if not pin:
        raise InputError(f"the stack's outputs name no {what}, so a rollback could not return to it: run `pulumi up` "
                         "with this version of twinspark first; nothing changed")
    return pin


def lane_key_allowed(key: str) -> bool:
    """A key a lane has of its own (`upgrade --model` writes it at the lane's path)."""
    return key == "model.revision" or key.removeprefix("serving.") in schema.LANE_SERVING_KEYS


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


def plan_upgrade(blocks: dict[str, Any], settings: list[Setting], known_good: Optional[KnownGood] = None,
                 model: Optional[str] = None) -> Plan:
    """The writes there and back, checked before anything changes. InputError on bad input.
    `known_good` (what serves now): the rollback writes its digest and commit where the program
    would resolve the previous text again; without it, the previous text as it was. `model`: the
    settings are the lane's serving it (`lanes[i].serving.X`, `lanes[i].model.revision`), and the plan's
    before and after are that lane's view."""
    keys = upgradable_keys()
    before = validated(blocks, "the stack's current config is invalid")
    lane = lane_choice(before, model) if model else None
    is_list = {lane_key(s.key, lane): keys[s.key] for s in settings}  # a lane's path, the key's kind of value
    settings = [Setting(lane_key(s.key, lane), s.text) for s in settings]
    seen = [s.key for s in settings]
    twice = sorted({k for k in seen if seen.count(k) > 1})
    if twice:
        raise InputError(f"--set {', '.join(twice)} given more than once")
    forward = combined(requested_writes(setting, is_list[setting.key]) for setting in settings)
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
    pinned = pins(changes, known_good, lane) if known_good else {}
    backward = combined([restoring_writes(c.key, pinned.get(c.key, c.before)) for c in changes]
                        + [([], [(key, value)]) for key, value in pinned.items() if key not in seen])
    if lane:
        before, after = lane_view(before, lane), lane_view(after, lane)
    return Plan(changes, forward, backward, before, after, undo, pinned, lane)


def lane_view(cfg: schema.StackConfig, lane: LaneChoice) -> schema.StackConfig:
    return cfg.lane_view(next(served for served in cfg.served_lanes if served.name == lane.name))
