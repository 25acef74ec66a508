#!/usr/bin/env python3
"""loaders-bare.py DIR --runs RUN,... — vLLM 0.24.0's safetensors weight loaders timed WITHOUT vLLM.

Issue 42 item 2, cut down: what each `--load-format` costs for the loader's own work, reading a
checkpoint (big-checkpoint.py: Qwen2.5-14B's shapes, 29.5 GB bf16 in 6 shards) from disk into GPU
memory. Not vLLM's start, /health or first token: only the weight iterator vLLM builds for that
format, driven the way vLLM's DefaultModelLoader / RunaiModelStreamerLoader drive it.

A RUN is LOADER-CACHE:
  LOADER  safetensors      vLLM's default (`auto`/`safetensors`, safetensors_load_strategy None =
                           lazy): safetensors.safe_open(framework="pt") per shard, get_tensor per
                           name — CPU tensors on a mmap of the file, copied to the GPU by the copy_
                           below (page faults read the file during that copy)
          fastsafetensors  fastsafetensors.parallel_loader.ParallelLoader, GDS tried first and nogds
                           taken on vLLM's RuntimeError fallback (no /dev/nvidia-fs* on the device)
          instanttensor    instanttensor.safe_open(all files, framework="pt", device=cuda index)
          runai_streamer   runai_model_streamer.SafetensorsStreamer to CPU, each tensor .clone()d
  CACHE   cold  sync; echo 3 > /proc/sys/vm/drop_caches (posix_fadvise DONTNEED on each shard if
                that is refused), then the share still resident (mincore: page-cache.py)
          warm  each shard read through the page cache first (page-cache.py's read), then resident
          asis  the cache left as it is

Each run, as vLLM does: the model's parameters exist before the load (here one empty GPU tensor
per checkpoint tensor, allocated before the clock starts, as vLLM allocates the model before
load_weights), then every (name, tensor) the iterator yields is copied into its parameter
(vLLM's default_weight_loader: param.data.copy_(loaded_weight); a stacked qkv/gate_up parameter
takes the same bytes through narrow()), then torch.cuda.synchronize(). The clock: from the
iterator's creation to after that synchronize (vLLM's "Loading weights took" also starts when the
iterator is made). The loaders' modules are imported before the clock (vLLM imports
fastsafetensors and runai_model_streamer with weight_utils; instanttensor inside its iterator,
a second or less on a first import). use_tqdm_on_load is False here (vLLM's default True only
draws a progress bar).

Checked: every tensor of every shard arrives once (count and bytes against the files' headers),
and a checksum — sha256 over the first and last 4 MiB of the first and last tensor (by file
offset) of each shard, as they sit in GPU memory after the load — is compared with the same bytes
read from the files by os.pread (column checksum_vs_file: ok / MISMATCH), so a loader that puts
wrong bytes in place is caught; the checksum itself is printed to compare across loaders.

Memory: torch.cuda.max_memory_allocated (torch's allocator: the parameters plus what the loader
allocates through torch) and, where nvidia-ml-py is importable, the device's used memory sampled
every 20 ms by NVML (also what a loader allocates itself, and the CUDA context). Between runs
everything is freed (del, gc, torch.cuda.empty_cache()).

One line per run on stdout (RESULT ...) and one TSV row appended to --results (written at once,
so a run cut short loses only itself). --deadline EPOCH and --reserve S: no run starts with less
than S seconds left. --state DIR: RUN.started / RUN.done markers, so a caller can rerun the
script for the runs left after a crash (a run started and not done is reported by the caller).
LOADERS_BARE_DEVICE=cpu runs on the CPU (a dry run where there is no GPU; instanttensor needs
CUDA and refuses); LOADERS_BARE_NO_DROP=1 makes `cold` use posix_fadvise alone (a dry run on a
shared machine). Needs torch and safetensors (the device's python3 has them) and, for each
loader, its wheel; page-cache.py beside this file.

vLLM's code copied below: vllm 0.24.0 wheel, vllm/model_executor/model_loader/weight_utils.py
(_natural_sort_key, safetensors_weights_iterator, fastsafetensors_weights_iterator,
instanttensor_weights_iterator, runai_safetensors_weights_iterator) and default_loader.py
(DefaultModelLoader._get_weights_iterator, load_weights).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import re
import struct
import threading
import time
from pathlib import Path

import torch

LOADERS = ("safetensors", "fastsafetensors", "instanttensor", "runai_streamer")
CACHES = ("cold", "warm", "asis")
DEVICE = os.environ.get("LOADERS_BARE_DEVICE", "cuda")
SUM_BYTES = 4 << 20
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I64": torch.int64,
          "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F64": torch.float64}
COLUMNS = ("run", "loader", "cache", "resident_before_pct", "seconds", "GB_per_s", "bytes", "tensors",
           "torch_peak_GiB", "params_GiB", "nvml_peak_used_GiB", "checksum", "checksum_vs_file",
           "cache_step_s", "note")

_spec = importlib.util.spec_from_file_location("page_cache", Path(__file__).with_name("page-cache.py"))
page_cache = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(page_cache)


# ---- the checkpoint's own description, from the files' headers -------------------------------

def header(path: str) -> tuple[int, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
    meta.pop("__metadata__", None)
    return 8 + n, meta


def _natural_sort_key(filepath: str) -> list:
    # vllm/model_executor/model_loader/weight_utils.py: _natural_sort_key
    return [int(s) if s.isdigit() else s.lower() for s in re.split(r"(\d+)", os.path.basename(filepath))]


def shards_of(model_dir: str) -> list[str]:
    files = [str(p) for p in Path(model_dir).glob("*.safetensors")]
    if not files:
        raise SystemExit(f"no *.safetensors in {model_dir}")
    return sorted(files, key=_natural_sort_key)


def plan(files: list[str]) -> tuple[dict, list[tuple[str, str, int, int]]]:
    """name -> (shape, dtype); the checksum's pieces: (name, file, absolute start, length)."""
    tensors, pieces = {}, []
    for path in files:
        base, meta = header(path)
        for name, m in meta.items():
            tensors[name] = (tuple(m["shape"]), DTYPES[m["dtype"]])
        ordered = sorted(meta.items(), key=lambda kv: kv[1]["data_offsets"][0])
        for name, m in {ordered[0][0]: ordered[0][1], ordered[-1][0]: ordered[-1][1]}.items():
            a, b = m["data_offsets"]
            k = min(SUM_BYTES, b - a)
            pieces += [(name, path, base + a, k), (name, path, base + b - k, k)]
    return tensors, pieces


