"""weights.py — the model weights' integrity, on a node (stdlib only) and against the hub.

    python3 weights.py hub-resolve   --repo R [--revision SHA]            (in the serving image)
    python3 weights.py hub-download  --repo R --revision SHA --dir D --hub-listing OUT
    python3 weights.py pin    --dir D --hub-listing H --manifest M --record REC --node N
    python3 weights.py verify --dir D --manifest M --record REC --node N [--repair]
    python3 weights.py plan   --manifest M --need FILE --buckets N --out-prefix P
    python3 weights.py release-cache --dir D --files FILE

The two hub-* commands run inside the serving base image, which has huggingface_hub; the
others on the host's python3. What the hub publishes for a revision (HfApi.model_info with
files_metadata=True): the commit sha, and per file its size and git blob id, plus the sha256
of its content for every LFS file (the weights). A small non-LFS file (config.json, the
tokenizer) has only its git blob id, a sha1 over "blob <size>\\0" + content: `pin` checks
that and records the file's sha256 beside, so the workers are checked against sha256 alone.

The manifest (head, written by `pin`; sent to each worker): {repo, revision, files: {path:
{size, sha256}}}. The record (every node): what was verified there, per file {size, mtime_ns,
ctime_ns, ino, sha256}, and the revision once every file verified. A file whose stat still
equals its record is not read again: a second run with everything intact hashes nothing.
Files are hashed in parallel (hashlib releases the GIL), largest first; each file's page
cache is released once it is verified, so the check leaves memory as it found it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 8 << 20
OWN_PREFIX = ".twinspark-"  # the manifest, the record, the hub listing: never weights
HUB_METADATA_DIR = ".cache"  # huggingface_hub's download metadata inside local_dir


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- the hub (inside the serving image) ------------------------------------------------------
def hub_resolve(args) -> None:
    from huggingface_hub import HfApi

    info = HfApi().model_info(args.repo, revision=args.revision or None)
    print(info.sha)


def hub_download(args) -> None:
    from huggingface_hub import HfApi, snapshot_download

    info = HfApi().model_info(args.repo, revision=args.revision, files_metadata=True)
    if info.sha != args.revision:
        raise SystemExit(f"the hub answered revision {info.sha} for {args.repo}@{args.revision}")
    files = {}
    for sibling in info.siblings:
        lfs = sibling.lfs  # BlobLfsInfo, a dict (huggingface_hub hf_api.py); None for a git-stored file
        files[sibling.rfilename] = {"size": sibling.size, "blob_id": sibling.blob_id,
                                    "sha256": lfs["sha256"] if lfs else None}
    snapshot_download(repo_id=args.repo, revision=args.revision, local_dir=args.dir)
    write_json(Path(args.hub_listing), {"repo": args.repo, "revision": info.sha, "files": files})


# ---- files on this node ----------------------------------------------------------------------
def write_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def weight_files(root: Path) -> list[str]:
    """Every file under root but huggingface_hub's metadata and ours, relative, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d != HUB_METADATA_DIR]
        found += [str(rel / f) if rel != Path(".") else f for f in filenames
                  if not (rel == Path(".") and f.startswith(OWN_PREFIX))]
    return sorted(found)


