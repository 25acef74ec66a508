"""docs/configuration.md's parameter table, rendered from the schema's field descriptions and the secrets'
rules (dev/doc_tables.py writes it there; tests/test_docs.py fails when the page drifts from it).
"""

from __future__ import annotations

import string

from pydantic import BaseModel

from .blocks import LANE_SERVING_KEYS, RECIPE_KEYS, ConfigBlock
from .schema import OPTIONAL_STRUCTURED_KEYS, STRUCTURED_KEYS, StackConfig
from .secret_keys import SECRET_KEYS

# Keys whose unset value follows from others (StackConfig)
DERIVED_DEFAULTS = {"serving.tensorParallel": "node count ÷ `pipelineParallel`"}


def parameter_table() -> str:
    """docs/configuration.md's parameter table, from the field descriptions: the two cannot drift."""
    rows = ["| key | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{field.alias or name}"
            annotation = field.annotation
            inner = getattr(annotation, "__args__", (annotation,))
            nested = next((t for t in inner if isinstance(t, type) and issubclass(t, ConfigBlock)), None)
            if key == "lanes[].model":  # `model`'s keys, listed once above
                rows.append(f"| `{key}` | required | {field.description} |")
                continue
            if key == "lanes[].serving":  # a lane sets the lane keys only; the rest is the stack's
                rows.append(f"| `{key}` | see below | {field.description} |")
                rows.extend(f"| `{key}.{lane_key}` | `serving.{lane_key}` | the lane's own `serving.{lane_key}` |"
                            for lane_key in LANE_SERVING_KEYS)
                continue
            if nested is not None:
                rows.append(f"| `{key}` | {'required' if field.is_required() else 'see below'} | {field.description} |")
                walk(nested, f"{key}{'[]' if getattr(annotation, '__origin__', None) is list else ''}.")
                continue
            if field.is_required():
                default = "required"
            else:
                value = field.get_default(call_default_factory=True)
                if key in RECIPE_KEYS:
                    default = "the recipe's"
                elif key in DERIVED_DEFAULTS:
                    default = DERIVED_DEFAULTS[key]
                else:
                    default = "none" if value is None else f"`{str(value).lower() if isinstance(value, bool) else value}`"
            rows.append(f"| `{key}` | {default} | {field.description} |")

    blocks = STRUCTURED_KEYS + OPTIONAL_STRUCTURED_KEYS
    for field in StackConfig.model_fields.values():  # in the order the stack file has them
        block = field.alias
        assert block in blocks, block
        model = field.annotation
        listed = "list[" in str(model)  # nodes, lanes: Optional[list[Block]] or list[Block]
        while not (isinstance(model, type) and issubclass(model, BaseModel)):
            model = getattr(model, "__args__", (model,))[0]  # a block, or a list or Optional of one
        walk(model, f"{block}{'[]' if listed else ''}.")
    for key, spec in SECRET_KEYS.items():
        shown = "".join(sorted(spec.characters - set(string.ascii_letters + string.digits)))
        rules = f"{spec.min_length}–{spec.max_length} letters, digits or `{shown}`"
        rows.append(f"| `{key}` (secret) | none | {spec.meaning}; {rules} |")
    return "\n".join(rows) + "\n"
