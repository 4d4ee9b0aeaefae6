"""Overhead benchmark (see bench/overhead).  Prints a Markdown table of IOPS
per mode, the ratios (b)/(a) and (c)/(a) from the same run, the events
per second nestrace captured with the lost count, and the machine's CPU
time per I/O in each mode; then (e), the same hooks attached with every
program returning at once (the agent's --empty-programs): the floor
under (b) that the tracepoints alone set.

The trace output of (b) and (c) goes to --out-dir (default /dev/shm), off
the disk under test: the lab's disk image lives on the root disk, and a
trace written there competes with the workload for that disk (blktrace's
manual gives the same advice).  `--out-dir /var/tmp` measures that too."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NT = [sys.executable, "-m", "nestrace"]
TRACING = Path("/sys/kernel/tracing")


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def fio_cmd(mount: str, depth: int, runtime: int, out: Path) -> list[str]:
    """fio between two /proc/stat snapshots (out.cpu0, out.cpu1), so that CPU
    time is counted over the workload alone, not tracer start-up or seal."""
    engine = "--ioengine=psync" if depth == 1 else f"--ioengine=libaio --iodepth={depth}"
    fio = (f"fio --name=bench --directory={mount} --rw=randwrite --bs=4k --direct=1 "
           f"--size=256M --time_based --runtime={runtime} --output-format=json "
           f"--output={out} {engine}")
    return ["sh", "-c", f"head -1 /proc/stat > {out}.cpu0 && {fio} && head -1 /proc/stat > {out}.cpu1"]


def fio_result(out: Path) -> dict:
    """IOPS, and the machine's busy CPU time (user, nice, system, irq,
    softirq: not idle, iowait or steal) per I/O over the fio run."""
    job = json.loads(out.read_text())["jobs"][0]["write"]
    snap = [[int(x) for x in Path(f"{out}.cpu{i}").read_text().split()[1:9]] for i in (0, 1)]
    d = [b - a for a, b in zip(*snap)]
    busy_s = (d[0] + d[1] + d[2] + d[5] + d[6]) / os.sysconf("SC_CLK_TCK")
    return {"iops": job["iops"], "ios": job["total_ios"],
            "cpu_us_per_io": 1e6 * busy_s / max(job["total_ios"], 1)}


def cpu_times() -> list[int]:
    """Machine-wide jiffies from /proc/stat: user nice system idle iowait irq softirq steal."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def steal_pct(before: list[int], after: list[int]) -> float:
    d = [b - a for a, b in zip(before, after)]
    return 100.0 * d[7] / max(sum(d), 1)


def run_plain(mount, depth, runtime, tmp) -> dict:
    out = tmp / "fio.json"
    sh(*fio_cmd(mount, depth, runtime, out))
    return fio_result(out)


