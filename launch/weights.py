"""weights.py — the model weights on a node (stdlib only) and against the hub: the download,
each file's integrity, and the copy's plan. Whether the model can run at the stack's TP × PP is
model-shape.py's.

    python3 weights.py hub-resolve   --repo R [--revision SHA]            (in the serving image)
    python3 weights.py hub-download  --repo R --revision SHA --dir D --hub-listing OUT
    python3 weights.py pin    --dir D --hub-listing H --manifest M --record REC --node N
    python3 weights.py verify --dir D --manifest M --record REC --node N [--repair | --full | --follow]
    python3 weights.py plan   --manifest M --need FILE --buckets N --out-prefix P [--dir D --arrivals OUT]
    python3 weights.py release-cache --dir D (--files FILE | --manifest M) [--wait-for-disk]

The hub-* commands run inside the serving base image, which has huggingface_hub; the
others on the host's python3.

What the hub publishes for a revision (HfApi.model_info with files_metadata=True): the
commit sha, and per file its size and git blob id, plus the sha256 of its content for every
LFS file (the weights). A small non-LFS file (config.json, the tokenizer) has only its git
blob id, a sha1 over "blob <size>\\0" + content: `pin` checks that
and records the file's sha256 beside, so the workers are checked against sha256 alone.

The manifest (head, written by `pin`; sent to each worker): {repo, revision, files: {path:
{size, sha256}}}. The record (every node): what was verified there, per file {size, mtime_ns,
ctime_ns, ino, sha256}, and the revision once every file verified. A file whose stat still
equals its record is not read again: a second run with everything intact hashes nothing.
Files are hashed in parallel (hashlib releases the GIL), largest first; each file's page
cache is released once it is verified (see release_cache). On a worker receiving a copy, the
files are hashed as each arrives (verify --follow), beside the rest of the copy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

CHUNK = 8 << 20
# what the hub published for the revision, on the head (fetch-weights.sh's HUB_LISTING, the same name)
HUB_LISTING = ".twinspark-hub.json"
# huggingface_hub's bookkeeping inside local_dir (2.4: _local_folder.py, _tree_cache.py): .gitignore
# (and its .lock), CACHEDIR.TAG, trees/<commit>.json, download/<file>.metadata and .lock, and
# <short hash>.<etag>.incomplete while a file downloads
HUB_METADATA = (".cache", "huggingface")
HUB_METADATA_FILES = {(".gitignore",), (".gitignore.lock",), ("CACHEDIR.TAG",)}


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
    for sibling in info.siblings:  # type: ignore[union-attr]  # the hub always lists a model's files
        lfs = sibling.lfs  # BlobLfsInfo, a dict (huggingface_hub hf_api.py); None for a git-stored file
        files[sibling.rfilename] = {"size": sibling.size, "blob_id": sibling.blob_id,
                                    "sha256": lfs["sha256"] if lfs else None}
    snapshot_download(repo_id=args.repo, revision=args.revision, local_dir=args.dir)
    write_json(Path(args.hub_listing), {"repo": args.repo, "revision": info.sha, "files": files})


# ---- files on this node ----------------------------------------------------------------------
def write_json(path: Path, value) -> None:
    # a temp file of this process's own: two verifications of one copy at once (a source sending
    # to several, `ops verify-weights` beside a step) shared one name, and the second's rename failed
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def is_bookkeeping(rel: str, own: set[str], expected) -> bool:
    """Ours at the top (the manifest, the record, the hub's listing, a write_json temp of one) or
    huggingface_hub's own of a file of the revision: nothing else is passed over, so a file slipped
    in beside the weights (a `.py` vLLM would import, a shard, anything under .cache) is named."""
    parts = Path(rel).parts
    if len(parts) == 1:
        return any(rel == name or re.fullmatch(re.escape(name) + r"\.\d+\.tmp", rel) for name in own)
    if parts[:2] != HUB_METADATA:
        return False
    if parts[2:] in HUB_METADATA_FILES or re.fullmatch(r"trees/[0-9a-f]{40}\.json", "/".join(parts[2:])):
        return True
    if parts[2:3] != ("download",) or len(parts) < 4:
        return False
    inner = "/".join(parts[3:])
    if any(inner.endswith(suffix) and inner[:-len(suffix)] in expected for suffix in (".metadata", ".lock")):
        return True
    folder = str(Path(*parts[3:]).parent)
    return inner.endswith(".incomplete") and any(str(Path(e).parent) == folder for e in expected)


def weight_files(root: Path, own: set[str], expected) -> list[str]:
    """Every file under root but is_bookkeeping's, relative, sorted."""
    found = []
    for dirpath, _, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        found += [str(rel / f) if rel != Path(".") else f for f in filenames]
    return sorted(rel for rel in found if not is_bookkeeping(rel, own, expected))


def own_files(args) -> set[str]:
    return {Path(args.manifest).name, Path(args.record).name, HUB_LISTING}


def stat_key(path: Path, st: os.stat_result | None = None) -> dict:
    """What the record keeps of a file's stat (st: one already taken)."""
    st = st or path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}


