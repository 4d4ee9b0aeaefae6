"""See bench/hostfs_hooks."""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NT = [sys.executable, "-m", "nestrace"]
ACCESS = {1: "xfs_file_buffered_read", 2: "xfs_file_buffered_write", 3: "xfs_file_direct_read",
          4: "xfs_file_direct_write", 5: "iomap_dio_rw_begin", 6: "mm_filemap_get_pages",
          7: "ext4_write_begin", 8: "ext4_da_write_begin"}
CACHE = {1: "page cache add", 2: "page cache delete", 3: "sync readahead", 4: "async readahead",
         5: "readahead unbounded", 6: "readahead order", 7: "folio dirtied", 8: "iomap writeback"}
MAPS = {1: "iomap_iter_dstmap", 2: "iomap_iter_srcmap", 3: "ext4_ext_map_blocks_exit",
        6: "btrfs_ordered_extent_add", 7: "ext4_ind_map_blocks_exit",
        8: "xfs_reflink_remap_extent_dest", 9: "btrfs_get_extent",
        10: "xfs_reflink_cow_remap_from"}


def run(host: str, dio: str, tmp: Path) -> dict:
    name = f"hooks{host}{dio}"
    subprocess.run(NT + ["lab", "down", "--name", name], capture_output=True, cwd=ROOT)
    mp = subprocess.run(NT + ["lab", "up", "--name", name, "--host-fs", host, "--guest-dio", dio],
                        capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    store = tmp / name
    try:
        job = ["fio", "--name=h", f"--directory={mp}", "--size=32M", "--ioengine=psync",
               "--output=/dev/null"]
        subprocess.run(job + ["--rw=write", "--bs=1M", "--direct=1"], check=True)
        from nestrace.capture.lab import Lab
        from nestrace.capture.matrix import drop_caches
        drop_caches(Lab(name).state())  # (the lab's own file systems synced, none other)
        cmd = ["sh", "-c", " ; ".join([
            " ".join(job + ["--rw=randrw", "--bs=4k", "--direct=1", "--io_size=4M"]),
            " ".join(job + ["--rw=read", "--bs=128k", "--direct=1"]),
            " ".join(job + ["--rw=randwrite", "--bs=4k", "--io_size=2M", "--fsync=16"])])]
        subprocess.run(NT + ["record", "--all-hooks", "-o", str(store), "--stack", mp, "--", *cmd],
                       check=True, capture_output=True, cwd=ROOT)
    finally:
        subprocess.run(NT + ["lab", "down", "--name", name], capture_output=True, cwd=ROOT)
    import nestrace
    s = nestrace.open(store)
    img = "(SELECT backing_ino FROM device_map WHERE level = 'vdisk')"
    hdev = "(SELECT dev FROM device_map WHERE level = 'hostfs')"
    out = {}
    for r in s.rows("SELECT source, count(*) AS n FROM hostfs_events GROUP BY ALL"):
        out["access: " + ACCESS[r["source"]]] = r["n"]
    for r in s.rows(f"SELECT event, count(*) AS n FROM pagecache_events WHERE ino = {img} "
                    f"AND dev = {hdev} GROUP BY ALL"):
        out["image page cache: " + CACHE[r["event"]]] = r["n"]
    for r in s.rows(f"SELECT source, count(*) AS n FROM mapping_events WHERE dev = {hdev} GROUP BY ALL"):
        out["image mapping: " + MAPS[r["source"]]] = r["n"]
    out["hostfs_io rows"] = s.rows("SELECT count(*) AS n FROM hostfs_io")[0]["n"]
    return out


HOSTS = ("xfs", "ext4", "ext3", "ext2", "btrfs")


def main() -> int:
    ap = argparse.ArgumentParser(description="which host FS yields which nestrace events")
    ap.add_argument("--hosts", default=",".join(HOSTS),
                    help="comma-separated host file systems (default: %(default)s)")
    hosts = ap.parse_args().hosts.split(",")
    if bad := [h for h in hosts if h not in HOSTS]:
        ap.error(f"--hosts: unknown file system {', '.join(bad)} (one of {', '.join(HOSTS)})")
    cols = [(h, d) for h in hosts for d in ("on", "off")]
    res = {}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as t:
        for h, d in cols:
            res[(h, d)] = run(h, d, Path(t))
            print(f"{h} dio={d}: {res[(h, d)]}", file=sys.stderr)
    keys = sorted({k for r in res.values() for k in r})
    print("| event | " + " | ".join(f"{h} dio {d}" for h, d in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for k in keys:
        print(f"| {k} | " + " | ".join(str(res[c].get(k, "")) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
