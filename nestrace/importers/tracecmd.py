"""trace-cmd's trace.dat files (versions 6 and 7), read for their block
events.

A trace.dat holds the kernel's ftrace ring buffer pages as recorded
(`trace-cmd record`, or `trace-cmd extract` after enabling events by
hand), with the format file of every event, so each event's fields are
found by name and offset, not by a layout built in here.  Version 7
files may compress their sections and the ring buffer data (zlib or
zstd, in chunks).

`read(path)` walks every CPU's pages and keeps the block layer's request
events (block_bio_queue, the bio merges, block_getrq, block_split,
block_rq_insert, block_rq_issue, block_rq_requeue, block_rq_complete) as
rows of nestrace.importers.blktrace's SCHEMA, so that the same pairing (ftrace's
block events carry no request address either: btt's rule by device and
sector) and the same import write them into a store.  Events of other
kinds are counted by name.  Events the kernel lost are counted per CPU:
the ring buffer's own count at each page that lost some, and the
overruns and dropped events of trace-cmd's per-CPU statistics.

Damage (a file cut short, a page whose records run past its end, an
unknown record type) stops the read with a TraceCmdError naming the
file and the byte offset, except inside a CPU's data, where a damaged
page is named in `problems` and the next page is read, and a block event
with fields no kernel writes is named and left out: no good event is
lost.  What was skipped is counted (`damage`: places, bytes, and at
least one record each) and stored with the import as lost records.

Each CPU's data is walked a window of pages (WINDOW bytes) at a time,
as nestrace.importers.datimport streams a file into a store.
"""
from __future__ import annotations

import dataclasses
import functools
import mmap
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from nestrace.importers import blkimport, compiled
from nestrace.importers import blktrace as bt
from nestrace.importers.datfile import (
    MAGIC,
    Buf,
    DatFile,
    Field,
    TraceCmdError,
    decompress,
    open_dat,
)

# ring buffer event header types (type_len)
TYPE_PADDING, TYPE_TIME_EXTEND, TYPE_TIME_STAMP = 29, 30, 31
TS_SHIFT = 27
MISSED_EVENTS, MISSED_STORED = 1 << 31, 1 << 30
# the most events a page can say were missed before it: more than any
# ring buffer of the largest machine holds (2^40 events) is damage
MAX_MISSED = 1 << 40
COMMIT_MASK = (1 << 27) - 1


# block events -> blktrace's action codes (nestrace.importers.blktrace.ACTIONS)
BLOCK_ACTIONS = {"block_bio_queue": 1, "block_bio_backmerge": 2, "block_bio_frontmerge": 3,
                 "block_getrq": 4, "block_rq_requeue": 6, "block_rq_issue": 7,
                 "block_rq_complete": 8, "block_rq_insert": 12, "block_split": 13}


def _page_layout(dat: DatFile) -> tuple[int, int]:
    """(offset, size) of the page header's commit field, from header_page."""
    m = re.search(r"field:\s*local_t\s+commit;\s*offset:(\d+);\s*size:(\d+);", dat.header_page)
    return (int(m[1]), int(m[2])) if m else (8, dat.long_size)


# bytes of a CPU's data walked at a time (whole pages)
WINDOW = 8 << 20


def _cpu_chunks(dat: DatFile, b: Buf, cpu: int, off: int, size: int) -> Iterator[bytes]:
    """A CPU's data, a compressed chunk (or WINDOW bytes) at a time."""
    if dat.version == 7 and dat.compression != "none" and size:
        n = b.u(off, 4, f"cpu {cpu} chunk count")
        p = off + 4
        for _ in range(n):
            where = f"{dat.path}: offset {p} (a chunk of cpu {cpu}'s data)"
            csize, usize = b.u(p, 4, "chunk size"), b.u(p + 4, 4, "chunk uncompressed size")
            b.need(p + 8, csize, f"cpu {cpu} chunk")
            chunk = bytes(b.data[p + 8:p + 8 + csize])
            _let_go(b.data, p, 8 + csize)
            yield decompress(dat.compression, chunk, usize, where)
            p += 8 + csize
        return
    b.need(off, size, f"cpu {cpu}'s data")
    for w in range(0, size, WINDOW):
        window = bytes(b.data[off + w:off + min(size, w + WINDOW)])
        _let_go(b.data, off + w, len(window))
        yield window


