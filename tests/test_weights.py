"""The weights for real, without the simulator: the program's own command lines and stdin
(script_command / runner_stdin over ModelWeights' args), real rsync daemons, real sha256.

- the fetch: fetch-weights.sh with tests/docker_run_standin for `docker run` (weights.py with
  the container's -e environment), the real huggingface_hub (requirements-dev.txt) talking to the Hub's HTTP API
  as tests/hub_standin.py serves it from a local directory (model.hubEndpoint -> HF_ENDPOINT);
- the copy: two network namespaces, "head" and "worker", joined by two veth rails (the
  cable); sshd on the worker's first rail, in a mount namespace of its own where the model
  directory is another folder at the same path and the forced command's folder holds
  launch/sync-key-command.py and weights.py, with the sync key authorized as the program does
  (render_authorized_key_line of forced_command).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from core import contract
from hub_standin import HubStandin
from program_harness import stack_config
from components import firewall, model_weights, remote
from components.config import Topology, parse_stack_config, resolve_node_addresses
from components.config import CopyRail
from components.model_weights import ModelWeightsArgs, NodeAccess
from components.remote import launch_file, runner_stdin, script_command, script_text
from toolbox import load_launch, sh, wait_for

ROOT = Path(__file__).resolve().parent.parent
DOCKER_RUN_STANDIN = ROOT / "tests" / "docker_run_standin"
REPO = "org/model"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_bit(path: Path, offset: int) -> None:
    """One bit, size unchanged (mtime and ctime move, as with any write)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def make_model(root: Path, shards: int, shard_mb: int) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for i, name in enumerate(names):
        with open(root / name, "wb") as f:  # sizes differ: the plan must balance them
            f.write(os.urandom((shard_mb << 20) + i * 4096))
    (root / "config.json").write_text(json.dumps({"num_attention_heads": 64, "num_key_value_heads": 8}))
    (root / "tokenizer.json").write_text(json.dumps({"vocab": list(range(2000))}))
    return names


@dataclass
class Head:
    """The head's side: a HOME, the model directory, a PATH whose `docker` is the run stand-in, the hub."""

    home: Path
    dir: Path
    hub: Path
    bin: Path
    endpoint: str  # model.hubEndpoint: the stand-in's
    netns: str | None = None

    def env(self) -> dict:
        # the stand-in's "container" runs this interpreter: it has the real huggingface_hub
        return {"HOME": str(self.home), "PATH": f"{self.bin}:{PATH}", "DOCKER_STANDIN_PYTHON": sys.executable,
                "DOCKER_STANDIN_LOG": str(self.docker_calls)}

    @property
    def docker_calls(self) -> Path:
        return self.home / "docker-calls.log"

    def run(self, script: str, args, secrets=(), payload="", timeout=300, background=False):
        """The runner's command line and stdin, as pulumi-command sends them to the head."""
        secret_env = {"fetch-weights.sh": ["HF_TOKEN"], "sync-weights.sh": []}[script]
        line = script_command(script, args, secret_env)
        stdin = runner_stdin(list(secrets), script_text(script), payload or launch_file(model_weights.WEIGHTS_PROGRAM))
        argv = (["ip", "netns", "exec", self.netns] if self.netns else []) + ["env", "-i", *(
            f"{k}={v}" for k, v in self.env().items()), "bash", "-c", line]
        if background:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            proc.stdin.write(stdin)
            proc.stdin.close()
            return proc
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)


def weights_args(head_dir: Path, workers=(), revision=None, endpoint="https://huggingface.co",
                 memory_fit=()) -> ModelWeightsArgs:
    return ModelWeightsArgs(
        repo=REPO, revision=revision, dir=str(head_dir), downloader_image="twinspark-sim/base:local", ssh_user="root",
        head=NodeAccess("spark1", None), workers=list(workers),
        hf_token=None, tensor_parallel_size=2, gpu_memory_utilization=0.85,
        hub_endpoint=endpoint, memory_fit=memory_fit)


WORKER = NodeAccess("spark2", None, [CopyRail("10.0.0.2", "10.0.0.1"), CopyRail("10.0.1.2", "10.0.1.1")])


def resolve(head: Head, revision=None):
    args = model_weights.revision_args(weights_args(head.dir, revision=revision, endpoint=head.endpoint),
                                       "spark1-weights-revision")
    return head.run("fetch-weights.sh", args, secrets=["hf_token"])


def fetch(head: Head, revision: str, memory_fit=()):
    args = model_weights.fetch_args(weights_args(head.dir, endpoint=head.endpoint, memory_fit=memory_fit), revision)
    return head.run("fetch-weights.sh", args, secrets=["hf_token"], payload=model_weights.fetch_payload())


@pytest.fixture
def home():
    """The head's HOME, short: ssh's ControlPath (a unix socket under ~/.ssh) must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="tw-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


@pytest.fixture
def hub(tmp_path):
    """The Hub's API over tmp_path/hub (one folder per repo), on a free port of this machine."""
    (tmp_path / "hub").mkdir()
    with HubStandin(tmp_path / "hub") as standin:
        yield standin


def fetched_head(tmp_path: Path, home: Path, hub: HubStandin, shards=6, shard_mb=8) -> tuple[Head, str]:
    head = Head(home, tmp_path / "models" / "model", tmp_path / "hub", tmp_path / "bin", hub.endpoint)
    head.bin.mkdir()
    (head.bin / "docker").symlink_to(DOCKER_RUN_STANDIN)
    make_model(head.hub / REPO, shards, shard_mb)
    out = resolve(head)
    assert out.returncode == 0, out.stdout + out.stderr
    revision = model_weights.parse_revision(out.stdout)
    out = fetch(head, revision)
    assert out.returncode == 0, out.stdout + out.stderr
    return head, revision


def manifest(head: Head) -> dict:
    return json.loads((head.dir / contract.WEIGHTS_MANIFEST).read_text())


