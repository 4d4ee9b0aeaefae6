"""See bench/imports."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TRACING = Path("/sys/kernel/tracing")
EVENTS = ("block_bio_queue", "block_getrq", "block_rq_insert", "block_rq_issue",
          "block_rq_complete")
READ = """
import resource, sys, time
from nestrace.importers import tracecmd
t = time.perf_counter()
r = tracecmd.read(sys.argv[1])
print(r.table.num_rows, time.perf_counter() - t,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, sum(r.lost.values()))
"""


def record(tmp: Path, seconds: int) -> Path:
    """fio on a loop device with the block events on: the trace.dat."""
    img, dat = tmp / "disk.img", tmp / "trace.dat"
    subprocess.run(["truncate", "-s", "256M", str(img)], check=True)
    size = TRACING / "buffer_size_kb"
    old_size = size.read_text().split()[0]
    loop, enabled = None, []
    try:
        loop = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(img)],
                              check=True, capture_output=True, text=True).stdout.strip()
        size.write_text("65536\n")
        # empty the buffer of what was there (trace-cmd extract also turns events off)
        subprocess.run(["trace-cmd", "extract", "-o", str(tmp / "before.dat")], check=True,
                       capture_output=True)
        for e in EVENTS:
            f = TRACING / "events" / "block" / e / "enable"
            f.write_text("1\n")
            enabled.append(f)
        subprocess.run(["fio", "--name=r", f"--filename={loop}", "--rw=randread", "--bs=4k",
                        "--direct=1", "--ioengine=libaio", "--iodepth=8", f"--runtime={seconds}",
                        "--time_based", "--size=256M"], check=True, capture_output=True)
    finally:
        for f in enabled:
            f.write_text("0\n")
        if loop:
            subprocess.run(["losetup", "-d", loop], check=True)
    try:
        subprocess.run(["trace-cmd", "extract", "-o", str(dat)], check=True, capture_output=True)
    finally:
        size.write_text(old_size + "\n")
    return dat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=4, help="seconds of fio to record")
    ap.add_argument("--runs", type=int, default=2, help="reads of the file, each a new process")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/imports: needs root (tracefs, a loop device)")
    if (TRACING / "tracing_on").read_text().strip() != "1":
        raise SystemExit(f"bench/imports: {TRACING}/tracing_on is 0: nothing would be recorded")
    with tempfile.TemporaryDirectory(prefix="nestrace-bench-imports-", dir="/var/tmp") as t:
        dat = record(Path(t), args.seconds)
        mib = dat.stat().st_size / (1 << 20)
        print(f"trace-cmd extract of {args.seconds} s of fio 4k random reads on a loop device "
              f"({mib:.1f} MiB, v7 zstd), read by nestrace.importers.tracecmd.read:\n")
        print("| run | block events | lost | read s | peak RSS GB |")
        print("|---|---|---|---|---|")
        for i in range(args.runs):
            out = subprocess.run([sys.executable, "-c", READ, str(dat)], check=True,
                                 capture_output=True, text=True).stdout.split()
            n, secs, rss, lost = int(out[0]), float(out[1]), int(out[2]), int(out[3])
            print(f"| {i + 1} | {n:,} | {lost:,} | {secs:.2f} | {rss / 1e9:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
