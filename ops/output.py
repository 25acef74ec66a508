"""How the day-2 tools print: one console for all of them."""

from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

from rich.console import Console

# wide enough that no line of a report or table is ever cut, narrow enough for Rich's layout
PIPED_WIDTH = 10_000


def tool_console(file: Optional[TextIO] = None, **options: Any) -> Console:
    """A terminal's own width; piped or redirected (`ops status > f`, a script), no hard wrap: each
    line as long as it is, so a grep or a diff sees whole lines."""
    out = file or sys.stdout
    if not out.isatty():
        options.setdefault("width", PIPED_WIDTH)
    return Console(file=out, **options)
