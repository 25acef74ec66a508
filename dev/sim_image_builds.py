"""sim_image_builds.py — how each of the sim's images is built, and the key of its inputs: the serving
base (debootstrap, the serving lock's wheels, the stand-ins), the monitoring servers from Debian's
packages, the stand-ins built from Go (in private_dockerd.py's dockerd, never the system's).
A recipe's key hashes its inputs and its build functions' source: an edit here rebuilds
what it touches (sim_images.py decides what to build and pushes it)."""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from components.config import SERVING_IMAGE_LOCK, StackConfig
from components.config.values import LOADER_LOCK
from private_dockerd import Docker
from sim_registry import CACHE, ROOT, Registry, log, run, sim_ca, split_reference

STANDINS = ROOT / "tests" / "sim" / "images"
# torch as far as the NCCL check asks (tests/sim/images/torch-standin/torch/__init__.py says what it is)
TORCH_STANDIN = STANDINS / "torch-standin"

# Debian's docker.io pair: the CLI on PATH may be another (newer, BuildKit-only) one
DEBIAN_MIRROR, SUITE = "http://deb.debian.org/debian", "bookworm"
BASE_PACKAGES = ("python3", "python3-pip", "nginx")
PYTHON_SITE = "/usr/local/lib/python3.11/dist-packages"  # bookworm's python3 is 3.11
SIM_CA_IN_IMAGE = "/etc/twinspark-sim/ca.crt"
# Ray's libraries that neither the stand-ins nor Ray's core, dashboard or agents import (the
# dashboard's Serve, Data and Train routes import theirs only when asked), its Java workers'
# jars, then (make_rootfs) py-spy and the dashboard's source maps: ~90 MB of the base's ~490 that
# every node's pull, every image ship and every load extracted and hashed for nothing (the real
# serving image is NVIDIA's and keeps all of Ray)
RAY_UNUSED_IN_THE_SIM = tuple(f"{PYTHON_SITE.lstrip('/')}/ray/{lib}"
                              for lib in ("jars", "rllib", "tune", "train", "serve", "data", "llm"))
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NOBODY = 65534


def debian_version(tag: str) -> str:
    """A Debian image's tag is the package's version with '+' as '_' (docker tags have no '+')."""
    return tag.replace("_", "+")


# ---- keys ------------------------------------------------------------------------------------
def key_of(*parts) -> str:
    """sha256 over the inputs: text, bytes, files and directories (by content), functions (by source)."""
    h = hashlib.sha256()

    def feed(part) -> None:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
                if part.is_dir() else [part]
            for f in files:
                h.update(str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f.name).encode() + b"\0")
                h.update(f.read_bytes() + b"\0")
        elif callable(part):
            h.update(inspect.getsource(part).encode() + b"\0")
        elif isinstance(part, (list, tuple)):
            for p in part:
                feed(p)
        else:
            h.update(str(part).encode() + b"\0")

    feed(parts)
    return h.hexdigest()


# ---- the recipes -----------------------------------------------------------------------------
@dataclass
class ImageRecipe:
    ref: str  # as the stack names it: REGISTRY/PATH:TAG
    key: str
    build: Callable[["Docker", "Registry", str], None]  # (docker, registry, local ref) -> built and pushed
    path: str = field(init=False)
    tag: str = field(init=False)

    def __post_init__(self):
        self.path, self.tag = split_reference(self.ref)

    @property
    def stamp(self) -> Path:
        return CACHE / "stamps" / (self.path.replace("/", "+") + "@" + self.tag + ".json")

    def pushed_digest(self, registry: Registry) -> Optional[str]:
        """The digest the registry serves for this key, or None: built from other inputs, or gone."""
        try:
            stamp = json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return None
        served = registry.manifest_digest(self.path, self.tag)
        return served if stamp.get("key") == self.key and served == stamp.get("digest") else None


def arch_of(platform: str) -> str:
    os_name, arch = platform.split("/", 1)
    if arch != "amd64" or os_name != "linux":
        raise SystemExit(f"sim_images: serving.platform {platform!r}: this machine builds linux/amd64 only (no emulation)")
    return arch


