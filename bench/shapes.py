"""See bench/shapes."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rows import DISK, HOSTFS, VDISK, capture_meta, device_map, extents, request, vfs  # noqa: E402

from nestrace.query.session import Session  # noqa: E402

MiB = 1 << 20


def session(**tables) -> Session:
    """(the plain views: each run plans and computes the whole query, where
    a session's own cache would make every run after the first a lookup)"""
    base = {"capture_meta": capture_meta(), "device_map": device_map(), "extent_maps": extents()}
    return Session.from_tables(base | tables, cache_links=False)


def fragmented(n: int) -> Session:
    """An image in n extents of 64 KiB, scattered on the host disk, that a
    copy-on-write host moved during the capture (at the start they were
    scattered elsewhere), and 20,000 4 KiB O_DIRECT reads through it at
    all levels."""
    k, reads = 65536, 20000
    order = sorted(range(n), key=lambda i: (i * 7919) % n)
    img = [(i * k, 100 * MiB + order[i] * k, k) for i in range(n)]
    dm = device_map()
    for r in dm:
        r["size_sectors"] = max(r["size_sectors"], (n * k + 400 * MiB) >> 9)
    ext = extents(guest=((0, 4 * MiB, n * k - 8 * MiB),), image=img)
    before = [(i * k, 100 * MiB + (n + (i * 104729) % n) * k, k) for i in range(n)]
    ext += [r | {"phase": "start"} for r in extents(image=before) if r["role"] == "image"]
    ev, blk = [], []
    for i in range(reads):
        t, off = i * 10000, (i * 104729 % ((n * k - 8 * MiB) // 4096)) * 4096
        ev.append(vfs(t, 5000, off=off, f_flags=0o40000))
        vo = 4 * MiB + off
        blk += request(t + 100, t + 110, t + 4000, VDISK, vo, 4096, rq=2 * i + 1, bio=2 * i + 1)
        blk += request(t + 200, t + 210, t + 3000, DISK, img[vo // k][1] + vo % k, 4096,
                       rq=2 * i + 2, bio=2 * i + 2)
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                "extent_maps": ext, "vfs_events": ev, "block_events": blk},
                               cache_links=False)


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


def overlay(n: int) -> Session:
    """A qcow2 overlay (inode 131) over a qcow2 base (inode 140) of n 64
    KiB clusters scattered in its file: the overlay has none at the start;
    n / 2 4 KiB writes each allocate one (QEMU copies the rest of the
    cluster from the base), and the overlay holds them at the end."""
    k, base = 65536, {"capture_id": "c1", "path": "", "dev": HOSTFS, "flags": 0,
                      "role": "vdisk_image", "cluster_bytes": 65536}
    dm = device_map()
    dm[1]["backing_format"] = "qcow2"
    for r in dm:
        r["size_sectors"] = max(r["size_sectors"], (2 * n * k + 400 * MiB) >> 9)
    ext = extents(image=((0, 100 * MiB, n * k),))
    ext += [r | {"ino": 140, "physical_bytes": 100 * MiB + n * k}
            for r in extents(image=((0, 0, n * k),)) if r["role"] == "image"]
    start = [(140, i * k, ((i * 7919) % n) * k) for i in range(n)]
    written = sorted(range(0, n, 2), key=lambda i: (i * 104729) % n)
    moved = {c: j for j, c in enumerate(written)}
    end = [(131, i * k, moved[i] * k) if i in moved else (140, i * k, ((i * 7919) % n) * k)
           for i in range(n)]
    ext += [base | {"phase": ph, "ino": ino, "logical_bytes": lo, "physical_bytes": p,
                    "length_bytes": k}
            for ph, rows in (("start", start), ("end", end)) for ino, lo, p in rows]
    blk = []
    for j, c in enumerate(written):
        t = j * 10000
        blk += request(t, t + 10, t + 5000, VDISK, c * k + 8192, 4096, rq=j + 1, bio=j + 1, op=1)
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                "extent_maps": ext, "block_events": blk}, cache_links=False)


CASES = {"sync_transform": (fsyncs, "SELECT * FROM sync_transform", "writes"),
         "rmw_summary": (partial_writes, "SELECT * FROM rmw_summary", "writes"),
         "map_vfs + map_disk + moved": (
             fragmented, "SELECT (SELECT count(*) FROM map_vfs), (SELECT count(*) FROM map_disk), "
             "(SELECT count(*) FROM _map_image_moved)", "image extents"),
         "links of cluster-allocating writes": (overlay, "SELECT count(*) FROM _links_upper",
                                                "base clusters")}
SIZES = {"image extents": lambda n: n // 4, "base clusters": lambda n: n // 4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="32000,128000")
    ap.add_argument("--runs", type=int, default=2, help="runs per size (the best is kept)")
    ap.add_argument("--only", default="", help="the cases whose name holds this")
    args = ap.parse_args()
    if min(int(x) for x in args.sizes.split(",")) // 4 <= 8 * MiB // 65536:
        ap.error("--sizes: each at least 516 (the fragmented image's guest file needs more "
                 "than 8 MiB of 64 KiB extents, a quarter as many as the size)")
    print("| view | rows | of | best of runs, s | us per row |")
    print("|---|---|---|---|---|")
    for view, (build, q, unit) in CASES.items():
        if args.only not in view:
            continue
        for n in [SIZES.get(unit, int)(int(x)) for x in args.sizes.split(",")]:
            s = build(n)
            best = float("inf")
            for _ in range(args.runs):
                t = time.monotonic()
                s.rows(q)
                best = min(best, time.monotonic() - t)
            print(f"| {view} | {n} | {unit} | {best:.2f} | {best / n * 1e6:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
