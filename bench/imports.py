"""See bench/imports."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACING = Path("/sys/kernel/tracing")
EVENTS = ("block_bio_queue", "block_getrq", "block_rq_insert", "block_rq_issue",
          "block_rq_complete")
ROOT = Path(__file__).resolve().parent.parent
NESTRACE = [sys.executable, "-m", "nestrace"]


def fio(loop: str, seconds: int) -> None:
    subprocess.run(["fio", "--name=r", f"--filename={loop}", "--rw=randread", "--bs=4k",
                    "--direct=1", "--ioengine=libaio", "--iodepth=8", f"--runtime={seconds}",
                    "--time_based", "--size=256M"], check=True, capture_output=True)


# a long trace: 4 KiB sequential reads of a sparse 64 GiB device, 16 in
# flight, submitted 16 at a time (the plug merges some), 20,000 a second:
# every bio starts at a sector of its own, and the trace outlasts the 30 s
# after which the pairings forget a start (STALE_NS)
LONG_SIZE = "64G"


def fio_long(loop: str, seconds: int) -> None:
    subprocess.run(["fio", "--name=s", f"--filename={loop}", "--rw=read", "--bs=4k",
                    "--direct=1", "--ioengine=libaio", "--iodepth=16",
                    "--iodepth_batch_submit=16", "--rate_iops=20000", f"--runtime={seconds}",
                    "--time_based", f"--size={LONG_SIZE}"], check=True, capture_output=True)


class Loop:
    """A loop device with direct I/O on a sparse file in tmp (256 MiB)."""

    def __init__(self, tmp: Path, size: str = "256M"):
        self.img = tmp / "disk.img"
        subprocess.run(["truncate", "-s", size, str(self.img)], check=True)

    def __enter__(self) -> str:
        self.dev = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(self.img)],
                                  check=True, capture_output=True, text=True).stdout.strip()
        return self.dev

    def __exit__(self, *exc) -> None:
        subprocess.run(["losetup", "-d", self.dev], check=True)
        self.img.unlink()


def record_blk(tmp: Path, seconds: int, long: bool = False) -> tuple[str, list[Path], int]:
    """The kernel's blk tracer in bin mode (what blktrace reads from relay
    files, which this kernel's lockdown refuses) on the loop device under
    fio (long: fio_long, on a LONG_SIZE device), read from trace_pipe, then
    split per CPU as blktrace writes it (DEV.blktrace.N): its name, the
    files and their records.  Every ftrace setting it touches is put
    back."""
    knobs = {TRACING / "trace_clock": "mono", TRACING / "options" / "bin": "1",
             TRACING / "options" / "context-info": "0"}
    old = {k: k.read_text().strip() for k in knobs}
    old[TRACING / "trace_clock"] = old[TRACING / "trace_clock"].split("[")[1].split("]")[0]
    if (TRACING / "current_tracer").read_text().strip() != "nop":
        raise SystemExit("bench/imports: another ftrace tracer is in use")
    pipe = tmp / "pipe.bin"
    reader, enable = None, None
    with Loop(tmp, LONG_SIZE if long else "256M") as loop:
        try:
            for k, v in knobs.items():
                k.write_text(v + "\n")
            (TRACING / "current_tracer").write_text("blk\n")
            with open(pipe, "wb") as f:
                reader = subprocess.Popen(["cat", str(TRACING / "trace_pipe")], stdout=f)
            enable = Path("/sys/block") / Path(loop).name / "trace" / "enable"
            enable.write_text("1\n")
            (fio_long if long else fio)(loop, seconds)
        finally:
            if enable:
                enable.write_text("0\n")
            if reader:
                time.sleep(0.5)     # (the reader drains the buffer)
                reader.terminate()
                reader.wait()
            (TRACING / "current_tracer").write_text("nop\n")
            for k, v in old.items():
                k.write_text(v + "\n")
    name = Path(loop).name
    # (in a child: this process stays small, and so do the ones it starts,
    # whose peak RSS counts what they were forked with)
    r = subprocess.run([sys.executable, "-c", SPLIT, str(pipe), str(tmp / name)],
                       capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode:
        raise SystemExit(f"bench/imports: splitting {pipe} per CPU failed (exit {r.returncode})")
    n = int(r.stdout)
    pipe.unlink()
    return name, sorted(tmp.glob(f"{name}.blktrace.*")), n


SPLIT = """
import sys
from nestrace.importers import blktrace
files, n, problems = blktrace.split_by_cpu(sys.argv[1], sys.argv[2])
# (the reader stopped mid-record, or the ftrace buffer lost events on a
# busy machine: named, every whole record kept)
for p in problems:
    print(f"bench/imports: {p}: left out", file=sys.stderr)
