"""The documents' own links: every relative link in README.md and docs/ names a file of the
repository, and every #anchor a heading of the file it points into (GitHub's anchors: the
heading lowercased, punctuation dropped, spaces as dashes); their generated blocks are what
dev/doc_tables.py writes from the code."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import doc_tables
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """GitHub's anchor for each heading (github/cmark-gfm's slug: lowercase, keep letters,
    digits, spaces, '-' and '_', spaces to '-')."""
    text = FENCE.sub("", path.read_text())
    slugs = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        slugs.add(slug)
    return slugs


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", path.read_text()))
            if not re.match(r"[a-z]+:", target)]  # http(s):, mailto: ... are not ours to check


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(document):
    broken = []
    for target in links(document):
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert broken == [], f"{document.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_check_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A heading, with punctuation!\n[ok](#a-heading-with-punctuation) [gone](missing.md) [bad](#nope)\n")
    assert anchors(page) == {"a-heading-with-punctuation"}
    assert links(page) == ["#a-heading-with-punctuation", "missing.md", "#nope"]


def test_every_launch_file_has_its_role_in_the_architecture_page():
    """docs/architecture.md's `launch/` by role names every file (or folder) of launch/, once."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("### `launch/` by role", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    named = [name.rstrip("/") for line in table for name in re.findall(r"`([^`]+)`", line.split("|")[2])]
    on_disk = sorted(p.name for p in (ROOT / "launch").iterdir() if not p.name.startswith((".", "__")))
    rendered = {"launch-vllm.sh", "twinspark.env", "Dockerfile", "locked-install.sh"}
    assert sorted(set(named) - rendered) == on_disk
    assert len(named) == len(set(named)), "a file named twice"


def test_regenerating_the_docs_generated_blocks_changes_nothing():
    assert doc_tables.drifted() == [], "run .venv/bin/python dev/doc_tables.py"


def test_a_generated_block_edited_by_hand_is_named_and_written_back(tmp_path):
    for page, _ in doc_tables.BLOCKS:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    page = tmp_path / "docs" / "configuration.md"
    pristine = page.read_text()
    page.write_text(pristine.replace("`gpt-oss-120b`", "`gpt-oss-999b`", 1))
    assert doc_tables.drifted(tmp_path) == ["docs/configuration.md: models"]
    assert doc_tables.drifted(tmp_path, write=True) == ["docs/configuration.md: models"]
    assert page.read_text() == pristine and doc_tables.drifted(tmp_path) == []


def test_the_readmes_diagram_is_what_its_source_renders(tmp_path):
    """docs/diagram/cluster.svg is Graphviz's rendering of cluster.dot (scripts/setup.sh installs it):
    an edit of the source without the command in its header fails here."""
    source = ROOT / "docs" / "diagram" / "cluster.dot"
    rendered = tmp_path / "cluster.svg"
    assert shutil.which("dot"), "Graphviz's dot is missing: scripts/setup.sh installs it (apt-get install graphviz)"
    subprocess.run(["dot", "-Tsvg", str(source), "-o", str(rendered)], check=True, capture_output=True)
    assert rendered.read_text() == (ROOT / "docs" / "diagram" / "cluster.svg").read_text(), \
        "run: dot -Tsvg docs/diagram/cluster.dot -o docs/diagram/cluster.svg"
