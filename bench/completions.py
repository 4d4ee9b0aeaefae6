"""See bench/completions."""
from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NT = [sys.executable, "-m", "nestrace"]
FT = Path("/sys/kernel/tracing/instances/nestrace_completions")
LAB = "completions"
# ftrace: "<task>-<pid> [cpu] flags time: block_rq_complete: maj,min rwbs () sector + n ..."
LINE = re.compile(r"^\s*(.+)-(\d+)\s+\[(\d+)\]\s+\S+\s+[\d.]+: block_rq_complete: "
                  r"(\d+),(\d+) \S+ \(\S*\) (\d+) \+ \d+")


def ftrace(on: bool) -> None:
    if on:
        FT.mkdir(exist_ok=True)
        (FT / "buffer_size_kb").write_text("32768")
        (FT / "trace").write_text("")
    (FT / "events/block/block_rq_complete/enable").write_text("1" if on else "0")


def unrecorded(store: Path, tasks: dict) -> Counter:
    """The store's requests dispatched before the end that have no C,
    counted by the task ftrace saw a completion at their (dev, sector) on."""
    import nestrace
    s = nestrace.open(store)
    rows = s.rows("SELECT r.dev, r.sector FROM block_requests r, capture_meta m "
                  "WHERE r.capture_id = m.capture_id AND r.c_ns IS NULL AND r.d_ns <= m.end_ns")
    return Counter(tasks.get((r["dev"], r["sector"]), "(not in ftrace)") for r in rows)


def one_run(mnt: str, image: str, tmp: Path, i: int) -> dict:
    from nestrace.capture.lab import Lab
    from nestrace.capture.matrix import drop_caches
    drop_caches(Lab(LAB).state())       # (the lab's own file systems synced, none other)
    g, h = tmp / f"g{i}", tmp / f"h{i}"
    ftrace(True)
    host = subprocess.Popen(NT + ["record", "-o", str(h), "--side", "host", "--image", image],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in host.stderr:
            if "recording; Ctrl-C to stop" in line:
                break
        subprocess.run(NT + ["record", "-o", str(g), "--side", "guest", "--stack", mnt, "--",
                             "fio", "--name=t", f"--directory={mnt}", "--ioengine=psync",
                             "--output=/dev/null", "--rw=randread", "--bs=4k", "--direct=1",
                             "--size=64M", "--io_size=16M"],
                       cwd=ROOT, check=True, capture_output=True)
    finally:
        host.send_signal(signal.SIGINT)
        host.communicate(timeout=120)
        ftrace(False)
    # completions in ftrace, by (dev_t, sector) -> task of the last one
    tasks, ctx = {}, Counter()
    for line in (FT / "trace").read_text().splitlines():
        m = LINE.match(line)
        if m:
            task = m[1].strip()
            tasks[((int(m[4]) << 20) | int(m[5]), int(m[6]))] = task
            ctx[task] += 1
    import nestrace
    out = {}
    for side, store in (("guest", g), ("host", h)):
        meta = nestrace.open(store).rows("SELECT completions_missed, requests_unfinished, "
                                         "hook_misses, lost_total FROM capture_meta")[0]
        out[side] = {"meta": meta, "without_c": dict(unrecorded(store, tasks))}
    out["ftrace_completions_by_task"] = dict(ctx.most_common(6))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hog", type=int, default=0, help="busy loops to run meanwhile (they make "
                    "the losses more frequent)")
    args = ap.parse_args()
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.hog)]
    subprocess.run(NT + ["lab", "down", "--name", LAB], capture_output=True, cwd=ROOT)
    mnt = subprocess.run(NT + ["lab", "up", "--name", LAB, "--guest-fs", "ext4", "--host-fs", "xfs",
                               "--guest-dio", "on", "--host-dio", "on"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    try:
        sys.path.insert(0, str(ROOT))
        from nestrace.capture.stack import discover
        image = discover(mnt).image_path
        subprocess.run(["fio", "--name=t", f"--directory={mnt}", "--rw=write", "--bs=1M",
                        "--direct=1", "--size=64M", "--output=/dev/null"], check=True)
        with tempfile.TemporaryDirectory(dir="/var/tmp") as t:
            for i in range(1, args.runs + 1):
                r = one_run(mnt, image, Path(t), i)
                print(f"run {i}:")
                for side in ("guest", "host"):
                    print(f"  {side}: {r[side]['meta']}; requests without C by the task "
                          f"ftrace saw their completion on: {r[side]['without_c']}")
                print(f"  ftrace completions by task: {r['ftrace_completions_by_task']}")
    finally:
        for p in hogs:
            p.kill()
            p.wait()
        if FT.exists():
            FT.rmdir()
        subprocess.run(NT + ["lab", "down", "--name", LAB], capture_output=True, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
