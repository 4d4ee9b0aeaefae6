"""trace-cmd's trace.dat container (versions 6 and 7, its sections, options
and compression), read up to the per-CPU ring-buffer pages that
nestrace.importers.tracecmd decodes."""
from __future__ import annotations

import mmap
import os
import re
import struct
import zlib
from dataclasses import dataclass, field

MAGIC = b"\x17\x08\x44tracing"


# v7 section ids and options
SEC_OPTIONS, SEC_HEADER_INFO, SEC_FTRACE_EVENTS, SEC_EVENT_FORMATS = 0, 16, 17, 18


SEC_CMDLINES = 21


OPT_DONE, OPT_CPUSTAT, OPT_BUFFER, OPT_TRACECLOCK, OPT_UNAME, OPT_OFFSET = 0, 2, 3, 4, 5, 7


OPT_TSC2NSEC = 14


OPT_SECTIONS = {16: "header_info", 17: "ftrace_events", 18: "event_formats", 21: "cmdlines"}


class TraceCmdError(ValueError):
    pass


@dataclass
class Field:
    offset: int
    size: int
    signed: bool
    data_loc: bool


@dataclass
class EventFormat:
    system: str
    name: str
    id: int
    fields: dict[str, Field]
    where: str = ""          # the file and offset of its text, for messages


@dataclass
class DatFile:
    path: str
    version: int
    little_endian: bool
    long_size: int
    page_size: int
    compression: str = "none"
    formats: dict[int, EventFormat] = field(default_factory=dict)
    header_page: str = ""
    cmdlines: dict[int, str] = field(default_factory=dict)
    clock: str = "local"
    uname: str = ""
    offset_ns: int = 0
    tsc2nsec: tuple[int, int, int] | None = None
    clock_where: str = ""    # where the clock, OFFSET or TSC2NSEC option is, for messages
    cpus: list[tuple[int, int, int]] = field(default_factory=list)   # (cpu, offset, size)
    cpustats: dict[int, str] = field(default_factory=dict)


_FIELD = re.compile(r"field:(?P<decl>[^;]*);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);"
                    r"(?:\s*signed:(?P<signed>\d+);)?")


def parse_format(text: str, with_fields: bool = True) -> EventFormat:
    """One ftrace event format file (events/<system>/<event>/format); its
    name and ID alone when not with_fields."""
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    eid = re.search(r"^ID:\s*(\d+)", text, re.M)
    if not name or not eid:
        raise ValueError("no name: or ID: line")
    fields = {}
    for m in _FIELD.finditer(text) if with_fields else ():
        decl = m["decl"].strip()
        words = re.sub(r"\[.*?\]", "", decl).split()
        if not words:
            raise ValueError(f"a field with no name at character {m.start()} of the format")
        fname = words[-1]
        fields[fname] = Field(int(m["off"]), int(m["size"]), m["signed"] == "1",
                              decl.startswith("__data_loc") or decl.startswith("__rel_loc"))
    return EventFormat("", name[1], int(eid[1]), fields)


class Buf:
    """Bounds-checked reads from one file's bytes (or a section of them,
    `base` being where the section's bytes start, for the messages)."""

    def __init__(self, path: str, data, endian: str = "<", base: int | None = None):
        self.path, self.data, self.e, self.base = path, data, endian, base

    def where(self, off: int) -> str:
        if self.base is None:
            return f"{self.path}: offset {off}"
        return f"{self.path}: section at offset {self.base}, byte {off} of its data"

    def need(self, off: int, n: int, what: str) -> None:
        if off < 0 or off + n > len(self.data):
            raise TraceCmdError(f"{self.where(off)}: {what}: {n} bytes needed, the "
                                f"{'file' if self.base is None else 'section'} ends at "
                                f"{len(self.data)}")

    def u(self, off: int, size: int, what: str) -> int:
        self.need(off, size, what)
        return int.from_bytes(self.data[off:off + size], "little" if self.e == "<" else "big")

    def cstr(self, off: int, what: str) -> tuple[str, int]:
        end = bytes(self.data[off:off + 4096]).find(b"\0") if off < len(self.data) else -1
        if end < 0:
            raise TraceCmdError(f"{self.where(off)}: {what}: no terminating NUL")
        return bytes(self.data[off:off + end]).decode(errors="replace"), off + end + 1


