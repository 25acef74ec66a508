"""Checks the day-2 tools run before any request, so bad input costs one line, not a run."""

from __future__ import annotations

import argparse
import os
from typing import Optional


class InputError(ValueError):
    """Bad input found before a tool starts; the message is one line saying what to fix."""


def check_output_path(path: Optional[str]) -> None:
    """Refuse an output file that cannot be written before spending minutes on the measurement."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InputError(f"--output {path}: is a directory")
    if not os.path.isdir(folder):
        raise InputError(f"--output {path}: no such directory {folder}")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise InputError(f"--output {path}: not writable")


def positive_int(text: str) -> int:
    """argparse type: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not above zero")
    return value


def positive_int_list(text: str) -> list[int]:
    """argparse type: comma-separated whole numbers above zero, e.g. 1,2,4,6."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} lists no values")
    return values