print(n)
"""
COUNT = """
import sys, nestrace
print(nestrace.open(sys.argv[1]).rows("SELECT count(*) AS n FROM block_events")[0]["n"])
"""


def record_dat(tmp: Path, seconds: int) -> Path:
    """fio on a loop device with the block tracepoints on in the top
    ftrace buffer, saved by `trace-cmd extract` (v7, zstd).  The buffer
    holds what extract saves: 64 MiB a CPU (8 s of this fio fill it), more
    for longer runs (10 MB a CPU a second: a 38 s run keeps about 10 M
    events)."""
    dat = tmp / "trace.dat"
    size = TRACING / "buffer_size_kb"
    old_size = size.read_text().split()[0]
    enabled = []
    with Loop(tmp) as loop:
        try:
            size.write_text(f"{max(65536, seconds * 10000)}\n")
            # empty the buffer of what was there (trace-cmd extract also turns events off)
            subprocess.run(["trace-cmd", "extract", "-o", str(tmp / "before.dat")], check=True,
                           capture_output=True)
            for e in EVENTS:
                f = TRACING / "events" / "block" / e / "enable"
                f.write_text("1\n")
                enabled.append(f)
            fio(loop, seconds)
        finally:
            for f in enabled:
                f.write_text("0\n")
    try:
        subprocess.run(["trace-cmd", "extract", "-o", str(dat)], check=True, capture_output=True)
    finally:
        size.write_text(old_size + "\n")
        (tmp / "before.dat").unlink(missing_ok=True)
    return dat


def timed(cmd: list[str], cwd: Path, out=subprocess.DEVNULL) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of one run of cmd, a fresh process,
    started with nothing left to write back (blkparse's 200 MB dump is not
    written back during the next step)."""
    os.sync()
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    secs = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    if p.returncode:
        raise SystemExit(f"bench/imports: {' '.join(cmd)} exited {p.returncode}: {err[-2000:]}")
    return secs, ru.ru_maxrss * 1024 / 1e9


def row(step: str, tool: tuple[str, float, float], ours: tuple[str, float, float]) -> str:
    return (f"| {step} | `{tool[0]}`: {tool[1]:.2f} s, {tool[2]:.2f} GB | `{ours[0]}`: "
            f"{ours[1]:.2f} s, {ours[2]:.2f} GB | {tool[1] / ours[1]:.2f} |")


def blk_part(tmp: Path, seconds: int) -> None:
    name, files, records = record_blk(tmp, seconds)
    n = sum(f.stat().st_size for f in files)
    bp = timed(["blkparse", "-i", name, "-d", f"{name}.bin", "-o", "/dev/null"], tmp)
    btt = timed(["btt", "-i", f"{name}.bin", "-o", str(tmp / "btt")], tmp)
    imp = timed(NESTRACE + ["import", *map(str, files), "-o", str(tmp / "blk.store")], tmp)
    rep = timed(NESTRACE + ["report", str(tmp / "blk.store")], tmp)
    print(f"The kernel's blk tracer (bin mode) on a loop device under {seconds} s of fio 4 KiB "
          f"random reads (iodepth 8): {records:,} records, {n / 1e6:.0f} MB, split per CPU "
          f"into {len(files)} files as blktrace writes them.  One run of each, a fresh "
          "process; ratio = the classic tool's time over nestrace's (> 1: nestrace faster).\n")
    print("| step | classic tool | nestrace | ratio |")
    print("|---|---|---|---|")
    print(row("read the binary trace", ("blkparse -d -o /dev/null", *bp), ("nestrace import", *imp)))
    print(row("analyse", ("btt", *btt), ("nestrace report", *rep)))
    both = (bp[0] + btt[0], max(bp[1], btt[1]))
    ours = (imp[0] + rep[0], max(imp[1], rep[1]))
    print(row("both", ("blkparse + btt", *both), ("import + report", *ours)))
    for f in files:
        f.unlink()
    shutil.rmtree(tmp / "blk.store")


def large_part(tmp: Path, seconds: int) -> None:
    """The import's time and peak memory on a file of about 10 M records
    (issue #75: under 1 GiB), blkparse's beside it."""
    name, files, records = record_blk(tmp, seconds)
    n = sum(f.stat().st_size for f in files)
    bp = timed(["blkparse", "-i", name, "-d", "/dev/null", "-o", "/dev/null"], tmp)
    imp = timed(NESTRACE + ["import", *map(str, files), "-o", str(tmp / "large.store")], tmp)
    print(f"\nThe same, {seconds} s of fio: {records:,} records, {n / 1e6:.0f} MB in "
          f"{len(files)} files:\n")
    print("| step | classic tool | nestrace | ratio |")
    print("|---|---|---|---|")
    print(row("read the large trace", ("blkparse -d -o /dev/null", *bp), ("nestrace import", *imp)))
    for f in files:
        f.unlink()
    shutil.rmtree(tmp / "large.store")


