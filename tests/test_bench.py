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
    floor = [l.split(" | ") for l in out.splitlines() if re.match(r"\| \d+ \| [\d.]+ \|", l)]
    assert len(floor) == 1 and float(floor[0][5]) > 0, out   # and its floor


def test_bench_render_runs():
    assert "`nestrace html` on " in bench("render", "--events", "200000")


def test_bench_overhead_runs():
    out = bench("overhead", "--rounds", "1", "--runtime", "2", "--depths", "1", "--no-bpf-stats")
    assert "| 1 | " in out and "(b)/(a)" in out
    assert re.search(r"^\| 1 \| \d+ \| [\d.]+ \| [\d.]+ \[", out, re.M), out   # (e)'s row


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
    out = bench("imports", "--seconds", "1", "--runs", "1")
    rows = [l for l in out.splitlines() if re.match(r"\| 1 \| [\d,]+ \|", l)]
    assert len(rows) == 1 and int(rows[0].split(" | ")[1].replace(",", "")) > 1000, out


def test_agent_empty_programs_attach_every_hook_and_record_nothing(lab_factory, tmp_path):
    """bench/overhead's (e): `nestrace-agent --empty-programs` attaches
    the hooks `record` attaches, each program a few instructions long,
    and records nothing while fio writes through the stack; the same
    agent without it records the writes at every level."""
    import json
    import signal
    from nestrace.record import agent_args, side_families
    from nestrace.stack import discover
    from nestrace.stream import iter_frames
    lab = lab_factory("ext4", "xfs")
    stack = discover(lab.mount)
    fio = ["fio", "--name=e", f"--directory={lab.mount}", "--rw=randwrite", "--bs=4k",
           "--direct=1", "--size=8M", "--output=/dev/null"]
    seen = {}
    for empty in (True, False):
        out = tmp_path / f"{empty}.ntr"
        agent = subprocess.Popen(agent_args(stack, None, "auto", side_families(stack))
                                 + (["--empty-programs"] if empty else []) + ["-o", str(out)],
                                 stderr=subprocess.PIPE, text=True)
        try:
            line = ""
            for line in agent.stderr:    # up to the line that says all is attached
                if line.startswith("nestrace-agent: tracing"):
                    break
            assert line.startswith("nestrace-agent: tracing"), line
            assert ("empty programs: nothing is recorded" in line) == empty, line
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
        rows: dict[str, int] = {}
        for fr in frames:
            if fr.batch is not None:
                rows[fr.table] = rows.get(fr.table, 0) + fr.batch.num_rows
        sizes = {p["name"]: p["bytes_xlated"] for p in progs
                 if p.get("name") == "block_rq_issue_btf" and p["id"] in ours}
        seen[empty] = (sorted(h for h, m in start["hooks"].items() if m != "skipped"), rows,
                       sizes)
    hooks, rows, sizes = seen[True]
    assert hooks == seen[False][0] and "block_rq_complete" in hooks and "sys_enter" in hooks
    assert not {t: n for t, n in rows.items() if t in ("block_events", "vfs_events", "hostfs_events")}, rows
    assert seen[False][1].get("block_events", 0) >= 2 * 2048 and \
        seen[False][1].get("vfs_events", 0) >= 2048, seen[False][1]
    assert sizes["block_rq_issue_btf"] <= 64 < seen[False][2]["block_rq_issue_btf"], sizes
