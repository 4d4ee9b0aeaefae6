"""The importers' compiled loops (tracers/readers*.c, built with the agent
as libnestrace-readers.so), called through ctypes on numpy arrays.

- `blk_index`: the record offsets and headers of an undamaged blktrace
  file, or None at the first record that is not plainly whole (the
  Python walk of nestrace.importers.blktrace then decides).
- `FtracePages`: the event records of a trace.dat's ring-buffer pages,
  a page a call.
- `blk_window`: the same for one window of a file read in windows.
- `blk_pair`: bio ids, request ids and per-CPU sequence numbers of block
  events in time order, in one pass over a hash table of (device,
  sector) streams; `Pairing` the same a chunk at a time.
- `Requests`: the block requests of block events in time order, a chunk
  at a time (what nestrace.importers.requests pairs in numpy).
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from nestrace._paths import READERS_ABI, ReadersNotFound, readers_path

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


@functools.cache
def _lib() -> ctypes.CDLL:
    path = readers_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ReadersNotFound(f"{path}: cannot load: {e}") from None
    abi = lib.nt_readers_abi()
    if abi != READERS_ABI:
        raise ReadersNotFound(f"{path}: loops of ABI {abi}, this nestrace calls ABI "
                              f"{READERS_ABI} (rebuild them: make -C tracers)")
    lib.nt_blk_index.restype = _I64
    lib.nt_blk_index.argtypes = [_P, _I64, _I64, _P]
    lib.nt_ftrace_page.restype = _I64
    lib.nt_ftrace_page.argtypes = [_P, _I64, _I64, _I64, ctypes.c_uint64, _P, _P, _P, _I64, _P]
    lib.nt_blk_window.restype = _I64
    lib.nt_blk_window.argtypes = [_P, _I64, ctypes.c_int, _I64, _P, _P]
    lib.nt_blk_pair.restype = ctypes.c_int
    lib.nt_blk_pair.argtypes = [_I64, _P, _P, _P, _P, _P, _P, _P, _P, _P]
    lib.nt_pairing_new.restype = _P
    lib.nt_pairing_new.argtypes = []
    lib.nt_pairing_free.restype = None
    lib.nt_pairing_free.argtypes = [_P]
    lib.nt_pairing_step.restype = ctypes.c_int
    lib.nt_pairing_step.argtypes = [_P, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _P]
    lib.nt_pairing_held.restype = _I64
    lib.nt_pairing_held.argtypes = [_P]
    lib.nt_requests_new.restype = _P
    lib.nt_requests_new.argtypes = []
    lib.nt_requests_free.restype = None
    lib.nt_requests_free.argtypes = [_P]
    lib.nt_requests_step.restype = _I64
    lib.nt_requests_step.argtypes = [_P, _I64, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P]
    lib.nt_requests_held.restype = _I64
    lib.nt_requests_held.argtypes = [_P]
    return lib


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


# nt_blk_index's columns: struct blk_columns, in its order
BLK_COLUMNS = (("offset", np.int64), ("sequence", np.uint32), ("time", np.uint64),
               ("sector", np.uint64), ("bytes", np.uint32), ("action", np.uint32),
               ("pid", np.uint32), ("device", np.uint32), ("cpu", np.uint32),
               ("error", np.uint16), ("pdu_len", np.uint16))


class _BlkColumns(ctypes.Structure):
    _fields_ = [(name, _P) for name, _ in BLK_COLUMNS]


def blk_columns(n: int) -> dict[str, np.ndarray]:
    """Empty columns for n records, for blk_index to fill."""
    return {name: np.empty(n, t) for name, t in BLK_COLUMNS}


def blk_index(data, into: dict[str, np.ndarray] | None = None,
              start: int = 0) -> dict[str, np.ndarray] | None:
    """The records of a blktrace file's bytes as columns: "offset" (where
    each starts) and its header's fields (blktrace.DTYPE's names but
    magic), or None if a record is not plainly whole.  into: blk_columns
    to fill from row start (the columns returned are views of them)."""
    cols = into if into is not None else blk_columns(len(data) // 48)
    cap = len(cols["offset"]) - start
    buf = np.frombuffer(data, np.uint8)
    c = _BlkColumns(*(_ptr(cols[name]) + start * np.dtype(t).itemsize
                      for name, t in BLK_COLUMNS))
    n = _lib().nt_blk_index(_ptr(buf) if len(buf) else None, len(buf), cap, ctypes.byref(c))
    if n < 0:
        return None
    return {name: a[start:start + n] for name, a in cols.items()}


def blk_window(buf: np.ndarray, n: int, at_end: bool, into: dict[str, np.ndarray]
               ) -> tuple[int, int]:
    """The records of a window of a file, buf[:n] (at_end: the file's
    last), into the columns `into` (from row 0): (how many, where the next
    window starts); a record the window cuts off is the next window's.
    (-1, offset) at a record that is not plainly whole: damage."""
    c = _BlkColumns(*(_ptr(into[name]) for name, _ in BLK_COLUMNS))
    nxt = ctypes.c_int64(0)
    k = _lib().nt_blk_window(_ptr(buf), n, int(at_end), len(into["offset"]), ctypes.byref(c),
                             ctypes.byref(nxt))
    return (-1, -k - 1) if k < 0 else (k, nxt.value)


def _pair_args(a, ts, dev, sec, aux, cpu) -> tuple[np.ndarray, ...]:
    return (np.ascontiguousarray(a, np.uint16), np.ascontiguousarray(ts, np.uint64),
            np.ascontiguousarray(dev, np.uint32),
            np.ascontiguousarray(sec, np.uint64), np.ascontiguousarray(aux, np.uint64),
            np.ascontiguousarray(cpu, np.uint32))


def _paired(r: int, cpu: np.ndarray) -> None:
    if r == -2:
        raise ValueError(f"a CPU numbered {int(cpu.max())}: past the 65,535 a record can name")
    if r:
        raise MemoryError("nestrace-readers: out of memory pairing block events")


def blk_pair(a: np.ndarray, ts: np.ndarray, dev: np.ndarray, sec: np.ndarray,
             aux: np.ndarray, cpu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bio ids, request ids, per-CPU sequence numbers) of block events in
    time order (block_action codes a, times ts), as blkimport.block_events
    gives them."""
    args = _pair_args(a, ts, dev, sec, aux, cpu)
    m = len(args[0])
    bio, rq, seq = (np.empty(m, np.uint64) for _ in range(3))
    if m:
        _paired(_lib().nt_blk_pair(m, *map(_ptr, (*args, bio, rq, seq))), args[5])
    return bio, rq, seq


