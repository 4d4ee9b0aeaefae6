"""blktrace files read a window at a time and merged into time order: the
records of an import that never holds them all (`Records.chunks`).

The files must be what blktrace and the kernel's blk tracer write: each
a regular file, undamaged (but for a last record cut short, as a
trace_pipe reader stopped mid-record leaves it: named and counted as
the whole read names and counts it), its records in time order, and
blktrace's sequence numbers rising on each device and CPU within one
file.
Anything else raises NotStreamable (one line, naming the file and
byte), and the import reads the files whole instead: the walk that names
damage and resumes past it, a sort of all the records.  So a chunk of
records holds exactly the records the whole read would have, in the same
order (time, then file, then place in the file)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterator

import numpy as np

from nestrace.importers import compiled
from nestrace.importers.blktrace import (
    HEADER,
    TA_CGROUP,
    Damage,
    _implausible,
    _payloads,
    cut_at_end,
)
from nestrace.store.seqs import MAX_SEQ_JUMP

WINDOW = 8 << 20        # bytes of a file read at a time
_SLACK = 4096           # (room for a record the last window cut off)


class NotStreamable(Exception):
    """Why the files are read whole instead."""


def _columns(h: dict[str, np.ndarray], aux: np.ndarray) -> dict[str, np.ndarray]:
    """A window's records as blktrace.read_columns names them."""
    action = h["action"]
    return {"sequence": h["sequence"], "time_ns": h["time"], "sector": h["sector"],
            "bytes": h["bytes"], "pid": h["pid"], "dev": h["device"], "cpu": h["cpu"],
            "error": h["error"],
            "action_code": (action & 0xFFFF & ~np.uint32(TA_CGROUP)).astype(np.uint16),
            "categories": (action >> 16).astype(np.uint16), "aux": aux}


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


def _take(cols: dict[str, np.ndarray], sel) -> dict[str, np.ndarray]:
    return {c: v[sel] for c, v in cols.items()}


