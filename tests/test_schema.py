"""schemas/records.toml is the single definition: generated files and the
compiled BPF objects must agree with it."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nestrace import schemagen
from nestrace.schema import RECORDS

ROOT = Path(__file__).resolve().parent.parent
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
    ("block.bpf.o", ["block_event"]),
    ("hostfs.bpf.o", ["hostfs_event", "pagecache_event", "mapping_event"]),
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