def run_nestrace(mount, depth, runtime, tmp, out_dir: Path, *flags: str) -> dict:
    out, store = tmp / "fio.json", out_dir / f"nestrace-bench-store-{time.monotonic_ns()}"
    t0 = time.monotonic()
    r = subprocess.run(NT + ["record", "-o", str(store), "--stack", mount, *flags, "--",
                             *fio_cmd(mount, depth, runtime, out)],
                       capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - t0
    if r.returncode:
        raise RuntimeError(r.stderr)
    import nestrace
    s = nestrace.open(store)
    m = s.rows("SELECT records_total, lost_total, completions_missed, "
               "(SELECT coalesce(sum(ringbuf_drops), 0) FROM lost_events) AS ringbuf_drops, "
               "(end_ns - start_ns) / 1e9 AS secs FROM capture_meta")[0]
    s.close()
    shutil.rmtree(store)
    return {**fio_result(out), "events": m["records_total"], "lost": m["lost_total"],
            "drops": m["ringbuf_drops"], "missed_c": m["completions_missed"] or 0,
            "events_per_s": m["records_total"] / max(m["secs"], 1e-9), "wall_s": wall}


def run_per_request(mount, depth, runtime, tmp, out_dir: Path) -> dict:
    """(p): (b) with --per-request: a block request recorded once, at its
    end, its phase times kept in the kernel (issue #75's item 3)."""
    return run_nestrace(mount, depth, runtime, tmp, out_dir, "--per-request")


def run_from_completions(mount, depth, runtime, tmp, out_dir: Path) -> dict:
    """(k): (b) with --from-completions: a block request recorded once, from
    its completion alone, its times read from the kernel's struct request;
    no program on a request's way down (issue #75's item 3, the shape of
    (h))."""
    return run_nestrace(mount, depth, runtime, tmp, out_dir, "--from-completions")


def run_empty(mount, depth, runtime, tmp) -> dict:
    """(e): the agent as `record` starts it (the same hooks, filters and
    CPUs), but with --empty-programs: each program returns at once, and
    nothing is recorded.  What the tracepoint hits alone cost: a floor
    for any capture of this design, which must attach these hooks."""
    return run_agent_alone(mount, depth, runtime, tmp, "--empty-programs", Path("/dev/null"))


def run_floor(mount, depth, runtime, tmp, out_dir: Path) -> dict:
    """(f): the agent as `record` starts it, with --floor-records: each
    program filters as (b)'s does, then writes its record's header alone
    (one clock read, no field), and the vfs level one header per call on
    a traced file, its file resolved and filtered at exit (an io_getevents
    that reaped any: one per call).  The records' bytes go through the agent
    to --out-dir as (b)'s do.  No hit does more work than in (b) and no
    I/O gets more records: the floor of any capture that writes a record
    per event on these hooks."""
    return run_agent_streaming(mount, depth, runtime, tmp, "--floor-records", out_dir)


def run_agent_streaming(mount, depth, runtime, tmp, flag: str, out_dir: Path) -> dict:
    """run_agent_alone with its stream to a file in out_dir, removed after."""
    out = out_dir / f"nestrace-bench-floor-{time.monotonic_ns()}.ntr"
    try:
        return run_agent_alone(mount, depth, runtime, tmp, flag, out)
    finally:
        out.unlink(missing_ok=True)


def run_request_floor(mount, depth, runtime, tmp, out_dir: Path) -> dict:
    """(g): as (f), but the block programs keep each request's phase times
    in maps (a bio's Q and G, a request's I and D) and write one header at
    its completion: the floor of a capture with a record per block request
    (issue #75's design), beside (f)'s record per event."""
    return run_agent_streaming(mount, depth, runtime, tmp, "--request-floor", out_dir)


MODES = ("a", "b", "c", "e", "f", "g", "h", "p", "k")

# (h): the block layer's tracepoints but its completions
BLOCK_BEGINNINGS = ("block_bio_queue,block_bio_backmerge,block_bio_frontmerge,block_getrq,"
                    "block_split,block_rq_insert,block_rq_issue,block_rq_merge")
COMPLETION_FLOOR = f"--floor-records --skip-hooks {BLOCK_BEGINNINGS}"


# The extra runs with kernel.bpf_stats_enabled: the mode each measures ->
# the agent's flags ("": `nestrace record`); results' key (depth, "stats_" + mode).
STATS = {"b": "", "f": "--floor-records", "g": "--request-floor", "h": COMPLETION_FLOOR,
         "p": "--per-request", "k": "--from-completions"}


def run_completion_floor(mount, depth, runtime, tmp, out_dir: Path) -> dict:
    """(h): as (f), but of the block layer's tracepoints only the request's
    completion (and requeue) attached: one header per request, and no
    hook on the way down.  The floor of a capture that reads a request's
    life from the kernel's own fields at completion (its allocation and
    issue times in struct request, where the block layer keeps them)."""
    return run_agent_streaming(mount, depth, runtime, tmp, COMPLETION_FLOOR, out_dir)


def run_agent_alone(mount, depth, runtime, tmp, flag: str, stream: Path, then: str = "",
                    before: str = "") -> dict:
    """fio under the agent alone, started as `record` starts it (hooks,
    filters, CPU pinning) with `flag` (its words: a --skip-hooks among
    them adds to record's), its stream written to `stream`; `before` and
    `then`, shell commands run before and after fio while the agent
    runs."""
    sys.path.insert(0, str(ROOT))
    from nestrace.capture.agent import agent_args, agent_cpus, side_families
    from nestrace.capture.stack import discover
    stack = discover(mount)
    pin = agent_cpus("auto")
    args = agent_args(stack, None, "auto", side_families(stack))
    words = flag.split()
    if "--skip-hooks" in words and "--skip-hooks" in args:
        i, j = words.index("--skip-hooks"), args.index("--skip-hooks")
        args[j + 1] += "," + words[i + 1]
        del words[i:i + 2]
    args += words + ["-o", str(stream)]
    out = tmp / "fio.json"
    agent = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                             preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None)
    try:
        said = []
        for line in agent.stderr:       # until "nestrace-agent: tracing (...)": all attached
            said.append(line)
            if line.startswith("nestrace-agent: tracing"):
                break
        else:
            raise RuntimeError(f"nestrace-agent {flag}: {''.join(said)}")
        cmd = fio_cmd(mount, depth, runtime, out)
        cmd[-1] = before + cmd[-1] + then
        sh(*cmd)
    finally:
        agent.send_signal(2)
        rest = agent.communicate(timeout=60)[1]
    if agent.returncode:
        raise RuntimeError(f"nestrace-agent {flag} exited {agent.returncode}: {rest}")
    return fio_result(out)


