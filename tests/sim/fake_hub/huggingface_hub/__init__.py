"""A stand-in for the two huggingface_hub calls launch/weights.py makes, answered from a local
hub directory (TWINSPARK_SIM_HUB, default /srv/twinspark-sim-hub; one folder per repo id).

It publishes what the real hub does (huggingface_hub hf_api.py: ModelInfo.sha, siblings of
RepoSibling(rfilename, size, blob_id, lfs=BlobLfsInfo(size, sha256, pointer_size), a dict)):
a commit sha (REPO/.revision where the test publishes one, else derived from the content, as
git's would change with it), and per file
its size and git blob sha1, plus the sha256 for the files the hub would store in LFS
(here: the .safetensors and anything over 10 MB). Used by the sim's docker shim and by
tests/test_weights.py, so the production code path is weights.py's, unchanged.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

LFS_THRESHOLD = 10 << 20


class RevisionNotFoundError(Exception):
    pass


class BlobLfsInfo(dict):
    def __init__(self, size: int, sha256: str, pointer_size: int = 134):
        super().__init__(size=size, sha256=sha256, pointer_size=pointer_size)
        self.size, self.sha256, self.pointer_size = size, sha256, pointer_size


@dataclass
class RepoSibling:
    rfilename: str
    size: Optional[int] = None
    blob_id: Optional[str] = None
    lfs: Optional[BlobLfsInfo] = None


@dataclass
class ModelInfo:
    id: str
    sha: str
    siblings: list = field(default_factory=list)


def _hub(repo_id: str) -> Path:
    return Path(os.environ.get("TWINSPARK_SIM_HUB", "/srv/twinspark-sim-hub")) / repo_id


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def _sibling(root: Path, rel: str) -> RepoSibling:
    data_size = (root / rel).stat().st_size
    sha256, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % data_size)
    with open(root / rel, "rb") as f:
        while chunk := f.read(8 << 20):
            sha256.update(chunk)
            blob.update(chunk)
    lfs = rel.endswith(".safetensors") or data_size > LFS_THRESHOLD
    return RepoSibling(rel, data_size, blob.hexdigest(), BlobLfsInfo(data_size, sha256.hexdigest()) if lfs else None)


def _commit(siblings) -> str:
    return hashlib.sha1("".join(f"{s.rfilename} {s.blob_id}\n" for s in siblings).encode()).hexdigest()


class HfApi:
    def model_info(self, repo_id: str, revision: Optional[str] = None, files_metadata: bool = False) -> ModelInfo:
        root = _hub(repo_id)
        if not root.is_dir():
            raise RevisionNotFoundError(f"404: no repo {repo_id}")
        siblings = [_sibling(root, rel) for rel in _files(root)]
        published = root / ".revision"
        sha = published.read_text().strip() if published.exists() else _commit(siblings)
        if revision not in (None, "main", sha):
            raise RevisionNotFoundError(f"404: {repo_id} has no revision {revision} (the sim hub holds {sha})")
        if not files_metadata:
            siblings = [RepoSibling(s.rfilename) for s in siblings]
        return ModelInfo(repo_id, sha, siblings)


def snapshot_download(repo_id: str, revision: Optional[str] = None, local_dir: Optional[str] = None, **_) -> str:
    """Copies what is missing or of another size (the real one skips what it already fetched)."""
    HfApi().model_info(repo_id, revision)
    root, dest = _hub(repo_id), Path(local_dir)
    for rel in _files(root):
        target = dest / rel
        if not target.exists() or target.stat().st_size != (root / rel).stat().st_size:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, target)
    return str(dest)
