#!/usr/bin/env python3
"""page-cache.py resident|evict|read FILE... — the page cache's hold on files (issue 42's loader runs).

resident: the share of each file's pages in the page cache (mincore(2) on a shared read-only
          mapping, which faults nothing in), and of all together.
evict:    posix_fadvise(POSIX_FADV_DONTNEED) on each file (clean pages only: sync first), then resident.
read:     read each file through the page cache (1 MiB reads), with the rate: a read-back timing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import time

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_pages(path: str) -> tuple[int, int]:
    size = os.path.getsize(path)
    pages = (size + PAGE - 1) // PAGE
    if size == 0:
        return 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        libc.munmap(addr, size)
        return sum(b & 1 for b in vec), pages
    finally:
        os.close(fd)


def resident(paths: list[str]) -> None:
    have = total = 0
    for p in paths:
        r, n = resident_pages(p)
        have, total = have + r, total + n
        print(f"  {os.path.basename(p)}: {100 * r / max(n, 1):.1f}% resident")
    print(f"resident: {100 * have / max(total, 1):.1f}% of {total * PAGE / 1e9:.2f} GB")


def main() -> None:
    verb, paths = sys.argv[1], sys.argv[2:]
    buf = bytearray(1 << 20)
    if verb == "evict":
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        resident(paths)
    elif verb == "resident":
        resident(paths)
    elif verb == "read":
        started, total = time.monotonic(), 0
        for p in paths:
            t, n = time.monotonic(), 0
            with open(p, "rb", buffering=0) as f:
                while chunk := f.readinto(buf):
                    n += chunk
            dt = time.monotonic() - t
            total += n
            print(f"read {os.path.basename(p)}: {n / 1e9:.2f} GB in {dt:.2f} s, {n / 1e9 / dt:.2f} GB/s")
        dt = time.monotonic() - started
        print(f"read: {total / 1e9:.2f} GB in {dt:.2f} s, {total / 1e9 / dt:.2f} GB/s")
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
