"""How a refusal reaches the user: the key path as written in the stack file, one line per problem.

Every check of the package (schema, secrets, node addresses, loading) ends in `config_error`,
the one `pulumi.RunError` the program stops on before any resource exists.
"""

from __future__ import annotations

from typing import Any

import pulumi

NAMESPACE = "twinspark"


class CrossFieldError(ValueError):
    """A rule failed at `path` (relative to the validated model); pydantic carries it in ctx."""

    def __init__(self, path: str, value: Any, expected: str):
        super().__init__(f"{value} — expected {expected}")
        self.path, self.value, self.expected = path, value, expected


def format_key_path(loc: tuple[Any, ...]) -> str:
    """('nodes', 1, 'rails', 0, 'address') -> 'twinspark:nodes[1].rails[0].address'."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{NAMESPACE}:{path}"


def config_error(problems: list[str]) -> pulumi.RunError:
    return pulumi.RunError("invalid stack config:\n  " + "\n  ".join(problems))