def decompress(algo: str, blob: bytes, usize: int, where: str) -> bytes:
    """One compressed chunk, streamed and stopped one byte past `usize`: a
    damaged size or a damaged stream is never allocated up front nor let
    grow without bound."""
    try:
        if algo == "zlib":
            out = zlib.decompressobj().decompress(blob, usize + 1)
        elif algo == "zstd":
            import zstandard
            try:
                with zstandard.ZstdDecompressor().stream_reader(blob) as r:
                    parts, got = [], 0
                    while got <= usize:
                        part = r.read(min(1 << 20, usize + 1 - got))
                        if not part:
                            break
                        parts.append(part)
                        got += len(part)
                out = b"".join(parts)
            except zstandard.ZstdError as e:    # (not a ValueError)
                raise ValueError(str(e)) from None
        else:
            raise TraceCmdError(f"{where}: compression {algo!r} is not read (zlib, zstd are)")
    except (zlib.error, ValueError) as e:
        if isinstance(e, TraceCmdError):
            raise
        raise TraceCmdError(f"{where}: {algo} data does not decompress: {e}") from None
    except ImportError:
        raise TraceCmdError(f"{where}: zstd data needs the zstandard module "
                            "(pip install zstandard; ci/setup installs it)") from None
    if len(out) > usize:
        raise TraceCmdError(f"{where}: decompresses past the {usize} bytes expected")
    if len(out) < usize:
        raise TraceCmdError(f"{where}: {len(out)} bytes decompressed, {usize} expected")
    return out


def _formats_block(b: Buf, off: int, dat: DatFile) -> int:
    """Event formats: systems, each with its events' format files.  Only
    the block system's fields are read (no other event's fields are): a
    file of all the kernel's events holds 2,000 formats, and parsing
    their fields took nine tenths of reading one of 7 MB."""
    nsys = b.u(off, 4, "count of event systems")
    off += 4
    for _ in range(nsys):
        system, off = b.cstr(off, "event system name")
        nev = b.u(off, 4, f"count of {system} events")
        off += 4
        for _ in range(nev):
            size = b.u(off, 8, "size of an event format")
            b.need(off + 8, size, f"{system} event format")
            text = bytes(b.data[off + 8:off + 8 + size]).decode(errors="replace")
            try:
                fmt = parse_format(text, with_fields=system == "block")
            except ValueError as e:
                raise TraceCmdError(f"{b.where(off + 8)}: a {system} event format: {e}") from None
            fmt.system, fmt.where = system, b.where(off + 8)
            dat.formats[fmt.id] = fmt
            off += 8 + size
    return off


def _header_info(b: Buf, off: int, dat: DatFile) -> int:
    for tag in ("header_page", "header_event"):
        name, off = b.cstr(off, "header info tag")
        if name != tag:
            raise TraceCmdError(f"{b.where(off)}: {tag!r} expected, found {name!r}")
        size = b.u(off, 8, f"size of {tag}")
        b.need(off + 8, size, tag)
        if tag == "header_page":
            dat.header_page = bytes(b.data[off + 8:off + 8 + size]).decode(errors="replace")
        off += 8 + size
    return off


def _ftrace_events(b: Buf, off: int) -> int:
    n = b.u(off, 4, "count of ftrace event formats")
    off += 4
    for _ in range(n):
        off += 8 + b.u(off, 8, "size of an ftrace event format")
    return off


def _cmdlines(text: str) -> dict[int, str]:
    out = {}
    for line in text.splitlines():
        pid, _, comm = line.strip().partition(" ")
        if pid.isdigit():
            out[int(pid)] = comm
    return out


