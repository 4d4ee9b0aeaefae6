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


def source_capture(tmp: Path, workload: str, io_size: str | None = None,
                   name: str = "src") -> Path:
    """A real capture of one of WORKLOADS on ext4 on xfs (io_size: fio's,
    in place of the workload's)."""
    fio, lab = WORKLOADS[workload]
    if io_size:
        fio = [a for a in fio if not a.startswith("--io_size=")] + [f"--io_size={io_size}"]
    store = tmp / name
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


# Where correlate's and report's time goes, view by view: each view
# correlate computes (what `links` reads, lower first, then links and rmw)
# made a table once, as the commands do, then each of report's queries;
# DuckDB's profiler gives each one's operators, and the costliest are
# kept.  One process, the store's files in the page cache.
PROFILE = """
import json, re, sys, time
from nestrace.query.session import LINKS_CACHE, Session
from nestrace.report import document
out = []
PROF = "/dev/shm/nestrace-bench-profile.json"

def ops(tree):
    found = []
    def walk(n):
        found.append((n.get("timing", 0.0), n.get("name", ""), n.get("intermediate_rows", 0)))
        for c in n.get("children", []):
            walk(c)
    for n in tree.get("operator", []):
        walk(n)
    return [{"op": name, "s": t, "rows": r} for t, name, r in sorted(found, reverse=True)[:3]]

def profiled(con, what, sql, params=None):
    con.execute("PRAGMA enable_profiling = 'json'")
    con.execute(f"PRAGMA profiling_output = '{PROF}'")
    t = time.monotonic()
    cur = con.execute(sql, params or [])
    done = Done(cur.description, cur.fetchall() if cur.description else [])
    took = time.monotonic() - t
    con.execute("PRAGMA disable_profiling")
    out.append({"what": what, "s": took, "rows": len(done.rows) if cur.description else None,
                "top": ops(json.load(open(PROF)))})
    return done

class Done:
    # (a query's rows, fetched inside the profile, for the caller)
    def __init__(self, description, rows):
        self.description, self.rows = description, rows
    def fetchall(self):
        return self.rows
    def fetchone(self):
        return self.rows[0] if self.rows else None

with Session(sys.argv[1]) as s:
    for v in s.views_to_cache([*LINKS_CACHE, "rmw"]):
        profiled(s.con, f"correlate: {v}", f"CREATE OR REPLACE TEMP TABLE _cache_{v} AS "
                 f"SELECT * FROM {v}")
        out[-1]["rows"] = s.con.execute(f"SELECT count(*) FROM _cache_{v}").fetchone()[0]
        s.con.execute(f"CREATE OR REPLACE VIEW {v} AS SELECT * FROM temp._cache_{v}")
        s._cached.add(v)
    real = s.con
    class Profiling:
        def __getattr__(self, name):
            return getattr(real, name)
        def execute(self, sql, params=None):
            if not sql.lstrip().upper().startswith("SELECT"):
                return real.execute(sql, params or [])
            views = list(dict.fromkeys(re.findall(r"FROM\s+([a-z_]+)", sql)))
            return profiled(real, "report: " + ", ".join(views[:3]), sql, params)
    s.con = Profiling()
    document.build(s)
    s.con = real
print(json.dumps(out))
"""


# What every run of correlate pays, whatever the store's size, on a
# small store: the imports of `nestrace correlate`, opening a session
# (every module's views created), the inputs of links made tables, and
# links itself, with DuckDB's own times for binding and optimizing its
# plan.  One process; the times are wall seconds.
FIXED = """
import importlib.util, json, os, sys, time
t = time.monotonic()
import nestrace.cli, nestrace.report.document
imports = time.monotonic() - t
from nestrace.query.session import LINKS_INPUTS, Session
t = time.monotonic()
s = Session(sys.argv[1], late_modules=False)
opened = time.monotonic() - t
t = time.monotonic()
s.cache(["_block_requests_core"])
requests = time.monotonic() - t
t = time.monotonic()
s.cache(LINKS_INPUTS)
inputs = time.monotonic() - t
s.con.execute("PRAGMA enable_profiling = 'json'")
s.con.execute("PRAGMA profiling_output = '/dev/shm/nestrace-bench-fixed.json'")
s.con.execute("PRAGMA profiling_mode = 'detailed'")
t = time.monotonic()
s.con.execute("CREATE TEMP TABLE _fixed_links AS SELECT * FROM _links_computed")
links = time.monotonic() - t
s.con.execute("PRAGMA disable_profiling")
flat = {}
def walk(d, pre=""):
    for k, v in d.items():
        if isinstance(v, dict):
            walk(v, pre + k + ".")
        elif isinstance(v, (int, float)):
            flat[pre + k] = v
walk(json.load(open("/dev/shm/nestrace-bench-fixed.json")))
print(json.dumps({"imports": imports, "opened": opened, "requests": requests, "inputs": inputs,
                  "links": links, "binding": flat.get("planner.total_time", 0.0),
                  "optimizing": flat.get("optimizer.total_time", 0.0),
                  "running": flat.get("query.cpu_time", 0.0),
                  "no_bytecode": not os.path.exists(
                      importlib.util.cache_from_source(nestrace.cli.__file__))}))
"""


