"""The benchmarks run (at toy sizes: no timing is checked here, only that
each bench still works end to end and prints its table)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, prog_ids

pytestmark = pytest.mark.root


def bench(name: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, f"bench/{name} {' '.join(args)}: exit {r.returncode}\n{r.stderr}"
    return r.stdout


def test_bench_correlate_runs():
    out = bench("correlate", "--sizes", "200000")
    rows = [l for l in out.splitlines() if re.match(r"\| \d+ \| \d+[MG]B \|", l)]
    assert len(rows) == 2, out        # the size, with 6 GB and held to 256 MB
    cells = [l.split(" | ") for l in out.splitlines() if re.match(r"\| \d+ \| [\d.]+ \|", l)]
    floor = [c for c in cells if len(c) == 7]
    assert len(floor) == 1 and float(floor[0][5]) > 0, out   # and its floor
    sums = [c for c in cells if len(c) == 5]
    assert len(sums) == 1 and float(sums[0][3].replace(",", "")) > 0, out   # the first read
    # what every run pays, on a small capture
    assert re.search(r"on a store of [\d,]+ records: `correlate` [\d.]+ s", out), out
    assert re.search(r"\| links: DuckDB binding [\d.]+, optimizing [\d.]+", out), out


def test_bench_render_runs():
    assert "`nestrace html` on " in bench("render", "--events", "200000")


def test_bench_overhead_runs():
    out = bench("overhead", "--rounds", "1", "--runtime", "2", "--depths", "1", "--no-bpf-stats")
    assert "| 1 | " in out and "(b)/(a)" in out
    for mode in ("(e) hooks only", "(f) floor records", "(g) floor, a block record per request",
                 "(h) floor, block completions alone", "(p) nestrace --per-request",
                 "(k) nestrace --from-completions"):  # their rows
        assert re.search(rf"^\| 1 \| {re.escape(mode)} \| \d+ \| [\d.]+ \| [\d.]+ \[", out, re.M), out
    # (p) and (k) against (b) and the floor: records per I/O, fewer for both
    for mode in ("(p) --per-request", "(k) --from-completions"):
        per_io = re.search(rf"^\| 1 \| {re.escape(mode)} \| ([\d.]+) / ([\d.]+) \| \d+ \(\d+ / \d+\) "
                           r"\| [-\d.]+ / [-\d.]+ / [-\d.]+ \| ", out, re.M)
        assert per_io and float(per_io[2]) < float(per_io[1]) / 2, out
    # the CPU each adds, paired by round, and over (f)'s (none for (f),
    # nor for any when (f) added none in this short run)
    for m in "bcefghpk":
        ratio = r"\|  \|  \|" if m == "f" else r"\| [-\d.]* \| [-\d.\[\], ]* \|"
        assert re.search(rf"^\| 1 \| \({m}\) \| 1 \| [-\d.]+ \[[-\d.]+, [-\d.]+\] {ratio}$",
                         out, re.M), out


def test_bench_overhead_runs_the_modes_asked():
    out = bench("overhead", "--rounds", "1", "--runtime", "2", "--depths", "1", "--modes", "a,f,k",
                "--no-bpf-stats")
    assert re.findall(r"^\| 1 \| \((\w)\) \| 1 \|", out, re.M) == ["f", "k"], out
    assert "(b)/(a)" not in out, out      # the tables that need (b) and (c) are left out
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "overhead.py"), "--modes", "a,z"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "--modes: no mode z" in r.stderr, r.stderr


def test_bench_overhead_measures_the_programs_of_a_capture_and_of_the_floor():
    out = bench("overhead", "--rounds", "0", "--runtime", "2", "--depths", "1")
    total = re.search(r"^\| 1 \| all" + r" \| \| \| (\d+)" * 6 + r" \|$", out, re.M)
    # (b)'s ns per I/O, (f)'s, (g)'s, (h)'s, (p)'s, (k)'s
    assert total and all(int(total[k]) > 0 for k in (1, 2, 3, 4, 5, 6)), out
    block = re.search(r"^\| 1 \| block" + r" \| ([\d.]+) \| \d+ \| \d+" * 6 + r" \|$", out, re.M)
    # Q G D C, two disks: (g) and (p) run the same programs, writing less;
    # (h) the completions alone: C, two disks (and the root disk's,
    # filtered); (k) D, to count, and C
    assert block and all(float(block[k]) >= 8 for k in (1, 2, 3, 5)), out
    assert 2 <= float(block[4]) <= float(block[2]) / 3, out
    assert 2 * float(block[4]) <= float(block[6]) <= float(block[2]) / 2, out
    # the agent process's own CPU over fio's run (in clock ticks: it may be
    # 0 in 2 s), added to the programs', and each over (f)'s
    agent = re.search(r"^\| 1 \| the agent's own CPU" + r" \| \| \| (\d+)" * 6 + r" \|$", out, re.M)
    own = re.search(r"^\| 1 \| nestrace's own CPU \(all \+ agent\)" + r" \| \| \| (\d+)" * 6 + r" \|$",
                    out, re.M)
    assert agent and own, out
    assert all(abs(int(own[k]) - int(total[k]) - int(agent[k])) <= 1 for k in range(1, 7)), out
    over = re.search(r"^\| 1 \| nestrace's own, over \(f\)'s" + r" \| \| \| ([\d.]+)" * 6 + r" \|$",
                     out, re.M)
    assert over and over[2] == "1.00" and float(over[4]) < 1, out    # (h) writes less than (f)


def test_bench_shapes_runs():
    out = bench("shapes", "--sizes", "2000", "--runs", "1")
    rows = [l for l in out.splitlines() if re.match(r"\| \w", l)]
    assert len(rows) == 5, out    # the header and a row per case


def test_bench_completions_runs():
    assert "ftrace completions by task" in bench("completions", "--runs", "1")


def test_bench_hostfs_hooks_runs():
    out = bench("hostfs_hooks", "--hosts", "xfs")
    assert "| event | xfs dio on | xfs dio off |" in out and "page cache add" in out, out


def test_bench_loop_workers_runs():
    out = bench("loop_workers", "--runtime", "1", "--modes", "plain,traced,traced:block")
    rows = [l for l in out.splitlines() if re.match(r"\| \d", l)]
    assert [r.split(" | ")[1] for r in rows] == ["plain", "traced", "traced:block"], out
    assert not list(Path("/sys/kernel/tracing/instances").glob("nestrace_lw_*"))


def test_bench_imports_runs():
    out = bench("imports", "--seconds", "1", "--large-seconds", "1", "--large-dat-seconds", "1",
                "--long-seconds", "2")
    # a long sequential trace, read by blkparse and nestrace (seconds; peak GB)
    long = re.search(r"^\| 2 \| ([\d,]+) \| \d+ \| [\d,]+ \| ([\d.]+); ([\d.]+) "
                     r"\| ([\d.]+); ([\d.]+) \|$", out, re.M)
    assert long and int(long.group(1).replace(",", "")) > 1000, out
    assert float(long.group(4)) > 0 and float(long.group(5)) > 0, out
    # the blk tracer's records, and the trace.dat's events, each read by
    # the classic tool and by nestrace, with the ratio of their times
    n = re.search(r"fio 4 KiB random reads \(iodepth 8\): ([\d,]+) records", out)
    assert n and int(n.group(1).replace(",", "")) > 1000, out
    steps = {l.split(" | ")[0].lstrip("| "): l for l in out.splitlines() if l.startswith("| ")
             and " s, " in l}
    assert set(steps) == {"read the binary trace", "analyse", "both", "read the large trace",
                          "read trace.dat", "read the large trace.dat"}, out
    assert all(float(l.rstrip(" |").rsplit(" | ", 1)[1]) > 0 for l in steps.values()), out
    assert "`blkparse -d -o /dev/null`" in steps["read the binary trace"]
    assert "`trace-cmd report > /dev/null`" in steps["read trace.dat"]
    assert not list(Path("/var/tmp").glob("nestrace-bench-imports-*"))


def agent_alone(stack, flags: list[str], out: Path, mount: str) -> dict:
    """Run the agent as `record` starts it (with `flags`) around fio's 2048
    4 KiB O_DIRECT writes on `mount`: its tracing line, the hooks attached,
    the rows per table of its stream, the size of its block_rq_issue_btf
    program, and its block records."""
    import json
    import signal

    import pyarrow as pa

    from nestrace.capture.agent import agent_args, side_families
    from nestrace.store.stream import iter_frames
    fio = ["fio", "--name=e", f"--directory={mount}", "--rw=randwrite", "--bs=4k",
           "--direct=1", "--size=8M", "--output=/dev/null"]
    agent = subprocess.Popen(agent_args(stack, None, "auto", side_families(stack))
                             + flags + ["-o", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for line in agent.stderr:    # up to the line that says all is attached
            if line.startswith("nestrace-agent: tracing"):
                break
        assert line.startswith("nestrace-agent: tracing"), line
        progs = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                          capture_output=True, text=True).stdout)
        ours = prog_ids(agent.pid)      # (another test's agent may run beside)
        subprocess.run(fio, check=True)
    finally:
        agent.send_signal(signal.SIGINT)
        err = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, err
    with open(out, "rb") as f:
        frames = list(iter_frames(f, str(out)))
    start = next(fr.meta for fr in frames if fr.meta and fr.meta["type"] == "start")
    end = next(fr.meta for fr in frames if fr.meta and fr.meta["type"] == "end")
    rows: dict[str, int] = {}
    block = []
    for fr in frames:
        if fr.batch is not None:
            rows[fr.table] = rows.get(fr.table, 0) + fr.batch.num_rows
            if fr.table == "block_events":
                block.append(fr.batch)
    size = next(p["bytes_xlated"] for p in progs
                if p.get("name") == "block_rq_issue_btf" and p["id"] in ours)
    return {"line": line, "hooks": sorted(h for h, m in start["hooks"].items() if m != "skipped"),
            "rows": rows, "size": size, "end": end,
            "block": pa.Table.from_batches(block) if block else None}


def test_agent_empty_programs_attach_every_hook_and_record_nothing(lab_factory, tmp_path):
    """bench/overhead's (e): `nestrace-agent --empty-programs` attaches
    the hooks `record` attaches, each program a few instructions long,
    and records nothing while fio writes through the stack; the same
    agent without it records the writes at every level."""
    from nestrace.capture.stack import discover
    lab = lab_factory("ext4", "xfs")
    stack = discover(lab.mount)
    empty = agent_alone(stack, ["--empty-programs"], tmp_path / "e.ntr", lab.mount)
    full = agent_alone(stack, [], tmp_path / "b.ntr", lab.mount)
    assert "empty programs: nothing is recorded" in empty["line"], empty["line"]
    assert "empty programs" not in full["line"], full["line"]
    assert empty["hooks"] == full["hooks"] and "block_rq_complete" in full["hooks"] \
        and "sys_enter" in full["hooks"]
    rows = empty["rows"]
    assert not {t: n for t, n in rows.items() if t in ("block_events", "vfs_events", "hostfs_events")}, rows
    assert full["rows"].get("block_events", 0) >= 2 * 2048 and \
        full["rows"].get("vfs_events", 0) >= 2048, full["rows"]
    assert empty["size"] <= 64 < full["size"], (empty["size"], full["size"])


def test_agent_floor_records_filter_and_record_headers_alone(lab_factory, tmp_path):
    """bench/overhead's (f): `nestrace-agent --floor-records` attaches the
    hooks `record` attaches and records what a capture records, each
    record its header alone: programs larger than empty ones (they
    filter and reserve) and smaller than a capture's, as many block,
    host-FS and vfs records as fio's writes make, and no block record
    carrying a request's or bio's address (a capture's always do).
    And (g): with --request-floor the block programs keep each request's
    times in their slots and write one header when it completes (or is
    requeued): as many block records as the capture has completions,
    where (f) writes one per event; the other families as in (f)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from nestrace.capture.stack import discover
    lab = lab_factory("ext4", "xfs")
    stack = discover(lab.mount)
    full = agent_alone(stack, [], tmp_path / "b.ntr", lab.mount)     # (fio lays its file out)
    floor = agent_alone(stack, ["--floor-records"], tmp_path / "f.ntr", lab.mount)
    empty = agent_alone(stack, ["--empty-programs"], tmp_path / "e.ntr", lab.mount)
    per_rq = agent_alone(stack, ["--request-floor"], tmp_path / "g.ntr", lab.mount)
    assert "floor records: headers alone" in floor["line"], floor["line"]
    assert "request floor: a header per block request" in per_rq["line"], per_rq["line"]
    assert floor["hooks"] == full["hooks"] == per_rq["hooks"]
    assert empty["size"] < floor["size"] < full["size"], (empty["size"], floor["size"], full["size"])
    rows = floor["rows"]
    assert rows.get("block_events", 0) >= 2 * 2048 and rows.get("hostfs_events", 0) >= 2048, rows
    # the vfs level filters by file as a capture does: fio's 2048 pwrite64s
    # and the few other calls on its file, no more than the capture saw
    assert 2048 <= rows.get("vfs_events", 0) <= full["rows"]["vfs_events"], (rows, full["rows"])
    kernel = pa.scalar(0xffff000000000000, pa.uint64())
    for name, t in (("floor", floor["block"]), ("full", full["block"])):
        ptr = pc.or_(pc.greater_equal(t["rq_id"], kernel), pc.greater_equal(t["bio_id"], kernel))
        seen = pc.sum(pc.cast(ptr, "int64")).as_py() or 0
        assert (seen == 0) if name == "floor" else (seen == t.num_rows), (name, seen, t.num_rows)
    # (g): fio's 2048 writes at two levels, ~4096 requests (and the file
    # systems' own few), each one record, where (f) has Q, G, D, C ...
    done = pc.sum(pc.cast(pc.is_in(full["block"]["action"], value_set=pa_codes("c", "requeue")),
                          "int64")).as_py()
    got = per_rq["rows"].get("block_request_records", 0)
    assert 2 * 2048 <= done and abs(got - done) <= 0.05 * done, (per_rq["rows"], done)
    # (f) writes Q, G, D and C for each of its run's ~4096 requests: four
    # records for each of (g)'s one, give or take an event at a run's edge
    # (one run of CI saw 16,383 against 4 x 4,096)
    assert got * 4 <= rows["block_events"] * 1.02, (per_rq["rows"], rows)
    assert per_rq["rows"].get("hostfs_events", 0) >= 2048 and \
        2048 <= per_rq["rows"].get("vfs_events", 0) <= full["rows"]["vfs_events"], per_rq["rows"]
    # requests whose times found no slot: none, at this depth
    assert per_rq["end"]["requests_lost"] == 0 and per_rq["rows"].get("block_events", 0) == 0, \
        per_rq["end"]


def pa_codes(*names: str):
    import pyarrow as pa

    from nestrace.schema import code
    return pa.array([code("block_action", n) for n in names], pa.uint16())
