"""How a day-2 tool ends early (one line, an exit code) and the checks it runs before any
request, so that bad input costs one line, not a run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any, Awaitable, Optional, TypeVar

T = TypeVar("T")


class ToolError(Exception):
    """Ends a tool with one line on stderr (the message) and exit_code, never a traceback."""
    exit_code = 1


class InputError(ToolError, ValueError):
    """Bad input found before a tool starts; the message is one line saying what to fix."""
    exit_code = 2


class EndpointError(ToolError):
    """The endpoint cannot be used: unreachable, the key refused, or answers that are not the API."""


class DeadlineError(ToolError):
    """The run's overall deadline (--deadline-min) passed before it finished."""


def run_with_deadline(work: Awaitable[T], deadline_s: Optional[float]) -> T:
    """asyncio.run(work), cancelled after deadline_s seconds (None: no deadline) with DeadlineError."""
    async def bounded() -> T:
        scope = asyncio.timeout(deadline_s)
        try:
            async with scope:
                return await work
        except TimeoutError:
            if not scope.expired():  # a timeout of the work's own, not the deadline
                raise
            assert deadline_s is not None  # only a deadline expires
            raise DeadlineError(f"stopped at the overall deadline of {deadline_s / 60:g} min "
                                "(--deadline-min)") from None

    return asyncio.run(bounded())


def one_line(text: str) -> str:
    """What a node, a server or a CLI said, on one line (an error message must not break it)."""
    return " ".join(text.split())


def read_json_file(path: str, flag: str) -> Any:
    """The JSON in a file a flag names; InputError saying what is wrong, in one line."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise InputError(f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{flag} {path}: cannot read it ({err})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{flag} {path}: not JSON ({err.msg}, line {err.lineno})") from None


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


def whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not above zero" if least == 1 else f"{value} is below {least}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number above zero."""
    return whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number, zero or more."""
    return whole_number(text, 0)


def positive_float(text: str) -> float:
    """argparse type: a number above zero, e.g. 0.5."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above zero")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1 to 65535)")
    return value


def positive_int_list(text: str) -> list[int]:
    """argparse type: comma-separated whole numbers above zero, e.g. 1,2,4,6."""
    values = [positive_int(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} lists no values")
    return values


def fraction(text: str) -> float:
    """argparse type: a share such as 0.2 (above 0, below 1)."""
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"{text} is not below 1 (0.2 is 20%)")
    return value
