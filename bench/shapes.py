"""See bench/shapes."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from nestrace.session import Session  # noqa: E402
from rows import (VDISK, capture_meta, device_map, extents, request,  # noqa: E402
                  vfs)

MiB = 1 << 20


def session(**tables) -> Session:
    base = {"capture_meta": capture_meta(), "device_map": device_map(), "extent_maps": extents()}
    return Session.from_tables(base | tables)


def fsyncs(n: int) -> Session:
    """n buffered writes, each followed by an fsync (every third a
    sync_file_range) of 50 ns to 2.5 us, and a virtual-disk write in or
    near it: windows overlap."""
    ev, blk = [], []
    for i in range(n):
        t = i * 1000
        ev.append(vfs(t, 10, off=i * 4096, syscall=2))
        ev.append(vfs(t + 20, (50, 300, 2500)[i % 3 * 7 % 3], off=-1, req=0, ret=0,
                      syscall=13 if i % 3 == 0 else 11))
        blk += request(t + 40 + (0, 100, 400)[i % 5 % 3], t + 445, t + 900, VDISK, i * 4096, 4096,
                       rq=i + 1, bio=i + 1, op=1)
    return session(vfs_events=ev, block_events=blk)


def partial_writes(n: int) -> Session:
    """n 512-byte O_DIRECT writes into a 1 MiB file, each with a virtual-
    disk read of its 4 KiB block while it is in flight (every block is
    written many times: the worst case for pairing them)."""
    ev, blk = [], []
    for i in range(n):
        t = i * 1000
        off = (i * 7919 % 2047) * 512 + 512
        ev.append(vfs(t, 500, off=off, req=512, ret=512, syscall=4, f_flags=0o40000))
        blk += request(t + 100, t + 110, t + 300, VDISK, 4 * MiB + off // 4096 * 4096, 4096,
                       rq=i + 1, bio=i + 1)
    return session(vfs_events=ev, block_events=blk)


CASES = {"sync_transform": (fsyncs, "SELECT * FROM sync_transform"),
         "rmw_summary": (partial_writes, "SELECT * FROM rmw_summary")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="32000,128000")
    ap.add_argument("--runs", type=int, default=2, help="runs per size (the best is kept)")
    args = ap.parse_args()
    print("| view | writes | best of runs, s | us per write |")
    print("|---|---|---|---|")
    for view, (build, q) in CASES.items():
        for n in [int(x) for x in args.sizes.split(",")]:
            s = build(n)
            best = float("inf")
            for _ in range(args.runs):
                t = time.monotonic()
                s.rows(q)
                best = min(best, time.monotonic() - t)
            print(f"| {view} | {n} | {best:.2f} | {best / n * 1e6:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