class _Handle:
    """A state the library keeps between calls, freed with this object."""
    _new = _free = _held = ""

    def __init__(self):
        self._lib = _lib()
        self._h = getattr(self._lib, self._new)()
        if not self._h:
            raise MemoryError("nestrace-readers: out of memory")

    def __del__(self):
        if getattr(self, "_h", None):
            getattr(self._lib, self._free)(self._h)
            self._h = None

    def held(self) -> int:
        """How many entries the state holds now: starts, bios and requests
        (STALE_NS, nestrace.importers.requests, bounds them)."""
        return int(getattr(self._lib, self._held)(self._h))


class Pairing(_Handle):
    """blk_pair a chunk at a time: the ids go on from the chunks before
    (bio ids count every event of every chunk)."""
    _new, _free, _held = "nt_pairing_new", "nt_pairing_free", "nt_pairing_held"

    def step(self, a, ts, dev, sec, aux, cpu) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        args = _pair_args(a, ts, dev, sec, aux, cpu)
        m = len(args[0])
        bio, rq, seq = (np.empty(m, np.uint64) for _ in range(3))
        if m:
            _paired(self._lib.nt_pairing_step(self._h, m, *map(_ptr, (*args, bio, rq, seq))),
                    args[5])
        return bio, rq, seq


# struct nt_phases: a request's phases, a column each (row: see Requests)
PHASES = (("row", np.int64), ("q", np.int64), ("g", np.int64), ("i", np.int64),
          ("c", np.int64), ("done", np.int64), ("error", np.int32))