def run_ftrace(mount, depth, runtime, tmp, out_dir: Path, devs: list[str]) -> dict:
    out, log = tmp / "fio.json", out_dir / f"nestrace-bench-blk-{time.monotonic_ns()}.trace"
    if (TRACING / "tracing_on").read_text().strip() != "1":
        # with tracing off the blk tracer records nothing and costs nothing
        raise SystemExit(f"bench/overhead: {TRACING}/tracing_on is 0: the blk tracer would "
                         "record nothing; echo 1 > tracing_on and run again")
    (TRACING / "current_tracer").write_text("blk\n")
    for d in devs:
        (Path("/sys/block") / d / "trace" / "enable").write_text("1\n")
    with open(log, "wb") as f:
        reader = subprocess.Popen(["cat", str(TRACING / "trace_pipe")], stdout=f)
        try:
            sh(*fio_cmd(mount, depth, runtime, out))
        finally:
            for d in devs:
                (Path("/sys/block") / d / "trace" / "enable").write_text("0\n")
            time.sleep(0.5)
            reader.terminate()
            reader.wait()
            (TRACING / "current_tracer").write_text("nop\n")  # EBUSY while a reader is open
    lines = sum(1 for _ in open(log, "rb"))
    log.unlink()
    if lines == 0:
        raise SystemExit(f"bench/overhead: the blk tracer recorded nothing on {', '.join(devs)}")
    return {**fio_result(out), "events": lines}


def program_families() -> dict[str, str]:
    """BPF program name -> the family (vfs, block, hostfs) whose source
    declares it: each NT_TWIN(tp) is loaded as tp_btf or tp_raw."""
    import re
    out = {"nt_flush": "flush"}
    for src in sorted((ROOT / "tracers").glob("*.bpf.c")):
        fam = src.name.split(".")[0]
        for tp in re.findall(r"NT_TWIN\((\w+)\)", src.read_text()):
            out[f"{tp}_btf"] = out[f"{tp}_raw"] = fam
    return out