def checksum_from_files(pieces) -> str:
    h = hashlib.sha256()
    for _name, path, start, length in pieces:
        fd = os.open(path, os.O_RDONLY)
        try:
            h.update(os.pread(fd, length, start))
        finally:
            os.close(fd)
    return h.hexdigest()[:16]


def checksum_from_params(params: dict, pieces) -> str:
    h = hashlib.sha256()
    for name, path, start, length in pieces:
        flat = params[name].reshape(-1).view(torch.uint8)
        base, meta = header(path)
        a, b = meta[name]["data_offsets"]
        off = start - base - a  # 0 for the head, size - length for the tail
        h.update(flat[off:off + length].cpu().numpy().tobytes())
    return h.hexdigest()[:16]


# ---- the iterators, as vLLM 0.24.0 writes them --------------------------------------------------

NOTES: list[str] = []


def safetensors_weights_iterator(hf_weights_files):
    # weight_utils.py: safetensors_weights_iterator, safetensors_load_strategy None, not NFS/Lustre
    # (so no prefetch), local_expert_ids None: the `else` branch
    from safetensors.torch import safe_open

    sorted_files = sorted(hf_weights_files, key=_natural_sort_key)
    for st_file in sorted_files:
        with safe_open(st_file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118
                param = f.get_tensor(name)
                yield name, param


def fastsafetensors_weights_iterator(hf_weights_files):
    # weight_utils.py: fastsafetensors_weights_iterator (torch.distributed not initialised: SingleGroup)
    from fastsafetensors import SingleGroup
    from fastsafetensors.parallel_loader import ParallelLoader

    pg = SingleGroup()
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if DEVICE == "cuda" else torch.device("cpu")
    hf_weights_files = sorted(hf_weights_files, key=_natural_sort_key)
    nogds = pg.size() > 1
    queue_size = int(os.getenv("VLLM_FASTSAFETENSORS_QUEUE_SIZE", "0"))  # envs.VLLM_FASTSAFETENSORS_QUEUE_SIZE

    def _make_loader(nogds: bool):
        return ParallelLoader(pg=pg, hf_weights_files=hf_weights_files, queue_size=queue_size,
                              use_tqdm_on_load=False, device=str(device), nogds=nogds)

    pl = None
    yielded = False
    try:
        try:
            pl = _make_loader(nogds)
            for name, tensor in pl.iterate_weights():
                yielded = True
                yield name, tensor
        except RuntimeError as e:
            if nogds or yielded or "gds" not in str(e):
                raise
            NOTES.append(f"fastsafetensors: GDS refused ({str(e)[:80]!r}), nogds=True as vLLM does")
            if pl is not None:
                pl.close()
            pl = _make_loader(nogds=True)
            yield from pl.iterate_weights()
    finally:
        if pl is not None:
            pl.close()


def instanttensor_weights_iterator(hf_weights_files):
    # weight_utils.py: instanttensor_weights_iterator (world group absent: process_group None)
    import instanttensor

    if DEVICE != "cuda":
        raise ValueError("InstantTensor requires NVIDIA GPUs")
    device = torch.cuda.current_device()  # current_platform.current_device()
    with instanttensor.safe_open(list(hf_weights_files), framework="pt", device=device, process_group=None) as f:
        yield from f.tensors()


def runai_safetensors_weights_iterator(hf_weights_files):
    # weight_utils.py: runai_safetensors_weights_iterator, is_distributed False (vLLM's default):
    # streamed to the CPU, each tensor cloned
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as streamer:
        streamer.stream_files(hf_weights_files, device="cpu", is_distributed=False)
        for name, tensor in streamer.get_tensors():
            yield name, tensor.clone()


ITERATORS = {"safetensors": safetensors_weights_iterator,
             "fastsafetensors": fastsafetensors_weights_iterator,
             "instanttensor": instanttensor_weights_iterator,
             "runai_streamer": runai_safetensors_weights_iterator}


def import_loader(loader: str) -> str:
    """The loader's module imported ahead of the clock; its version."""
    from importlib.metadata import version
    name = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors",
            "instanttensor": "instanttensor", "runai_streamer": "runai_model_streamer"}[loader]
    __import__(name)
    return f"{name} {version(name.replace('_', '-'))}"


