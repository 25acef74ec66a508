"""The few names of the on-node contract that scripts in launch/ spell themselves (core/contract.py
says which and why): every spelling there is the contract's, so a rename in the contract that
misses a script fails here, not on a node."""

import re

from core import contract
from program_harness import ROOT

LAUNCH = ROOT / "launch"


def launch_texts() -> dict[str, str]:
    """Every file of launch/ but Python's bytecode cache (the tests load its scripts as modules)."""
    return {p.name: p.read_text() for p in sorted(LAUNCH.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_the_env_files_the_scripts_source_are_the_contracts():
    """The entry points source the bundle's env files from their own directory."""
    sourced = {name: re.findall(r'^\s*\. "\$\w+/([^"/]+)"$', text, re.M) for name, text in launch_texts().items()}
    env_files = {name: [f for f in files if f.endswith(".env")] for name, files in sourced.items()}
    assert {name: files for name, files in env_files.items() if files} == {
        contract.BOOT_COMMON: [contract.ENV_FILE],
        contract.API_GATEWAY_SCRIPT: [contract.ENV_FILE, contract.SECRETS_FILE],
    }


def test_every_env_file_named_in_launch_is_one_of_the_contracts():
    """Messages and comments too: a script's error names the file the program writes."""
    named = {(name, m) for name, text in launch_texts().items() for m in re.findall(r"\b[\w-]+\.env\b", text)}
    assert {m for _, m in named} == {contract.ENV_FILE, contract.SECRETS_FILE}, sorted(named)


def test_what_host_steps_keep_in_the_home_is_under_the_contracts_state_directory():
    spelled = {(name, m.group(1)) for name, text in launch_texts().items()
               for m in re.finditer(r"(?:\$HOME|%s)/(\.local/state/[\w-]+)", text)}
    assert {name for name, _ in spelled} == {contract.STEP_PRELUDE, "fetch-weights.sh"}
    assert {where for _, where in spelled} == {contract.USER_STATE_DIR}
    every_mention = {m for text in launch_texts().values() for m in re.findall(r"\.local/state/[\w-]+", text)}
    assert every_mention == {contract.USER_STATE_DIR}  # none elsewhere, under another root