def fixed(store: Path) -> dict:
    """What every run pays, on `store` (small): the two commands' times
    (the best of three each), and FIXED's steps of correlate."""
    n = __import__("nestrace").open(store).rows(
        "SELECT sum(records_total) AS n FROM capture_meta")[0]["n"]
    # (FIXED first: on a store correlate has not stored anything in)
    out = subprocess.run([sys.executable, "-c", FIXED, str(store)], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    wall_c = min(timed(NT + ["correlate", str(store)])[0] for _ in range(3))
    wall_r = min(timed(NT + ["report", str(store), "--json"])[0] for _ in range(3))
    return {"events": n, "correlate": wall_c, "report": wall_r, **json.loads(out)}


def print_fixed(f: dict) -> None:
    print(f"\nWhat every run pays, on a store of {f['events']:,} records: `correlate` "
          f"{f['correlate']:.2f} s and `report --json` {f['report']:.2f} s (the best of three "
          "each); where correlate's time goes, in one process"
          + (" (nestrace's own modules have no bytecode here, which ci/setup makes: "
             "they are compiled at each import)" if f["no_bytecode"] else "") + "\n")
    print("| step | s |")
    print("|---|---|")
    for key, what in (("imports", "imports (nestrace, DuckDB, pyarrow, click)"),
                      ("opened", "opening the store: every module's views created"),
                      ("requests", "block_requests"),
                      ("inputs", "the inputs of links, each made a table")):
        print(f"| {what} | {f[key]:.2f} |")
    print(f"| links: DuckDB binding {f['binding']:.2f}, optimizing {f['optimizing']:.2f}, "
          f"running (CPU) {f['running']:.2f} | {f['links']:.2f} |")


def profile(store: Path) -> list[dict]:
    """PROFILE's rows for `store`."""
    out = subprocess.run([sys.executable, "-c", PROFILE, str(store)], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout
    return json.loads(out)


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
    ap.add_argument("--no-fixed", action="store_true",
                    help="leave out what every run pays (correlate and report on a small "
                         "capture)")
    ap.add_argument("--profile", action="store_true",
                    help="and where the time goes on the largest size: each view correlate "
                         "computes and each query of report, its costliest DuckDB operators")
    args = ap.parse_args()
    import nestrace
    from nestrace.store.synth import replicate
    rows, floors, sums, prof = [], [], [], []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as t:
        tmp = Path(t)
        src = source_capture(tmp, args.workload)
        fixed_cost = None if args.no_fixed else \
            fixed(source_capture(tmp, args.workload, io_size="1M", name="small"))
        n_src = nestrace.open(src).rows("SELECT records_total AS n FROM capture_meta")[0]["n"]
        for size in [int(x) for x in args.sizes.split(",")]:
            copies = max(1, round(size / n_src))
            dst = tmp / f"s{size}"
            n = replicate(src, dst, copies)
            sums.append((n, *first_read(dst)))
            if args.profile and size == max(int(x) for x in args.sizes.split(",")):
                prof = [n, profile(dst)]    # (before correlate stores what it computes)
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
    if fixed_cost:
        print_fixed(fixed_cost)
    if prof:
        print_profile(*prof)
    return 1 if any(r[-1] for r in rows) else 0


def print_profile(n: int, steps: list[dict]) -> None:
    total = sum(x["s"] for x in steps)
    print(f"\nWhere the time goes at {n} events (one process, no start-up): each view "
          "correlate computes, then each query of report (the views it reads); the steps "
          f"of 0.05 s or more, {total:.1f} s in all, the profiler's own cost included; the "
          "three costliest DuckDB operators of each (an operator's own time, summed over "
          "the threads that ran it; the rows it gave)\n")
    print("| step | s | rows | costliest operators |")
    print("|---|---|---|---|")
    for x in steps:
        if x["s"] < 0.05:
            continue
        top = "; ".join(f"{o['op']} {o['s']:.2f} s ({o['rows']:,})" for o in x["top"])
        rows = "" if x["rows"] is None else f"{x['rows']:,}"
        print(f"| {x['what']} | {x['s']:.2f} | {rows} | {top} |")


if __name__ == "__main__":
    sys.exit(main())