def _option(dat: DatFile, b: Buf, oid: int, off: int, size: int, sections: dict) -> None:
    e = b.e
    data = bytes(b.data[off:off + size])
    if oid == OPT_BUFFER:
        ob = Buf(dat.path, data, e)
        _sec = ob.u(0, 8, "BUFFER option")
        name, p = ob.cstr(8, "BUFFER instance name")
        if name:            # an instance other than the top one: not read
            return
        dat.clock, p = ob.cstr(p, "BUFFER clock")
        p += 4                                   # page size
        n = ob.u(p, 4, "BUFFER cpu count")
        p += 4
        dat.cpus = []
        for _ in range(n):
            dat.cpus.append((ob.u(p, 4, "cpu"), ob.u(p + 4, 8, "cpu data offset"),
                             ob.u(p + 12, 8, "cpu data size")))
            p += 20
    elif oid == OPT_CPUSTAT:
        text = data.split(b"\0", 1)[0].decode(errors="replace")
        m = re.search(r"^CPU:\s*(\d+)", text, re.M)
        dat.cpustats[int(m[1]) if m else len(dat.cpustats)] = text
    elif oid == OPT_TRACECLOCK:
        text = data.split(b"\0", 1)[0].decode(errors="replace")
        m = re.search(r"\[(\S+)\]", text)
        if m:
            dat.clock = m[1]
            dat.clock_where = dat.clock_where or b.where(off)
    elif oid == OPT_UNAME:
        dat.uname = data.split(b"\0", 1)[0].decode(errors="replace")
    elif oid == OPT_OFFSET:
        text = data.split(b"\0", 1)[0].decode(errors="replace").strip()
        try:
            dat.offset_ns = int(text or 0)
        except ValueError:
            raise TraceCmdError(f"{b.where(off)}: OFFSET option {text[:40]!r} is not a "
                                "number of nanoseconds") from None
        dat.clock_where = b.where(off)
    elif oid == OPT_TSC2NSEC and size >= 16:
        dat.tsc2nsec = struct.unpack(e + "IIq", data[:16])
        dat.clock_where = b.where(off)
    elif oid in OPT_SECTIONS and size >= 8:
        sections[oid] = int.from_bytes(data[:8], "little" if e == "<" else "big")


def _section(dat: DatFile, b: Buf, off: int, expect: int) -> Buf:
    """A v7 section's data (decompressed), from its header at `off`."""
    sid = b.u(off, 2, "section id")
    flags = b.u(off + 2, 2, "section flags")
    size = b.u(off + 8, 8, "section size")
    if sid != expect:
        raise TraceCmdError(f"{b.where(off)}: section {expect} expected, found {sid}")
    start = off + 16
    b.need(start, size, f"section {sid}")
    if flags & 1:
        csize, usize = b.u(start, 4, "compressed size"), b.u(start + 4, 4, "uncompressed size")
        b.need(start + 8, csize, f"section {sid} compressed data")
        data = decompress(dat.compression, bytes(b.data[start + 8:start + 8 + csize]), usize,
                           b.where(start))
        return Buf(dat.path, data, b.e, base=off)
    return Buf(dat.path, memoryview(b.data)[start:start + size], b.e, base=off)


def _options_v7(dat: DatFile, b: Buf, off: int) -> dict[int, int]:
    sections: dict[int, int] = {}
    seen = set()
    while off:
        if off in seen:
            raise TraceCmdError(f"{b.where(off)}: options sections form a loop")
        seen.add(off)
        s = _section(dat, b, off, SEC_OPTIONS)
        p, nxt = 0, 0
        while True:
            oid, size = s.u(p, 2, "option id"), s.u(p + 2, 4, "option size")
            s.need(p + 6, size, f"option {oid}")
            if oid == OPT_DONE:
                nxt = s.u(p + 6, 8, "next options offset") if size >= 8 else 0
                break
            _option(dat, s, oid, p + 6, size, sections)
            p += 6 + size
        off = nxt
    return sections


