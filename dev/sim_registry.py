"""sim_registry.py — the simulated Sparks' registry: its TLS (a CA of the sim's own, which each
node's dockerd trusts), its config, `serve_registry` (read-only, for the nodes), a writable one on
loopback for the build (`push_registry`) and a small client of the registry's HTTP API (digests,
manifests, a variant pushed under a tag); with the process helpers sim_images.py and
sim_image_builds.py share (run, log, free_port, wait_for: dev/ runs as programs, outside the tests, so
not tests/toolbox.py's). Pure of the images themselves."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TWINSPARK_SIM_IMAGES_CACHE", "~/.cache/twinspark-sim-images")).expanduser()

# The registry as the nodes name it: /etc/hosts on each node maps the name to its own gateway
# (the host side of its management veth), where `serve` listens.
REGISTRY_NAME = "registry.twinspark-sim"
REGISTRY_PORT = int(os.environ.get("TWINSPARK_SIM_REGISTRY_PORT", "5000"))
REGISTRY = f"{REGISTRY_NAME}:{REGISTRY_PORT}"
REGISTRY_BINARY = "/usr/bin/docker-registry"  # Debian's


# ---- for the sim: the registry the nodes pull from (tests/sim/cluster.py names it in each node) --
TLS_DIR = CACHE / "tls"
# a CA of the sim's own: each node's dockerd trusts it for the registry
# (/etc/docker/certs.d/REGISTRY/ca.crt), the serving base's Python for the hub stand-in (SSL_CERT_FILE)
REGISTRY_CA = TLS_DIR / "ca.crt"


def sim_certificate(name: str) -> tuple[Path, Path]:
    """A certificate for `name` signed by the sim's CA (made once, with the CA), and its key: the
    nodes reach the registry and the hub over TLS as a Spark reaches them. Under a lock, each file
    put in place whole: the simulator's two workers ask at once."""
    cert, key = TLS_DIR / f"{name}.crt", TLS_DIR / f"{name}.key"
    TLS_DIR.mkdir(parents=True, exist_ok=True)
    with open(TLS_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cert.exists() and key.exists() and REGISTRY_CA.exists():
            return cert, key
        ca_key = TLS_DIR / "ca.key"
        if not (REGISTRY_CA.exists() and ca_key.exists()):
            run("openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-days", "3650", "-subj",
                "/CN=twinspark-sim CA", "-keyout", ca_key, "-out", REGISTRY_CA)
        csr, new_key, new_cert = (TLS_DIR / f"{name}.{part}" for part in ("csr", "key.new", "crt.new"))
        run("openssl", "req", "-new", "-newkey", "ed25519", "-nodes", "-subj", f"/CN={name}", "-keyout", new_key,
            "-out", csr)
        extensions = TLS_DIR / f"{name}.san.cnf"
        extensions.write_text(f"subjectAltName=DNS:{name}\n")
        run("openssl", "x509", "-req", "-in", csr, "-CA", REGISTRY_CA, "-CAkey", ca_key, "-CAcreateserial",
            "-days", "3650", "-extfile", extensions, "-out", new_cert)
        new_key.replace(key)
        new_cert.replace(cert)
    return cert, key


def sim_ca() -> Path:
    """The sim's CA certificate, made with the registry's when there is none yet."""
    registry_tls()
    return REGISTRY_CA


def registry_tls() -> tuple[Path, Path]:
    """The registry's certificate (BuildKit in dockerd 20.10 would not take a plain-HTTP registry
    from `insecure-registries` for a FROM)."""
    return sim_certificate(REGISTRY_NAME)


def serve_registry(addr: str = f"0.0.0.0:{REGISTRY_PORT}", log=subprocess.DEVNULL) -> subprocess.Popen:
    """The registry, read-only (the nodes only pull), over TLS, on `addr`; the caller stops it."""
    return subprocess.Popen([REGISTRY_BINARY, "serve", str(registry_config(addr, read_only=True, tls=registry_tls()))],
                            stdout=log, stderr=subprocess.STDOUT)


def split_reference(ref: str) -> tuple[str, str]:
    """REGISTRY/PATH:TAG -> (PATH, TAG); a reference elsewhere is refused: the nodes reach only ours."""
    registry, _, rest = ref.partition("/")
    if registry != REGISTRY or "@" in rest or ":" not in rest:
        raise SystemExit(f"sim_images: {ref!r}: expected {REGISTRY}/PATH:TAG (Pulumi.sim.yaml must name this "
                         "registry by tag; the script pushes the digest)")
    path, tag = rest.rsplit(":", 1)
    return path, tag


# ---- running things ------------------------------------------------------------------------
def run(*argv, check=True, quiet=True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("text", True)
    proc = subprocess.run([str(a) for a in argv], capture_output=quiet, **kw)
    if check and proc.returncode != 0:
        out = [o.decode(errors="replace") if isinstance(o, bytes) else (o or "") for o in (proc.stderr, proc.stdout)]
        tail = "".join(out)[-2000:] if quiet else ""
        raise SystemExit(f"sim_images: `{' '.join(map(str, argv))[:300]}` failed ({proc.returncode}):\n{tail}")
    return proc


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} sim_images: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"sim_images: {what} not ready after {timeout_s:.0f}s")
        time.sleep(0.2)