def _let_go(data, start: int, n: int) -> None:
    """A mapped file's pages of bytes [start, start + n), read, out of this
    process's memory (the page cache keeps them): what a stream holds does
    not grow with the file."""
    if isinstance(data, mmap.mmap) and n > 0:
        a = start - start % mmap.PAGESIZE
        data.madvise(mmap.MADV_DONTNEED, a, start + n - a)


def _cpu_windows(dat: DatFile, b: Buf, cpu: int, off: int, size: int
                 ) -> Iterator[tuple[int, bytes]]:
    """A CPU's data in windows of whole pages, at least WINDOW bytes each
    but the last: (where the window starts in the CPU's data, its bytes)."""
    ps = dat.page_size
    base, held, n = 0, [], 0
    for chunk in _cpu_chunks(dat, b, cpu, off, size):
        held.append(chunk)
        n += len(chunk)
        if n >= WINDOW:
            data = b"".join(held)
            cut = len(data) - len(data) % ps
            yield base, data[:cut]
            base += cut
            held, n = [data[cut:]], len(data) - cut
    if n:
        yield base, b"".join(held)


@dataclass
class _Block:
    """Field offsets of one block event kind."""
    action: int
    dev: Field
    sector: Field
    nr: Field
    rwbs: Field
    comm: Field | None
    error: Field | None
    new_sector: Field | None
    need: int = 0            # the bytes a record holds its fields in


def _block_kinds(dat: DatFile) -> dict[int, _Block]:
    out = {}
    for eid, f in dat.formats.items():
        a = BLOCK_ACTIONS.get(f.name) if f.system == "block" else None
        if a is None:
            continue
        fl = f.fields
        need = ("dev", "sector", "rwbs")
        if any(k not in fl for k in need) or ("nr_sector" not in fl and a != 13):
            raise TraceCmdError(f"{f.where or dat.path}: event format block/{f.name} lacks "
                                f"one of dev, sector, nr_sector, rwbs")
        k = _Block(a, fl["dev"], fl["sector"], fl.get("nr_sector"), fl["rwbs"],
                   fl.get("comm"), fl.get("error"), fl.get("new_sector"))
        # (a __data_loc field's 4-byte place: its text may lie anywhere in the record)
        k.need = max(x.offset + (4 if x.data_loc else x.size)
                     for x in (k.dev, k.sector, k.nr, k.rwbs, k.comm, k.error, k.new_sector)
                     if x is not None)
        out[eid] = k
    return out


def rwbs_categories(s: str) -> int:
    """blktrace's BLK_TC_* bits for an ftrace rwbs string (blk_fill_rwbs:
    F for a preflush, the op R W D N or F for a flush, E after a secure
    erase's D, then F FUA, A readahead, S sync, M meta)."""
    cats, i = 0, 0
    if len(s) > 1 and s[0] == "F" and s[1] in "RWDNF":
        cats, i = bt.TC_FLUSH, 1
    op = s[i] if i < len(s) else "N"
    cats |= {"W": bt.TC_WRITE, "D": bt.TC_DISCARD, "F": bt.TC_FLUSH}.get(op, 0)
    i += 1
    if op == "D" and i < len(s) and s[i] == "E":
        i += 1
    for c in s[i:]:
        cats |= {"F": bt.TC_FUA, "A": bt.TC_AHEAD, "S": bt.TC_SYNC, "M": bt.TC_META}.get(c, 0)
    return cats


def _implausible(sector: int, nr: int, dev: int) -> str:
    """What in a block event no kernel writes ("": nothing): data past
    2^54 sectors, as blktrace's import rules; a request of 2^23 sectors
    or more (a bio's size is 32 bits of bytes), a device number past 32
    bits."""
    if not 0 <= nr < 1 << 23:
        return f"nr_sector {nr} (a request holds under 4 GiB"
    if nr and sector >= bt.MAX_SECTOR - nr:
        return f"{nr} sectors at sector {sector} (past 2^54 sectors, 2^63 bytes"
    if not 0 <= dev < 1 << 32:
        return f"dev {dev} (past 32 bits"
    return ""


