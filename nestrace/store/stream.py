"""Decode the agent's framed record stream into Arrow record batches.

A stream is a sequence of frames: a 16-byte header {magic u32, kind u16,
version u16, rec_size u32, count u32} and `count` records of `rec_size`
bytes (kind 0: `count` bytes of JSON).  The decoder checks every frame
against schemas/ and refuses what it does not understand, naming the file
and byte offset; it then resynchronises on the next frame magic, so a bad
frame never costs the good frames after it.
"""
from __future__ import annotations

import codecs
import json
import struct
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nestrace.errors import StreamError
from nestrace.schema import BY_KIND, RECORDS, STREAM_MAGIC, record_dtype, record_schema

FRAME = struct.Struct("<IHHII")
MAGIC_BYTES = struct.pack("<I", STREAM_MAGIC)
MAX_FRAME_BYTES = 64 << 20

# Task names are bytes; a byte that is not part of well-formed UTF-8
# becomes '?' (the agent's Arrow writer does the same, utf8__fix).
codecs.register_error("nestrace-qmark", lambda e: ("?" * (e.end - e.start), e.end))


@dataclass
class Frame:
    offset: int
    kind: int
    table: str | None = None        # kernel record table, or None for meta
    batch: pa.RecordBatch | None = None
    meta: dict | None = None


@dataclass
class DecodeState:
    source: str
    problems: list[StreamError] = field(default_factory=list)
    skipped_bytes: int = 0


def records_to_batch(name: str, payload: bytes | memoryview, count: int) -> pa.RecordBatch:
    """Turn `count` packed records of kind `name` into an Arrow batch."""
    arr = np.frombuffer(payload, dtype=record_dtype(name), count=count)
    schema = record_schema(name)
    cols = []
    for f in schema:
        col = arr[f.name]
        if col.dtype.kind == "S":
            a = pa.array(col)  # binary, trailing NULs stripped
            try:
                a = pc.cast(a, pa.string())
            except pa.ArrowInvalid:
                a = pa.array([b.decode("utf-8", "nestrace-qmark") for b in col.tolist()],
                             pa.string())
            cols.append(a)
        else:
            cols.append(pa.array(np.ascontiguousarray(col), type=f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _check_header(state: DecodeState, offset: int, kind: int, version: int,
                  rec_size: int, count: int) -> str | None:
    """Return a reason string if the frame header is not one we understand."""
    if kind == 0:
        return None if rec_size == 1 and count <= MAX_FRAME_BYTES else \
            f"bad metadata frame (rec_size {rec_size}, length {count})"
    name = BY_KIND.get(kind)
    if name is None:
        return f"unknown record kind {kind}"
    spec = RECORDS[name]
    if version != spec["version"]:
        return f"{name} version {version}, this nestrace reads version {spec['version']}"
    if rec_size != spec["size"]:
        return f"{name} record size {rec_size}, schema says {spec['size']}"
    if rec_size * count > MAX_FRAME_BYTES:
        return f"frame of {count} records is larger than {MAX_FRAME_BYTES} bytes"
    return None


def iter_frames(f: BinaryIO, source: str, state: DecodeState | None = None) -> Iterator[Frame]:
    """Yield decoded frames from a binary stream (file or pipe).

    Problems are appended to `state.problems` (never raised mid-stream), so a
    caller keeps every good frame and reports the bad spots at the end."""
    state = state or DecodeState(source)
    buf = bytearray()
    base = 0          # stream offset of buf[0]
    eof = False

    read = getattr(f, "read1", f.read)

    def fill(n: int) -> bool:
        nonlocal eof
        while len(buf) < n and not eof:
            chunk = read(max(n - len(buf), 1 << 16))
            if not chunk:
                eof = True
                break
            buf.extend(chunk)
        return len(buf) >= n

    def resync(reason: str) -> None:
        nonlocal base
        state.problems.append(StreamError(source, base, reason))
        nxt = buf.find(MAGIC_BYTES, 1)
        while nxt < 0 and not eof:
            keep = max(len(buf) - 3, 1)
            state.skipped_bytes += keep
            del buf[:keep]
            base += keep
            fill(len(buf) + (1 << 16))
            nxt = buf.find(MAGIC_BYTES, 1 if base == 0 else 0)
        if nxt < 0:
            state.skipped_bytes += len(buf)
            base += len(buf)
            buf.clear()
            return
        state.skipped_bytes += nxt
        del buf[:nxt]
        base += nxt

    while True:
        if not fill(FRAME.size):
            if buf:
                state.problems.append(StreamError(
                    source, base, f"truncated frame header ({len(buf)} bytes at end of stream)"))
            return
        magic, kind, version, rec_size, count = FRAME.unpack_from(buf, 0)
        if magic != STREAM_MAGIC:
            resync(f"bad frame magic 0x{magic:08x}")
            continue
        reason = _check_header(state, base, kind, version, rec_size, count)
        if reason:
            resync(reason)
            continue
        total = FRAME.size + rec_size * count
        if not fill(total):
            state.problems.append(StreamError(
                source, base, f"truncated frame: {len(buf) - FRAME.size} of "
                f"{rec_size * count} payload bytes at end of stream"))
            # keep the whole records that did arrive
            whole = (len(buf) - FRAME.size) // rec_size if kind else 0
            if whole:
                yield _decode(kind, base, bytes(buf[FRAME.size:FRAME.size + whole * rec_size]), whole)
            return
        with memoryview(buf) as mv:
            payload = bytes(mv[FRAME.size:total])   # one copy, not two
        if kind and rec_size % 2 == 0:
            kinds = np.frombuffer(payload, dtype="<u2")[::rec_size // 2]
            if not (kinds == kind).all():
                bad = int(np.argmax(kinds != kind))
                resync(f"record {bad} of a kind-{kind} frame has kind {int(kinds[bad])}")
                continue
        frame = _decode(kind, base, payload, count)
        del buf[:total]
        base += total
        yield frame


def _decode(kind: int, offset: int, payload: bytes, count: int) -> Frame:
    if kind == 0:
        try:
            meta = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            meta = {"type": "invalid", "error": str(e)}
        return Frame(offset, 0, meta=meta)
    name = BY_KIND[kind]
    batch = records_to_batch(name, payload, count)
    return Frame(offset, kind, table=RECORDS[name]["table"], batch=batch)