# ---- the page cache -------------------------------------------------------------------------------

def resident_pct(files) -> float:
    have = total = 0
    for p in files:
        r, n = page_cache.resident_pages(p)
        have, total = have + r, total + n
    return 100 * have / max(total, 1)


def set_cache(cache: str, files) -> str:
    if cache == "cold":
        os.sync()
        try:
            if os.environ.get("LOADERS_BARE_NO_DROP"):  # a dry run on a shared machine
                raise PermissionError("LOADERS_BARE_NO_DROP")
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            how = "drop_caches"
        except OSError:
            for p in files:
                fd = os.open(p, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            how = "fadvise DONTNEED"
    elif cache == "warm":
        buf, n = bytearray(1 << 20), 0
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while chunk := f.readinto(buf):
                    n += chunk
        how = f"read {n / 1e9:.2f} GB"
    else:
        how = "as is"
    return how


# ---- a run ------------------------------------------------------------------------------------------

class NvmlPeak:
    """The device's used memory, sampled every 20 ms by NVML (None where nvidia-ml-py is absent)."""

    def __init__(self):
        self.peak = None
        self._stop = threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            index = torch.cuda.current_device()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._read = lambda: pynvml.nvmlDeviceGetMemoryInfo(self._handle).used
            self.peak = self._read()
        except Exception:
            self._read = None

    def __enter__(self):
        if self._read:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._read())

    def __exit__(self, *exc):
        self._stop.set()
        if self._read:
            self._thread.join()
            self.peak = max(self.peak, self._read())