def run_bpf_stats(mount, depth, runtime, tmp, out_dir: Path, floor: str = "") -> dict:
    """One more (b) run (with `floor`, the agent alone with that flag: (f),
    (g) or (h)) with kernel.bpf_stats_enabled=1,
    outside the timed rounds (the kernel then reads the clock twice around
    every program run): the CPU time nestrace's programs spent, per family,
    per I/O.  bpftool reads the counters while fio's last I/Os are still
    traced."""
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = knob.read_text().strip()
    out, snap, agent = tmp / "fio.json", tmp / "progs.json", tmp / "agent.stat"
    store = out_dir / f"nestrace-bench-store-{time.monotonic_ns()}"
    # the agent's own CPU time over fio's run: its /proc stat before and after
    stat = "cat /proc/$(pgrep -x nestrace-agent | head -1)/stat"
    before = f"{stat} > {agent}0 && "
    then = f" && {stat} > {agent}1 && bpftool prog show -j > {snap}"
    knob.write_text("1\n")
    try:
        if floor:
            run_agent_alone(mount, depth, runtime, tmp, floor, store, then, before)
        else:
            cmd = fio_cmd(mount, depth, runtime, out)
            cmd[-1] = before + cmd[-1] + then
            r = subprocess.run(NT + ["record", "-o", str(store), "--stack", mount, "--", *cmd],
                               capture_output=True, text=True, cwd=ROOT)
            if r.returncode:
                raise RuntimeError(r.stderr)
    finally:
        knob.write_text(old + "\n")
        if store.is_dir():
            shutil.rmtree(store, ignore_errors=True)
        else:
            store.unlink(missing_ok=True)
    fams = program_families()
    ios = json.loads(out.read_text())["jobs"][0]["write"]["total_ios"]
    cost: dict[str, list[int]] = {}
    for p in json.loads(snap.read_text()):
        fam = fams.get(p.get("name"))
        if fam and p.get("run_cnt"):
            c = cost.setdefault(fam, [0, 0])
            c[0] += p["run_cnt"]
            c[1] += p["run_time_ns"]
    if not cost:
        raise SystemExit("bench/overhead: bpftool showed no nestrace program with run counts")
    # utime and stime, fields 14 and 15 of /proc/PID/stat (after the
    # parenthesised comm), in clock ticks
    ticks = [sum(int(x) for x in Path(f"{agent}{i}").read_text().rsplit(")", 1)[1].split()[11:13])
             for i in (0, 1)]
    return {"ios": ios, **fio_result(out),
            "agent_ns_per_io": 1e9 * (ticks[1] - ticks[0]) / os.sysconf("SC_CLK_TCK") / ios,
            "families": {f: {"runs_per_io": n / ios, "ns_per_run": t / n, "ns_per_io": t / ios}
                         for f, (n, t) in sorted(cost.items())}}


