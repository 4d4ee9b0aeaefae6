"""The benchmarks run (at toy sizes: no timing is checked here, only that
each bench still works end to end and prints its table)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

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