# ---- the fetch: a pinned revision, checked against the hub ---------------------------------------
def test_fetch_pins_the_revision_and_checks_every_file_against_the_hub(tmp_path, home, hub):
    head, revision = fetched_head(tmp_path, home, hub)
    pinned = manifest(head)
    assert pinned["revision"] == revision and pinned["repo"] == REPO
    for name in ("config.json", "tokenizer.json", "model-00003-of-00006.safetensors"):
        assert pinned["files"][name]["sha256"] == sha256(head.hub / REPO / name)
    # the small files were checked against their git blob id: what git itself computes
    hub_listing = json.loads((head.dir / ".twinspark-hub.json").read_text())
    assert hub_listing["files"]["config.json"]["sha256"] is None
    assert hub_listing["files"]["config.json"]["blob_id"] == sh("git", "hash-object", head.dir / "config.json").stdout.strip()

    again = fetch(head, revision)
    assert "nothing to download" in again.stdout and "verified" not in again.stderr  # nothing re-hashed
    assert "hashed" not in again.stdout + again.stderr

    # the revision is kept: a hub that moved on changes nothing until the step is replaced
    (head.hub / REPO / "extra.json").write_text("{}")
    kept = resolve(head)
    assert "kept:" in kept.stdout and model_weights.parse_revision(kept.stdout) == revision
    forget = head.run("fetch-weights.sh", ["forget", "--owner", "spark1-weights-revision"], secrets=["hf_token"])
    assert forget.returncode == 0, forget.stderr
    moved = model_weights.parse_revision(resolve(head).stdout)
    assert moved != revision
    # asking for a commit the hub does not have fails, naming it (the hub's words, through the client)
    absent = resolve(head, revision="f" * 40)
    assert absent.returncode != 0 and "Invalid rev id: " + "f" * 40 in absent.stdout + absent.stderr
    assert "huggingface_hub.errors.RevisionNotFoundError" in absent.stderr, absent.stderr


def test_the_download_refuses_programs_not_framed_before_touching_the_model(tmp_path, home, hub):
    """download reads two programs (remote.payloads); one sent bare, as before the split, is named
    as the wrong input and nothing is downloaded."""
    head, revision = fetched_head(tmp_path, home, hub, shards=2)
    shutil.rmtree(head.dir)
    args = model_weights.fetch_args(weights_args(head.dir, endpoint=head.endpoint), revision)
    bare = head.run("fetch-weights.sh", args, secrets=["hf_token"], payload=launch_file(model_weights.WEIGHTS_PROGRAM))
    assert bare.returncode != 0
    assert "model-shape.py must follow the script on stdin, behind its size" in bare.stdout + bare.stderr
    short = model_weights.fetch_payload()[:-100]
    cut = head.run("fetch-weights.sh", args, secrets=["hf_token"], payload=short)
    assert cut.returncode != 0 and "weights.py ended early on stdin" in cut.stdout + cut.stderr
    assert not head.dir.exists()


def test_a_commit_the_head_has_moved_past_still_fetches_as_it_was(tmp_path, home, hub):
    """The rollback's premise (ops upgrade writes back the commit that served): the hub's main
    moved on, and the earlier commit, asked for by id, is what it was: its files and no others."""
    head, first = fetched_head(tmp_path, home, hub, shards=2)
    (head.hub / REPO / "notes.md").write_text("a later commit\n")
    head.run("fetch-weights.sh", ["forget", "--owner", "spark1-weights-revision"], secrets=["hf_token"])
    second = model_weights.parse_revision(resolve(head).stdout)  # the head as it is now
    assert second != first
    moved = fetch(head, second)
    assert moved.returncode == 0 and manifest(head)["revision"] == second and (head.dir / "notes.md").exists()
    back = fetch(head, first)
    assert back.returncode == 0, back.stdout + back.stderr
    assert manifest(head)["revision"] == first and "notes.md" not in manifest(head)["files"]


def test_fetch_of_a_revision_the_hub_lacks_fails_with_the_clients_error_and_keeps_the_files(tmp_path, home, hub):
    head, revision = fetched_head(tmp_path, home, hub, shards=2)
    before = {p.name: sha256(p) for p in head.dir.glob("*.json")} | {
        p.name: sha256(p) for p in head.dir.glob("*.safetensors")}
    out = fetch(head, "e" * 40)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "huggingface_hub.errors.RevisionNotFoundError" in text and "Invalid rev id: " + "e" * 40 in text, text
    assert f"the hub did not answer the shape check of {REPO}@{'e' * 40}" in text  # asked before any download
    assert {name: sha256(head.dir / name) for name in before} == before  # nothing fetched, nothing removed


def test_the_token_reaches_the_hub_and_never_the_cdn(tmp_path, home, hub):
    """HF_TOKEN (stdin -> docker -e) is sent on the hub's API; the LFS redirect leaves it behind."""
    fetched_head(tmp_path, home, hub, shards=2)
    api = [r for r in hub.requests if not r[1].startswith("/lfs/")]
    cdn = [r for r in hub.requests if r[1].startswith("/lfs/")]
    assert api and all(token for _, _, token in api), api
    assert len(cdn) == 2 and not any(token for _, _, token in cdn), cdn  # the two shards, from the CDN origin


def test_fetch_repairs_a_damaged_file_on_the_head(tmp_path, home, hub):
    head, revision = fetched_head(tmp_path, home, hub)
    shard = head.dir / "model-00002-of-00006.safetensors"
    # damaged with its mtime kept: the hub client trusts its own record of a file whose mtime is
    # within a second of that record (huggingface_hub _local_folder.py) and downloads nothing, so the
    # pin's sha256 must catch it and fetch again. A later mtime made the client fetch it by itself,
    # on a loaded machine only (the cold CI rehearsal of 77a4caf): the path this test is for unwalked
    mtime_ns = shard.stat().st_mtime_ns
    flip_bit(shard, 12345)
    os.utime(shard, ns=(mtime_ns, mtime_ns))
    out = fetch(head, revision)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert "FAIL spark1: model-00002-of-00006.safetensors: sha256 " in text, text
    assert "downloading them again" in text
    assert sha256(shard) == manifest(head)["files"][shard.name]["sha256"]


