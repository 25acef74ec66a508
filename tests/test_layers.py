"""docs/architecture.md's layers, one rule per folder, held by what each module imports (read with
ast, nothing run): core/ imports nothing of the project but core/, and no Pulumi; a component (a
module of components/ defining a ComponentResource) imports no other component, and its pure
renders no Pulumi; ops/ no Pulumi but its automation; launch/'s Python payloads only the
standard library, each other and what the serving image holds (they run on a node's own python3
or in the image)."""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

from core import contract
from components import launch_bundle
from components.remote import LAUNCH_DIR
from program_harness import ROOT

PROJECT = {"core", "components", "ops"}
# no Pulumi: the pure renders of components/, the day-2 tools (but ops upgrade's stack, which
# drives pulumi.automation)
# what launch/'s payloads may import beyond the standard library and each other: the serving image's
IN_THE_IMAGE = {"ray", "torch", "huggingface_hub"}
NO_PULUMI = ("components/firewall.py", "components/observability_files/*.py", "ops/*.py")
AUTOMATION = ("ops/stack.py", "ops/upgrade*.py")  # pulumi.automation, and the schema's RunError


def imports(path: Path, root: Path) -> set[str]:
    """Every module `path` imports, dotted and absolute (a relative import resolved from its package)."""
    package = path.relative_to(root).parent.parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def outermost(modules: set[str]) -> list[str]:
    """`from a.b import c` records a.b and a.b.c: name a.b alone."""
    return sorted(m for m in modules if not any(m.startswith(f"{other}.") for other in modules))


def component_modules(root: Path) -> dict[str, Path]:
    """components.X for every module of components/ that defines a ComponentResource subclass."""
    found = {}
    for path in sorted((root / "components").glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.ClassDef) and any(ast.unparse(base).endswith("ComponentResource")
                                                       for base in node.bases) for node in ast.walk(tree)):
            found[f"components.{path.stem}"] = path
    return found


def violations(root: Path) -> list[str]:
    found = []
    components = component_modules(root)
    for name, path in components.items():
        for other in sorted(imports(path, root) & set(components) - {name}):
            found.append(f"{path.relative_to(root)}: a component imports another component, {other}")
    for path in sorted((root / "core").glob("*.py")):
        for module in outermost(imports(path, root)):
            top = module.split(".")[0]
            if top in PROJECT - {"core"} or top.startswith("pulumi"):
                found.append(f"{path.relative_to(root)}: imports {module} (core/ imports nothing of the project "
                             "but core/, and no Pulumi)")
    payloads = sorted((root / "launch").glob("*.py"))
    allowed = set(sys.stdlib_module_names) | IN_THE_IMAGE | {p.stem for p in payloads}
    for path in payloads:
        for module in outermost(imports(path, root)):
            if module.split(".")[0] not in allowed:
                found.append(f"{path.relative_to(root)}: imports {module} (a node payload: the standard library, "
                             "launch/ and the serving image's packages only)")
    automation = {p for pattern in AUTOMATION for p in root.glob(pattern)}
    for pattern in NO_PULUMI:
        for path in sorted(root.glob(pattern)):
            pulumi = {m for m in imports(path, root) if m.split(".")[0].startswith("pulumi")}
            if path in automation:
                pulumi = {m for m in pulumi if m not in ("pulumi", "pulumi.RunError") and not m.startswith("pulumi.automation")}
            found += [f"{path.relative_to(root)}: imports {m} (a leaf: no Pulumi)" for m in outermost(pulumi)]
    return found


def test_the_layers_hold():
    assert len(component_modules(ROOT)) >= 10  # the rule is about something
    assert violations(ROOT) == []


def test_each_folders_rule_names_what_breaks_it(tmp_path):
    for rel in ("core", "components", "ops", "launch"):
        shutil.copytree(ROOT / rel, tmp_path / rel)
    readiness = tmp_path / "components" / "readiness.py"
    readiness.write_text("from .serving_guard import ServingGuard\n" + readiness.read_text())
    firewall = tmp_path / "components" / "firewall.py"
    firewall.write_text("import pulumi\n" + firewall.read_text())
    contract = tmp_path / "core" / "contract.py"
    contract.write_text("from components import config\n" + contract.read_text())
    flags = tmp_path / "core" / "vllm_flags.py"
    flags.write_text("import pulumi\n" + flags.read_text())
    weights = tmp_path / "launch" / "weights.py"
    weights.write_text("import yaml\n" + weights.read_text())
    assert violations(tmp_path) == [
        "components/readiness.py: a component imports another component, components.serving_guard",
        "core/contract.py: imports components (core/ imports nothing of the project but core/, and no Pulumi)",
        "core/vllm_flags.py: imports pulumi (core/ imports nothing of the project but core/, and no Pulumi)",
        "launch/weights.py: imports yaml (a node payload: the standard library, launch/ and the serving image's "
        "packages only)",
        "components/firewall.py: imports pulumi (a leaf: no Pulumi)",
    ]


# ---- the shell preludes: prelude.sh for every script, step-prelude.sh only where sourced --------

SHELL_FUNCTION = re.compile(r"^(\w+)\(\) \{", re.M)


def prelude_misuse(launch: Path) -> list[str]:
    """Each launch script that calls a step-prelude function without sourcing step-prelude.sh (the
    runner would not send it: `command not found` on the node), and each step-prelude function the
    prelude defines as well (the containers would carry it again)."""
    step_functions = set(SHELL_FUNCTION.findall((launch / contract.STEP_PRELUDE).read_text()))
    found = [f"{contract.PRELUDE} defines {name}, a step-prelude function"
             for name in sorted(step_functions & set(SHELL_FUNCTION.findall((launch / contract.PRELUDE).read_text())))]
    for script in sorted(launch.glob("*.sh")):
        if script.name in (contract.PRELUDE, contract.STEP_PRELUDE):
            continue
        text = script.read_text()
        called = sorted(name for name in step_functions if re.search(rf"\b{name}\b", text))
        if called and f"source={contract.STEP_PRELUDE}" not in text:
            found.append(f"{script.name} calls {', '.join(called)} without sourcing {contract.STEP_PRELUDE}")
    return found


def test_the_step_prelude_goes_only_where_it_is_sourced_and_the_prelude_does_not_repeat_it():
    assert prelude_misuse(LAUNCH_DIR) == []
    # what the serving containers carry: no step-prelude function is called there
    bundled = {*launch_bundle.static_files("ray"), *launch_bundle.static_files("mp"), contract.API_GATEWAY_SCRIPT}
    bundle_texts = "".join((LAUNCH_DIR / name).read_text() for name in sorted(bundled) if name != contract.PRELUDE)
    assert not [n for n in SHELL_FUNCTION.findall((LAUNCH_DIR / contract.STEP_PRELUDE).read_text())
                if re.search(rf"\b{n}\b", bundle_texts)]


def test_a_script_calling_a_step_function_unsourced_and_a_prelude_repeating_one_are_both_named(tmp_path):
    for name in (contract.PRELUDE, contract.STEP_PRELUDE, "sync-weights.sh"):
        shutil.copy(LAUNCH_DIR / name, tmp_path / name)
    (tmp_path / "ship-it.sh").write_text('sync_key_ssh_options o "$key" "$hosts"\n')
    with (tmp_path / contract.PRELUDE).open("a") as prelude:
        prelude.write('claim_owner() { :; }\n')
    assert prelude_misuse(tmp_path) == [
        f"{contract.PRELUDE} defines claim_owner, a step-prelude function",
        f"ship-it.sh calls sync_key_ssh_options without sourcing {contract.STEP_PRELUDE}"]