class _File:
    """One file's records, a window at a time, checked as they come."""

    def __init__(self, path: Path, owners: dict[tuple[int, int], Path], seqs: dict):
        self.path = path
        try:
            self.f = open(path, "rb")
            st = os.fstat(self.f.fileno())
        except OSError as e:
            raise NotStreamable(f"{path}: cannot read: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            self.f.close()
            raise NotStreamable(f"{path}: not a regular file")
        self.size = st.st_size
        self.buf = np.empty(WINDOW + _SLACK, np.uint8)
        self.pos = 0            # the file's offset of buf[0]
        self.have = 0           # bytes in buf
        self.done = False       # every record read
        self.last_time = 0
        self.comms: dict[int, str] = {}
        self.owners, self.seqs = owners, seqs
        self.pending: dict[str, np.ndarray] | None = None
        self.devs: dict[int, int] = {}      # records per device
        self.numbered = False
        self.problem: str | None = None     # a last record cut short
        self.damage = Damage()

    def close(self) -> None:
        self.f.close()

    def check_devices(self) -> None:
        """A device of one or two records in a file of another's numbered
        records may be a damaged record (blktrace._foreign): the whole
        read decides."""
        if not self.numbered or sum(self.devs.values()) < 8:
            return
        main = max(self.devs, key=lambda d: (self.devs[d], -d))
        odd = [d for d, k in self.devs.items() if k <= 2 and d != main]
        if odd:
            raise NotStreamable(f"{self.path}: {self.devs[odd[0]]} record(s) of device "
                                f"{odd[0] >> 20}:{odd[0] & 0xFFFFF} among another's")

    def read(self) -> dict[str, np.ndarray] | None:
        """The next window's records, or None when there are no more."""
        if self.done:
            return None
        n = self.f.readinto(memoryview(self.buf)[self.have:WINDOW])
        self.have += n
        at_end = self.pos + self.have >= self.size or not n
        # (columns of its own for each window: its records are held until taken)
        cols = compiled.blk_columns(self.have // HEADER.size)
        k, nxt = compiled.blk_window(self.buf, self.have, at_end, cols)
        if at_end and (k < 0 or nxt < self.have):     # (the file ends in a record's bytes)
            k, nxt = self._cut_at_end(nxt, cols)
        if k < 0:
            raise NotStreamable(f"{self.path}: byte {self.pos + nxt}: not a whole record")
        h = {c: v[:k] for c, v in cols.items()}
        aux = np.zeros(k, np.uint64)
        _payloads(self.buf, h, aux, self.comms)
        cols = _columns(h, aux)
        self._check(cols, h["offset"])
        rest = self.have - nxt
        self.buf[:rest] = self.buf[nxt:self.have]
        self.pos += nxt
        self.have = rest
        if at_end:
            self.done = True
            self.f.close()
        return cols if k else None

    def _cut_at_end(self, stop: int, cols: dict[str, np.ndarray]) -> tuple[int, int]:
        """The window's records before stop, where the file ends there in a
        record cut short (blktrace.cut_at_end): its one problem and damage,
        as the whole read names and counts them.  (-1, stop) otherwise."""
        problem = cut_at_end(self.path, bytes(self.buf[stop:self.have]), 0, self.pos + stop)
        if problem is None:
            return -1, stop
        k, nxt = compiled.blk_window(self.buf, stop, True, cols)
        if k < 0 or nxt != stop:
            return -1, stop
        self.problem = problem
        self.damage = Damage(1, self.have - stop, 1)
        self.have = stop
        return k, nxt

    def _check(self, cols: dict[str, np.ndarray], offs: np.ndarray) -> None:
        t = cols["time_ns"]
        if not len(t):
            return
        h = {"cpu": cols["cpu"], "time": t, "sector": cols["sector"], "bytes": cols["bytes"]}
        bad = _implausible(self.path, h, offs + self.pos)
        if bad:
            raise NotStreamable(bad[0][1])
        dev = cols["dev"]
        if (dev == dev[0]).all():       # (one device: most files)
            self.devs[int(dev[0])] = self.devs.get(int(dev[0]), 0) + len(dev)
        else:
            for d, k in zip(*np.unique(dev, return_counts=True)):
                self.devs[int(d)] = self.devs.get(int(d), 0) + int(k)
        back = np.flatnonzero(t[1:] < t[:-1])
        if t[0] < self.last_time or len(back):
            at = int(offs[0]) if t[0] < self.last_time else int(offs[back[0] + 1])
            raise NotStreamable(f"{self.path}: byte {self.pos + at}: a record earlier than "
                                "the one before it")
        self.last_time = int(t[-1])
        seq = cols["sequence"]
        numbered = np.flatnonzero(seq)
        if not len(numbered):
            return
        self.numbered = True
        key = (cols["dev"][numbered].astype(np.uint64) << np.uint64(32)) | \
            cols["cpu"][numbered].astype(np.uint64)
        q = seq[numbered].astype(np.int64)
        for k in np.unique(key).tolist():
            sel = key == k
            dev_cpu = (k >> 32, k & 0xFFFFFFFF)
            owner = self.owners.setdefault(dev_cpu, self.path)
            if owner != self.path:
                raise NotStreamable(f"{self.path}: records of CPU {dev_cpu[1]} of device "
                                    f"{dev_cpu[0] >> 20}:{dev_cpu[0] & 0xFFFFF}, which {owner} "
                                    "has too")
            last, count, gaps = self.seqs.get(dev_cpu, (None, 0, 0))
            qs = q[sel]
            d = np.diff(qs if last is None else np.r_[last, qs])
            if (d <= 0).any():
                # (d[j] is the step to qs[j + 1], or to qs[j] from the last window's)
                j = int(np.flatnonzero(d <= 0)[0]) + (1 if last is None else 0)
                at = int(offs[numbered[np.flatnonzero(sel)[j]]])
                raise NotStreamable(f"{self.path}: byte {self.pos + at}: a sequence number "
                                    "not past the one before it")
            self.seqs[dev_cpu] = (int(qs[-1]), count + len(qs),
                                  gaps + int((d[d <= MAX_SEQ_JUMP] - 1).sum()))


class Records:
    """The records of blktrace files in time order, a chunk at a time."""

    def __init__(self, paths):
        self.paths = [Path(p) for p in paths]
        self.owners: dict[tuple[int, int], Path] = {}
        self.seqs: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.files: list[_File] = []

    def comms(self) -> dict[int, str]:
        """pid -> task name of the notify records read so far (a later
        file's over an earlier's, as the whole read gives them)."""
        out: dict[int, str] = {}
        for f in self.files:
            out.update(f.comms)
        return out

    def problems(self) -> list[str]:
        """The last records cut short, one line each, in file order."""
        return [f.problem for f in self.files if f.problem]

    def damage(self) -> Damage:
        """What those cost, as the whole read counts it."""
        out = Damage()
        for f in self.files:
            out.add(f.damage)
        return out

    def lost(self, capture_id: str) -> list[dict]:
        """lost_events rows (per CPU) of records missing by blktrace's
        sequence numbers, as blkimport counts them."""
        by_cpu: dict[int, list[int]] = {}
        for (_, cpu), (_, count, gaps) in self.seqs.items():
            x = by_cpu.setdefault(cpu, [0, 0])
            x[0], x[1] = x[0] + count, x[1] + gaps
        return [{"capture_id": capture_id, "cpu": c, "emitted": n + g, "received": n,
                 "ringbuf_drops": 0, "seq_gaps": g} for c, (n, g) in sorted(by_cpu.items())]

    def chunks(self) -> Iterator[dict[str, np.ndarray]]:
        """Every record, in chunks of time order (merged)."""
        try:
            for p in self.paths:
                self.files.append(_File(p, self.owners, self.seqs))
            yield from merged(self.files)
            for f in self.files:
                f.check_devices()
        finally:
            for f in self.files:
                f.close()


def _fill(f) -> None:
    while not f.done and (f.pending is None or not len(f.pending["time_ns"])):
        f.pending = f.read()


def merged(sources) -> Iterator[dict[str, np.ndarray]]:
    """The records of sources, each in time order (read(): its next
    records, None at the end; done: no more; pending: read, not yet
    given), merged in chunks of time order: each chunk's records are all
    earlier than the next chunk's, or at the same time from a later
    source, as a stable sort of all of them, source after source, would
    give them.  Records of a chunk from sources not yet at their end
    wait."""
    for f in sources:
        _fill(f)
    while True:
        live = [f for f in sources if f.pending is not None and len(f.pending["time_ns"])]
        if not live:
            return
        more = [f for f in sources if not f.done]
        # (a source with more to read holds back what is past its last record read)
        until = min(int(f.pending["time_ns"][-1]) for f in more) if more else None
        parts = []
        for f in live:
            t = f.pending["time_ns"]
            k = len(t) if until is None else int(np.searchsorted(t, until, "left"))
            if k:
                parts.append(_take(f.pending, slice(0, k)))
                f.pending = _take(f.pending, slice(k, None))
        if not parts:
            # (every record left is at that one time: read on past it)
            for f in more:
                if int(f.pending["time_ns"][-1]) == until:
                    nxt = f.read()
                    if nxt is not None:
                        f.pending = _concat([f.pending, nxt])
            continue
        chunk = _concat(parts)
        order = np.argsort(chunk["time_ns"], kind="stable")
        yield _take(chunk, order)
        for f in sources:
            _fill(f)