def long_part(tmp: Path, lengths: list[int]) -> None:
    """The import's peak memory on long sequential traces of each length
    (seconds), at one rate: it should not grow with the length."""
    print("\nLong traces: 4 KiB sequential reads of a sparse 64 GiB loop device, 20,000 a "
          "second, 16 in flight, submitted 16 at a time; every bio at a sector of its own. "
          "The pairings forget a start 30 s after it (STALE_NS):\n")
    print("| fio s | records | MB | bios merged | `blkparse -d /dev/null -o /dev/null` (s; GB) "
          "| `nestrace import` (s; GB) |")
    print("|---|---|---|---|---|---|")
    for seconds in lengths:
        name, files, records = record_blk(tmp, seconds, long=True)
        n = sum(f.stat().st_size for f in files)
        bp = timed(["blkparse", "-i", name, "-d", "/dev/null", "-o", "/dev/null"], tmp)
        imp = timed(NESTRACE + ["import", *map(str, files), "-o", str(tmp / "long.store")],
                    tmp)
        merged = int(subprocess.run(
            [sys.executable, "-c", COUNT.replace("FROM block_events",
                                                 "FROM block_events WHERE action IN (2, 3)"),
             str(tmp / "long.store")], capture_output=True, text=True, check=True).stdout)
        print(f"| {seconds} | {records:,} | {n / 1e6:.0f} | {merged:,} | {bp[0]:.2f}; {bp[1]:.2f} "
              f"| {imp[0]:.2f}; {imp[1]:.2f} |")
        for f in files:
            f.unlink()
        shutil.rmtree(tmp / "long.store")


def dat_part(tmp: Path, seconds: int, step: str = "read trace.dat") -> None:
    dat = record_dat(tmp, seconds)
    tc = timed(["trace-cmd", "report", "-i", str(dat)], tmp)
    imp = timed(NESTRACE + ["import", str(dat), "-o", str(tmp / "dat.store")], tmp)
    events = int(subprocess.run([sys.executable, "-c", COUNT, str(tmp / "dat.store")],
                                capture_output=True, text=True, check=True).stdout)
    print(f"\n`trace-cmd extract` of {seconds} s of the same fio with the block tracepoints "
          f"on ({dat.stat().st_size / 1e6:.0f} MB, v7 zstd; {events:,} block events stored):\n")
    print("| step | classic tool | nestrace | ratio |")
    print("|---|---|---|---|")
    print(row(step, ("trace-cmd report > /dev/null", *tc), ("nestrace import", *imp)))
    dat.unlink()
    shutil.rmtree(tmp / "dat.store")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=8,
                    help="seconds of fio to record (8: over 3 M blk tracer records here)")
    ap.add_argument("--large-seconds", type=int, default=21,
                    help="seconds of fio for the peak-memory blk tracer file (21: about 10 M "
                    "records here; 0: none)")
    ap.add_argument("--large-dat-seconds", type=int, default=38,
                    help="seconds of fio for the peak-memory trace.dat (38: about 10 M block "
                    "events here; 0: none)")
    ap.add_argument("--long-seconds", default="60,180",
                    help="seconds of fio for each long sequential trace, whose import's peak "
                    "memory should not grow with its length (\"\": none)")
    ap.add_argument("--only-long", action="store_true",
                    help="only the long traces")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/imports: needs root (tracefs, a loop device)")
    if (TRACING / "tracing_on").read_text().strip() != "1":
        raise SystemExit(f"bench/imports: {TRACING}/tracing_on is 0: nothing would be recorded")
    for tool in ("blkparse", "btt", "trace-cmd", "fio"):
        if not shutil.which(tool):
            raise SystemExit(f"bench/imports: no {tool} (ci/setup installs it)")
    with tempfile.TemporaryDirectory(prefix="nestrace-bench-imports-", dir="/var/tmp") as t:
        if args.long_seconds:
            long_part(Path(t), [int(x) for x in args.long_seconds.split(",")])
        if args.only_long:
            return 0
        blk_part(Path(t), args.seconds)
        if args.large_seconds:
            large_part(Path(t), args.large_seconds)
        dat_part(Path(t), args.seconds)
        if args.large_dat_seconds:
            dat_part(Path(t), args.large_dat_seconds, "read the large trace.dat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