def print_iops_tables(results: dict, depths: list[int]) -> None:
    print("| iodepth | (a) none IOPS | (b) nestrace IOPS | (c) ftrace blk IOPS | (b)/(a) | (c)/(a) "
          "| nestrace events/s | nestrace lost (ring-buffer drops / completions missed) |")
    print("|---|---|---|---|---|---|---|---|")
    for depth in depths:
        med = {m: statistics.median(r["iops"] for r in results[(depth, m)]) for m in "abc"}
        b = results[(depth, "b")]
        evs = statistics.median(r["events_per_s"] for r in b)
        lost = sum(r["lost"] for r in b)
        drops, missed = sum(r["drops"] for r in b), sum(r["missed_c"] for r in b)
        print(f"| {depth} | {med['a']:.0f} | {med['b']:.0f} | {med['c']:.0f} | "
              f"{med['b'] / med['a']:.3f} | {med['c'] / med['a']:.3f} | {evs:.0f} "
              f"| {lost} ({drops} / {missed}) |")
    # The host is noisy: each round's own ratios show how far one run is
    # from the medians above.
    print("\n| iodepth | (b)/(a) per round: median [min, max] | (c)/(a) per round: median [min, max] "
          "| CPU µs per I/O a / b / c (median) | steal % a / b / c (median) |")
    print("|---|---|---|---|---|")
    for depth in depths:
        rs = {m: results[(depth, m)] for m in "abc"}
        cells = [per_round(rs[m], rs["a"]) for m in "bc"]
        steal = " / ".join(f"{statistics.median(r['steal_pct'] for r in rs[m]):.1f}" for m in "abc")
        cpu = " / ".join(f"{statistics.median(r['cpu_us_per_io'] for r in rs[m]):.1f}" for m in "abc")
        print(f"| {depth} | {cells[0]} | {cells[1]} | {cpu} | {steal} |")
    # (e): the hooks alone, every program returning at once.  What part of
    # (b)'s loss any capture on these tracepoints pays before recording.
    # (f): the same hooks, each hit filtered and recorded as a header
    # alone: what part any capture with a record per event pays.
    print("\n| iodepth | mode | IOPS | /(a) | /(a) per round: median [min, max] "
          "| CPU µs per I/O a / this / b (median) | (b)'s loss beyond this one's |")
    print("|---|---|---|---|---|---|---|")
    for depth in depths:
        for m, name in (("e", "(e) hooks only"), ("f", "(f) floor records"),
                        ("g", "(g) floor, a block record per request"),
                        ("h", "(h) floor, block completions alone"),
                        ("p", "(p) nestrace --per-request"),
                        ("k", "(k) nestrace --from-completions")):
            rs = {k: results[(depth, k)] for k in ("a", "b", m)}
            med = {k: statistics.median(r["iops"] for r in rs[k]) for k in rs}
            cpu = " / ".join(f"{statistics.median(r['cpu_us_per_io'] for r in rs[k]):.1f}"
                             for k in ("a", m, "b"))
            print(f"| {depth} | {name} | {med[m]:.0f} | {med[m] / med['a']:.3f} "
                  f"| {per_round(rs[m], rs['a'])} | {cpu} | {(med[m] - med['b']) / med['a']:.3f} |")


def print_per_request(results: dict, depths: list[int]) -> None:
    """(p) and (k) against (b) and the floor (f): records per I/O, losses,
    and the CPU per I/O each adds over (a) (#75's target: a capture adds
    at most half of what (f) adds)."""
    print("\n| iodepth | mode | records per I/O (b) / this | lost (ring-buffer drops / completions missed) "
          "| CPU µs per I/O added over (a): (b) / (f) / this | this added / (f) added |")
    print("|---|---|---|---|---|---|")
    for depth in depths:
        for m, name in (("p", "(p) --per-request"), ("k", "(k) --from-completions")):
            rs = {k: results[(depth, k)] for k in ("a", "b", "f", m)}
            cpu = {k: statistics.median(r["cpu_us_per_io"] for r in rs[k]) for k in rs}
            per_io = [statistics.median(r["events"] / max(r["ios"], 1) for r in rs[k]) for k in ("b", m)]
            added = {k: cpu[k] - cpu["a"] for k in ("b", "f", m)}
            share = f"{added[m] / added['f']:.2f}" if added["f"] > 0 else "((f) added none)"
            print(f"| {depth} | {name} | {per_io[0]:.1f} / {per_io[1]:.1f} | "
                  f"{sum(r['lost'] for r in rs[m])} ({sum(r['drops'] for r in rs[m])} / "
                  f"{sum(r['missed_c'] for r in rs[m])}) | "
                  f"{added['b']:.1f} / {added['f']:.1f} / {added[m]:.1f} | {share} |")


def spread(xs: list[float], fmt: str = ".1f") -> str:
    """median [min, max]"""
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}, {max(xs):{fmt}}]"