def one_run(run: str, files, tensors: dict, pieces, expect_sum: str) -> dict:
    loader, cache = run.rsplit("-", 1)
    NOTES.clear()
    row = dict(run=run, loader=loader, cache=cache)
    t = time.monotonic()
    how = set_cache(cache, files)
    row["cache_step_s"] = f"{time.monotonic() - t:.2f}"
    row["resident_before_pct"] = f"{resident_pct(files):.1f}"
    print(f"== {run} ({time.strftime('%H:%M:%S', time.gmtime())} UTC): cache {how} in "
          f"{row['cache_step_s']} s, {row['resident_before_pct']}% resident", flush=True)

    cuda = DEVICE == "cuda"
    params = {name: torch.empty(shape, dtype=dtype, device=DEVICE) for name, (shape, dtype) in tensors.items()}
    expect_bytes = sum(p.numel() * p.element_size() for p in params.values())
    row["params_GiB"] = f"{expect_bytes / 2**30:.2f}"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seen, got_bytes = set(), 0
    with (NvmlPeak() if cuda else _Null()) as nvml:
        started = time.perf_counter()
        for name, tensor in ITERATORS[loader](files):
            param = params[name]  # a KeyError: a name the checkpoint does not have
            if name in seen:
                raise RuntimeError(f"{name} yielded twice")
            if tuple(tensor.shape) != tuple(param.shape) or tensor.dtype != param.dtype:
                raise RuntimeError(f"{name}: {tuple(tensor.shape)} {tensor.dtype}, expected "
                                   f"{tuple(param.shape)} {param.dtype}")
            param.data.copy_(tensor)  # default_weight_loader
            seen.add(name)
            got_bytes += tensor.numel() * tensor.element_size()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    missing = set(params) - seen
    if missing:
        raise RuntimeError(f"{len(missing)} tensors never yielded, e.g. {sorted(missing)[:3]}")
    row.update(seconds=f"{seconds:.2f}", GB_per_s=f"{got_bytes / 1e9 / seconds:.2f}", bytes=str(got_bytes),
               tensors=str(len(seen)))
    row["torch_peak_GiB"] = f"{torch.cuda.max_memory_allocated() / 2**30:.2f}" if cuda else ""
    row["nvml_peak_used_GiB"] = f"{nvml.peak / 2**30:.2f}" if getattr(nvml, "peak", None) else ""
    row["checksum"] = checksum_from_params(params, pieces)
    row["checksum_vs_file"] = "ok" if row["checksum"] == expect_sum else f"MISMATCH (file {expect_sum})"
    row["note"] = "; ".join(NOTES)
    del params
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--runs", required=True, help="LOADER-CACHE,... e.g. safetensors-cold,instanttensor-warm")
    ap.add_argument("--results", help="TSV to append one row a run to (its header written when new)")
    ap.add_argument("--deadline", type=float, help="epoch seconds: no run starts with less than --reserve left")
    ap.add_argument("--reserve", type=float, default=60)
    ap.add_argument("--state", help="folder for RUN.started / RUN.done; runs done there are skipped")
    args = ap.parse_args()

    runs = [r for r in args.runs.split(",") if r]
    for r in runs:
        loader, _, cache = r.rpartition("-")
        if loader not in LOADERS or cache not in CACHES:
            ap.error(f"run {r!r}: LOADER-CACHE with LOADER in {LOADERS}, CACHE in {CACHES}")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (LOADERS_BARE_DEVICE=cpu for a dry run)")
    files = shards_of(args.dir)
    tensors, pieces = plan(files)
    total = sum(os.path.getsize(p) for p in files)
    print(f"checkpoint {args.dir}: {len(files)} shards, {len(tensors)} tensors, {total / 1e9:.2f} GB; "
          f"device {DEVICE}" + (f" ({torch.cuda.get_device_name()})" if DEVICE == "cuda" else "")
          + f"; torch {torch.__version__}", flush=True)
    expect_sum = checksum_from_files(pieces)
    state = Path(args.state) if args.state else None
    if state:
        state.mkdir(parents=True, exist_ok=True)
    results = Path(args.results) if args.results else None
    if results and not results.exists():
        results.write_text("\t".join(COLUMNS) + "\n")

    for run in runs:
        if state and (state / f"{run}.done").exists():
            continue
        if state and (state / f"{run}.started").exists():
            continue  # it crashed an earlier process: the caller reports it
        if args.deadline is not None:
            left = args.deadline - time.time()
            if left < args.reserve:
                print(f"== {run} not started: {left:.0f} s left", flush=True)
                continue
        loader = run.rpartition("-")[0]
        try:
            print(f"   {import_loader(loader)}", flush=True)
        except Exception as e:  # a missing wheel: that loader's runs fail, the others go on
            row = dict(run=run, loader=loader, cache=run.rpartition("-")[2], note=f"import: {e!r}"[:300])
            print(f"RESULT {run} FAIL {row['note']}", flush=True)
            if results:
                with results.open("a") as f:
                    f.write("\t".join(row.get(c, "FAIL" if c == "seconds" else "") for c in COLUMNS) + "\n")
            if state:
                (state / f"{run}.done").touch()
            continue
        if state:
            (state / f"{run}.started").touch()
        try:
            row = one_run(run, files, tensors, pieces, expect_sum)
        except Exception as e:
            row = dict(run=run, loader=loader, cache=run.rpartition("-")[2], seconds="FAIL",
                       note=f"{type(e).__name__}: {e}"[:300].replace("\t", " ").replace("\n", " "))
            gc.collect()
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        print("RESULT " + " ".join(f"{c}={row.get(c, '')}" for c in COLUMNS if c != "note")
              + (f" note={row['note']}" if row.get("note") else ""), flush=True)
        if results:
            with results.open("a") as f:
                f.write("\t".join(str(row.get(c, "")) for c in COLUMNS) + "\n")
        if state:
            (state / f"{run}.done").touch()


if __name__ == "__main__":
    main()