def download_wheels(lock: Path, dest: Path) -> None:
    """Every package of the serving image's lock (Ray and its [default] deps, at the lock's versions,
    checked against its hashes) as cp311 manylinux wheels, fetched by this machine's pip (its trust,
    its proxy settings): the image itself never reaches an index."""
    if (dest / ".complete").exists():
        return
    platforms = [f"manylinux_2_{v}_x86_64" for v in range(36, 16, -1)] + ["manylinux2014_x86_64"]
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}  # PyPI's wheels, not a local pile
    run(sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", "3.11",
        "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
        *[a for p in platforms for a in ("--platform", p)], "--progress-bar", "off", "-d", dest,
        "--require-hashes", "-r", lock, env=env)
    (dest / ".complete").touch()


def hub_requirement() -> str:
    """huggingface_hub==V as requirements-dev.txt pins it: the image runs the client the tests run."""
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement.lower().replace("-", "_").startswith("huggingface_hub=="):
            return requirement
    raise SystemExit("sim_images: requirements-dev.txt pins no huggingface_hub==VERSION")


def download_layer_wheels(dest: Path, *requirements: str) -> None:
    """As download_wheels (left as it is: its source keys the rootfs), for the stand-ins' layer:
    pip's REQUIREMENTS arguments (a requirement, or `--no-deps --require-hashes -r LOCK`)."""
    if (dest / ".complete").exists():
        return
    platforms = [f"manylinux_2_{v}_x86_64" for v in range(36, 16, -1)] + ["manylinux2014_x86_64"]
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    run(sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", "3.11",
        "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
        *[a for p in platforms for a in ("--platform", p)], "--progress-bar", "off", "-d", dest, *requirements,
        env=env)
    (dest / ".complete").touch()