def stat_key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def release_cache(path: Path) -> None:
    """Drop the file's pages from the page cache: written ones are flushed first (DONTNEED
    leaves dirty pages), then the kernel may drop them. Unprivileged, per file: unlike
    /proc/sys/vm/drop_caches, which needs root and empties every cache of the machine."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def digest_file(path: Path, git_blob: bool = False) -> dict:
    sha256 = hashlib.sha256()
    blob = None
    if git_blob:
        blob = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            sha256.update(view[:n])
            if blob is not None:
                blob.update(view[:n])
    release_cache(path)
    return {"sha256": sha256.hexdigest(), "blob_id": blob.hexdigest() if blob else None}


def hash_all(root: Path, paths: list[str], jobs: int, git_blob=frozenset()) -> tuple[dict, int, float]:
    """{path: digests} of every path, hashed in parallel, largest first; bytes, seconds."""
    paths = sorted(paths, key=lambda p: -(root / p).stat().st_size)
    total = sum((root / p).stat().st_size for p in paths)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = dict(zip(paths, pool.map(lambda p: digest_file(root / p, p in git_blob), paths)))
    return results, total, time.monotonic() - started


def rate(total: int, seconds: float) -> str:
    return f"{total / 1e6:.0f} MB in {seconds:.1f} s ({total / 1e6 / max(seconds, 1e-6):.0f} MB/s)"


def unchanged(root: Path, rel: str, entry: dict | None) -> bool:
    try:
        return entry is not None and all(entry.get(k) == v for k, v in stat_key(root / rel).items())
    except FileNotFoundError:
        return False


# ---- pin: the head's download against the hub's listing ---------------------------------------
def pin(args) -> int:
    root, node = Path(args.dir), args.node
    hub = json.loads(Path(args.hub_listing).read_text())
    record = read_json(Path(args.record), {"files": {}})
    expected = hub["files"]
    problems = []
    for rel in weight_files(root):
        if rel not in expected:  # left by an earlier revision: not part of this one
            log(f"{node}: removing {rel}: not in {hub['repo']}@{hub['revision']}")
            (root / rel).unlink()
    missing = [rel for rel in expected if not (root / rel).is_file()]
    problems += [f"{node}: {rel}: missing after the download" for rel in missing]
    present = [rel for rel in expected if rel not in missing]
    stale = [rel for rel in present if not (unchanged(root, rel, record["files"].get(rel))
                                           and record["files"][rel].get("hub") == expected[rel])]
    digests, total, seconds = hash_all(root, stale, args.jobs, git_blob={r for r in stale if not expected[r]["sha256"]})
    files = {rel: record["files"][rel] for rel in present if rel not in digests}
    for rel, digest in digests.items():
        want = expected[rel]
        size = (root / rel).stat().st_size
        if want["sha256"]:
            ok, what, got, hub_value = digest["sha256"] == want["sha256"], "sha256", digest["sha256"], want["sha256"]
        else:
            ok, what, got, hub_value = digest["blob_id"] == want["blob_id"], "git blob sha1", digest["blob_id"], want["blob_id"]
        if ok and size == want["size"]:
            files[rel] = {**stat_key(root / rel), "sha256": digest["sha256"], "hub": want}
        else:
            problems.append(f"{node}: {rel}: {what} {got} ({size} bytes), the hub publishes {hub_value} "
                            f"({want['size']} bytes) for revision {hub['revision']}")
            (root / rel).unlink()  # the next download fetches it again
    write_json(Path(args.record), {"revision": hub["revision"] if not problems else None, "files": files})
    if stale:
        log(f"{node}: verified against the hub: {len(stale)} files, {rate(total, seconds)}")
    if problems:
        for p in problems:
            log(f"FAIL {p}")
        return 1
    write_json(Path(args.manifest), {"repo": hub["repo"], "revision": hub["revision"],
                                     "files": {rel: {"size": e["size"], "sha256": files[rel]["sha256"]}
                                               for rel, e in sorted(expected.items())}})
    log(f"{node}: {len(expected)} files of {hub['repo']}@{hub['revision']} match the hub")
    return 0


# ---- verify: a node's copy against the manifest ------------------------------------------------
def verify(args) -> int:
    """Exit 0 with the files still to send on stdout (none: complete), or 1 naming each
    mismatch. --repair (a worker before the copy): a wrong file is removed, to be sent again,
    and a shorter one kept (an interrupted copy, to be appended to and checked whole)."""
    root, node = Path(args.dir), args.node
    manifest = json.loads(Path(args.manifest).read_text())
    expected, revision = manifest["files"], manifest["revision"]
    record = read_json(Path(args.record), {"files": {}})
    if record.get("revision") not in (None, revision):
        log(f"{node} holds revision {record['revision']}; this stack pins {revision}: "
            + ("replacing the files that differ" if args.repair else "refused"))
    extraneous = [rel for rel in weight_files(root) if rel not in expected]
    if args.repair:  # vLLM globs *.safetensors: a stale shard must not be loaded
        for rel in extraneous:
            log(f"{node}: removing {rel}: not in revision {revision}")
            (root / rel).unlink()
        extraneous = []
    need, problems, stale = [], [], []
    for rel, want in sorted(expected.items()):
        path = root / rel
        entry = record["files"].get(rel)
        if not path.is_file():
            need.append(rel)
        elif unchanged(root, rel, entry) and entry["sha256"] == want["sha256"]:
            continue
        elif path.stat().st_size < want["size"] and args.repair:
            need.append(rel)  # partial: the copy appends and checks it whole
        elif path.stat().st_size != want["size"]:
            problems.append(f"{node}: {rel}: {path.stat().st_size} bytes, expected {want['size']}")
        else:
            stale.append(rel)
    digests, total, seconds = hash_all(root, stale, args.jobs)
    files = {rel: e for rel, e in record["files"].items() if rel in expected and unchanged(root, rel, e)
             and e["sha256"] == expected[rel]["sha256"]}
    for rel, digest in digests.items():
        if digest["sha256"] == expected[rel]["sha256"]:
            files[rel] = {**stat_key(root / rel), "sha256": digest["sha256"]}
        else:
            problems.append(f"{node}: {rel}: sha256 {digest['sha256']}, expected {expected[rel]['sha256']} "
                            f"(revision {revision})")
    if stale:
        log(f"{node}: hashed {len(stale)} changed files: {rate(total, seconds)}")
    if args.repair:
        for p in problems:
            rel = p.split(": ", 2)[1]
            log(f"{node}: damaged, sending again: {p.split(': ', 1)[1]}")
            (root / rel).unlink()
            need.append(rel)
        problems = []
    if not args.repair and not problems:
        problems += [f"{node}: {rel}: missing" for rel in need]
        problems += [f"{node}: {rel}: not in revision {revision}" for rel in extraneous]
    complete = not need and not problems and not extraneous
    # the revision is recorded once every file verified; until then the one held before stays
    write_json(Path(args.record), {"revision": revision if complete else record.get("revision"), "files": files})
    for p in problems:
        log(f"FAIL {p}")
    print("".join(f"{rel}\n" for rel in sorted(set(need))), end="")
    return 1 if problems else 0


# ---- plan: the files to send, split over the streams ------------------------------------------
def plan(args) -> int:
    """Largest first into the least loaded stream (LPT): the streams end together."""
    manifest = json.loads(Path(args.manifest).read_text())["files"]
    need = [line for line in Path(args.need).read_text().splitlines() if line]
    loads = [[0, i, []] for i in range(args.buckets)]
    for rel in sorted(need, key=lambda r: (-manifest[r]["size"], r)):
        bucket = min(loads)
        bucket[0] += manifest[rel]["size"]
        bucket[2].append(rel)
    for load, i, files in loads:
        Path(f"{args.out_prefix}{i}").write_text("".join(f"{rel}\n" for rel in files))
    print(sum(load for load, _, _ in loads))
    return 0


def release(args) -> int:
    root = Path(args.dir)
    for rel in Path(args.files).read_text().splitlines():
        if rel and (root / rel).is_file():
            release_cache(root / rel)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="weights.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("hub-resolve")
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", default="")
    p.set_defaults(run=hub_resolve)
    p = sub.add_parser("hub-download")
    for flag in ("--repo", "--revision", "--dir", "--hub-listing"):
        p.add_argument(flag, required=True)
    p.set_defaults(run=hub_download)
    for name, run in (("pin", pin), ("verify", verify)):
        p = sub.add_parser(name)
        for flag in ("--dir", "--manifest", "--record", "--node"):
            p.add_argument(flag, required=True)
        p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
        p.set_defaults(run=run)
    sub.choices["pin"].add_argument("--hub-listing", required=True)
    sub.choices["verify"].add_argument("--repair", action="store_true")
    p = sub.add_parser("plan")
    for flag in ("--manifest", "--need", "--out-prefix"):
        p.add_argument(flag, required=True)
    p.add_argument("--buckets", type=int, required=True)
    p.set_defaults(run=plan)
    p = sub.add_parser("release-cache")
    p.add_argument("--dir", required=True)
    p.add_argument("--files", required=True)
    p.set_defaults(run=release)
    args = parser.parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