def open_dat(path: str | os.PathLike) -> tuple[DatFile, Buf]:
    """Parse a trace.dat's metadata (not its events); the file mapped."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            try:        # (mapped: the CPUs' data is read a window at a time)
                data = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            except (ValueError, OSError):       # (empty, or not a regular file)
                data = f.read()
    except OSError as e:
        raise TraceCmdError(f"{path}: {e.strerror}") from None
    if data[:len(MAGIC)] != MAGIC:
        raise TraceCmdError(f"{path}: offset 0: not a trace-cmd file (no \\x17\\x08\\x44tracing)")
    b = Buf(path, data)
    ver, off = b.cstr(len(MAGIC), "version")
    if ver not in ("6", "7"):
        raise TraceCmdError(f"{path}: offset {len(MAGIC)}: trace-cmd file version {ver!r} "
                            "(6 and 7 are read)")
    b.need(off, 6, "endianness, long size and page size")
    endian = "<" if data[off] == 0 else ">"
    b.e = endian
    dat = DatFile(path=path, version=int(ver), little_endian=endian == "<",
                  long_size=data[off + 1], page_size=b.u(off + 2, 4, "page size"))
    if endian != "<":
        raise TraceCmdError(f"{path}: offset {off}: a big-endian trace (only little-endian is read)")
    off += 6
    if dat.version == 6:
        off = _header_info(b, off, dat)
        off = _ftrace_events(b, off)
        off = _formats_block(b, off, dat)
        off += 4 + b.u(off, 4, "kallsyms size")
        off += 4 + b.u(off, 4, "printk formats size")
        size = b.u(off, 8, "cmdlines size")
        b.need(off + 8, size, "cmdlines")
        dat.cmdlines = _cmdlines(data[off + 8:off + 8 + size].decode(errors="replace"))
        off += 8 + size
        ncpu = b.u(off, 4, "cpu count")
        off += 4
        while True:
            b.need(off, 10, "options/flyrecord tag")
            tag = data[off:off + 10]
            off += 10
            if tag == b"options  \0":
                sections: dict[int, int] = {}
                while True:
                    oid = b.u(off, 2, "option id")
                    off += 2
                    if oid == OPT_DONE:
                        break
                    size = b.u(off, 4, "option size")
                    b.need(off + 4, size, f"option {oid}")
                    _option(dat, b, oid, off + 4, size, sections)
                    off += 4 + size
            elif tag == b"flyrecord\0":
                dat.cpus = [(c, b.u(off + 16 * c, 8, "cpu data offset"),
                             b.u(off + 16 * c + 8, 8, "cpu data size")) for c in range(ncpu)]
                break
            elif tag == b"latency  \0":
                raise TraceCmdError(f"{path}: offset {off - 10}: a latency trace (text), "
                                    "not recorded events")
            else:
                raise TraceCmdError(f"{path}: offset {off - 10}: options or flyrecord expected, "
                                    f"found {tag!r}")
        return dat, b
    dat.compression, off = b.cstr(off, "compression name")
    _cver, off = b.cstr(off, "compression version")
    opt_off = b.u(off, 8, "options offset")
    sections = _options_v7(dat, b, opt_off)
    if SEC_HEADER_INFO in sections:
        _header_info(_section(dat, b, sections[SEC_HEADER_INFO], SEC_HEADER_INFO), 0, dat)
    if SEC_EVENT_FORMATS not in sections:
        raise TraceCmdError(f"{path}: offset {opt_off}: the options name no event formats "
                            "section: the events cannot be decoded")
    _formats_block(_section(dat, b, sections[SEC_EVENT_FORMATS], SEC_EVENT_FORMATS), 0, dat)
    if SEC_CMDLINES in sections:
        s = _section(dat, b, sections[SEC_CMDLINES], SEC_CMDLINES)
        size = s.u(0, 8, "cmdlines size")
        dat.cmdlines = _cmdlines(bytes(s.data[8:8 + size]).decode(errors="replace"))
    return dat, b