def _fld(data: bytes, p: int, f: Field) -> int:
    return int.from_bytes(data[p + f.offset:p + f.offset + f.size], "little", signed=f.signed)


def _text(data: bytes, p: int, f: Field) -> str:
    if f.data_loc:
        loc = _fld(data, p, Field(f.offset, 4, False, False))
        o, n = loc & 0xFFFF, loc >> 16
        raw = data[p + o:p + o + n]
    else:
        raw = data[p + f.offset:p + f.offset + f.size]
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@dataclass
class Events:
    columns: dict[str, np.ndarray]   # as blktrace.read_columns gives them, and file_offset
    comms: dict[int, str]
    other: dict[str, int]            # events of other kinds, by system/name
    lost: dict[int, int]             # cpu -> events the kernel lost
    received: dict[int, int]         # cpu -> events read
    problems: list[str]
    damage: bt.Damage                # what the damage in the CPUs' data cost
    dat: DatFile

    @functools.cached_property
    def table(self) -> pa.Table:
        """The events as rows of nestrace.importers.blktrace.SCHEMA."""
        return _table(self.dat, self.columns)


def _page_records(walk: compiled.FtracePages, page: int, p: int, end: int, ts: int, dat,
                  where, ci: int, found: list) -> int:
    """The event records of one ring-buffer page, from byte p to end: each
    record's header offset and its time, into walk.  A damaged record
    ends the page (a problem in found); 1 when a block event's time was
    damaged, else 0."""
    why, at, x, t = walk.page(p, end, ts)
    if why == compiled.PAGE_HEADER_CUT:
        found.append((ci, page, at - page, f"{where(page)}: a record header cut at "
                                           f"byte {at - page}: rest of the page skipped",
                      end - at, 1))
    elif why == compiled.PAGE_RECORD_PAST:
        found.append((ci, page, at - page, f"{where(page)}: a record of {x} bytes "
                                           f"at byte {at - page} runs past the page's "
                                           "data: rest of the page skipped", end - at, 1))
    elif why == compiled.PAGE_TIME_DAMAGED:
        found.append((ci, page, at - page, f"{where(page)}: a "
                      f"{dat.formats[x].name} record at byte {at - page}: time "
                      f"{t & ((1 << 64) - 1)} (past 2^63): the page's times are damaged, rest "
                      "of the page skipped", end - at, 1))
        return 1
    return 0


@dataclass
class _Cpu:
    """What one CPU's section of a trace.dat gave."""
    cols: dict[str, np.ndarray] | None = None
    found: list = dataclasses.field(default_factory=list)
    lost: dict[int, int] = dataclasses.field(default_factory=dict)
    other: dict[str, int] = dataclasses.field(default_factory=dict)
    comms: dict[int, str] = dataclasses.field(default_factory=dict)
    received: int = 0


def read(path: str | os.PathLike) -> Events:
    """The block request events of a trace.dat, in file order per CPU.
    A walk in Python reads only the record headers (and each event's id,
    to keep the block events); numpy reads the fields of those at once."""
    dat, b = open_dat(path)
    kinds = _block_kinds(dat)

    def one(ci: int, cpu: int, off: int, size: int) -> _Cpu:
        r, parts = _Cpu(), []
        try:
            for base, data in _cpu_windows(dat, b, cpu, off, size):
                parts.append(_window(dat, kinds, ci, cpu, off, base, data, r))
        except TraceCmdError as e:      # (one CPU's section: the others are read)
            return _Cpu(found=[(ci, 0, 0, f"{e}: cpu {cpu}'s events left out", size, 1)])
        r.cols = {k: np.concatenate([c[k] for c in parts]) for k in parts[0]} if len(parts) > 1 \
            else parts[0] if parts else _window(dat, kinds, ci, cpu, off, 0, b"", r)
        return r

    # (the CPUs' sections on both cores: the C walk, zstd and most of
    # numpy let go of the GIL; merged in CPU order, as read one by one)
    with ThreadPoolExecutor(2) as pool:
        cpus = list(pool.map(one, range(len(dat.cpus)), *zip(*dat.cpus))) if dat.cpus else []
    comms, other, lost, received, found = _merge_cpus(dat, cpus)
    parts = [r.cols for r in cpus if r.cols is not None]
    damage = bt.Damage(len(found), sum(f[4] for f in found), sum(f[5] for f in found))
    return Events(_columns(dat, parts), comms, other, lost, received, [f[3] for f in found],
                  damage, dat)


