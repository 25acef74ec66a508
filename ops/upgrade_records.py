"""What `ops upgrade` keeps in the checkout's .twinspark/, per stack: the bench baseline the next
upgrade is held to and what served before the last upgrade (known-good), each written whole with
the previous one kept beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from .bench_compare import load_baseline
from .inputs import InputError

BASELINE_DIR = Path(".twinspark") / "baselines"  # under the checkout
KNOWN_GOOD_DIR = Path(".twinspark") / "known-good"  # what served before the last upgrade, per stack


def baseline_path(work_dir: Path, stack_name: str, lane: Optional[str] = None) -> Path:
    """The stack's bench baseline; a lane's own where `upgrade --model` picks one of several."""
    return work_dir / BASELINE_DIR / f"{stack_name.replace('/', '--')}{f'-{lane}' if lane else ''}.json"


def read_baseline(path: Path) -> dict:
    try:
        return load_baseline(str(path))
    except InputError as err:
        raise InputError(str(err).replace("--compare ", "baseline ", 1)) from None


def write_keeping_previous(path: Path, record: dict) -> None:
    """`record` as JSON at path, written whole or not at all; the previous one kept as <stack>.previous.json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        os.replace(path, path.with_suffix(".previous.json"))
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2))
    os.replace(temporary, path)


def record_baseline(path: Path, result: dict, upgrade: Optional[dict] = None) -> None:
    """The new baseline (the previous one kept beside it)."""
    write_keeping_previous(path, {**result, **({"upgrade": upgrade} if upgrade else {})})


def known_good_path(work_dir: Path, stack_name: str) -> Path:
    return work_dir / KNOWN_GOOD_DIR / f"{stack_name.replace('/', '--')}.json"