def rot_below_the_filesystem(root: Path, rel: str, offset: int) -> None:
    """A bit flipped with the record made to agree with the file's stat again: what the disk does
    when a bit rots under the filesystem (size, mtime, ctime and inode all as they were)."""
    flip_bit(root / rel, offset)
    record_path = root / contract.WEIGHTS_RECORD
    record = json.loads(record_path.read_text())
    st = (root / rel).stat()
    record["files"][rel].update(size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino)
    record_path.write_text(json.dumps(record))


def weights_verify(head: Head, *flags: str) -> subprocess.CompletedProcess:
    return sh(sys.executable, ROOT / "launch" / "weights.py", "verify", *flags, "--dir", head.dir,
              "--manifest", head.dir / contract.WEIGHTS_MANIFEST, "--record", head.dir / contract.WEIGHTS_RECORD,
              "--node", "spark1", check=False)


def test_a_bit_rotten_below_the_filesystem_is_found_only_by_a_full_verify_and_the_next_fetch_repairs_it(
        tmp_path, home, hub):
    head, revision = fetched_head(tmp_path, home, hub)
    rotten = "model-00003-of-00006.safetensors"
    rot_below_the_filesystem(head.dir, rotten, 777)
    trusting = weights_verify(head)
    assert trusting.returncode == 0 and trusting.stdout == "", trusting  # the record vouches for it
    full = weights_verify(head, "--full")
    assert full.returncode == 1, full
    assert f"FAIL spark1: {rotten}: sha256 {sha256(head.dir / rotten)}, expected " in full.stderr, full.stderr
    assert "spark1: hashed 8 files: " in full.stderr, full.stderr
    assert rotten not in json.loads((head.dir / contract.WEIGHTS_RECORD).read_text())["files"]
    # the head's weights step run again (its --replace) hashes what the record no longer vouches for
    out = fetch(head, revision)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sha256(head.dir / rotten) == manifest(head)["files"][rotten]["sha256"]
    assert weights_verify(head, "--full").returncode == 0


def test_pin_refuses_a_file_the_hub_published_otherwise(tmp_path, home, hub):
    head, revision = fetched_head(tmp_path, home, hub, shards=2)
    listing = json.loads((head.dir / ".twinspark-hub.json").read_text())
    listing["files"]["model-00001-of-00002.safetensors"]["sha256"] = "0" * 64
    listing["files"]["config.json"]["blob_id"] = "1" * 40
    (tmp_path / "listing.json").write_text(json.dumps(listing))
    (head.dir / contract.WEIGHTS_RECORD).unlink()
    out = sh("python3", ROOT / "launch" / "weights.py", "pin", "--dir", head.dir, "--hub-listing", tmp_path / "listing.json",
             "--manifest", tmp_path / "m.json", "--record", tmp_path / "r.json", "--node", "spark1", check=False)
    assert out.returncode == 1
    assert ("FAIL spark1: model-00001-of-00002.safetensors: sha256 "
            f"{sha256(head.hub / REPO / 'model-00001-of-00002.safetensors')}"
            f" ({(head.hub / REPO / 'model-00001-of-00002.safetensors').stat().st_size} bytes), the hub publishes "
            f"{'0' * 64}") in out.stderr
    assert "FAIL spark1: config.json: git blob sha1 " in out.stderr
    assert not (tmp_path / "m.json").exists()  # no manifest: nothing is copied from a bad download


def test_fetch_refuses_a_revision_that_is_not_a_commit(tmp_path, home, hub):
    head, _ = fetched_head(tmp_path, home, hub, shards=1)
    out = fetch(head, "main")
    assert out.returncode == 2 and "--revision must be a full commit sha (40 hex), got 'main'" in out.stderr


def stack_memory_fit(max_model_len: int) -> list[str]:
    """The memory-fit flags the program sends for the stack file (the seed recipe's KV figures) at
    this serving.maxModelLen."""
    config = {k.removeprefix("twinspark:"): v for k, v in stack_config().items()}
    config["serving"] = {**config["serving"], "maxModelLen": max_model_len}
    return model_weights.memory_fit_args(parse_stack_config(config).serving)


# 100M tokens at the seed's 8206 B/token: 764 GiB of KV, beyond this machine and any Spark
IMPOSSIBLE_MAX_MODEL_LEN = 16_000_000  # under the config's 2^24, far over any memory


def test_an_impossible_max_model_len_stops_the_fetch_before_any_weight_is_downloaded(tmp_path, home, hub):
    head = Head(home, tmp_path / "models" / "model", tmp_path / "hub", tmp_path / "bin", hub.endpoint)
    head.bin.mkdir()
    (head.bin / "docker").symlink_to(DOCKER_RUN_STANDIN)
    make_model(head.hub / REPO, shards=4, shard_mb=8)
    revision = model_weights.parse_revision(resolve(head).stdout)
    out = fetch(head, revision, memory_fit=stack_memory_fit(IMPOSSIBLE_MAX_MODEL_LEN))
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    # the shape check's own line, on this node's MemTotal (fetch-weights.sh: why that suffices)
    assert re.search(r"fetch-weights spark1: FAIL memory fit: 0\.0 GiB weights per node, .* 8206 B/token = "
                     r"[\d,]+ tokens; .* sequences of maxModelLen 16,000,000 fit — .* lower serving\.maxModelLen "
                     r"to at most [\d,]+ or raise gpuMemoryUtilization \(0\.85\)", text), text
    assert f"{REPO}@{revision} cannot run over these 2 nodes at TP 2 × PP 1 (see the FAIL lines): nothing downloaded" in text
    assert not [r for r in hub.requests if r[1].startswith("/lfs/")], hub.requests  # not one shard asked for
    # the model directory not even made, nor mounted into the check's container (docker would make it root's)
    assert not head.dir.exists() and ":/weights" not in head.docker_calls.read_text()


