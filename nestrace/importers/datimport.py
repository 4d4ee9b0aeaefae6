"""trace.dat files imported into a store: streamed where they can be
(each CPU's block events a window of pages at a time, tracecmd's walk,
the CPUs merged into time order and written as they come by
blkimport.stream_import, in memory that does not grow with the file),
else read whole (tracecmd.read): a file with damage, or with an event
earlier than the one before it on its CPU."""
from __future__ import annotations

import os

import numpy as np

from nestrace.importers import blkimport
from nestrace.importers.datfile import Buf, DatFile, TraceCmdError, open_dat
from nestrace.importers.tracecmd import (
    _block_kinds,
    _columns,
    _Cpu,
    _cpu_windows,
    _merge_cpus,
    _window,
    read,
)


class _CpuStream:
    """One CPU's block events, a window of its pages at a time (for
    blkstream.merged), converted to nanoseconds; r: what else its pages
    held.  What the stream cannot take exactly raises NotStreamable: damage
    (the whole read names and skips it), an event earlier than the one
    before it, a clock conversion out of range."""

    def __init__(self, dat: DatFile, b: Buf, kinds, ci: int, cpu: int, off: int, size: int):
        self.dat, self.kinds, self.ci, self.cpu, self.off = dat, kinds, ci, cpu, off
        self.windows = _cpu_windows(dat, b, cpu, off, size)
        self.r = _Cpu(cols={})
        self.done, self.pending, self.last = False, None, 0

    def read(self) -> dict[str, np.ndarray] | None:
        from nestrace.importers.blkstream import NotStreamable
        try:
            base, data = next(self.windows)
        except StopIteration:
            self.done = True
            return None
        except TraceCmdError as e:
            raise NotStreamable(str(e)) from None
        cols = _window(self.dat, self.kinds, self.ci, self.cpu, self.off, base, data, self.r)
        if self.r.found:
            raise NotStreamable(self.r.found[0][3])
        try:
            cols = _columns(self.dat, [cols])
        except TraceCmdError as e:
            raise NotStreamable(str(e)) from None
        t = cols["time_ns"]
        back = np.flatnonzero(t[1:] < t[:-1])
        if len(t) and (t[0] < self.last or len(back)):
            raise NotStreamable(f"{self.dat.path}: cpu {self.cpu}: an event at file offset "
                                f"{int(cols['file_offset'][back[0] + 1 if len(back) else 0])} "
                                "earlier than the one before it")
        if len(t):
            self.last = int(t[-1])
        return cols

    def close(self) -> None:
        self.windows.close()


class _DatStream:
    """A trace.dat's block events in time order, a chunk at a time: its
    CPUs' sections merged (blkimport.stream_import's records)."""

    def __init__(self, dat: DatFile, b: Buf):
        self.dat, kinds = dat, _block_kinds(dat)
        self.cpus = [_CpuStream(dat, b, kinds, ci, *c) for ci, c in enumerate(dat.cpus)]

    def chunks(self):
        from nestrace.importers.blkstream import merged
        try:
            yield from merged(self.cpus)
        finally:
            for c in self.cpus:
                c.close()

    def facts(self):
        """_merge_cpus of what the CPUs' sections held."""
        return _merge_cpus(self.dat, [c.r for c in self.cpus])

    def comms(self) -> dict[int, str]:
        return self.facts()[0]


def _lost_rows(capture_id: str, lost: dict[int, int], received: dict[int, int]) -> list[dict]:
    return [{"capture_id": capture_id, "cpu": c,
             "emitted": received.get(c, 0) + lost.get(c, 0), "received": received.get(c, 0),
             "ringbuf_drops": lost.get(c, 0), "seq_gaps": lost.get(c, 0)}
            for c in sorted(set(received) | set(lost))]


def import_file(path: str | os.PathLike, store: str | os.PathLike, levels: dict[int, str],
                capture_id: str, machine: str = "") -> dict:
    """Write a trace.dat's block events as capture `capture_id` of `store`
    (like nestrace.importers.blkimport.import_files: streamed where it
    can be, else read whole; "read" says which)."""
    from nestrace.importers.blkstream import NotStreamable
    dat, b = open_dat(path)
    uname = dat.uname.split()
    machine = machine or (uname[1] if len(uname) > 1 else "")
    kernel = uname[2] if len(uname) > 2 else "unknown"
    extra = {"trace_cmd_version": dat.version, "compression": dat.compression}
    recs = _DatStream(dat, b)

    def facts(s) -> tuple[dict, dict]:
        _, other, lost, received, _ = recs.facts()
        return ({"lost": _lost_rows(capture_id, lost, received), "kernel": kernel,
                 "clock": f"ftrace {dat.clock}", "source": "trace-cmd",
                 "skipped": blkimport._letters(s.skipped) | other, "lost_total": sum(lost.values()),
                 "extra": extra | {"damaged": {"places": 0, "bytes": 0, "records_at_least": 0}}},
                {"records": sum(received.values())})
    try:
        return blkimport.stream_import(recs, [path], store, levels, capture_id, machine,
                                       facts) | {"read": "streamed"}
    except NotStreamable as e:
        why = str(e)
    recs = b = None     # (the windows and the file's bytes: not held through the whole read)
    return _import_whole(path, store, levels, capture_id, machine) | {"read": f"whole: {why}"}


def _import_whole(path, store, levels: dict[int, str], capture_id: str, machine: str) -> dict:
    """import_file, every event held at once."""
    r = read(path)
    ev, skipped = blkimport.block_events(r.columns, r.comms)
    r.columns = None      # (the records, not needed again: memory for the pairing)
    skipped = skipped | r.other
    lost = _lost_rows(capture_id, r.lost, r.received)
    uname = r.dat.uname.split()
    d = r.damage
    problems = r.problems if len(r.problems) < 2 else [   # (said once per file)
        f"{r.problems[0]}; and {len(r.problems) - 1} more damaged place(s) in the file: "
        f"{d.bytes} bytes, at least {d.records} records skipped in all"]
    out = blkimport.write_import(ev, skipped, problems, [path], store, levels, capture_id,
                          machine or (uname[1] if len(uname) > 1 else ""),
                          source="trace-cmd", clock=f"ftrace {r.dat.clock}", lost=lost,
                          records=sum(r.received.values()),
                          # (the kernel's missed events, and the records damage hid)
                          lost_total=sum(r.lost.values()) + d.records,
                          kernel=uname[2] if len(uname) > 2 else "unknown",
                          extra={"trace_cmd_version": r.dat.version,
                                 "compression": r.dat.compression,
                                 "damaged": {"places": d.places, "bytes": d.bytes,
                                             "records_at_least": d.records}})
    return out