class _Phases(ctypes.Structure):
    _fields_ = [(name, _P) for name, _ in PHASES]


def _phases(n: int) -> tuple[dict[str, np.ndarray], _Phases]:
    cols = {name: np.empty(n, t) for name, t in PHASES}
    return cols, _Phases(*(_ptr(cols[name]) for name, _ in PHASES))


class Requests(_Handle):
    """The requests of block events, a chunk at a time (each in time then
    CPU order, after the chunks before), paired as
    nestrace.importers.requests pairs all of them at once."""
    _new, _free, _held = "nt_requests_new", "nt_requests_free", "nt_requests_held"

    def step(self, a, ts, dev, bio, rq, sec, aux, error
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(this chunk's requests: a row per D, "row" the D's index in the
        chunk, then its q, g, i, c and done times, -1 for none, and error;
        the requests of earlier chunks finished now: "row" the request's
        number among all, from 0, and its c, done and error)."""
        m = len(a)
        cols = [np.ascontiguousarray(x, t) for x, t in (
            (a, np.uint16), (ts, np.uint64), (dev, np.uint32), (bio, np.uint64),
            (rq, np.uint64), (sec, np.uint64), (aux, np.uint64), (error, np.int32))]
        # (a row per D; a fix per request still open: at most a row per event)
        out, out_c = _phases(int(np.count_nonzero(cols[0] == 6)))
        fix, fix_c = _phases(m)
        fixes = ctypes.c_int64(0)
        n = self._lib.nt_requests_step(self._h, m, *map(_ptr, cols), ctypes.byref(out_c),
                                       ctypes.byref(fix_c), ctypes.byref(fixes)) if m else 0
        if n < 0:
            raise MemoryError("nestrace-readers: out of memory pairing block requests")
        k = fixes.value
        assert n == len(out["row"]), (n, len(out["row"]))
        return out, {c: fix[c][:k].copy() for c in ("row", "c", "done", "error")}


# why nt_ftrace_page stopped (status[0])
PAGE_DONE, PAGE_HEADER_CUT, PAGE_RECORD_PAST, PAGE_TIME_DAMAGED, PAGE_NO_ROOM = range(5)


class FtracePages:
    """The event records of one CPU's ring-buffer pages (data), walked a
    page at a time: where each record's header is (hdrs) and its time
    (tss), n of them so far.  kinds: the event ids whose time past 2^63
    is damage."""

    def __init__(self, data, kinds):
        self.buf = np.frombuffer(data, np.uint8)
        cap = len(data) // 12 + 1           # (a record takes 12 bytes at least)
        self.hdrs, self.tss = np.empty(cap, np.int64), np.empty(cap, np.uint64)
        self.n = 0
        self.kinds = np.zeros(1 << 16, np.uint8)
        self.kinds[list(kinds)] = 1
        self.status = np.zeros(4, np.int64)
        self._call = _lib().nt_ftrace_page
        # (the pointers once: a call a page, tens of thousands of pages)
        self._data = (_ptr(self.buf) if len(self.buf) else None, len(self.buf))
        self._at = _ptr(self.kinds), _ptr(self.hdrs), _ptr(self.tss), _ptr(self.status)

    def page(self, p: int, end: int, ts: int) -> tuple[int, int, int, int]:
        """Walk from byte p to end (the page's time ts): (why it stopped,
        at which byte, the length or event id, the time): status[]."""
        n, cap = self.n, len(self.hdrs) - self.n
        kinds, hdrs, tss, status = self._at
        got = self._call(*self._data, p, end, ts, kinds, hdrs + 8 * n, tss + 8 * n, cap, status)
        self.n += got
        s = self.status.tolist()
        if s[0] == PAGE_NO_ROOM:
            raise MemoryError("nestrace-readers: more ring-buffer records than bytes allow")
        return s[0], s[1], s[2], s[3]