def registry_config(addr: str, read_only: bool, tls: Optional[tuple[Path, Path]] = None) -> Path:
    storage = CACHE / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(storage)},
                    "maintenance": {"uploadpurging": {"enabled": False}, "readonly": {"enabled": read_only}}},
        "http": {"addr": addr, "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }
    if tls:
        config["http"]["tls"] = {"certificate": str(tls[0]), "key": str(tls[1])}
    path = CACHE / f"registry-{'read-only' if read_only else 'push'}.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass
class Registry:
    addr: str  # host:port
    tls: bool = False  # the served registry (serve_registry); the build's own push registry is plain HTTP

    def _open(self, request, timeout: float):
        if not self.tls:
            return urllib.request.urlopen(request, timeout=timeout)
        context = ssl.create_default_context(cafile=str(REGISTRY_CA))
        context.check_hostname = False  # reached by address here; the nodes check the name
        return urllib.request.urlopen(request, timeout=timeout, context=context)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.addr}"

    def manifest_digest(self, path: str, tag: str) -> Optional[str]:
        request = urllib.request.Request(
            f"{self.url}/v2/{path}/manifests/{tag}", method="HEAD",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
        try:
            with self._open(request, timeout=10) as response:
                return response.headers.get("Docker-Content-Digest")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def answers(self) -> bool:
        try:
            with self._open(f"{self.url}/v2/", timeout=2):
                return True
        except OSError:
            return False

    # what a registry's owner does between two deploys: push another image under a tag
    MANIFEST_TYPES = ("application/vnd.docker.distribution.manifest.v2+json",
                      "application/vnd.oci.image.manifest.v1+json")

    def _call(self, method: str, url: str, data: Optional[bytes] = None, headers: Optional[dict] = None):
        request = urllib.request.Request(url if "://" in url else self.url + url, data=data, method=method,
                                         headers=headers or {})
        with self._open(request, timeout=60) as response:
            return response.read(), response.headers

    def manifest(self, path: str, reference: str) -> tuple[bytes, str]:
        """A single-platform image's manifest (its bytes, its media type), by tag or digest."""
        body, headers = self._call("GET", f"/v2/{path}/manifests/{reference}",
                                   headers={"Accept": ", ".join(self.MANIFEST_TYPES)})
        kind = headers.get("Content-Type", "")
        if kind not in self.MANIFEST_TYPES:
            raise SystemExit(f"sim_images: {path}:{reference} is a {kind}, not one image's manifest")
        return body, kind

    def tag(self, path: str, tag: str, manifest: bytes, kind: str) -> str:
        """PATH:TAG names `manifest` from now on; returns its digest."""
        self._call("PUT", f"/v2/{path}/manifests/{tag}", data=manifest, headers={"Content-Type": kind})
        return "sha256:" + hashlib.sha256(manifest).hexdigest()

    def push_variant(self, path: str, tag: str, label: str, value: str, tags: list[str]) -> str:
        """Another image from PATH:TAG (its layers, one more label in its config) pushed under
        each of `tags`; returns its manifest digest."""
        body, kind = self.manifest(path, tag)
        manifest = json.loads(body)
        config = json.loads(self._call("GET", f"/v2/{path}/blobs/{manifest['config']['digest']}")[0])
        config.setdefault("config", {}).setdefault("Labels", {})[label] = value
        blob = json.dumps(config).encode()
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        _, upload = self._call("POST", f"/v2/{path}/blobs/uploads/")
        location = upload["Location"]
        self._call("PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", data=blob,
                   headers={"Content-Type": "application/octet-stream"})
        manifest["config"].update(digest=digest, size=len(blob))
        variant = json.dumps(manifest).encode()
        for name in tags:
            pushed = self.tag(path, name, variant, kind)
        return pushed


@contextlib.contextmanager
def push_registry() -> Iterator[Registry]:
    """The registry on a free loopback port, writable: loopback is insecure to docker by default."""
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([REGISTRY_BINARY, "serve", str(registry_config(addr, read_only=False))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        registry = Registry(addr)
        wait_for(lambda: proc.poll() is None and registry.answers(), f"the registry on {addr}", 30)
        yield registry
    finally:
        proc.terminate()
        proc.wait(timeout=30)
