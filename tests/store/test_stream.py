"""The agent stream decoder: good frames kept, bad ones named by offset."""
from __future__ import annotations

import io
import json
import struct

import numpy as np

from nestrace.schema import RECORDS, STREAM_MAGIC, record_dtype
from nestrace.store.stream import FRAME, DecodeState, iter_frames


def block_records(n: int, start_seq: int = 1) -> bytes:
    spec = RECORDS["block_event"]
    a = np.zeros(n, dtype=record_dtype("block_event"))
    a["kind"] = spec["kind"]
    a["version"] = spec["version"]
    a["seq"] = np.arange(start_seq, start_seq + n)
    a["ts_ns"] = 1000 + np.arange(n)
    a["sector"] = 8 * np.arange(n)
    a["nr_sectors"] = 8
    a["comm"] = b"fio"
    return a.tobytes()


def frame(kind: int, payload: bytes, count: int, rec_size: int, version: int | None = None) -> bytes:
    if version is None:
        version = 1
    return FRAME.pack(STREAM_MAGIC, kind, version, rec_size, count) + payload


def block_frame(n: int, start_seq: int = 1) -> bytes:
    size = RECORDS["block_event"]["size"]
    return frame(2, block_records(n, start_seq), n, size)


def meta_frame(obj: dict) -> bytes:
    b = json.dumps(obj).encode()
    return frame(0, b, len(b), 1)


def decode(data: bytes):
    st = DecodeState("t.ntr")
    frames = list(iter_frames(io.BytesIO(data), "t.ntr", st))
    return frames, st


def test_frames_decode_to_arrow_with_schema_columns():
    frames, st = decode(meta_frame({"type": "start"}) + block_frame(3))
    assert st.problems == []
    assert frames[0].meta == {"type": "start"}
    b = frames[1].batch
    assert frames[1].table == "block_events"
    assert b.column("sector").to_pylist() == [0, 8, 16]
    assert b.column("comm").to_pylist() == ["fio"] * 3
    assert "_pad0" not in b.schema.names


def test_garbage_between_frames_is_reported_at_its_offset_and_later_frames_kept():
    first = block_frame(2, 1)
    data = first + b"\xde\xad\xbe\xef" * 5 + block_frame(2, 3)
    frames, st = decode(data)
    assert [f.batch.column("seq").to_pylist() for f in frames] == [[1, 2], [3, 4]]
    assert len(st.problems) == 1
    assert st.problems[0].offset == len(first)
    assert "t.ntr: offset %d: bad frame magic" % len(first) in str(st.problems[0])
    assert st.skipped_bytes == 20


def test_unknown_kind_and_wrong_version_and_size_are_refused_with_offset():
    size = RECORDS["block_event"]["size"]
    bad_kind = frame(99, b"\0" * 8, 1, 8)
    bad_version = frame(2, block_records(1), 1, size, version=7)
    bad_size = frame(2, b"\0" * 8, 1, 8)
    good = block_frame(1, 9)
    data = bad_kind + bad_version + bad_size + good
    frames, st = decode(data)
    assert [f.batch.column("seq").to_pylist() for f in frames] == [[9]]
    reasons = [(p.offset, p.reason) for p in st.problems]
    assert reasons[0] == (0, "unknown record kind 99")
    assert reasons[1][0] == len(bad_kind) and "version 7" in reasons[1][1]
    assert reasons[2][0] == len(bad_kind) + len(bad_version) and "record size 8" in reasons[2][1]


def test_truncated_last_frame_keeps_its_whole_records():
    size = RECORDS["block_event"]["size"]
    data = block_frame(1, 1) + block_frame(3, 2)[: FRAME.size + 2 * size + 5]
    frames, st = decode(data)
    assert [f.batch.column("seq").to_pylist() for f in frames] == [[1], [2, 3]]
    assert len(st.problems) == 1 and "truncated frame" in st.problems[0].reason
    assert st.problems[0].offset == FRAME.size + size


def test_record_of_another_kind_inside_a_frame_is_refused():
    recs = bytearray(block_records(2))
    struct.pack_into("<H", recs, RECORDS["block_event"]["size"], 3)
    data = frame(2, bytes(recs), 2, RECORDS["block_event"]["size"]) + block_frame(1, 5)
    frames, st = decode(data)
    assert [f.batch.column("seq").to_pylist() for f in frames] == [[5]]
    assert "record 1 of a kind-2 frame has kind 3" in st.problems[0].reason
