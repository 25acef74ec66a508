"""`twinspark`: the day-2 tools (`python -m ops` in a checkout) as a command that runs from anywhere.

The tools share `core` and `components` with the Pulumi program, which Pulumi runs from the project
directory by those top-level names; the wheel carries them, with launch/ and recipes/ that they
read by path, under twinspark/source/ (pyproject.toml's force-include), so site-packages gains one
name, not six. Here that tree goes first on sys.path, as the project directory is for the program.
"""

from __future__ import annotations

import sys
from pathlib import Path

INSTALLED_SOURCE = Path(__file__).resolve().parent / "source"


def source_tree() -> Path:
    """The installed copy when there is one, else the checkout this package lies in."""
    return INSTALLED_SOURCE if (INSTALLED_SOURCE / "ops").is_dir() else INSTALLED_SOURCE.parent.parent


def main() -> int:
    tree = str(source_tree())
    if tree not in sys.path:
        sys.path.insert(0, tree)
    from ops.__main__ import main as tools_main

    return tools_main(prog="twinspark")


if __name__ == "__main__":
    sys.exit(main())
