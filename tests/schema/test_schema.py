"""schemas/records.toml is the single definition: generated files and the
compiled BPF objects must agree with it."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

from nestrace.schema import RECORDS
from nestrace.schema import gen as schemagen

BUILD = ROOT / "tracers" / "build"


def test_generated_files_match_the_schema():
    assert schemagen.check() == []


def test_schema_with_implicit_padding_is_rejected(tmp_path):
    bad = tmp_path / "r.toml"
    text = (ROOT / "schemas" / "records.toml").read_text().replace(
        '["duration_ns",  "__u64"', '["duration_x", "__u16", "uint16", "", "x"],\n  ["duration_ns",  "__u64"', 1)
    bad.write_text(text)
    with pytest.raises(schemagen.SchemaError, match="not 8-aligned"):
        schemagen.load(bad)


def _btf_structs(obj: Path) -> dict[str, dict[str, tuple[int, int]]]:
    out = subprocess.run(["bpftool", "-j", "btf", "dump", "file", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    types = json.loads(out)["types"]
    by_id = {t["id"]: t for t in types}

    def size_of(tid: int) -> int:
        t = by_id[tid]
        while t["kind"] in ("TYPEDEF", "VOLATILE", "CONST"):
            t = by_id[t["type_id"]]
        if t["kind"] == "ARRAY":
            return t["nr_elems"] * size_of(t["type_id"])
        return t["size"]

    structs = {}
    for t in types:
        if t["kind"] == "STRUCT" and t["name"].startswith("nt_"):
            structs[t["name"]] = {m["name"]: (m["bits_offset"] // 8, size_of(m["type_id"]))
                                  for m in t["members"]}
            structs[t["name"]]["__size__"] = (0, t["size"])
    return structs


@pytest.mark.skipif(not shutil.which("bpftool") or not BUILD.exists(),
                    reason="needs bpftool and the built BPF objects (make -C tracers)")
@pytest.mark.parametrize("obj,records", [
    ("vfs.bpf.o", ["vfs_event"]),
    ("block.bpf.o", ["block_event", "block_request"]),
    ("hostfs.bpf.o", ["hostfs_event", "pagecache_event", "mapping_event"]),
    ("netfs.bpf.o", ["netfs_event"]),
])
def test_compiled_bpf_record_layout_matches_the_schema(obj, records):
    structs = _btf_structs(BUILD / obj)
    header = structs["nt_header"]
    for name in records:
        spec = RECORDS[name]
        got = structs[f"nt_{name}"]
        assert got["__size__"][1] == spec["size"]
        nh = len(header) - 1
        for fname, _, _, _, _, offset in spec["fields"][nh:]:
            assert got[fname][0] == offset, (name, fname)
        for fname, _, _, _, _, offset in spec["fields"][:nh]:
            assert header[fname][0] == offset, ("header", fname)


def test_drift_in_a_generated_file_is_caught(tmp_path, monkeypatch):
    import shutil as sh
    for rel in schemagen.OUTPUTS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        sh.copy(ROOT / rel, tmp_path / rel)
    h = tmp_path / "tracers" / "nestrace_records.h"
    h.write_text(h.read_text().replace("__u64 rq_id;", "__u32 rq_id;"))
    monkeypatch.setattr(schemagen, "ROOT", tmp_path)
    drift = schemagen.check()
    assert len(drift) == 1 and "nestrace_records.h" in drift[0] and "rq_id" in drift[0]


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_the_agents_arrow_schema_message_is_the_record_schema(name):
    """tracers/nestrace_arrow.h carries these bytes: pyarrow must read them
    back as exactly the schema Python stores, docs and units included."""
    import pyarrow as pa

    from nestrace.schema import record_schema
    from nestrace.schema.arrowipc import schema_message
    want = record_schema(name)
    cols = [(f.name, "string" if f.type == pa.string() else str(f.type),
             {k.decode(): v.decode() for k, v in f.metadata.items()}) for f in want]
    got = pa.ipc.read_schema(pa.py_buffer(schema_message(cols)))
    assert got.equals(want, check_metadata=True)


def test_a_batch_built_from_the_template_reads_back():
    """Fill the RecordBatch template the way the agent does (row count,
    body length, nodes, buffers) and read the stream with pyarrow."""
    import struct

    import pyarrow as pa

    from nestrace.schema.arrowipc import batch_template, schema_message
    cols = [("a", "uint64", {"doc": "x"}), ("b", "int32", {"doc": "y", "unit": "ns"}),
            ("c", "string", {"doc": "z"})]
    t = batch_template(3, 7)
    msg, body, bufs = bytearray(t.message), bytearray(), []

    def add(data: bytes) -> None:
        bufs.append((len(body), len(data)))
        body.extend(data + bytes(-len(data) % 8))
    add(b""), add(struct.pack("<2Q", 7, 2**64 - 1))
    add(b""), add(struct.pack("<2i", -5, 9))
    add(b""), add(struct.pack("<3i", 0, 3, 6)), add("héllo".encode())
    for i in range(3):
        struct.pack_into("<qq", msg, t.nodes_pos + 16 * i, 2, 0)
    for j, (off, n) in enumerate(bufs):
        struct.pack_into("<qq", msg, t.buffers_pos + 16 * j, off, n)
    struct.pack_into("<q", msg, t.length_pos, 2)
    struct.pack_into("<q", msg, t.body_length_pos, len(body))
    stream = schema_message(cols) + bytes(msg) + bytes(body) + struct.pack("<Ii", 0xFFFFFFFF, 0)
    table = pa.ipc.open_stream(pa.py_buffer(stream)).read_all()
    table.validate(full=True)
    assert table.to_pylist() == [{"a": 7, "b": -5, "c": "hé"}, {"a": 2**64 - 1, "b": 9, "c": "llo"}]
