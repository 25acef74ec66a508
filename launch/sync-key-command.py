"""sync-key-command.py — all that a sync key may do on the node that admits it (stdlib only).

The forced command of each sync key's authorization (authorize-key.sh; the line is rendered by
components/model_weights.render_authorized_key_line): sshd runs it for every session of that
key, whatever the client asked, and the client's request arrives in SSH_ORIGINAL_COMMAND. Its
flags are the authorization's own, fixed when the key was admitted: the model directory, the
copy's rails and port, the firewall set — a key holder can name none of them. Installed
root-owned beside weights.py (ModelWeights' `{worker}-weights-forced-command*` steps).

    python3 sync-key-command.py --node N --dir D --manifest M --record R --revision SHA --port P \\
        --hours H --firewall-set "FAMILY TABLE SET" --rail WORKER_IP=SOURCE_IP ... --image-repository REPO \\
        --state-dir .local/state/twinspark/weights-sync

The verbs (the client's command line; anything else is refused and nothing runs):
    nproc                the cores this node gives a session (the copy's stream count)
    image-id IMAGE       the ID of IMAGE (REPO:TAG only), or nothing (ship-image.sh)
    image-load           `docker load` of stdin (ship-image.sh)
    manifest             the manifest on stdin, into D/M (JSON of revision SHA only; sync-weights.sh)
    verify [--repair]    weights.py verify of D against it
    follow               weights.py verify --follow (stdin: the arrivals, then the copy's end),
                         then D's page cache released, detached
    daemons-start        the copy's rsync daemons, one per rail, its secret on stdin (48 letters
                         and digits); each rail's (source . destination) pair added to the firewall
                         set for the daemons' lifetime (--hours)
    daemons-stop         the daemons stopped, the pairs deleted
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WEIGHTS_PROGRAM = HERE / "weights.py"
sys.path.insert(0, str(HERE))  # weights.py beside it (root-owned, the same install): its write_json
import weights  # noqa: E402
MODULE, RSYNC_USER = "model", "twinspark"  # sync-weights.sh's send_stream names both
MAX_MANIFEST_BYTES = 64 << 20
VERBS = ("nproc", "image-id", "image-load", "manifest", "verify", "follow", "daemons-start",
         "daemons-stop")


class Refused(Exception):
    pass


def bound_flags(argv: list[str]) -> argparse.Namespace:
    """The authorization's flags (authorized_keys' command=), not the client's."""
    p = argparse.ArgumentParser(prog="sync-key-command.py")
    for flag in ("--node", "--dir", "--manifest", "--record", "--revision", "--firewall-set", "--image-repository"):
        p.add_argument(flag, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--hours", type=int, required=True)
    p.add_argument("--rail", action="append", required=True, help="WORKER_IP=SOURCE_IP, one per rail")
    p.add_argument("--state-dir", required=True, help="under the home: the daemons' configs, pid files, the secret")
    bound = p.parse_args(argv)
    bound.state = Path.home() / bound.state_dir
    return bound


def weights_argv(bound, *verb: str) -> list[str]:
    d = Path(bound.dir)
    return [sys.executable, str(WEIGHTS_PROGRAM), *verb, "--dir", str(d), "--manifest", str(d / bound.manifest),
            "--record", str(d / bound.record), "--node", bound.node]


def nproc() -> int:
    return len(os.sched_getaffinity(0))


def image_id(bound, image: str) -> int:
    if not re.fullmatch(re.escape(bound.image_repository) + r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", image):
        raise Refused(f"image-id takes an image {bound.image_repository}:TAG, not {image!r}")
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True)
    print(out.stdout.strip() if out.returncode == 0 else "")
    return 0


def inside(rel: str) -> bool:
    """A path the manifest may name: under the model directory (verify --repair removes what fails)."""
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts and "\0" not in rel


def write_manifest(bound) -> int:
    """The head's manifest, checked before it lands (weights.py reads it as the revision's truth)."""
    data = sys.stdin.buffer.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise Refused(f"the manifest is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(data)
        files = manifest["files"]
        ok = (manifest["revision"] == bound.revision and isinstance(files, dict)
              and all(inside(rel) for rel in files)
              and all(isinstance(e, dict) and isinstance(e.get("size"), int)
                      and re.fullmatch(r"[0-9a-f]{64}", str(e.get("sha256"))) for e in files.values()))
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise Refused(f"the manifest must be JSON {{revision: {bound.revision}, files: {{path: {{size, sha256}}}}}}, "
                      "every path inside the model directory")
    Path(bound.dir).mkdir(parents=True, exist_ok=True)
    # put in place whole, through a temp the extra-file check knows as ours (weights.is_bookkeeping)
    weights.write_json(Path(bound.dir) / bound.manifest, manifest)
    return 0


def follow(bound) -> int:
    status = subprocess.run(weights_argv(bound, "verify", "--follow"), stdin=sys.stdin, stdout=subprocess.DEVNULL).returncode
    # the copy's pages go as the disk takes them; the session does not wait on the disk
    subprocess.Popen([sys.executable, str(WEIGHTS_PROGRAM), "release-cache", "--dir", bound.dir,
                      "--manifest", str(Path(bound.dir) / bound.manifest), "--wait-for-disk"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    return status


def rails(bound) -> list[tuple[str, str]]:
    """(this node's address, the source's) per rail."""
    return [tuple(r.split("=", 1)) for r in bound.rail]


def firewall(verb: str, set_name: str, elements: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["sudo", "-n", "nft", verb, "element", *set_name.split(), "{ " + ", ".join(elements) + " }"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)


def rsyncd_config(bound, i: int, address: str, source: str) -> str:
    # rsyncd drops a root daemon to nobody; any other user keeps its own (and may not set one)
    as_root = "uid = 0\ngid = 0\n" if os.getuid() == 0 else ""
    return f"""pid file = {bound.state}/rsyncd-{i}.pid
address = {address}
port = {bound.port}
use chroot = no
reverse lookup = no
max connections = 64
{as_root}
[{MODULE}]
path = {bound.dir}
read only = no
list = no
auth users = {RSYNC_USER}
secrets file = {bound.state}/rsyncd.secrets
hosts allow = {source}
hosts deny = *
refuse options = delete remove-source-files
# twinspark's own files (the manifest, the record) are neither read nor written through the module
filter = - /.twinspark-*
"""


def listening(address: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def daemons_start(bound) -> int:
    secret = sys.stdin.readline().strip()
    if not re.fullmatch(r"[A-Za-z0-9]{48}", secret):
        raise Refused("daemons-start reads the copy's secret on stdin: 48 letters and digits")
    daemons_stop(bound)
    bound.state.mkdir(parents=True, exist_ok=True, mode=0o700)
    # each rail's (source . destination) pair, open as long as the daemons may live
    pairs = [f"{source} . {address}" for address, source in rails(bound)]
    (bound.state / "firewall").write_text(json.dumps(pairs))
    opened = firewall("add", bound.firewall_set, [f"{p} timeout {bound.hours}h" for p in pairs])
    if opened.returncode != 0:
        raise Refused(f"cannot open the copy's port in this node's firewall (nftables set {bound.firewall_set}: "
                      f"is HostPrep's table loaded?): {opened.stderr.strip()}")
    secrets = bound.state / "rsyncd.secrets"
    fd = os.open(secrets, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{RSYNC_USER}:{secret}\n")
    for i, (address, source) in enumerate(rails(bound)):
        config = bound.state / f"rsyncd-{i}.conf"
        config.write_text(rsyncd_config(bound, i, address, source))
        subprocess.Popen(["timeout", f"{bound.hours}h", "rsync", "--daemon", "--no-detach", f"--config={config}",
                          f"--log-file={bound.state}/rsyncd-{i}.log"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for address, _ in rails(bound):
        deadline = time.monotonic() + 10
        while not listening(address, bound.port):
            if time.monotonic() > deadline:
                logs = " ".join(p.read_text()[-300:] for p in sorted(bound.state.glob("rsyncd-*.log")))
                raise Refused(f"the rsync daemon on {address}:{bound.port} did not start: {logs}")
            time.sleep(0.1)
    return 0


def daemons_stop(bound) -> int:
    """SIGKILL: a daemon whose copy ended holds nothing to flush, and a TERM costs it 0.4 s to exit."""
    killed = []
    for pid_file in bound.state.glob("rsyncd-*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            # only the daemon that wrote it: the pid in a file a killed run left may have been reused since
            if f"--config={bound.state}/rsyncd-".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, 9)
                killed.append(pid)
        except (ValueError, OSError):
            pass
    for pid in killed:
        deadline = time.monotonic() + 2
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    for leftover in [*bound.state.glob("rsyncd-*.pid"), *bound.state.glob("rsyncd-*.conf"), bound.state / "rsyncd.secrets"]:
        leftover.unlink(missing_ok=True)
    # the port shuts: the pairs daemons-start opened (gone already where their timeout passed)
    opened = bound.state / "firewall"
    if opened.exists():
        pairs = json.loads(opened.read_text() or "[]")
        if pairs:
            firewall("delete", bound.firewall_set, pairs)
        opened.unlink()
    return 0


def run(bound, request: list[str]) -> int:
    verb, rest = (request[0], request[1:]) if request else ("", [])
    if verb == "nproc" and not rest:
        print(nproc())
        return 0
    if verb == "image-id" and len(rest) == 1:
        return image_id(bound, rest[0])
    if verb == "image-load" and not rest:
        return subprocess.run(["docker", "load", "--quiet"], stdin=sys.stdin).returncode
    if verb == "manifest" and not rest:
        return write_manifest(bound)
    if verb == "verify" and rest in ([], ["--repair"]):
        return subprocess.run(weights_argv(bound, "verify", *rest), stdin=subprocess.DEVNULL).returncode
    if verb == "follow" and not rest:
        return follow(bound)
    if verb == "daemons-start" and not rest:
        return daemons_start(bound)
    if verb == "daemons-stop" and not rest:
        return daemons_stop(bound)
    raise Refused(f"this key only copies weights: refused {shlex.join(request) or 'a login'!r} "
                  f"(it may run: {', '.join(VERBS)})")


def main(argv=None) -> int:
    bound = bound_flags(sys.argv[1:] if argv is None else argv)
    try:
        request = shlex.split(os.environ.get("SSH_ORIGINAL_COMMAND", ""))
    except ValueError:
        request = [os.environ.get("SSH_ORIGINAL_COMMAND", "")]
    try:
        return run(bound, request)
    except Refused as refused:
        print(f"{bound.node}: {refused}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