def test_a_new_max_model_len_on_verified_weights_asks_the_hub_nothing_and_downloads_nothing(tmp_path, home, hub):
    """The fetch's command line carries the fit flags, so a new maxModelLen re-runs it: with the
    weights verified that is the verify pass (a stat per file), no container, no hub call. The
    shape check after the download (its own flags changed too) judges the new value."""
    head, revision = fetched_head(tmp_path, home, hub)
    hub.requests.clear()
    runs_before = head.docker_calls.read_text().count("docker run")
    out = fetch(head, revision, memory_fit=stack_memory_fit(IMPOSSIBLE_MAX_MODEL_LEN))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "nothing to download" in out.stdout and "hashed" not in out.stdout + out.stderr
    assert hub.requests == [] and head.docker_calls.read_text().count("docker run") == runs_before


def test_plan_balances_the_streams_largest_first(tmp_path):
    sizes = {f"f{i}": s for i, s in enumerate([90, 80, 70, 60, 50, 40, 30, 20, 10, 5])}
    (tmp_path / "m.json").write_text(json.dumps({"files": {k: {"size": v, "sha256": ""} for k, v in sizes.items()}}))
    (tmp_path / "need").write_text("".join(f"{k}\n" for k in sizes))
    out = sh("python3", ROOT / "launch" / "weights.py", "plan", "--manifest", tmp_path / "m.json", "--need",
             tmp_path / "need", "--buckets", "3", "--out-prefix", tmp_path / "s.")
    assert int(out.stdout) == sum(sizes.values())
    loads = [sum(sizes[n] for n in (tmp_path / f"s.{i}").read_text().split()) for i in range(3)]
    assert sorted(n for i in range(3) for n in (tmp_path / f"s.{i}").read_text().split()) == sorted(sizes)
    streams = [(tmp_path / f"s.{i}").read_text().split() for i in range(3)]
    assert [files[0] for files in streams] == ["f0", "f1", "f2"]  # the largest first, one per stream
    assert max(loads) <= sum(sizes.values()) / 3 * 4 / 3, loads  # LPT's bound: within 4/3 of an even split


# ---- the receiver's follow: hashed as they arrive, vouching only for what it hashed ------------------
SOURCE_MTIME_NS = 1_700_000_000_123_456_789  # the sender's mtime, which rsync -t sets last


