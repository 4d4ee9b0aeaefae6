"""The importers' compiled loops (tracers/readers.c, built with the agent
as libnestrace-readers.so), called through ctypes on numpy arrays.

- `blk_index`: the record offsets and headers of an undamaged blktrace
  file, or None at the first record that is not plainly whole (the
  Python walk of nestrace.importers.blktrace then decides).
- `FtracePages`: the event records of a trace.dat's ring-buffer pages,
  a page a call.
- `blk_pair`: bio ids, request ids and per-CPU sequence numbers of block
  events in time order, in one pass over a hash table of (device,
  sector) streams.
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
    lib.nt_blk_pair.restype = ctypes.c_int
    lib.nt_blk_pair.argtypes = [_I64, _P, _P, _P, _P, _P, _P, _P, _P]
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


def blk_pair(a: np.ndarray, dev: np.ndarray, sec: np.ndarray, aux: np.ndarray,
             cpu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bio ids, request ids, per-CPU sequence numbers) of block events in
    time order (block_action codes a), as blkimport.block_events gives
    them."""
    m = len(a)
    a = np.ascontiguousarray(a, np.uint16)
    dev = np.ascontiguousarray(dev, np.uint32)
    sec = np.ascontiguousarray(sec, np.uint64)
    aux = np.ascontiguousarray(aux, np.uint64)
    cpu = np.ascontiguousarray(cpu, np.uint32)
    bio, rq, seq = (np.empty(m, np.uint64) for _ in range(3))
    if not m:
        return bio, rq, seq
    r = _lib().nt_blk_pair(m, *map(_ptr, (a, dev, sec, aux, cpu, bio, rq, seq)))
    if r == -2:
        raise ValueError(f"a CPU numbered {int(cpu.max())}: past the 65,535 a record can name")
    if r:
        raise MemoryError("nestrace-readers: out of memory pairing block events")
    return bio, rq, seq


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
