"""See bench/loop_workers."""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NT = [sys.executable, "-m", "nestrace"]
INSTANCES = Path("/sys/kernel/tracing/instances")
LAB = "benchlw"


class QueueCounter:
    """workqueue_queue_work events whose workqueue matches FILTER, counted
    in a tracefs instance of its own: the buffer keeps a few, and its
    per-CPU stats count every event (entries + overruns)."""

    def __init__(self, name: str, filt: str):
        self.dir = INSTANCES / f"nestrace_lw_{name}"
        self.dir.mkdir()
        (self.dir / "buffer_size_kb").write_text("64")
        (self.event / "filter").write_text(filt)

    @property
    def event(self) -> Path:
        return self.dir / "events/workqueue/workqueue_queue_work"

    def start(self) -> None:
        (self.dir / "trace").write_text("")
        (self.event / "enable").write_text("1")

    def stop(self) -> int:
        (self.event / "enable").write_text("0")
        n = 0
        for stats in self.dir.glob("per_cpu/cpu*/stats"):
            for line in stats.read_text().splitlines():
                key, _, val = line.partition(":")
                if key in ("entries", "overrun"):
                    n += int(val)
        return n

    def remove(self) -> None:
        if self.dir.exists():
            (self.event / "enable").write_text("0")
            self.dir.rmdir()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runtime", type=int, default=8, help="seconds per fio run")
    ap.add_argument("--modes", default="plain,traced,plain,traced,plain,traced",
                    help="runs in order: plain (no tracing), traced (nestrace record), or "
                    "traced:FAMILY+FAMILY (only those BPF program families: vfs, block, hostfs)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for m in modes:
        fams = m.partition(":")[2].split("+") if m.startswith("traced:") else []
        if m not in ("plain", "traced") and (not fams or set(fams) - {"vfs", "block", "hostfs"}):
            ap.error(f"--modes: {m}: plain, traced or traced:FAMILY+FAMILY (vfs, block, hostfs)")
    subprocess.run(NT + ["lab", "down", "--name", LAB], capture_output=True, cwd=ROOT)
    mount = subprocess.run(NT + ["lab", "up", "--name", LAB, "--guest-fs", "ext4", "--host-fs", "xfs",
                                 "--image-size", "1G"],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()
    counters: dict[str, QueueCounter] = {}
    lat = os.open("/dev/cpu_dma_latency", os.O_WRONLY)   # idle exits otherwise dominate
    os.write(lat, struct.pack("i", 0))
    rows = []
    try:
        sys.path.insert(0, str(ROOT))
        from nestrace.capture.stack import discover
        st = discover(mount)
        queues = {"disk": st.disk.name, "vdisk": st.vdisk.name}   # (loop N: workqueue loopN)
        for level, q in queues.items():
            counters[level] = QueueCounter(level, f'workqueue == "{q}"')
        counters["dio"] = QueueCounter("dio", 'workqueue ~ "dio*"')
        subprocess.run(["fio", "--name=bench", f"--directory={mount}", "--rw=write", "--bs=1M",
                        "--direct=1", "--size=256M", "--ioengine=psync", "--output=/dev/null"],
                       check=True)
        with tempfile.TemporaryDirectory(dir="/dev/shm") as t:
            out = Path(t) / "fio.json"
            fio = ["fio", "--name=bench", f"--directory={mount}", "--rw=randwrite", "--bs=4k",
                   "--direct=1", "--size=256M", "--time_based", f"--runtime={args.runtime}",
                   "--ioengine=libaio", "--iodepth=32", "--output-format=json", f"--output={out}"]
            for i, mode in enumerate(modes, 1):
                for c in counters.values():
                    c.start()
                if mode == "plain":
                    subprocess.run(fio, check=True)
                elif mode == "traced":
                    subprocess.run(NT + ["record", "-o", str(Path(t) / f"s{i}"), "--stack", mount,
                                         "--", *fio], check=True, capture_output=True, cwd=ROOT)
                else:   # (the CLI has no switch for families: the API's)
                    code = ("import sys; from nestrace.capture.record import record; "
                            "from nestrace.capture.stack import discover; "
                            "record(sys.argv[1], discover(sys.argv[2]), command=sys.argv[4:], "
                            "families=sys.argv[3], log=lambda m: None)")
                    subprocess.run([sys.executable, "-c", code, str(Path(t) / f"s{i}"), mount,
                                    mode.partition(":")[2].replace("+", ","), *fio],
                                   check=True, capture_output=True, cwd=ROOT)
                n = {k: c.stop() for k, c in counters.items()}
                w = json.loads(out.read_text())["jobs"][0]["write"]
                rows.append((i, mode, w["iops"], w["total_ios"], n))
                print(f"run {i} ({mode}): {w['iops']:.0f} IOPS", file=sys.stderr)
    finally:
        for c in counters.values():
            c.remove()
        os.close(lat)
        subprocess.run(NT + ["lab", "down", "--name", LAB], capture_output=True, cwd=ROOT)
    print(f"\nfio 4k randwrite QD32, {args.runtime} s per run, ext4 on xfs, both loops direct: "
          f"work queued per write\n")
    print(f"| run | mode | IOPS | writes | to the disk loop's worker ({queues['disk']}) "
          f"| to the vdisk loop's worker ({queues['vdisk']}) | dio completion items per write |")
    print("|---|---|---|---|---|---|---|")
    for i, mode, iops, ios, n in rows:
        ios = max(ios, 1)
        print(f"| {i} | {mode} | {iops:.0f} | {ios} | {100 * n['disk'] / ios:.1f} % "
              f"| {100 * n['vdisk'] / ios:.1f} % | {n['dio'] / ios:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