def _merge_cpus(dat: DatFile, cpus: list[_Cpu]):
    """What the CPUs' sections gave, as one: task names (the file's list,
    then each CPU's in CPU order), other events by name, lost and received
    events per CPU (the kernel's statistics too), the damage found."""
    comms = dict(dat.cmdlines)
    other: dict[str, int] = {}
    lost: dict[int, int] = {}
    received: dict[int, int] = {}
    # (cpu index, page, byte, problem, bytes skipped, records skipped: at least)
    found: list[tuple[int, int, int, str, int, int]] = []
    for (cpu, _, _), r in zip(dat.cpus, cpus):
        found += r.found
        for k, v in r.lost.items():
            lost[k] = lost.get(k, 0) + v
        for k, v in r.other.items():
            other[k] = other.get(k, 0) + v
        for k, v in r.comms.items():
            comms.setdefault(k, v)
        if r.cols is not None:
            received[cpu] = r.received
    for cpu, text in dat.cpustats.items():
        n = sum(int(m[1]) for m in re.finditer(r"^(?:overrun|dropped events):\s*(\d+)", text, re.M))
        if n:
            lost[cpu] = lost.get(cpu, 0) + n
    found.sort(key=lambda x: x[:3])
    return comms, other, lost, received, found


def _window(dat: DatFile, kinds: dict[int, "_Block"], ci: int, cpu: int, off: int, base: int,
            data: bytes, r: _Cpu) -> dict[str, np.ndarray]:
    """The block events of one window of a CPU's data (whole pages, from
    byte base of the CPU's data at file offset off) as columns, and what
    else it holds into r: events of other kinds, the kernel's missed
    events, damage (pages: from the start of the CPU's data), the task
    names first met, the records read."""
    commit_off, commit_size = _page_layout(dat)
    data_off = commit_off + commit_size
    ps = dat.page_size
    by_page = dat.compression == "none" or dat.version == 6

    def where(page: int) -> str:        # (page: in this window)
        return (f"{dat.path}: cpu {cpu}, page at byte {base + page} of its data"
                + (f" (file offset {off + base + page})" if by_page else ""))

    found: list = []
    walk = compiled.FtracePages(data, kinds)     # each event record: its header, its time
    n_damaged = 0                           # (read, and left out with their page's rest)
    for page in range(0, len(data) - data_off + 1, ps):
        ts = int.from_bytes(data[page:page + 8], "little")
        commit = int.from_bytes(data[page + commit_off:page + commit_off + commit_size], "little")
        used = commit & COMMIT_MASK
        if commit & MISSED_EVENTS:
            missed = 1
            if commit & MISSED_STORED:
                at = page + data_off + used
                missed = int.from_bytes(data[at:at + dat.long_size], "little") or 1
                if missed > MAX_MISSED:
                    found.append((ci, page, 0, f"{where(page)}: {missed} events missed "
                                               "(no ring buffer holds that many: a "
                                               "damaged count): counted as 1", 0, 0))
                    missed = 1
            r.lost[cpu] = r.lost.get(cpu, 0) + missed
        if data_off + used > ps:
            found.append((ci, page, 0, f"{where(page)}: commit {used} runs past the page "
                                       f"({ps} bytes): page skipped", ps - data_off, 1))
            continue
        n_damaged += _page_records(walk, page, page + data_off, page + data_off + used, ts,
                                   dat, where, ci, found)
    hdrs, tss = walk.hdrs[:walk.n], walk.tss[:walk.n]
    r.received += len(hdrs) + n_damaged
    cols = _fields(dat, kinds, data, ci, cpu, hdrs, tss, where, found, r.comms, r.other)
    r.found += [(c, base + pg, *rest) for c, pg, *rest in found]
    page = cols.pop("page") + base
    cols["file_offset"] = (off + page) if by_page else np.full(len(page), off, np.int64)
    return cols