def release_cache(path: Path, wait_for_disk: bool = False) -> None:
    """Drop the file's pages from the page cache. DONTNEED drops the clean ones and starts
    writing the dirty ones back, without waiting: a step that has just written the file does not
    wait on the disk (rsync does not either). wait_for_disk (release-cache --wait-for-disk, which a
    worker runs detached after its copy verified): the file is flushed first, so every page goes.
    The boot's memory check flushes and drops what is left before the model loads
    (launch/memory-check.py). Unprivileged, per file: unlike /proc/sys/vm/drop_caches, which
    needs root and empties every cache of the machine."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if wait_for_disk:
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
    for rel in weight_files(root, own_files(args), expected):
        if rel not in expected:  # left by an earlier revision (or put there): not part of this one
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


# ---- follow: hash the files a copy writes as each is finished -----------------------------------
def settled(st: os.stat_result, size: int, mtime_ns: int) -> bool:
    """rsync has finished the file: all its bytes, and the sender's mtime, which rsync -t sets last."""
    return st.st_size == size and st.st_mtime_ns == mtime_ns


def follow(args, expected: dict) -> dict:
    """The record, with what was hashed while the copy ran (--follow, on the receiving node), for
    the verification after it to trust or hash again and write. stdin's first line is
    {path: the sender's mtime_ns} of the files being sent; each is hashed as soon as it has
    settled, in parallel with the rest of the copy, and goes into the record with the stat it
    had when its hashing began. stdin's end says the copy ended: the files still hashing are
    waited for, the others left to the verification after it. A file rsync writes again after
    its hash began (a retried transfer) no longer matches its stat in the record, and is hashed
    again by that verification: the record only ever vouches for the bytes that were hashed."""
    root = Path(args.dir)
    pending = {rel: mtime for rel, mtime in json.loads(sys.stdin.readline() or "{}").items() if rel in expected}
    copy_ended = threading.Event()
    # the tuple only runs both calls: nothing reads set()'s None
    threading.Thread(target=lambda: (sys.stdin.read(), copy_ended.set()), daemon=True).start()  # type: ignore[func-returns-value]
    record = read_json(Path(args.record), {"files": {}})
    hashing, hashed, started = {}, [], time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        while True:
            ended = copy_ended.is_set()  # read before the scan: a file finished with the copy is still seen
            for rel, mtime_ns in list(pending.items()):
                try:
                    st = (root / rel).stat()
                except FileNotFoundError:
                    continue
                if settled(st, expected[rel]["size"], mtime_ns):
                    del pending[rel]
                    hashing[pool.submit(digest_file, root / rel)] = (rel, stat_key(root / rel, st))
            for future in [f for f in hashing if f.done()]:
                rel, key = hashing.pop(future)
                hashed.append(key["size"])
                if future.result()["sha256"] == expected[rel]["sha256"]:
                    record["files"][rel] = {**key, "sha256": expected[rel]["sha256"]}
                # a mismatch stays out of the record: the verification after the copy names it
            if ended and not hashing:  # the verification after it must see whatever the copy did last
                break
            if hashing:
                wait(hashing, timeout=0.05, return_when=FIRST_COMPLETED)
            else:
                copy_ended.wait(0.05 if pending else None)
    log(f"{args.node}: hashed {len(hashed)} files as they arrived: {rate(sum(hashed), time.monotonic() - started)}")
    return record