def make_rootfs(lock: Path, apt_packages: list[str], arch: str, wheels: Path, out: Path) -> None:
    """debootstrap minbase + BASE_PACKAGES, the lock from the wheels, then what makes it offline and
    small. The serving Dockerfile's locked install finds all of it there at the versions it names:
    pip the lock's (else it would reach for an index), apt serving.aptPackages' (checked here)."""
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=CACHE) as tmp:
        root = Path(tmp) / "root"
        run("nice", "-n", "19", "debootstrap", "--variant=minbase", f"--arch={arch}",
            f"--include={','.join(BASE_PACKAGES)}", SUITE, root, DEBIAN_MIRROR)
        installed = set(run("chroot", root, "dpkg-query", "-W", "-f", "${Package}=${Version}\\n").stdout.split())
        missing = [p for p in apt_packages if p not in installed]
        if missing:
            found = sorted(i for i in installed if i.split("=", 1)[0] in {p.split("=", 1)[0] for p in missing})
            raise SystemExit(f"sim_images: {SUITE} now serves {', '.join(found) or 'none of them'}, the sim stack "
                             f"names {', '.join(missing)}: set serving.aptPackages in Pulumi.sim.yaml to what "
                             "Debian serves")
        # the serving Dockerfile's plain `pip install` (PEP 668 would refuse it on Debian's python)
        (root / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink()
        (root / "tmp/wheels").mkdir()
        run("mount", "--bind", wheels, root / "tmp/wheels")
        shutil.copy(lock, root / "tmp/serving-lock.txt")
        try:
            run("nice", "-n", "19", "unshare", "--net", "chroot", root, "/usr/bin/env", "-i", f"PATH={DEFAULT_PATH}",
                "HOME=/root", "pip", "install", "--no-index", "--find-links", "/tmp/wheels", "--no-cache-dir",
                "--no-warn-script-location", "--progress-bar", "off", "--require-hashes", "-r",
                "/tmp/serving-lock.txt")
        finally:
            run("umount", root / "tmp/wheels")
        (root / "tmp/wheels").rmdir()
        (root / "tmp/serving-lock.txt").unlink()
        # no apt source, no package lists: `apt-get update` reads nothing and succeeds offline
        (root / "etc/apt/sources.list").write_text("")
        for junk in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/info",
                     "usr/share/locale", "var/log", *RAY_UNUSED_IN_THE_SIM):
            shutil.rmtree(root / junk, ignore_errors=True)
        for unused in (root / "usr/local/bin/py-spy", *(root / PYTHON_SITE.lstrip("/") / "ray/dashboard/client")
                       .rglob("*.map")):
            unused.unlink()
        (root / "var/lib/apt/lists/partial").mkdir(parents=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        (root / "var/log/apt").mkdir(parents=True)
        (root / "etc/resolv.conf").unlink(missing_ok=True)  # docker mounts its own
        (root / "etc/hostname").write_text("")
        partial = out.with_suffix(".partial")
        run("tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", partial, ".")
        partial.rename(out)


def base_recipe(stack: StackConfig) -> ImageRecipe:
    ray, arch = stack.serving.ray_version, arch_of(stack.serving.platform)
    apt_packages = list(stack.serving.apt_packages)
    rootfs_key = key_of(SUITE, DEBIAN_MIRROR, BASE_PACKAGES, SERVING_IMAGE_LOCK, apt_packages, arch, make_rootfs,
                        download_wheels, RAY_UNUSED_IN_THE_SIM)
    hub = hub_requirement()
    # the hub stand-in is served over https with a certificate of the sim's CA: the base trusts it
    # alone (SSL_CERT_FILE, which huggingface_hub's HTTP client reads), as a Spark's image trusts the hub's
    ca = sim_ca()
    standins = (ROOT / "tests/sim/bin/vllm", ROOT / "tests/openai_standin.py", TORCH_STANDIN, hub, download_layer_wheels,
                ca, LOADER_LOCK)

    def build(docker: Docker, registry: Registry, local: str) -> None:
        rootfs = CACHE / "rootfs" / f"{rootfs_key[:16]}.tar"
        if not rootfs.exists():
            rootfs.parent.mkdir(parents=True, exist_ok=True)
            wheels = CACHE / "wheels" / f"serving-lock-{key_of(SERVING_IMAGE_LOCK)[:16]}-cp311-{arch}"
            log(f"downloading {SERVING_IMAGE_LOCK.name} (Ray {ray} [default]) wheels into {wheels}")
            download_wheels(SERVING_IMAGE_LOCK, wheels)
            log(f"debootstrap {SUITE} minbase + {', '.join(BASE_PACKAGES)} + {SERVING_IMAGE_LOCK.name}")
            make_rootfs(SERVING_IMAGE_LOCK, apt_packages, arch, wheels, rootfs)
        rootfs_image = f"twinspark-sim/base-rootfs:{rootfs_key[:16]}"
        log(f"importing {rootfs.name} as {rootfs_image}")
        with open(rootfs, "rb") as tar:
            docker("import", "--platform", stack.serving.platform, "--change", f"ENV PATH={DEFAULT_PATH}",
                   "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["/bin/bash"]', "-", rootfs_image, stdin=tar,
                   text=False)
        with tempfile.TemporaryDirectory(prefix="base-", dir=CACHE) as ctx:
            ctx = Path(ctx)
            shutil.copy(ROOT / "tests/sim/bin/vllm", ctx / "vllm")
            shutil.copy(ROOT / "tests/openai_standin.py", ctx / "openai_standin.py")
            shutil.copy(ca, ctx / "sim-ca.crt")
            shutil.copytree(TORCH_STANDIN, ctx / "torch-standin", ignore=shutil.ignore_patterns("__pycache__"))
            wheels = CACHE / "wheels" / f"{hub.replace('==', '-')}-cp311-{arch}"
            log(f"downloading {hub} wheels into {wheels}")
            download_layer_wheels(wheels, hub)
            shutil.copytree(wheels, ctx / "hub-wheels", ignore=shutil.ignore_patterns(".complete"))
            # the weight loaders the serving Dockerfile installs where its base lacks them: held here,
            # so its locked install finds them (the sim's nodes reach no index), as a vLLM image would
            wheels = CACHE / "wheels" / f"loader-lock-{key_of(LOADER_LOCK)[:16]}-cp311-{arch}"
            log(f"downloading {LOADER_LOCK.name} wheels into {wheels}")
            download_layer_wheels(wheels, "--no-deps", "--require-hashes", "-r", str(LOADER_LOCK))
            shutil.copytree(wheels, ctx / "loader-wheels", ignore=shutil.ignore_patterns(".complete"))
            shutil.copy(LOADER_LOCK, ctx / LOADER_LOCK.name)
            # the stand-ins and the hub client on python's path and PATH, apart from the rootfs:
            # a change to them rebuilds this small layer only (pip: from the wheels, no index)
            (ctx / "Dockerfile").write_text(
                f"FROM {rootfs_image}\n"
                f"COPY openai_standin.py {PYTHON_SITE}/openai_standin.py\n"
                f"COPY torch-standin {PYTHON_SITE}/\n"
                "COPY hub-wheels /tmp/hub-wheels\n"
                "RUN pip install --no-index --find-links /tmp/hub-wheels --no-cache-dir --no-warn-script-location "
                f"--progress-bar off '{hub}' && rm -rf /tmp/hub-wheels\n"
                f"COPY loader-wheels /tmp/loader-wheels\nCOPY {LOADER_LOCK.name} /tmp/{LOADER_LOCK.name}\n"
                "RUN pip install --no-index --find-links /tmp/loader-wheels --no-cache-dir --no-deps --require-hashes "
                f"--progress-bar off -r /tmp/{LOADER_LOCK.name} && rm -rf /tmp/loader-wheels /tmp/{LOADER_LOCK.name}\n"
                "COPY vllm /usr/local/bin/vllm\n"
                f"COPY sim-ca.crt {SIM_CA_IN_IMAGE}\n"
                f"ENV SSL_CERT_FILE={SIM_CA_IN_IMAGE}\n"
                "LABEL org.opencontainers.image.description=\"twinspark sim serving base: Debian bookworm, "
                f"ray[default]=={ray}, nginx, {hub}, the weight loaders, the vLLM and torch STAND-INs\"\n")
            docker("build", "--network", "none", "--platform", stack.serving.platform, "-t", local, ctx)
        docker("image", "rm", rootfs_image)

    return ImageRecipe(stack.serving.image, key_of(rootfs_key, standins, build), build)


def apt_download(package: str, version: str) -> Path:
    """One .deb from Debian's archive, kept in the cache (the mirror drops superseded versions)."""
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = [p for p in debs.glob(f"{package}_*.deb")
             if run("dpkg-deb", "-f", p, "Version").stdout.strip() == version]
    if found:
        return found[0]
    run("apt-get", "download", f"{package}={version}", cwd=debs)
    return next(p for p in debs.glob(f"{package}_*.deb") if run("dpkg-deb", "-f", p, "Version").stdout.strip() == version)


def installed_version(package: str) -> str:
    return run("dpkg-query", "-W", "-f", "${Version}", package).stdout.strip()


def minimal_root(root: Path, runtime_libc: Optional[Path]) -> None:
    """What a Go binary needs: users (root, nobody), /tmp, name resolution, and libc if it links it."""
    for d in ("etc", "tmp", "bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc/passwd").write_text(f"root:x:0:0:root:/root:/bin/false\nnobody:x:{NOBODY}:{NOBODY}:nobody:/:/bin/false\n")
    (root / "etc/group").write_text(f"root:x:0:\nnogroup:x:{NOBODY}:\n")
    (root / "etc/nsswitch.conf").write_text("hosts: files dns\n")
    if runtime_libc:
        with tempfile.TemporaryDirectory() as tmp:
            run("dpkg-deb", "-x", runtime_libc, tmp)
            lib = Path(tmp) / "lib/x86_64-linux-gnu"
            (root / "lib/x86_64-linux-gnu").mkdir(parents=True)
            (root / "lib64").mkdir()
            shutil.copy(lib / "libc.so.6", root / "lib/x86_64-linux-gnu/libc.so.6")
            shutil.copy(lib / "ld-linux-x86-64.so.2", root / "lib64/ld-linux-x86-64.so.2")


def import_root(docker: Docker, root: Path, local: str, platform: str, changes: list[str],
                owners: dict[str, int]) -> None:
    """The directory as one layer; `owners` gives paths (relative) to the uid that owns them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
            uid = owners.get(info.name.removeprefix("./"), 0)
            info.uid, info.gid, info.uname, info.gname = uid, uid, "", ""
            return info

        tar.add(root, arcname=".", filter=owned)
    args = [a for c in changes for a in ("--change", c)]
    docker("import", "--platform", platform, *args, "-", local, input=buffer.getvalue(), text=False)


@dataclass(frozen=True)
class DebianServer:
    """A monitoring image from Debian's package: its binary as the upstream image's entrypoint."""
    package: str
    binary: str  # in the package, /usr/bin/...
    entrypoint: str  # where the upstream image has it
    workdir: Optional[str] = None  # the upstream image's data directory, nobody's
    extra: tuple[str, ...] = ()  # more of the package (the web UI's files)


DEBIAN_SERVERS = {
    "prometheus": DebianServer("prometheus", "usr/bin/prometheus", "/bin/prometheus", "/prometheus",
                               ("usr/share/prometheus", "etc/prometheus/consoles", "etc/prometheus/console_libraries")),
    "alertmanager": DebianServer("prometheus-alertmanager", "usr/bin/prometheus-alertmanager", "/bin/alertmanager",
                                 "/alertmanager", ("usr/share/prometheus/alertmanager",)),
    "node_exporter": DebianServer("prometheus-node-exporter", "usr/bin/prometheus-node-exporter",
                                  "/bin/node_exporter"),
}


def debian_recipe(ref: str, server: DebianServer, platform: str) -> ImageRecipe:
    version = debian_version(split_reference(ref)[1])
    libc_version = installed_version("libc6")  # this machine is bookworm: the libc the binaries were built for

    def build(docker: Docker, registry: Registry, local: str) -> None:
        deb, libc = apt_download(server.package, version), apt_download("libc6", libc_version)
        with tempfile.TemporaryDirectory(prefix="debian-", dir=CACHE) as tmp:
            unpacked, root = Path(tmp) / "deb", Path(tmp) / "root"
            run("dpkg-deb", "-x", deb, unpacked)
            minimal_root(root, libc)
            target = root / server.entrypoint.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(unpacked / server.binary, target)
            for part in server.extra + (f"usr/share/doc/{server.package}/copyright",):
                source = unpacked / part
                if source.is_dir():
                    shutil.copytree(source, root / part, symlinks=True)
                elif source.exists():
                    (root / part).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(source, root / part)
            owners = {}
            if server.workdir:
                (root / server.workdir.lstrip("/")).mkdir(parents=True)
                owners[server.workdir.lstrip("/")] = NOBODY
            changes = [f'ENTRYPOINT ["{server.entrypoint}"]', f"USER {NOBODY}", f"ENV PATH={DEFAULT_PATH}",
                       f'LABEL org.opencontainers.image.description="Debian {server.package} {version}"']
            if server.workdir:
                changes.append(f"WORKDIR {server.workdir}")
            import_root(docker, root, local, platform, changes, owners)

    return ImageRecipe(ref, key_of(server, version, libc_version, platform, build, minimal_root, import_root), build)


@dataclass(frozen=True)
class Standin:
    """A stand-in built from tests/sim/images/NAME: a static Go binary where the upstream image has its entrypoint."""
    source: str
    binary: str
    entrypoint: tuple[str, ...]
    user: str
    dirs: tuple[tuple[str, int], ...] = ()  # (path, owner uid)


STANDIN_IMAGES = {
    # grafana/grafana: `grafana` on PATH (grafana-admin-password.sh execs `grafana cli`), uid 472 in group root
    "grafana": Standin("grafana-standin", "/usr/share/grafana/bin/grafana",
                       ("/usr/share/grafana/bin/grafana", "server"), "472:0",
                       (("var/lib/grafana", 472), ("etc/grafana", 0))),
    "gpu_exporter": Standin("gpu-exporter-standin", "/usr/bin/nvidia_gpu_exporter",
                            ("/usr/bin/nvidia_gpu_exporter",), "0:0"),
}


def standin_recipe(ref: str, standin: Standin, platform: str) -> ImageRecipe:
    source = STANDINS / standin.source

    def build(docker: Docker, registry: Registry, local: str) -> None:
        with tempfile.TemporaryDirectory(prefix="standin-", dir=CACHE) as tmp:
            root = Path(tmp) / "root"
            minimal_root(root, None)
            target = root / standin.binary.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": arch_of(platform),
                   "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
            run("go", "build", "-trimpath", "-ldflags=-s -w", "-o", target, source / "main.go", env=env, cwd=tmp)
            owners = {}
            for path, uid in standin.dirs:
                (root / path).mkdir(parents=True, exist_ok=True)
                owners[path] = uid
            search_path = f"{Path(standin.binary).parent}:{DEFAULT_PATH}"
            changes = [f"ENTRYPOINT {json.dumps(list(standin.entrypoint))}", f"USER {standin.user}",
                       f"ENV PATH={search_path}",
                       f'LABEL org.opencontainers.image.description="STAND-IN ({standin.source}), not the real image"']
            import_root(docker, root, local, platform, changes, owners)

    go_version = run("go", "env", "GOVERSION").stdout.strip()
    return ImageRecipe(ref, key_of(source, standin, go_version, platform, build, minimal_root, import_root), build)


def recipes(stack: StackConfig) -> list[ImageRecipe]:
    images, platform = stack.observability.images, stack.serving.platform
    return ([base_recipe(stack)]
            + [debian_recipe(getattr(images, name), server, platform) for name, server in DEBIAN_SERVERS.items()]
            + [standin_recipe(getattr(images, name), standin, platform) for name, standin in STANDIN_IMAGES.items()])