class Receiving:
    """A worker's directory receiving a copy as rsync writes it (in pieces, then the sender's
    mtime), with weights.py verify --follow watching; finish() closes its stdin (the copy ended)."""

    def __init__(self, root: Path, sizes: dict[str, int]):
        self.root, self.contents = root, {name: os.urandom(size) for name, size in sizes.items()}
        root.mkdir()
        (root / contract.WEIGHTS_MANIFEST).write_text(json.dumps({"repo": REPO, "revision": "a" * 40, "files": {
            name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in self.contents.items()}}))
        self.follower = subprocess.Popen(
            [sys.executable, ROOT / "launch" / "weights.py", "verify", "--follow", "--dir", root,
             "--manifest", root / contract.WEIGHTS_MANIFEST, "--record", root / contract.WEIGHTS_RECORD,
             "--node", "spark2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.follower.stdin.write(json.dumps({name: SOURCE_MTIME_NS for name in sizes}) + "\n")
        self.follower.stdin.flush()

    def write(self, name: str, data: bytes | None = None, pieces: int = 4) -> None:
        data = self.contents[name] if data is None else data
        with open(self.root / name, "wb") as f:
            for i in range(pieces):
                f.write(data[i * len(data) // pieces:(i + 1) * len(data) // pieces])
                f.flush()
                time.sleep(0.05)
        os.utime(self.root / name, ns=(SOURCE_MTIME_NS, SOURCE_MTIME_NS))

    def finish(self) -> subprocess.CompletedProcess:
        stdout, stderr = self.follower.communicate("", timeout=60)
        return subprocess.CompletedProcess(self.follower.args, self.follower.returncode, stdout, stderr)


def test_follow_hashes_each_file_as_it_arrives_and_the_verification_after_reads_none(tmp_path):
    receiving = Receiving(tmp_path / "model", {f"model-{i}.safetensors": (3 << 20) + i for i in range(4)})
    for name in receiving.contents:
        receiving.write(name)
    out = receiving.finish()
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert "spark2: hashed 4 files as they arrived: 13 MB" in out.stderr and "changed files" not in out.stderr, out.stderr
    record = json.loads((receiving.root / contract.WEIGHTS_RECORD).read_text())
    assert record["revision"] == "a" * 40 and sorted(record["files"]) == sorted(receiving.contents)


def test_follow_vouches_only_for_the_bytes_it_hashed(tmp_path):
    """A file written again after it settled (a retried transfer, here gone wrong: same size, same
    mtime) is hashed again after the copy and named; one that arrived damaged is named; one the
    copy never finished is missing — none of them vouched for by the record."""
    receiving = Receiving(tmp_path / "model", {"rewritten": 1 << 20, "damaged": 1 << 20, "short": 1 << 20, "good": 1 << 20})
    receiving.write("rewritten")
    receiving.write("good")
    bad = bytearray(receiving.contents["damaged"])
    bad[4096] ^= 1
    receiving.write("damaged", bytes(bad))
    (receiving.root / "short").write_bytes(receiving.contents["short"][:1000])
    time.sleep(0.5)  # the follower has hashed what settled
    wrong = bytearray(receiving.contents["rewritten"])
    wrong[0] ^= 1
    receiving.write("rewritten", bytes(wrong), pieces=1)
    out = receiving.finish()
    assert out.returncode == 1, out.stderr
    assert "FAIL spark2: rewritten: sha256 " in out.stderr and "FAIL spark2: damaged: sha256 " in out.stderr, out.stderr
    assert "FAIL spark2: short: 1000 bytes, expected 1048576" in out.stderr, out.stderr
    record = json.loads((receiving.root / contract.WEIGHTS_RECORD).read_text())
    assert sorted(record["files"]) == ["good"] and record["revision"] is None


# ---- the copy: two namespaces, two rails ----------------------------------------------------------
class Pair:
    """head and worker network namespaces joined by rail0 (10.0.0.0/24) and rail1 (10.0.1.0/24);
    the worker's sshd (root) on 10.0.0.2 sees worker_dir at the head's model path."""

    def __init__(self, tmp: Path, head: Head, revision: str):
        tag = uuid.uuid4().hex[:6]
        self.head_ns, self.worker_ns = f"twh{tag}", f"tww{tag}"
        self.tmp, self.head = tmp, head
        head.netns = self.head_ns
        self.worker_dir, self.worker_home = tmp / "worker-model", tmp / "worker-home"
        self.worker_dir.mkdir()
        self.worker_home.mkdir()
        for ns in (self.head_ns, self.worker_ns):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for i in range(2):
            a, b = f"twa{tag}{i}", f"twb{tag}{i}"
            sh("ip", "link", "add", a, "mtu", 9000, "type", "veth", "peer", "name", b, "mtu", 9000)
            for iface, ns, host in ((a, self.head_ns, 1), (b, self.worker_ns, 2)):
                sh("ip", "link", "set", iface, "netns", ns)
                sh("ip", "-n", ns, "link", "set", iface, "name", f"rail{i}")
                sh("ip", "-n", ns, "addr", "add", f"10.0.{i}.{host}/24", "dev", f"rail{i}")
                sh("ip", "-n", ns, "link", "set", f"rail{i}", "up")
        # the worker's own firewall, as HostPrep loads it: the copy's port opens only while it runs
        cfg = parse_stack_config({k.split(":", 1)[1]: v for k, v in stack_config().items()})
        worker = cfg.nodes[1]
        (tmp / "firewall.nft").write_text(firewall.render_firewall(
            worker, firewall.firewall_policy(worker, Topology(cfg, resolve_node_addresses(cfg.nodes)))))
        sh("ip", "netns", "exec", self.worker_ns, "nft", "-f", tmp / "firewall.nft")
        # the program's own steps: the sync key on the head, authorized on the worker
        key = head.home / ".ssh" / "twinspark_weights"
        key.parent.mkdir(mode=0o700)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "twinspark-weights@spark1", "-f", key)
        forced = model_weights.forced_command(weights_args(head.dir, [WORKER]), WORKER,
                                              model_weights.copy_source(weights_args(head.dir), WORKER), revision)
        # and a login of the operator's own, for the recipe's plain rsync over ssh (the speed's baseline)
        self.login_key = head.home / ".ssh" / "operator"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.login_key)
        (tmp / "authorized_keys").write_text(remote.render_authorized_key_line(
            "10.0.0.1", key.with_suffix(".pub").read_text(), forced) + self.login_key.with_suffix(".pub").read_text())
        # what ModelWeights installs root-owned on the worker (forced_command_files)
        programs = tmp / "sync-key-programs"
        programs.mkdir()
        for f in model_weights.forced_command_files():
            (programs / Path(f.path).name).write_text(f.content)
        os.makedirs(contract.SYNC_KEY_COMMAND_DIR, exist_ok=True)  # a mount point: bound in sshd's namespace only
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", tmp / "host_key")
        (tmp / "sshd_config").write_text(
            f"ListenAddress 10.0.0.2\nHostKey {tmp}/host_key\nAuthorizedKeysFile {tmp}/authorized_keys\n"
            f"PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {tmp}/sshd.pid\n"
            "PasswordAuthentication no\nSetEnv PATH=" + PATH + "\n")
        os.makedirs("/run/sshd", exist_ok=True)
        self.sshd = subprocess.Popen(
            ["ip", "netns", "exec", self.worker_ns, "unshare", "--mount", "--propagation", "private", "sh", "-c",
             'mount --bind "$0" "$1" && mount --bind "$2" /root && mount --bind "$4" "$5" && '
             'exec /usr/sbin/sshd -D -e -f "$3"',
             self.worker_dir, head.dir, self.worker_home, tmp / "sshd_config", programs, contract.SYNC_KEY_COMMAND_DIR],
            stdout=open(tmp / "sshd.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while "10.0.0.2:22" not in self.listening(self.worker_ns):
            assert time.monotonic() < deadline, (tmp / "sshd.log").read_text()
            time.sleep(0.1)

    def close(self):
        os.killpg(self.sshd.pid, signal.SIGKILL)
        self.sshd.wait()
        for ns in (self.worker_ns, self.head_ns):
            # a daemon left by a killed copy dies with its namespace's last process
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            sh("ip", "netns", "del", ns, check=False)

    @staticmethod
    def listening(ns: str) -> str:
        return sh("ip", "netns", "exec", ns, "ss", "-Hltn").stdout

    def copy_pair_elements(self) -> list[dict]:
        """The worker's firewall set of the copy's pairs, as nft -j lists them."""
        listed = json.loads(sh("ip", "netns", "exec", self.worker_ns, "nft", "-j", "list", "set", "inet",
                               contract.FIREWALL_TABLE, contract.WEIGHT_COPY_SET).stdout)
        (found,) = [item["set"] for item in listed["nftables"] if "set" in item]
        # an element with a timeout is {"elem": {"val": ..., "timeout": ...}}, one without it the value alone
        return [e["elem"] if "elem" in e else {"val": e} for e in found.get("elem", [])]

    def copy_pairs_open(self) -> list[str]:
        """The copy's pairs open in the worker's firewall, "source . destination" each."""
        return sorted(" . ".join(e["val"]["concat"]) for e in self.copy_pair_elements())

    def reaches(self, source: str, address: str, port: int) -> bool:
        code = (f"import socket; s = socket.socket(); s.settimeout(2); s.bind(({source!r}, 0)); "
                f"print(s.connect_ex(({address!r}, {port})))")
        return sh("ip", "netns", "exec", self.head_ns, "python3", "-c", code).stdout.strip() == "0"

    def rx_bytes(self) -> list[int]:
        return [int(sh("ip", "netns", "exec", self.worker_ns, "cat", f"/sys/class/net/rail{i}/statistics/rx_bytes").stdout)
                for i in range(2)]

    def sync(self, revision: str, background=False, max_streams_per_rail=4):
        args = model_weights.sync_args(weights_args(self.head.dir, [WORKER]), WORKER, revision, max_streams_per_rail)
        return self.head.run("sync-weights.sh", args, background=background)

    def copy_secret(self) -> str:
        """The daemons' secret as the worker holds it while a copy runs ("" while there is none)."""
        secrets = self.worker_home / ".local" / "state" / "twinspark" / "weights-sync" / "rsyncd.secrets"
        line = secrets.read_text().strip() if secrets.exists() else ""
        return line.removeprefix("twinspark:") if line.startswith("twinspark:") else ""


@pytest.fixture
def pair(tmp_path, home, hub):
    head, revision = fetched_head(tmp_path, home, hub)
    p = Pair(tmp_path, head, revision)
    p.revision = revision
    yield p
    p.close()


def same_copy(pair: Pair) -> None:
    for name, entry in manifest(pair.head)["files"].items():
        assert sha256(pair.worker_dir / name) == entry["sha256"], name


def cached_pages(path: Path) -> int:
    return int(sh("fincore", "--bytes", "--noheadings", "--output", "RES", path).stdout.split()[0])


def test_copy_crosses_both_rails_verifies_and_a_second_run_hashes_nothing(pair):
    before = pair.rx_bytes()
    out = pair.sync(pair.revision)
    assert out.returncode == 0, out.stdout + out.stderr
    total = sum(e["size"] for e in manifest(pair.head)["files"].values())
    grown = [after - b for after, b in zip(pair.rx_bytes(), before)]
    assert all(g > total * 0.3 for g in grown), (grown, total)  # both rails carried a share
    streams = 2 * max(1, min(4, os.cpu_count() // 4))  # both sides are this machine
    assert f"{streams} streams over 2 rails" in out.stdout, out.stdout
    # every file hashed as it arrived: the verification after the copy had nothing left to read
    assert "spark2: hashed 8 files as they arrived" in out.stderr and "changed files" not in out.stderr, out.stderr
    # the copy leaves no page cache behind (before this test reads the files): the head's at once,
    # the worker's once its disk has the copy (the step does not wait for that)
    files = manifest(pair.head)["files"]
    assert [cached_pages(pair.head.dir / name) for name in files] == [0] * len(files)
    wait_for(lambda: all(cached_pages(pair.worker_dir / name) == 0 for name in files),
             "the worker's page cache of the copy released", timeout_s=60)
    same_copy(pair)
    assert json.loads((pair.worker_dir / contract.WEIGHTS_RECORD).read_text())["revision"] == pair.revision
    assert ":8873" not in pair.listening(pair.worker_ns)  # the daemons are gone
    assert pair.copy_pairs_open() == []  # and the port is shut in the worker's firewall

    again = pair.sync(pair.revision)
    assert "nothing to copy" in again.stdout
    assert "hashed" not in again.stdout + again.stderr  # neither side read a file again


def test_damaged_worker_file_is_named_and_only_it_is_sent_again(pair):
    assert pair.sync(pair.revision).returncode == 0
    shard = "model-00004-of-00006.safetensors"
    flip_bit(pair.worker_dir / shard, 1 << 20)
    before = pair.rx_bytes()
    out = pair.sync(pair.revision)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"spark2: damaged, sending again: {shard}: sha256 " in out.stderr, out.stderr
    assert "copying 1 files" in out.stdout
    size = (pair.head.dir / shard).stat().st_size
    assert size < sum(pair.rx_bytes()) - sum(before) < size * 1.2
    same_copy(pair)


def test_damaged_head_file_is_refused_before_it_spreads(pair):
    shard = "model-00002-of-00006.safetensors"
    flip_bit(pair.head.dir / shard, 777)
    before = pair.rx_bytes()
    out = pair.sync(pair.revision)
    text = out.stdout + out.stderr
    assert out.returncode == 1
    assert f"FAIL spark1: {shard}: sha256 " in text and "nothing sent to spark2" in text, text
    assert sum(pair.rx_bytes()) - sum(before) < 100_000 and not (pair.worker_dir / shard).exists()


def test_faulty_copy_fails_naming_the_file_and_the_node(pair):
    """An rsync that damages what it wrote (a flaky disk or link): the worker's hashes catch it."""
    shard = "model-00005-of-00006.safetensors"
    flip = "import sys; f = open(sys.argv[1], 'r+b'); f.seek(4096); b = f.read(1)[0]; f.seek(4096); f.write(bytes([b ^ 1]))"
    (pair.head.bin / "rsync").write_text(
        '#!/bin/bash\n/usr/bin/rsync "$@" || exit\n'
        f'for a; do case $a in --files-from=*) grep -qx {shard} "${{a#--files-from=}}" && '
        f'python3 -c "{flip}" {pair.worker_dir / shard};; esac; done\nexit 0\n')
    (pair.head.bin / "rsync").chmod(0o755)
    out = pair.sync(pair.revision)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert f"FAIL spark2: {shard}: sha256 " in text and "verification failed for spark2" in text, text
    (pair.head.bin / "rsync").unlink()
    assert pair.sync(pair.revision).returncode == 0  # the next run sends it again
    same_copy(pair)


def test_interrupted_copy_resumes_and_the_daemons_answer_only_the_secret_on_the_rails(pair):
    for i in range(2):
        sh("ip", "netns", "exec", pair.head_ns, "tc", "qdisc", "add", "dev", f"rail{i}", "root", "tbf", "rate",
           "40mbit", "burst", "64kb", "latency", "400ms")
    total = sum(e["size"] for e in manifest(pair.head)["files"].values())
    proc = pair.sync(pair.revision, background=True)
    try:
        deadline = time.monotonic() + 60
        while sum(p.stat().st_size for p in pair.worker_dir.glob("*.safetensors")) < total * 0.4:
            assert time.monotonic() < deadline and proc.poll() is None, "40% not copied"
            time.sleep(0.2)
        for i in range(2):  # the copy held at a crawl while its doors are tried: it would end meanwhile
            sh("ip", "netns", "exec", pair.head_ns, "tc", "qdisc", "change", "dev", f"rail{i}", "root", "tbf", "rate",
               "1mbit", "burst", "64kb", "latency", "400ms")
        ports = re.findall(r"(\S+):8873\b", pair.listening(pair.worker_ns))
        assert sorted(ports) == ["10.0.0.2", "10.0.1.2"]  # the rail addresses, nothing else
        wrong = sh("ip", "netns", "exec", pair.head_ns, "env", "RSYNC_PASSWORD=wrong", "rsync",
                   "rsync://twinspark@10.0.0.2:8873/model/", check=False)
        assert wrong.returncode != 0 and "auth failed" in wrong.stderr, wrong.stderr
        # the port is open to the copy's source on each rail, and to no other device on the rail
        assert pair.copy_pairs_open() == ["10.0.0.1 . 10.0.0.2", "10.0.1.1 . 10.0.1.2"]
        # each closes by itself when the daemons' own limit (DAEMON_HOURS, 8 h) ends a killed copy
        assert [e.get("timeout") for e in pair.copy_pair_elements()] == [8 * 3600] * 2
        sh("ip", "-n", pair.head_ns, "addr", "add", "10.0.0.99/24", "dev", "rail0")
        assert pair.reaches("10.0.0.1", "10.0.0.2", contract.WEIGHTS_SYNC_PORT)
        assert not pair.reaches("10.0.0.99", "10.0.0.2", contract.WEIGHTS_SYNC_PORT)
        # issue 37: with the secret a client overwrote the manifest and left evil.py. The secret is
        # this copy's own; with it, the module neither shows nor takes twinspark's files
        secret = pair.copy_secret()
        assert re.fullmatch(r"[A-Za-z0-9]{48}", secret), secret
        first_secret = secret
        forged = pair.tmp / "forged"
        forged.mkdir()
        (forged / contract.WEIGHTS_MANIFEST).write_text('{"revision": "forged", "files": {}}')
        (forged / "evil.py").write_text("import os\n")
        manifest_before = (pair.worker_dir / contract.WEIGHTS_MANIFEST).read_bytes()
        pushed = sh("ip", "netns", "exec", pair.head_ns, "env", f"RSYNC_PASSWORD={secret}", "rsync", "-rt",
                    f"{forged}/", "rsync://twinspark@10.0.0.2:8873/model/", check=False)
        listed = sh("ip", "netns", "exec", pair.head_ns, "env", f"RSYNC_PASSWORD={secret}", "rsync",
                    "rsync://twinspark@10.0.0.2:8873/model/", check=False).stdout
        assert (pair.worker_dir / contract.WEIGHTS_MANIFEST).read_bytes() == manifest_before, pushed.stderr
        assert contract.WEIGHTS_MANIFEST not in listed and contract.WEIGHTS_RECORD not in listed, listed
        assert (pair.worker_dir / "evil.py").exists()  # a file of its own gets through: the verification names it
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole step, its rsync clients with it
        proc.wait()
        for i in range(2):
            sh("ip", "netns", "exec", pair.head_ns, "tc", "qdisc", "del", "dev", f"rail{i}", "root")
    copied = sum(p.stat().st_size for p in pair.worker_dir.glob("*.safetensors"))
    assert copied < total
    before = pair.rx_bytes()
    sh("ip", "netns", "exec", pair.head_ns, "tc", "qdisc", "add", "dev", "rail0", "root", "tbf", "rate",
       "40mbit", "burst", "64kb", "latency", "400ms")  # the resumed copy too runs long enough to be looked at
    out = pair.sync(pair.revision, background=True)  # stops the killed run's daemons, then resumes
    try:
        # the killed copy's daemons left their secret; the resumed copy's own replaces it
        wait_for(lambda: pair.copy_secret() not in ("", first_secret) or out.poll() is not None,
                 "a secret of the resumed copy's own", timeout_s=60)
        assert out.poll() is None, out.stdout.read()
        second_secret = pair.copy_secret()
        stdout = out.stdout.read()
        out.wait(timeout=300)
    finally:
        sh("ip", "netns", "exec", pair.head_ns, "tc", "qdisc", "del", "dev", "rail0", "root")
    assert out.returncode == 0, stdout
    assert second_secret != first_secret  # a secret per copy
    assert "removing evil.py: not in revision" in stdout and not (pair.worker_dir / "evil.py").exists(), stdout
    resumed = sum(pair.rx_bytes()) - sum(before)
    assert resumed < (total - copied) * 1.1 + 2_000_000, (resumed, total, copied)
    same_copy(pair)


def test_the_sync_key_only_copies(pair):
    """Issue 37: a relay's copy key ran `id` and `ls /etc/shadow` on the node that admitted it. Now
    sshd runs the forced command for every session of the key: what it was asked comes second."""
    key = pair.head.home / ".ssh" / "twinspark_weights"

    def as_key(*command: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", pair.head_ns, "ssh", "-i", key, "-o", "IdentitiesOnly=yes",
                               "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
                               "UserKnownHostsFile=/dev/null", "-b", "10.0.0.1", "root@10.0.0.2", *command],
                              input=stdin, capture_output=True, text=True, timeout=30)

    refused = "spark2: this key only copies weights: refused"
    for command in (["id"], ["cat", "/etc/shadow"], ["sh", "-c", "id"], ["meminfo"], ["nproc;", "id"], ["verify", "--full"],
                    ["image-id", "ubuntu:24.04"], ["daemons-start", "--rail", "10.0.0.2=10.0.0.99"], []):
        out = as_key(*command)
        assert out.returncode != 0 and "uid=" not in out.stdout and "root:" not in out.stdout, (command, out.stdout)
        assert (refused in out.stderr or "takes an image twinspark-vllm:TAG" in out.stderr), (command, out.stderr)
    # the manifest it may write is this revision's, every path inside the model directory
    revision, files = pair.revision, {"a.safetensors": {"size": 1, "sha256": "0" * 64}}
    for forged in ({"revision": "f" * 40, "files": files},
                   {"revision": revision, "files": {"../../root/.ssh/authorized_keys": files["a.safetensors"]}},
                   {"revision": revision, "files": {"/etc/passwd": files["a.safetensors"]}}):
        out = as_key("manifest", stdin=json.dumps(forged))
        assert out.returncode == 1 and "the manifest must be JSON {revision: " in out.stderr, out.stderr
        assert not (pair.worker_dir / contract.WEIGHTS_MANIFEST).exists()
    # what it is for still works: the cores for the stream count (the shape check reads no memory with it)
    assert int(as_key("nproc").stdout) >= 1
    assert pair.sync(pair.revision).returncode == 0


def test_another_revision_is_refused_naming_node_and_both(pair):
    out = pair.sync("e" * 40)
    assert out.returncode == 1
    assert f"spark1 holds revision {pair.revision} of {pair.head.dir}, this stack pins {'e' * 40}: refused" in out.stderr
    # a worker holding another revision is told so and brought to this one
    assert pair.sync(pair.revision).returncode == 0
    record = pair.worker_dir / contract.WEIGHTS_RECORD
    record.write_text(json.dumps({**json.loads(record.read_text()), "revision": "d" * 40}))
    out = pair.sync(pair.revision)
    assert f"spark2 holds revision {'d' * 40}; this stack pins {pair.revision}" in out.stderr, out.stderr


def test_copy_speed_against_rsync_over_ssh_on_the_same_data_and_link(tmp_path, home, hub):
    """Figures, not a gate: the whole step (its checks, the transfer, the worker's verification),
    the transfer alone, and the recipe's plain rsync over ssh, same files, same rails, the same clock.
    TWINSPARK_WEIGHTS_MEASURE_MB sets the
    model's size (default 256), TWINSPARK_WEIGHTS_MAX_STREAMS_PER_RAIL the streams' cap; the
    figures go to build/weights-local-report.json."""
    total_mb = int(os.environ.get("TWINSPARK_WEIGHTS_MEASURE_MB", "256"))
    head, revision = fetched_head(tmp_path, home, hub, shards=8, shard_mb=total_mb // 8)
    pair = Pair(tmp_path, head, revision)
    try:
        sh("sync")  # each side starts with the disk caught up (the fetch's writes, then the step's)
        started = time.monotonic()
        out = pair.sync(revision, max_streams_per_rail=int(os.environ.get("TWINSPARK_WEIGHTS_MAX_STREAMS_PER_RAIL", "4")))
        step_s = time.monotonic() - started
        assert out.returncode == 0, out.stdout + out.stderr
        copied = re.search(r"copied (\d+) MB to spark2 in ([\d.]+) s", out.stdout)
        verified = re.search(r"spark2: hashed \d+ files as they arrived: (\d+) MB in ([\d.]+) s", out.stderr)
        assert copied and verified, out.stdout + out.stderr
        size = sum(p.stat().st_size for p in head.dir.iterdir() if p.is_file() and not p.name.startswith(".twinspark-"))
        recipe = ["ip", "netns", "exec", pair.head_ns, "rsync", "-a", "-e",
                  f"ssh -i {pair.login_key} -o BatchMode=yes -o UserKnownHostsFile={home}/.ssh/twinspark_known_hosts",
                  f"{head.dir}/", f"root@10.0.0.2:{tmp_path}/recipe-copy/"]
        sh("sync")
        started = time.monotonic()
        sh(*recipe)
        recipe_s = time.monotonic() - started
        report = {
            "model_MB": round(size / 1e6), "cores": os.cpu_count(),
            "streams": int(re.search(r"(\d+) streams over 2 rails", out.stdout)[1]),
            "weight_step_s": round(step_s, 2), "weight_step_MBps": round(size / 1e6 / step_s, 1),
            "weight_sync_MBps": round(int(copied[1]) / float(copied[2]), 1),
            "rsync_over_ssh_s": round(recipe_s, 2), "rsync_over_ssh_MBps": round(size / 1e6 / recipe_s, 1),
            "weight_hashed_as_arrived_MBps": round(int(verified[1]) / float(verified[2]), 1),
        }
        report["step_ratio"] = round(report["weight_step_MBps"] / report["rsync_over_ssh_MBps"], 2)
        report["transfer_ratio"] = round(report["weight_sync_MBps"] / report["rsync_over_ssh_MBps"], 2)
        (ROOT / "build").mkdir(exist_ok=True)
        (ROOT / "build" / "weights-local-report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report))
        same_copy(pair)
    finally:
        pair.close()


def test_verify_names_every_file_the_revision_lacks_but_its_own_bookkeeping(tmp_path):
    """Issue 37: the extra-file check passed over every `.twinspark-*` file and all of `.cache/`,
    so a file slipped in there stayed unnamed. Now only ours (the manifest, the record, the hub's
    listing, a temp of one) and huggingface_hub's bookkeeping of a file of the revision pass."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"x" * 1000)
    (root / contract.WEIGHTS_MANIFEST).write_text(json.dumps({"revision": "a" * 40, "files": {
        "model.safetensors": {"size": 1000, "sha256": hashlib.sha256(b"x" * 1000).hexdigest()}}}))
    kept = [".twinspark-hub.json", f"{contract.WEIGHTS_RECORD}.4242.tmp", ".cache/huggingface/.gitignore",
            ".cache/huggingface/CACHEDIR.TAG", f".cache/huggingface/trees/{'b' * 40}.json",
            ".cache/huggingface/download/model.safetensors.metadata",
            ".cache/huggingface/download/model.safetensors.lock",
            ".cache/huggingface/download/Xy12Ab.0123456789abcdef.incomplete"]
    strays = [".twinspark-evil", ".cache/evil.py", ".cache/huggingface/download/other.bin.metadata",
              ".cache/huggingface/hub/x", ".cache/huggingface/trees/evil.py", "sub/evil.py", "modeling_evil.py"]
    for rel in kept + strays:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    out = sh("python3", ROOT / "launch" / "weights.py", "verify", "--dir", root, "--manifest",
             root / contract.WEIGHTS_MANIFEST, "--record", root / contract.WEIGHTS_RECORD, "--node", "spark2",
             check=False)
    assert out.returncode == 1, out.stderr
    assert sorted(re.findall(r"FAIL spark2: (\S+): not in revision", out.stderr)) == sorted(strays), out.stderr


def test_the_hub_listing_has_one_name():
    text = (ROOT / "launch" / "fetch-weights.sh").read_text()
    assert re.search(r"^HUB_LISTING=(\S+)", text, re.M).group(1) == weights_module().HUB_LISTING


def weights_module():
    return load_launch("weights.py")