def print_paired(results: dict, depths: list[int], chosen: list[str]) -> None:
    """The CPU per I/O each mode adds over (a), paired round by round: this
    mode's run less the same round's (a).  The host's speed drifts over
    minutes (back to back, two runs of (a) may differ by 2 µs per I/O), so
    a round's difference is steadier than a difference of medians taken
    over the whole run; with (f) run, each mode's added CPU over (f)'s, as
    the ratio of the two medians and round by round (#75's target: at
    most 0.5)."""
    print("\nThe CPU per I/O each mode adds over (a), paired by round (this run less the "
          "same round's (a)):\n")
    print("| iodepth | mode | rounds | CPU µs per I/O added: median [min, max] "
          "| over (f)'s added: ratio of the medians | over (f)'s added, per round: median [min, max] |")
    print("|---|---|---|---|---|---|")
    for depth in depths:
        plain = results[(depth, "a")]
        added = {m: [r["cpu_us_per_io"] - a["cpu_us_per_io"] for r, a in zip(results[(depth, m)], plain)]
                 for m in chosen if m != "a"}
        for m, xs in added.items():
            ratio = per = ""
            if "f" in added and m != "f" and statistics.median(added["f"]) > 0:
                ratio = f"{statistics.median(xs) / statistics.median(added['f']):.2f}"
                qs = [x / f for x, f in zip(xs, added["f"]) if f > 0]
                per = spread(qs, ".2f") if qs else ""
            print(f"| {depth} | ({m}) | {len(xs)} | {spread(xs)} | {ratio} | {per} |")


