"""bench/correlate: events/s and peak memory of correlate + report on
replicated captures.  Prints a Markdown table."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
NT = [sys.executable, "-m", "nestrace"]


# the workloads whose captures are replicated: fio arguments and the lab's dio modes
WORKLOADS = {
    # 4k random reads and writes, O_DIRECT in the guest and on both loops:
    # block requests and host-FS accesses, no page cache
    "direct": (["--rw=randrw", "--bs=4k", "--io_size=32M", "--direct=1", "--ioengine=psync"],
               ["--guest-dio", "on", "--host-dio", "on"]),
    # the same through the guest's and the host's page caches, an fsync
    # every 64 writes: page-cache, readahead and writeback events too
    "buffered": (["--rw=randrw", "--bs=4k", "--io_size=32M", "--fsync=64",
                  "--ioengine=psync"], ["--guest-dio", "off", "--host-dio", "on"]),
}


def source_capture(tmp: Path, workload: str) -> Path:
    """A real capture of one of WORKLOADS on ext4 on xfs."""
    fio, lab = WORKLOADS[workload]
    store = tmp / "src"
    subprocess.run(NT + ["lab", "down", "--name", "benchc"], capture_output=True, cwd=ROOT)
    mp = subprocess.run(NT + ["lab", "up", "--name", "benchc", *lab], capture_output=True,
                        text=True, check=True, cwd=ROOT).stdout.strip()
    try:
        subprocess.run(["fio", "--name=l", f"--directory={mp}", "--rw=write", "--bs=1M",
                        "--size=64M", "--direct=1", "--output=/dev/null"], check=True)
        subprocess.run(NT + ["record", "-o", str(store), "--stack", mp, "--", "fio", "--name=l",
                             f"--directory={mp}", "--size=64M", *fio, "--output=/dev/null"],
                       check=True, capture_output=True, cwd=ROOT)
    finally:
        subprocess.run(NT + ["lab", "down", "--name", "benchc"], capture_output=True, cwd=ROOT)
    return store


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (GiB) of a
    child command (its own, from wait4: RUSAGE_CHILDREN would carry an
    earlier child's peak over)."""
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {err.decode(errors='replace')}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / (1 << 20)


# The least any correlate + report of this design does, in child
# processes: each of the two commands starts Python and imports DuckDB and
# pyarrow; every event is read once (each column of each record table
# decoded and hashed: a sum of hashes, which no Parquet statistic
# answers); the block events are sorted twice to pair them (by bio, by
# request: read again, only the keys and the time).  No join, no view,
# nothing written, no report.
STARTUP = "import duckdb, pyarrow.parquet; duckdb.connect().execute('SELECT 1').fetchall()"
FLOOR = """
import json, sys, time
import duckdb
from nestrace.schema import kernel_tables
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
src = lambda table: (f"read_parquet('{sys.argv[1]}/{table}/*/*.parquet', "
                     "hive_partitioning = false)")
t = time.monotonic()
for table in kernel_tables():
    con.execute(f"SELECT sum(hash(COLUMNS(*))) FROM {src(table)}").fetchall()
scan = time.monotonic() - t
t = time.monotonic()
for key, actions in (("bio_id", "1, 4, 6, 8"), ("rq_id", "5, 6, 7")):
    con.execute(f"SELECT sum(a) FROM (SELECT lag(ts_ns) OVER (PARTITION BY dev, {key} "
                f"ORDER BY ts_ns, cpu) AS a FROM {src('block_events')} "
                f"WHERE action IN ({actions}))").fetchall()
print(json.dumps({"scan": scan, "pair": time.monotonic() - t}))
"""


