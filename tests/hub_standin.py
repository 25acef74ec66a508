"""hub_standin.py — the Hugging Face Hub's HTTP API, as far as the real huggingface_hub client
asks it for launch/weights.py and model-shape.py (model_info, snapshot_download, hf_hub_download),
served from a local directory.

    python tests/hub_standin.py --root DIR --listen ADDR:PORT [--cdn-listen ADDR:PORT] [--tls CERT KEY]

The client is pointed here with HF_ENDPOINT=http://ADDR:PORT (https:// with --tls: the API and the
CDN both, with that certificate; the simulator's, signed by its CA, which its serving base trusts). DIR holds one folder per repo
id (DIR/org/model/...). A repo's head (`main`) is one commit: DIR/org/model/.revision where the
test writes one, else a sha1 over the files' names and blob ids (as git's would change with the
content). Files whose path has a part starting with '.' are not published. Every commit the
head has been is kept and still answers by its id (its listing as it was; a file's content is
read from DIR as it is now, so a test that moves the head adds or removes files and changes none).

What is served, as huggingface.co serves it (huggingface_hub 2.4.0: hf_api.py model_info,
list_repo_tree; file_download.py get_hf_file_metadata, http_get; utils/_http.py
hf_raise_for_status):
- GET /api/models/REPO[/revision/REV][?blobs=true]: {id, sha, siblings}; with blobs, each
  sibling's size, blobId and, for an LFS file, lfs {size, sha256, pointerSize};
- GET /api/models/REPO/tree/REV[/PATH]?recursive=...: the files (oid, size, lfs {oid, size,
  pointerSize}) and folders, one page (the hub pages at 1000 entries);
- HEAD|GET /REPO/resolve/REV/FILE: a git-stored file answers 200 with ETag (its blob sha1),
  Content-Length and X-Repo-Commit; an LFS file answers 302 to the CDN (another origin, so
  the client neither follows it with the token nor reads metadata there) with X-Linked-Etag
  (the sha256), X-Linked-Size, X-Repo-Commit, and ETag, the pointer file's blob sha1;
- GET CDN/lfs/SHA256: the content, with Range (206) for resumed downloads;
- errors as the hub gives them, X-Error-Code being what the client maps to its exceptions:
  an unknown revision 404 RevisionNotFound, an unknown repo 401 RepoNotFound (404 with a
  token), an unknown file 404 EntryNotFound.
LFS (as the hub stores them): .safetensors and any file over 10 MB. An LFS file's blobId is
its pointer's, as on the hub (git stores the pointer); its content's sha256 is lfs.sha256.
Standard library only (http.server, threaded): the simulator runs it on the host's python3.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import ssl
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 10 << 20
CHUNK = 1 << 20
DEFAULT_BRANCH = "main"

API = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)?)(?:/revision/(?P<rev>[^/]+))?$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
CDN = re.compile(r"^/lfs/(?P<sha256>[0-9a-f]{64})$")


@dataclass(frozen=True)
class Entry:
    size: int
    blob_id: str  # git's blob sha1: of the content, or of the LFS pointer
    sha256: str
    lfs: bool
    pointer_size: int


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    """The repos under root, listed on each request (a test may change them between calls);
    a file is hashed again only when its stat changed."""

    def __init__(self, root: Path):
        self.root = root
        self._digests: dict[tuple, tuple[str, str]] = {}
        self._blobs: dict[str, Path] = {}  # sha256 -> file, for the CDN
        self._history: dict[tuple[str, str], dict[str, Entry]] = {}  # (repo, commit) -> its files
        self._lock = threading.Lock()

    def _digest(self, path: Path) -> tuple[str, str]:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if key not in self._digests:
            sha256, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % st.st_size)
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    sha256.update(chunk)
                    blob.update(chunk)
            self._digests[key] = (sha256.hexdigest(), blob.hexdigest())
        return self._digests[key]

    def repo_dir(self, repo_id: str) -> Optional[Path]:
        path = self.root / repo_id
        inside = path.resolve().is_relative_to(self.root.resolve())
        return path if inside and ".." not in repo_id.split("/") and path.is_dir() else None

    def listing(self, repo_id: str) -> tuple[str, dict[str, Entry]]:
        """(commit, {path: Entry}) of the repo as published now."""
        root = self.repo_dir(repo_id)
        with self._lock:
            files = {}
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if not path.is_file() or any(part.startswith(".") for part in rel.parts):
                    continue
                sha256, content_blob = self._digest(path)
                size = path.stat().st_size
                lfs = path.name.endswith(".safetensors") or size > LFS_THRESHOLD
                pointer = lfs_pointer(sha256, size)
                files[rel.as_posix()] = Entry(size, git_blob(pointer) if lfs else content_blob, sha256, lfs, len(pointer))
                if lfs:
                    self._blobs[sha256] = path
        published = root / ".revision"
        if published.exists():
            commit = published.read_text().strip()
        else:
            commit = hashlib.sha1("".join(f"{p} {e.blob_id}\n" for p, e in files.items()).encode()).hexdigest()
        with self._lock:
            self._history[(repo_id, commit)] = files
        return commit, files

    def earlier(self, repo_id: str, commit: str) -> Optional[dict[str, Entry]]:
        """The files of a commit the head was once (None: never seen)."""
        with self._lock:
            return self._history.get((repo_id, commit))

    def blob(self, sha256: str) -> Optional[Path]:
        with self._lock:
            return self._blobs.get(sha256)


class HubError(Exception):
    def __init__(self, status: int, code: str, message: str, commit: Optional[str] = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server_version = "twinspark-hub-standin"

    @property
    def hub(self) -> Hub:
        return self.server.hub

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        if self.server.log is not None:
            self.server.log.write(f"{self.address_string()} {format % args}\n")
            self.server.log.flush()

    def do_HEAD(self):
        self._answer(head=True)

    def do_GET(self):
        self._answer(head=False)

    def _answer(self, head: bool):
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        self.server.requests.append((self.command, url.path, "authorization" in {k.lower() for k in self.headers}))
        try:
            if self.server.cdn:
                match = CDN.match(path)
                blob = self.hub.blob(match["sha256"]) if match else None
                if blob is None:
                    raise HubError(404, "", "Not Found")
                return self._file(blob, {}, head)
            if match := TREE.match(path):
                return self._tree(match["repo"], match["rev"], match["path"] or "", head)
            if match := API.match(path):
                return self._model_info(match["repo"], match["rev"], query.get("blobs", [""])[0] == "true", head)
            if match := RESOLVE.match(path):
                return self._resolve(match["repo"], match["rev"], match["path"], head)
            raise HubError(404, "", "Sorry, we can't find the page you are looking for.")
        except HubError as e:
            headers = {"X-Error-Message": e.message}
            if e.code:
                headers["X-Error-Code"] = e.code
            if e.commit:
                headers["X-Repo-Commit"] = e.commit
            self._json(e.status, {"error": e.message}, head, headers)

    # ---- the API ----
    def _published(self, repo_id: str, revision: Optional[str]) -> tuple[str, dict[str, Entry]]:
        if self.hub.repo_dir(repo_id) is None:
            status = 404 if "authorization" in {k.lower() for k in self.headers} else 401
            raise HubError(status, "RepoNotFound", "Repository not found")
        commit, files = self.hub.listing(repo_id)
        if revision in (None, DEFAULT_BRANCH, commit):
            return commit, files
        earlier = self.hub.earlier(repo_id, revision)
        if earlier is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return revision, earlier

    def _model_info(self, repo_id: str, revision: Optional[str], blobs: bool, head: bool):
        commit, files = self._published(repo_id, revision)
        siblings = []
        for rel, e in files.items():
            sibling = {"rfilename": rel}
            if blobs:
                sibling.update(size=e.size, blobId=e.blob_id)
                if e.lfs:
                    sibling["lfs"] = {"size": e.size, "sha256": e.sha256, "pointerSize": e.pointer_size}
            siblings.append(sibling)
        owner = repo_id.split("/")[0] if "/" in repo_id else None
        self._json(200, {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "author": owner, "sha": commit,
                         "private": False, "disabled": False, "gated": False, "tags": [], "downloads": 0,
                         "likes": 0, "siblings": siblings}, head)

    def _tree(self, repo_id: str, revision: str, under: str, head: bool):
        _, files = self._published(repo_id, revision)
        recursive = parse_qs(urlsplit(self.path).query).get("recursive", ["false"])[0].lower() == "true"
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        entries, folders = [], set()
        for rel, e in files.items():
            if not rel.startswith(prefix):
                continue
            parts = rel[len(prefix):].split("/")
            for depth in range(1, len(parts)):
                folder = prefix + "/".join(parts[:depth])
                if folder not in folders and (recursive or depth == 1):
                    folders.add(folder)
                    entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(),
                                    "size": 0, "path": folder})
            if len(parts) > 1 and not recursive:
                continue
            entry = {"type": "file", "oid": e.blob_id, "size": e.size, "path": rel}
            if e.lfs:
                entry["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": e.pointer_size}
            entries.append(entry)
        if prefix and not entries:
            raise HubError(404, "EntryNotFound", f"{under} does not exist on \"{revision}\"")
        self._json(200, entries, head)

    def _resolve(self, repo_id: str, revision: str, rel: str, head: bool):
        commit, files = self._published(repo_id, revision)
        entry = files.get(rel)
        if entry is None:
            raise HubError(404, "EntryNotFound", "Entry not found", commit)
        headers = {"X-Repo-Commit": commit}
        if entry.lfs:
            host = (self.headers.get("Host") or self.server.server_address[0]).rsplit(":", 1)[0]
            headers.update({"ETag": f'"{entry.blob_id}"', "X-Linked-Etag": f'"{entry.sha256}"',
                            "X-Linked-Size": str(entry.size),
                            "Location": f"{self.server.scheme}://{host}:{self.server.cdn_port}/lfs/{entry.sha256}"})
            return self._body(302, b"", "text/plain", head, headers)
        headers["ETag"] = f'"{entry.blob_id}"'
        return self._file(self.hub.repo_dir(repo_id) / rel, headers, head)

    # ---- bodies ----
    def _json(self, status: int, value, head: bool, headers=None):
        self._body(status, json.dumps(value).encode(), "application/json", head, headers or {})

    def _body(self, status: int, data: bytes, content_type: str, head: bool, headers: dict):
        self.send_response(status)
        for k, v in {"Content-Type": content_type, "Content-Length": str(len(data)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _file(self, path: Path, headers: dict, head: bool):
        size = path.stat().st_size
        start, status = 0, 200
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if match and int(match[1]) < size:
            start, status = int(match[1]), 206
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self.send_response(status)
        for k, v in {"Content-Type": "application/octet-stream", "Content-Length": str(size - start),
                     "Accept-Ranges": "bytes", **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if head:
            return
        with open(path, "rb") as f:
            f.seek(start)
            while chunk := f.read(CHUNK):
                self.wfile.write(chunk)


class HubStandin:
    """The API on `listen`, the CDN (the LFS files' redirect target) on `cdn_listen`; both threaded."""

    def __init__(self, root: Path, listen=("127.0.0.1", 0), cdn_listen=None, log=None, tls=None):
        """tls: (certificate, key) files: both served over https."""
        hub = Hub(Path(root))
        self.requests: list[tuple[str, str, bool]] = []  # (method, path, sent a token)
        cdn_listen = cdn_listen or (listen[0], 0)
        scheme = "https" if tls else "http"
        self.servers = []
        for address, cdn in ((cdn_listen, True), (listen, False)):
            server = ThreadingHTTPServer(address, Handler)
            server.daemon_threads = True
            if tls:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(*map(str, tls))
                server.socket = context.wrap_socket(server.socket, server_side=True)
            server.hub, server.cdn, server.log, server.requests, server.scheme = hub, cdn, log, self.requests, scheme
            self.servers.append(server)
        self.servers[1].cdn_port = self.servers[0].server_address[1]
        host, port = self.servers[1].server_address[:2]
        self.endpoint = f"{scheme}://{host}:{port}"
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    def __enter__(self) -> "HubStandin":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "0.0.0.0", int(port)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="the Hugging Face Hub's API over a local directory of repos")
    parser.add_argument("--root", type=Path, required=True, help="one folder per repo id (ORG/NAME)")
    parser.add_argument("--listen", type=address, default=("127.0.0.1", 8080), help="ADDR:PORT of the API")
    parser.add_argument("--cdn-listen", type=address, help="ADDR:PORT the LFS files redirect to (default: PORT+1)")
    parser.add_argument("--tls", nargs=2, type=Path, metavar=("CERT", "KEY"), help="serve https with this certificate")
    args = parser.parse_args(argv)
    cdn = args.cdn_listen or (args.listen[0], args.listen[1] + 1)
    standin = HubStandin(args.root, args.listen, cdn, log=sys.stderr, tls=args.tls)
    print(f"hub stand-in: {args.root} at {standin.endpoint}, LFS from port {cdn[1]}", file=sys.stderr, flush=True)
    with standin:
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
