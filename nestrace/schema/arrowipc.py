"""Arrow IPC message bytes for the agent, which writes the live store itself.

The agent (C, no Arrow library) writes each kernel record table as an
Arrow IPC stream.  What it needs is generated here from schemas/, once:

- the table's Schema message, as finished bytes;
- a RecordBatch message template, with the byte positions of the numbers
  that change per batch (row count, body length, and each buffer's
  offset and length) for the agent to fill in.

Messages are flatbuffers (Arrow's format/Message.fbs, Schema.fbs).  The
writer below lays a table's children out after the table, so every
offset points forward as flatbuffers require, and aligns each scalar to
its size.  A test reads the generated messages back with pyarrow.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

METADATA_V5 = 4
HEADER_SCHEMA, HEADER_RECORD_BATCH = 1, 3
TYPE_INT, TYPE_UTF8, TYPE_BOOL = 2, 5, 6
CONTINUATION = 0xFFFFFFFF

_SCALAR = {"u8": "<B", "bool": "<B", "i16": "<h", "i32": "<i", "i64": "<q"}

# arrow type name -> (bit width, signed); "string" is Utf8
INT_TYPES = {"uint8": (8, False), "uint16": (16, False), "uint32": (32, False),
             "uint64": (64, False), "int8": (8, True), "int16": (16, True),
             "int32": (32, True), "int64": (64, True)}


@dataclass
class _Builder:
    """Front-to-back flatbuffer writer."""
    buf: bytearray = field(default_factory=lambda: bytearray(4))   # root offset
    marks: dict[str, int] = field(default_factory=dict)

    def _pad(self, align: int, extra: int = 0) -> None:
        while (len(self.buf) + extra) % align:
            self.buf.append(0)

    def table(self, fields: list[tuple], mark: str = "") -> int:
        """fields: (id, kind, value[, mark]); kind is a scalar type, or
        "off" with a callable that writes the child and returns its
        position.  Returns the table's position."""
        nslots = max(f[0] for f in fields) + 1 if fields else 0
        # inline layout after the 4-byte soffset, largest scalars first
        sized = sorted(fields, key=lambda f: -(4 if f[1] == "off" else struct.calcsize(_SCALAR[f[1]])))
        pos, layout = 4, []
        for f in sized:
            size = 4 if f[1] == "off" else struct.calcsize(_SCALAR[f[1]])
            pos = (pos + size - 1) // size * size
            layout.append((f, pos))
            pos += size
        tsize = (pos + 3) // 4 * 4
        self._pad(2)
        vt = len(self.buf)
        slots = [0] * nslots
        for f, p in layout:
            slots[f[0]] = p
        self.buf += struct.pack(f"<HH{nslots}H", 4 + 2 * nslots, tsize, *slots)
        self._pad(8)
        t = len(self.buf)
        self.buf += struct.pack("<i", t - vt) + bytes(tsize - 4)
        children = []
        for f, p in layout:
            if f[1] == "off":
                children.append((t + p, f[2]))
            else:
                struct.pack_into(_SCALAR[f[1]], self.buf, t + p, f[2])
            if len(f) > 3:
                self.marks[f[3]] = t + p
        for slot, write in children:
            child = write()
            struct.pack_into("<I", self.buf, slot, child - slot)
        if mark:
            self.marks[mark] = t
        return t

    def string(self, s: str) -> int:
        self._pad(4)
        p = len(self.buf)
        data = s.encode()
        self.buf += struct.pack("<I", len(data)) + data + b"\0"
        return p

    def tables(self, writers: list) -> int:
        """A vector of tables."""
        self._pad(4)
        p = len(self.buf)
        self.buf += struct.pack("<I", len(writers)) + bytes(4 * len(writers))
        for i, write in enumerate(writers):
            slot = p + 4 + 4 * i
            struct.pack_into("<I", self.buf, slot, write() - slot)
        return p

    def structs16(self, n: int, mark: str) -> int:
        """A vector of n 16-byte structs of two longs (FieldNode, Buffer),
        zeroed: the agent fills them in."""
        self._pad(8, extra=4)
        p = len(self.buf)
        self.buf += struct.pack("<I", n)
        self.marks[mark] = len(self.buf)
        self.buf += bytes(16 * n)
        return p

    def finish(self, root: int) -> bytes:
        struct.pack_into("<I", self.buf, 0, root)
        self._pad(8)
        return bytes(self.buf)


def _encapsulate(fb: bytes) -> bytes:
    """Continuation marker, metadata length, flatbuffer padded to 8."""
    assert len(fb) % 8 == 0
    return struct.pack("<Ii", CONTINUATION, len(fb)) + fb


def schema_message(columns: list[tuple[str, str, dict[str, str]]]) -> bytes:
    """Encapsulated Schema message for columns (name, arrow type, metadata)."""
    b = _Builder()

    def field_writer(name: str, arrow: str, meta: dict[str, str]):
        def kv(k: str, v: str):
            return lambda: b.table([(0, "off", lambda: b.string(k)), (1, "off", lambda: b.string(v))])

        def type_table():
            if arrow in ("string", "bool"):        # Utf8 and Bool have no fields
                return b.table([])
            width, signed = INT_TYPES[arrow]
            return b.table([(0, "i32", width), (1, "bool", int(signed))])

        type_id = TYPE_UTF8 if arrow == "string" else TYPE_BOOL if arrow == "bool" else TYPE_INT
        return lambda: b.table([
            (0, "off", lambda: b.string(name)),
            (1, "bool", 1),                            # nullable
            (2, "u8", type_id),                        # type_type
            (3, "off", type_table),                    # type
            (5, "off", lambda: b.tables([])),          # children
            (6, "off", lambda: b.tables([kv(k, v) for k, v in meta.items()])),
        ])

    def schema():
        return b.table([(1, "off", lambda: b.tables([field_writer(*c) for c in columns]))])

    root = b.table([(0, "i16", METADATA_V5), (1, "u8", HEADER_SCHEMA),
                    (2, "off", schema), (3, "i64", 0)])
    return _encapsulate(b.finish(root))


@dataclass
class BatchTemplate:
    """A RecordBatch message with zeroed numbers and where they go: the
    row count (i64), body length (i64), FieldNode {length, null_count}
    per column and Buffer {offset, length} per buffer, from nodes_pos and
    buffers_pos, 16 bytes each.  Positions count from the message start
    (continuation marker included)."""
    message: bytes
    length_pos: int
    body_length_pos: int
    nodes_pos: int
    buffers_pos: int


def batch_template(ncols: int, nbuffers: int) -> BatchTemplate:
    b = _Builder()

    def record_batch():
        return b.table([(0, "i64", 0, "length"),
                        (1, "off", lambda: b.structs16(ncols, "nodes")),
                        (2, "off", lambda: b.structs16(nbuffers, "buffers"))])

    root = b.table([(0, "i16", METADATA_V5), (1, "u8", HEADER_RECORD_BATCH),
                    (2, "off", record_batch), (3, "i64", 0, "body_length")])
    msg = _encapsulate(b.finish(root))
    return BatchTemplate(msg, b.marks["length"] + 8, b.marks["body_length"] + 8,
                         b.marks["nodes"] + 8, b.marks["buffers"] + 8)