def floor(store: Path) -> tuple[float, float, float]:
    """Seconds of the floor's parts: one command's start-up (the best of
    three), the scan and the two pairing sorts (one run each)."""
    start = min(timed([sys.executable, "-c", STARTUP])[0] for _ in range(3))
    out = subprocess.run([sys.executable, "-c", FLOOR, str(store)], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    parts = json.loads(out)
    return start, parts["scan"], parts["pair"]


def first_read(store: Path) -> tuple[float, float, float]:
    """(store MiB, seconds of the first read's checks, of a later read's)."""
    from nestrace.store.manifest import MANIFESTS, store_files
    for v in (store / MANIFESTS).glob("*.verified.json"):
        v.unlink()
    mib = sum(f.stat().st_size for f in store.rglob("*.parquet")) / (1 << 20)
    t = time.monotonic()
    store_files(store)
    first = time.monotonic() - t
    t = time.monotonic()
    store_files(store)
    return mib, first, time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="direct",
                    help="the capture replicated (default: direct, the README's table)")
    ap.add_argument("--memory-limit", default="6GB")
    ap.add_argument("--small-limit", default="256MB",
                    help="a second run with DuckDB held to this: RSS beyond it should stay flat")
    ap.add_argument("--no-floor", action="store_true",
                    help="leave out the floor (start-up, one scan, the pairing sorts)")
    args = ap.parse_args()
    import nestrace
    from nestrace.store.synth import replicate
    rows, floors, sums = [], [], []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as t:
        tmp = Path(t)
        src = source_capture(tmp, args.workload)
        n_src = nestrace.open(src).rows("SELECT records_total AS n FROM capture_meta")[0]["n"]
        for size in [int(x) for x in args.sizes.split(",")]:
            copies = max(1, round(size / n_src))
            dst = tmp / f"s{size}"
            n = replicate(src, dst, copies)
            sums.append((n, *first_read(dst)))
            for limit in (args.memory_limit, args.small_limit):
                # each measured in its own process, so peak RSS is its own
                try:
                    wall_c, cpu_c, rss_c = timed(NT + ["correlate", str(dst), "--memory-limit",
                                                       limit])
                    wall_r, cpu_r, rss_r = timed(NT + ["report", str(dst), "--json",
                                                       "--memory-limit", limit])
                except RuntimeError as e:   # a failed run is a row of the table too
                    rows.append((n, limit, None, None, None, None, None,
                                 str(e).splitlines()[0][-120:]))
                    print(f"{n} events, {limit}: failed: {e}", file=sys.stderr)
                    continue
                rows.append((n, limit, wall_c, wall_r, n / (wall_c + wall_r), cpu_c + cpu_r,
                             max(rss_c, rss_r), None))
                print(f"{n} events, {limit}: correlate {wall_c:.1f} s, report {wall_r:.1f} s",
                      file=sys.stderr)
            if not args.no_floor:
                floors.append((n, *floor(dst)))
            shutil.rmtree(dst)
    print(f"\nnestrace correlate + report on replicated real captures ({args.workload} "
          f"4k randrw; {os.cpu_count()} cores)\n")
    # per core: the wall-clock rate over the machine's cores; per CPU
    # second: over the CPU time both commands used (user + system), which
    # counts a core that sat idle as not used
    print("| events | DuckDB memory limit | correlate s | report s | events/s (both) "
          "| events/s per core | CPU s (both) | events per CPU s | peak RSS GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, lim, wc, wr, eps, cpu, rss, err in rows:
        if err:
            print(f"| {n} | {lim} | failed: {err} | | | | | | |")
            continue
        print(f"| {n} | {lim} | {wc:.1f} | {wr:.1f} | {eps:,.0f} | {eps / os.cpu_count():,.0f} "
              f"| {cpu:.1f} | {n / cpu:,.0f} | {rss:.2f} |")
    print("\nOpening the store: the first read after it was written checks each file's "
          "SHA-256 against the capture's manifest (the files in the page cache, as just "
          "written); later reads check sizes\n")
    print("| events | store MiB | first read s | MiB/s | later reads s |")
    print("|---|---|---|---|---|")
    for n, mib, first, later in sums:
        print(f"| {n} | {mib:.0f} | {first:.3f} | {mib / first:,.0f} | {later:.4f} |")
    if floors:
        cores = os.cpu_count()
        print(f"\nThe floor of correlate + report on this machine, against the target's time "
              f"(2 M events/s per core: events / {2 * cores} M s): two commands' start-up "
              "(Python, DuckDB, pyarrow), every event read once by DuckDB, the block "
              "events sorted twice to pair them; nothing joined, written or reported\n")
        print("| events | target s | start-up s (x 2) | scan s | pairing sorts s | floor s "
              "| floor / target |")
        print("|---|---|---|---|---|---|---|")
        for n, start, scan, pair in floors:
            target = n / (2e6 * cores)
            total = 2 * start + scan + pair
            print(f"| {n} | {target:.2f} | {start:.2f} | {scan:.2f} | {pair:.2f} | {total:.2f} "
                  f"| {total / target:.1f} |")
    return 1 if any(r[-1] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
