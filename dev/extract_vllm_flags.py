"""Extract `vllm serve`'s flag names from vLLM's source into recipes/vllm-names.toml's [engine_flags].

    .venv/bin/python dev/extract_vllm_flags.py --source "<where the files come from>" \
        vllm/engine/arg_utils.py vllm/entrypoints/openai/cli_args.py

Parses (never imports) the files with `ast`: every option string of an `add_argument` call, an
f-string flag in a loop over `get_kwargs(Cls).items()` standing for each field of Cls, and a
`--no-` form wherever argparse's BooleanOptionalAction applies (an explicit
`action=argparse.BooleanOptionalAction`, or `**kwargs[...]` for a field typed bool: vLLM's
get_kwargs gives bool fields that action).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from pathlib import Path

NAMES_FILE = Path(__file__).resolve().parent.parent / "recipes" / "vllm-names.toml"


def _fields(tree: ast.Module) -> dict[str, dict[str, ast.expr]]:
    """Each class's annotated fields: {class: {field: annotation}}."""
    return {node.name: {s.target.id: s.annotation for s in node.body
                        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _is_bool(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(isinstance(n, ast.Name) and n.id == "bool" for n in ast.walk(annotation))


def _boolean_action(call: ast.Call) -> bool:
    return any(k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction") for k in call.keywords)


def _with_no_forms(options: list[str], boolean: bool) -> list[str]:
    return options + ([f"--no-{o[2:]}" for o in options if o.startswith("--")] if boolean else [])


def extract(sources: list[str]) -> list[str]:
    """Every flag the files' parsers register, sorted."""
    trees = [ast.parse(text) for text in sources]
    fields: dict[str, dict[str, ast.expr]] = {}
    for tree in trees:
        fields.update(_fields(tree))
    typed = {name: ann for cls in fields.values() for name, ann in cls.items()}  # a dest's type, by name
    flags: set[str] = set()
    for tree in trees:
        kwargs_of = {t.id: node.value.args[0].id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Call)
                     and ast.unparse(node.value.func) == "get_kwargs" and isinstance(node.value.args[0], ast.Name)}
        literal_loops: dict[str, list[str]] = {}   # `for arg, type in [("--x", str), ...]`
        field_loops: set[int] = set()              # calls inside `for key, value in X_kwargs.items()`
        for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For)):
            target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
            if isinstance(loop.iter, (ast.List, ast.Tuple)) and isinstance(target, ast.Name):
                literal_loops[target.id] = [e.elts[0].value for e in loop.iter.elts if isinstance(e, ast.Tuple)]
            elif (isinstance(loop.iter, ast.Call) and ast.unparse(loop.iter.func).endswith(".items")
                  and ast.unparse(loop.iter.func)[:-6] in kwargs_of):
                cls = kwargs_of[ast.unparse(loop.iter.func)[:-6]]
                for call in (c for c in ast.walk(loop) if isinstance(c, ast.Call)
                             and ast.unparse(c.func).endswith(".add_argument")):
                    field_loops.add(id(call))
                    for name, ann in fields[cls].items():
                        flags.update(_with_no_forms([f"--{name.replace('_', '-')}"], _is_bool(ann)))
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            if not ast.unparse(call.func).endswith(".add_argument") or id(call) in field_loops or not call.args:
                continue
            first = call.args[0]
            if isinstance(first, ast.Name) and first.id in literal_loops:
                options = literal_loops[first.id]
            else:
                options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if len(options) != len(call.args):
                    raise SystemExit(f"line {call.lineno}: an add_argument whose names are not literals: "
                                     f"{ast.unparse(call)[:120]}")
            options = [o for o in options if o.startswith("-")]  # positionals (model_tag) are not flags
            if not options:
                continue
            from_field = any(k.arg is None for k in call.keywords)  # **X_kwargs["field"]: get_kwargs' action
            dest = next((o[2:].replace("-", "_") for o in options if o.startswith("--")), "")
            flags.update(_with_no_forms(options, _boolean_action(call) or (from_field and _is_bool(typed.get(dest)))))
    return sorted(flags)


def engine_flags_section(flags: list[str], source: str, command: str) -> str:
    lines, line = [], "names = ["
    for flag in flags:
        item = f'"{flag}", '
        if len(line) + len(item) > 110:
            lines.append(line.rstrip())
            line = "         "
        line += item
    lines.append(line.rstrip().rstrip(",") + "]")
    return ("[engine_flags]\n"
            "# Extracted from vLLM's argument parser by dev/extract_vllm_flags.py (do not edit by hand):\n"
            f"#   {command}\n"
            f'source = "{source}"\n' + "\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", required=True, help="the files' repository, paths and commit, for the toml")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    texts = [f.read_text() for f in args.files]
    flags = extract(texts)
    digests = ", ".join(f"{f.name} sha256 {hashlib.sha256(t.encode()).hexdigest()[:16]}" for f, t in zip(args.files, texts))
    command = (f"dev/extract_vllm_flags.py --source '...' {' '.join(f.name for f in args.files)}  "
               f"({len(flags)} flags; parsed {digests})")
    current = NAMES_FILE.read_text()
    section = re.compile(r"^\[engine_flags\]\n.*?(?=^\[(?!engine_flags\])|\Z)", re.S | re.M)
    if not section.search(current):
        raise SystemExit(f"{NAMES_FILE}: no [engine_flags] section to replace")
    NAMES_FILE.write_text(section.sub(lambda _: engine_flags_section(flags, args.source, command) + "\n", current, 1))
    print(f"{len(flags)} flags written to {NAMES_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