# ---- verify: a node's copy against the manifest ------------------------------------------------
def verify(args) -> int:
    """Exit 0 with the files still to send on stdout (none: complete), or 1 naming each
    mismatch. --repair (a worker before the copy): a wrong file is removed, to be sent again,
    and a shorter one kept (an interrupted copy, to be appended to and checked whole).
    --full (ops verify-weights): every file hashed, the record trusted for none — a bit that
    rots below the filesystem leaves size, mtime, ctime and inode as they were. A file that
    fails leaves the record, so the next weights step on this node hashes it and repairs it.
    --follow (a worker during the copy): see follow; what it hashed is then trusted as recorded."""
    root, node = Path(args.dir), args.node
    if not Path(args.manifest).is_file():
        log(f"FAIL {node}: no manifest at {args.manifest}: no weights step has completed in {root} on this node")
        return 1
    manifest = json.loads(Path(args.manifest).read_text())
    expected, revision = manifest["files"], manifest["revision"]
    record = follow(args, expected) if args.follow else read_json(Path(args.record), {"files": {}})
    if record.get("revision") not in (None, revision):
        log(f"{node} holds revision {record['revision']}; this stack pins {revision}: "
            + ("replacing the files that differ" if args.repair else "refused"))
    extraneous = [rel for rel in weight_files(root, own_files(args), expected) if rel not in expected]
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
        elif not args.full and unchanged(root, rel, entry) and entry["sha256"] == want["sha256"]:
            continue
        elif path.stat().st_size < want["size"] and args.repair:
            need.append(rel)  # partial: the copy appends and checks it whole
        elif path.stat().st_size != want["size"]:
            problems.append(f"{node}: {rel}: {path.stat().st_size} bytes, expected {want['size']}")
        else:
            stale.append(rel)
    digests, total, seconds = hash_all(root, stale, args.jobs)
    files = {rel: e for rel, e in record["files"].items() if rel in expected and rel not in digests
             and unchanged(root, rel, e) and e["sha256"] == expected[rel]["sha256"]}
    for rel, digest in digests.items():
        if digest["sha256"] == expected[rel]["sha256"]:
            files[rel] = {**stat_key(root / rel), "sha256": digest["sha256"]}
        else:
            problems.append(f"{node}: {rel}: sha256 {digest['sha256']}, expected {expected[rel]['sha256']} "
                            f"(revision {revision})")
    if stale:
        log(f"{node}: hashed {len(stale)} {'files' if args.full else 'changed files'}: {rate(total, seconds)}")
    if args.repair:
        for p in problems:
            rel = p.split(": ", 2)[1]
            log(f"{node}: damaged, sending again: {p.split(': ', 1)[1]}")
            (root / rel).unlink()
            need.append(rel)
        problems = []
    if not args.repair:
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
    loads: list[list] = [[0, i, []] for i in range(args.buckets)]  # [bytes, stream, files]
    for rel in sorted(need, key=lambda r: (-manifest[r]["size"], r)):
        bucket = min(loads)
        bucket[0] += manifest[rel]["size"]
        bucket[2].append(rel)
    for _, i, files in loads:
        Path(f"{args.out_prefix}{i}").write_text("".join(f"{rel}\n" for rel in files))
    if args.arrivals:  # what the receiver's follow waits for: each file's mtime here, which rsync -t sets there
        Path(args.arrivals).write_text(json.dumps({rel: (Path(args.dir) / rel).stat().st_mtime_ns for rel in need}) + "\n")
    print(sum(load for load, _, _ in loads))
    return 0


def release(args) -> int:
    root = Path(args.dir)
    listed = (Path(args.files).read_text().splitlines() if args.files
              else json.loads(Path(args.manifest).read_text())["files"])
    for rel in listed:
        if rel and (root / rel).is_file():
            release_cache(root / rel, args.wait_for_disk)
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
    sub.choices["verify"].add_argument("--full", action="store_true", help="hash every file, trusting no record")
    sub.choices["verify"].add_argument("--follow", action="store_true",
                                       help="first hash the files a copy writes as each settles (stdin: see follow)")
    p = sub.add_parser("plan")
    for flag in ("--manifest", "--need", "--out-prefix"):
        p.add_argument(flag, required=True)
    p.add_argument("--buckets", type=int, required=True)
    p.add_argument("--dir", help="with --arrivals: where the files are")
    p.add_argument("--arrivals", help="write {path: mtime_ns} of the files to send here, for the receiver's --follow")
    p.set_defaults(run=plan)
    p = sub.add_parser("release-cache")
    p.add_argument("--dir", required=True)
    listed = p.add_mutually_exclusive_group(required=True)
    listed.add_argument("--files", help="a file listing the paths, one a line")
    listed.add_argument("--manifest", help="every file of the manifest")
    p.add_argument("--wait-for-disk", action="store_true", help="flush each file first: every page goes")
    p.set_defaults(run=release)
    args = parser.parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