def per_round(runs: list[dict], plain: list[dict]) -> str:
    """The median [min, max] of each round's IOPS over that round's (a)."""
    return spread([x["iops"] / a["iops"] for x, a in zip(runs, plain)], ".3f")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runtime", type=int, default=10, help="seconds per fio run")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of a/b/c")
    ap.add_argument("--depths", default="1,32")
    ap.add_argument("--out-dir", default="/dev/shm",
                    help="where (b) and (c) write their traces (default /dev/shm: off the disk under test)")
    ap.add_argument("--no-bpf-stats", dest="bpf_stats", action="store_false",
                    help="skip the extra capture that measures the BPF programs' own CPU time")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="the modes run, of " + ",".join(MODES) + " ((a) is always run: every "
                         "other is measured against it); the tables that need a mode left out "
                         "are left out")
    args = ap.parse_args()
    chosen = ["a"] + [m for m in MODES if m != "a" and m in args.modes.split(",")]
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        print(f"bench/overhead: --modes: no mode {', '.join(sorted(unknown))} "
              f"(the modes: {', '.join(MODES)})", file=sys.stderr)
        return 2
    if os.geteuid():
        print("bench/overhead: needs root", file=sys.stderr)
        return 2
    if not (TRACING / "current_tracer").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACING)], check=False)
    # hold the CPUs out of deep idle for the whole run
    lat = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    os.write(lat, struct.pack("i", 0))
    lab = "bench"
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(NT + ["lab", "down", "--name", lab], capture_output=True, cwd=ROOT)
    mount = sh(*NT, "lab", "up", "--name", lab, "--guest-fs", "ext4", "--host-fs", "xfs",
               "--image-size", "1G", cwd=ROOT).stdout.strip()
    results: dict = {}
    try:
        state = json.loads(Path(f"/run/nestrace/labs/{lab}/state.json").read_text())
        devs = [Path(state["vdisk"]).name, Path(state["disk"]).name]
        sh("fio", "--name=bench", f"--directory={mount}", "--rw=write", "--bs=1M", "--direct=1",
           "--size=256M", "--ioengine=psync", "--output=/dev/null")
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            for depth in [int(d) for d in args.depths.split(",")]:
                modes = [(m, fn) for m, fn in (
                    ("a", run_plain), ("b", run_nestrace), ("c", run_ftrace),
                    ("e", run_empty), ("f", run_floor), ("g", run_request_floor),
                    ("h", run_completion_floor), ("p", run_per_request),
                    ("k", run_from_completions)) if m in chosen]
                for rnd in range(args.rounds):
                    # rotate the order, so that no mode always follows another
                    k = rnd % len(modes)
                    for mode, fn in modes[k:] + modes[:k]:
                        extra = {"a": (), "b": (out_dir,), "c": (out_dir, devs), "e": (),
                                 "f": (out_dir,), "g": (out_dir,), "h": (out_dir,),
                                 "p": (out_dir,), "k": (out_dir,)}[mode]
                        t0 = cpu_times()
                        r = fn(mount, depth, args.runtime, tmp, *extra)
                        r["steal_pct"] = round(steal_pct(t0, cpu_times()), 1)
                        results.setdefault((depth, mode), []).append(r)
                        print(f"depth {depth} round {rnd} mode {mode}: {r}", file=sys.stderr)
                if args.bpf_stats:
                    for m in (m for m in STATS if m in chosen):
                        r = run_bpf_stats(mount, depth, args.runtime, tmp, out_dir, STATS[m])
                        results[(depth, f"stats_{m}")] = r
                        print(f"depth {depth} bpf stats_{m}: {r}", file=sys.stderr)
    finally:
        subprocess.run(NT + ["lab", "down", "--name", lab], capture_output=True, cwd=ROOT)
        os.close(lat)
    print(f"\nfio 4k randwrite, ext4 on xfs lab stack (guest-dio on, host-dio on), "
          f"{args.rounds} rounds of {args.runtime} s in rotating order, median IOPS; "
          f"traces written to {out_dir}\n")
    depths = sorted({d for d, _ in results})
    if args.rounds:     # --rounds 0: the BPF programs' table alone
        if {"b", "c", "e", "f", "g", "h", "p", "k"} <= set(chosen):
            print_iops_tables(results, depths)
            print_per_request(results, depths)
        print_paired(results, depths, chosen)
    stats = [m for m in STATS if m in chosen]
    if args.bpf_stats and stats:
        # kernel.bpf_stats_enabled adds two clock reads to every run: an
        # upper bound on what the programs cost in the rounds above.
        names = ", ".join(f"({m})" for m in stats)
        print(f"\nBPF programs' own CPU time in one extra run each of {names} ((b): `nestrace "
              "record`; the others the agent alone with their flags) with "
              "kernel.bpf_stats_enabled=1 (upper bounds: the stats add two clock reads per run), "
              "and the agent process's own CPU time (user and system) over the same fio run\n")
        modes = ["" if m == "b" else f"({m}) " for m in stats]
        print("| iodepth | family | " + " | ".join(f"{m}runs per I/O | {m}ns per run | {m}ns per I/O"
                                                  for m in modes) + " |")
        print("|---|---|" + "---|---|---|" * len(modes))
        for depth in depths:
            runs = [results[(depth, f"stats_{m}")]["families"] for m in stats]
            for f in sorted(set().union(*runs)):
                cells = [f"{c['runs_per_io']:.2f} | {c['ns_per_run']:.0f} | {c['ns_per_io']:.0f}"
                         if c else " | | " for c in (x.get(f) for x in runs)]
                print(f"| {depth} | {f} | {' | '.join(cells)} |")
            total = [sum(c["ns_per_io"] for c in x.values()) for x in runs]
            print(f"| {depth} | all" + "".join(f" | | | {t:.0f}" for t in total) + " |")
            agent = [results[(depth, f"stats_{m}")]["agent_ns_per_io"] for m in stats]
            print(f"| {depth} | the agent's own CPU" + "".join(f" | | | {a:.0f}" for a in agent) + " |")
            own = [t + a for t, a in zip(total, agent)]
            print(f"| {depth} | nestrace's own CPU (all + agent)"
                  + "".join(f" | | | {o:.0f}" for o in own) + " |")
            if "f" in stats:
                f = own[stats.index("f")]
                print(f"| {depth} | nestrace's own, over (f)'s"
                      + "".join(f" | | | {o / f:.2f}" for o in own) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