def _gather(buf: np.ndarray, pos: np.ndarray, f: Field, signed: bool | None = None) -> np.ndarray:
    """Field f of the records whose fields start at pos, as int64 (uint64
    for an unsigned 8-byte field).  A 4- or 8-byte field is read as
    32-bit words of the buffer seen from the field's place modulo 4 (the
    ring buffer's records are 4-byte aligned: one view, one gather)."""
    sgn = f.signed if signed is None else signed
    q = pos + f.offset
    if f.size in (4, 8):
        out = np.zeros(len(q), np.uint64 if f.size == 8 else np.uint32)
        rem = q & 3
        for r in np.nonzero(np.bincount(rem, minlength=4))[0].tolist():
            sel = slice(None) if len(q) and (rem == r).all() else rem == r
            words = np.frombuffer(buf, "<u4", (len(buf) - r) // 4, r)
            idx = q[sel] >> 2
            out[sel] = words[idx] if f.size == 4 else \
                words[idx].astype(np.uint64) | words[idx + 1].astype(np.uint64) << np.uint64(32)
        if f.size == 8:
            return out.view(np.int64) if sgn else out
        return (out.view(np.int32) if sgn else out).astype(np.int64)
    if f.size in (1, 2):
        v = buf[q].astype(np.int64)
        if f.size == 2:
            v |= buf[q + 1].astype(np.int64) << 8
        top = 1 << (8 * f.size - 1)
        return np.where(v >= top, v - 2 * top, v) if sgn else v
    data = buf.tobytes()
    return np.array([_fld(data, int(x), f) for x in pos], np.int64 if sgn else np.uint64)


def _fixed_texts(buf: np.ndarray, pos: np.ndarray, f: Field) -> tuple[list[bytes], np.ndarray]:
    """The distinct raw texts of a fixed-size char field, and each record's
    index into them: as one 8-byte number when every text ends within its
    first 8 bytes (few values: no sort of them all), else as strings."""
    if f.size >= 8:
        keys, inverse = blkimport.few_values(_gather(buf, pos, Field(f.offset, 8, False, False)))
        texts = [int(t).to_bytes(8, "little") for t in keys]
        if all(b"\0" in t for t in texts):
            return texts, inverse
    raw = buf[pos[:, None] + (f.offset + np.arange(f.size))]
    if f.size < 8:
        wide = np.zeros((len(pos), 8), np.uint8)
        wide[:, :f.size] = raw
        keys, inverse = blkimport.few_values(wide.view("<u8")[:, 0])
        return [int(t).to_bytes(8, "little") for t in keys], inverse
    keys, inverse = np.unique(np.ascontiguousarray(raw).view(f"S{f.size}")[:, 0],
                              return_inverse=True)
    return keys.tolist(), inverse


def _categories(buf: np.ndarray, data: bytes, pos: np.ndarray, k: _Block) -> np.ndarray:
    """blktrace's category bits of each event's rwbs field, each distinct
    text decoded once."""
    if k.rwbs.data_loc:
        keys, inverse = np.unique(np.array([_text(data, int(q), k.rwbs) for q in pos],
                                           object), return_inverse=True)
        names = keys.tolist()
    else:
        texts, inverse = _fixed_texts(buf, pos, k.rwbs)
        names = [t.split(b"\0", 1)[0].decode(errors="replace") for t in texts]
    return np.array([rwbs_categories(t) for t in names], np.uint16)[inverse.reshape(-1)]


def _fields(dat: DatFile, kinds: dict[int, _Block], data: bytes, ci: int, cpu: int, hdrs,
            tss, where, found: list, comms: dict[int, str],
            other: dict[str, int]) -> dict[str, np.ndarray]:
    """The fields of one CPU's block events (hdrs: where each event
    record starts in `data`, whole within its page), by kind; events of
    other kinds are counted in `other`; an event too short for its fields,
    or with fields no kernel writes, is named in `found` and left out."""
    buf = np.frombuffer(data, np.uint8)
    hdr, ts = hdrs, tss
    tl = (buf[hdr] & 0x1F).astype(np.int64)
    ev = hdr + np.where(tl == 0, 8, 4)
    length = np.where(tl == 0, _gather(buf, hdr, Field(4, 4, False, False)) - 4, tl * 4)
    eid = buf[ev].astype(np.int64) | buf[ev + 1].astype(np.int64) << 8
    block = np.isin(eid, np.array(list(kinds), np.int64))
    ids, first, counts = np.unique(eid[~block], return_index=True, return_counts=True)
    for i in np.argsort(first).tolist():      # (in the order they come)
        e, c = int(ids[i]), int(counts[i])
        f = dat.formats.get(e)
        name = f"{f.system}/{f.name}" if f else f"id {e}"
        other[name] = other.get(name, 0) + c
    hdr, ts, ev, length, eid = hdr[block], ts[block], ev[block], length[block], eid[block]
    n = len(ev)
    page, at = hdr - hdr % dat.page_size, hdr % dat.page_size
    keep = np.ones(n, bool)
    sector, new_sector = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    # (the stored types: nr_sector < 2^23, a dev_t in 32 bits, checked below)
    nbytes, dev, error = np.zeros(n, np.uint32), np.zeros(n, np.uint32), np.zeros(n, np.uint16)
    action, cats = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    has_pdu, has_comm = np.zeros(n, bool), np.zeros(n, bool)
    pid = np.maximum(_gather(buf, ev, Field(4, 4, True, False)), 0).astype(np.uint32) if n \
        else np.zeros(0, np.uint32)

    def name(i: int) -> str:
        return dat.formats[int(eid[i])].name

    for e, k in kinds.items():
        m = np.nonzero(eid == e)[0]
        if not m.size:
            continue
        for i in m[length[m] < k.need]:
            found.append((ci, int(page[i]), int(at[i]),
                          f"{where(int(page[i]))}: a {length[i]}-byte {name(i)} record at byte "
                          f"{at[i]}: its format's fields need {k.need}: a damaged record, left out",
                          int(length[i]), 1))
            keep[i] = False
        m = m[length[m] >= k.need]
        pos = ev[m]
        sec = _gather(buf, pos, k.sector, signed=False).astype(np.uint64)
        nr = _gather(buf, pos, k.nr) if k.nr else np.zeros(len(m), np.int64)
        d = _gather(buf, pos, k.dev)
        bad = (nr >= 1 << 23) | (nr < 0) | ((nr != 0) & (sec >= np.uint64(bt.MAX_SECTOR)
                                                          - nr.clip(0).astype(np.uint64))) \
            | (d >= 1 << 32) | (d < 0)
        for j in np.nonzero(bad)[0]:
            i = m[j]
            why = _implausible(int(sec[j]), int(nr[j]), int(d[j]))
            found.append((ci, int(page[i]), int(at[i]), f"{where(int(page[i]))}: a {name(i)} "
                                                        f"record at byte {at[i]}: {why}): a "
                                                        "damaged record, left out",
                          int(length[i]), 1))
            keep[i] = False
        m, pos, sec, nr, d = m[~bad], pos[~bad], sec[~bad], nr[~bad], d[~bad]
        sector[m], nbytes[m], dev[m], action[m] = sec, nr * 512, d, k.action
        cats[m] = _categories(buf, data, pos, k)
        if k.error:
            error[m] = _gather(buf, pos, k.error) & 0xFFFF
        if k.new_sector is not None:
            new_sector[m] = _gather(buf, pos, k.new_sector, signed=False).astype(np.uint64)
            has_pdu[m] = True
        if k.comm is not None:
            has_comm[m] = True
    # a task's name from its first event that has one (after the file's own list)
    named = np.nonzero(has_comm & keep & (pid > 0))[0]
    first_pid, first = np.unique(pid[named], return_index=True)
    for q, i in zip(first_pid.tolist(), named[first].tolist()):
        if q not in comms:
            comms[q] = _text(data, int(ev[i]), kinds[int(eid[i])].comm)
    return {"page": page[keep], "time_ns": ts[keep], "sector": sector[keep],
            "bytes": nbytes[keep], "action_code": action[keep], "categories": cats[keep],
            "pid": pid[keep], "dev": dev[keep], "cpu": np.full(int(keep.sum()), cpu, np.uint32),
            "error": error[keep], "new_sector": new_sector[keep], "has_pdu": has_pdu[keep]}


def _columns(dat: DatFile, parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The CPUs' events (parts) as one set of columns, in nanoseconds."""
    if not parts:
        parts = [{k: np.zeros(0, np.int64) for k in (
            "file_offset", "time_ns", "sector", "bytes", "action_code", "categories", "pid", "dev",
            "cpu", "error", "new_sector", "has_pdu")}]
    cols = {k: np.concatenate([c[k] for c in parts]) if len(parts) > 1 else parts[0][k]
            for k in parts[0]}
    ts = cols["time_ns"]
    if dat.clock == "x86-tsc":
        if not dat.tsc2nsec:
            raise TraceCmdError(f"{dat.clock_where or dat.path}: recorded with the x86-tsc "
                                "clock and no TSC2NSEC option: its times cannot be made "
                                "nanoseconds")
        mult, shift, toff = dat.tsc2nsec
        ts = ((ts.astype(object) * mult) >> shift) + toff
    if dat.offset_ns:
        ts = ts.astype(object) + dat.offset_ns
    if ts.dtype == object:      # (Python integers: none wrapped round)
        out = [int(t) for t in ts if not 0 <= t < bt.MAX_TIME]
        if out:
            raise TraceCmdError(f"{dat.clock_where or dat.path}: the clock conversion "
                                f"(TSC2NSEC {dat.tsc2nsec}, OFFSET {dat.offset_ns}) puts "
                                f"{len(out)} event time(s) outside [0, 2^63) ns, the first at "
                                f"{out[0]}: a damaged option")
        ts = np.array(ts, np.uint64)
    acts = cols["action_code"].astype(np.uint16, copy=False)
    # a block_split's new sector: its payload, as blktrace's X carries it
    split = cols["has_pdu"].astype(bool) & (acts == bt.X_CODE)
    return {"file_offset": cols["file_offset"].astype(np.uint64, copy=False),
            "sequence": np.zeros(len(ts), np.uint32), "time_ns": ts.astype(np.uint64, copy=False),
            "sector": cols["sector"].astype(np.uint64, copy=False),
            "bytes": cols["bytes"].astype(np.uint32, copy=False), "pid": cols["pid"].astype(np.uint32, copy=False),
            "dev": cols["dev"].astype(np.uint32, copy=False), "cpu": cols["cpu"].astype(np.uint32, copy=False),
            "error": cols["error"].astype(np.uint16, copy=False), "action_code": acts,
            "categories": cols["categories"].astype(np.uint16, copy=False),
            "aux": np.where(split, cols["new_sector"], 0).astype(np.uint64),
            "has_pdu": cols["has_pdu"].astype(bool, copy=False)}


def _table(dat: DatFile, cols: dict[str, np.ndarray]) -> pa.Table:
    """_columns' events as rows of nestrace.importers.blktrace.SCHEMA."""
    n = len(cols["time_ns"])
    cats, nbytes, acts = cols["categories"], cols["bytes"], cols["action_code"]
    # a block_split's new sector is its pdu, big-endian, as in blktrace
    lens = np.where(cols["has_pdu"], 8, 0)
    pos = np.zeros(n + 1, np.int32)
    pos[1:] = np.cumsum(lens)
    body = cols["aux"][cols["has_pdu"]].astype(">u8").tobytes()
    pdu = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(pos), pa.py_buffer(body)])
    kind = cats.astype(np.int64) * 2 + (nbytes > 0)      # what rwbs and op depend on
    return pa.Table.from_pydict({
        "file": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                               pa.array([dat.path])),
        "file_offset": pa.array(cols["file_offset"]),
        "sequence": pa.array(cols["sequence"]),
        "time_ns": pa.array(cols["time_ns"]),
        "sector": pa.array(cols["sector"]),
        "bytes": pa.array(nbytes),
        "action": bt._strings(acts, lambda a: bt.ACTIONS[a], True),
        "action_code": pa.array(acts),
        "categories": pa.array(cats),
        "rwbs": bt._strings(kind, lambda k: bt.rwbs(k >> 1, k & 1), True),
        "op": bt._strings(kind, lambda k: bt.op_name(k >> 1, k & 1), True),
        "pid": pa.array(cols["pid"]),
        "dev": pa.array(cols["dev"]),
        "cpu": pa.array(cols["cpu"]),
        "error": pa.array(cols["error"]),
        "pdu": pdu,
    }, schema=bt.SCHEMA)


def is_dat(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False
