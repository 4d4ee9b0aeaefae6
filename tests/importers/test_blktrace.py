"""blktrace's binary format (nestrace.importers.blktrace): hand-built records, and bad
input named by file and byte offset with no good record lost."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from nestrace.importers import blkimport, blktrace

TC_WRITE, TC_SYNC, TC_FLUSH, TC_FUA, TC_AHEAD = 0x2, 0x8, 0x4, 0x8000, 0x800


def rec(action: int, cats: int, sector: int, nbytes: int, t: int, pdu: bytes = b"",
        magic: int = blktrace.MAGIC | 7, dev: int = (7 << 20) | 1, cpu: int = 1) -> bytes:
    return blktrace.HEADER.pack(magic, 0, t, sector, nbytes, (cats << 16) | action,
                                123, dev, cpu, 0, len(pdu)) + pdu


def test_records_are_decoded_like_blkparse(tmp_path):
    split = struct.pack(">Q", 2056)            # X: the new sector, big-endian
    cgroup = struct.pack("=Q", 99)
    data = (rec(1, TC_WRITE | TC_SYNC, 2048, 4096, 10)                      # Q  WS
            + rec(13, TC_WRITE, 2048, 8192, 11, split)                      # X  W
            + rec(7, 0x1, 4096, 4096, 12)                                   # D  R
            + rec(8 | 0x100, TC_FLUSH | 0x1, 0, 0, 13, cgroup)              # C  FN, cgroup id
            + rec(7, TC_WRITE | TC_FUA | TC_FLUSH, 8, 512, 14)              # D  FWF
            + rec(1, TC_AHEAD | 0x1, 64, 131072, 15))                       # Q  RA
    f = tmp_path / "loop1.blktrace.0"
    f.write_bytes(data)
    t = blktrace.read(f)
    rows = t.select(["file_offset", "time_ns", "sector", "bytes", "action", "rwbs", "op",
                     "dev", "pid", "pdu"]).to_pylist()
    assert rows == [
        {"file_offset": 0, "time_ns": 10, "sector": 2048, "bytes": 4096, "action": "Q",
         "rwbs": "WS", "op": "write", "dev": (7 << 20) | 1, "pid": 123, "pdu": b""},
        {"file_offset": 48, "time_ns": 11, "sector": 2048, "bytes": 8192, "action": "X",
         "rwbs": "W", "op": "write", "dev": (7 << 20) | 1, "pid": 123, "pdu": split},
        {"file_offset": 104, "time_ns": 12, "sector": 4096, "bytes": 4096, "action": "D",
         "rwbs": "R", "op": "read", "dev": (7 << 20) | 1, "pid": 123, "pdu": b""},
        {"file_offset": 152, "time_ns": 13, "sector": 0, "bytes": 0, "action": "C",
         "rwbs": "FN", "op": "flush", "dev": (7 << 20) | 1, "pid": 123, "pdu": b""},
        {"file_offset": 208, "time_ns": 14, "sector": 8, "bytes": 512, "action": "D",
         "rwbs": "FWF", "op": "write", "dev": (7 << 20) | 1, "pid": 123, "pdu": b""},
        {"file_offset": 256, "time_ns": 15, "sector": 64, "bytes": 131072, "action": "Q",
         "rwbs": "RA", "op": "read", "dev": (7 << 20) | 1, "pid": 123, "pdu": b""},
    ]
    assert t.column("file").to_pylist() == [str(f)] * 6


def test_several_files_are_read_in_order(tmp_path):
    a, b = tmp_path / "d.blktrace.0", tmp_path / "d.blktrace.1"
    a.write_bytes(rec(1, TC_WRITE, 8, 4096, 5))
    b.write_bytes(rec(8, TC_WRITE, 8, 4096, 9) + rec(7, TC_WRITE, 16, 4096, 7))
    t = blktrace.read(a, b)
    assert t.column("action").to_pylist() == ["Q", "C", "D"]
    assert t.column("file").to_pylist() == [str(a), str(b), str(b)]
    assert t.column("file_offset").to_pylist() == [0, 0, 48]


@pytest.mark.parametrize("tail, problem", [
    (rec(1, TC_WRITE, 8, 4096, 3, magic=0xdeadbeef), "byte 96: bad magic 0xdeadbeef"),
    (rec(1, TC_WRITE, 8, 4096, 3, magic=blktrace.MAGIC | 6), "byte 96: blktrace version 6"),
    (rec(1, TC_WRITE, 8, 4096, 3)[:30], "byte 96: record cut short (30 of 48 header bytes)"),
    (rec(13, TC_WRITE, 8, 4096, 3, b"12345678")[:52], "byte 96: payload cut short (4 of 8 bytes)"),
    # whole, but from a CPU no kernel has: a damaged field (it failed
    # correlation with a cast error before)
    (rec(1, TC_WRITE, 8, 4096, 3, cpu=65537) + rec(7, TC_WRITE, 8, 4096, 4),
     "byte 96: cpu 65537 (no kernel numbers CPUs past 65535: a damaged record)"),
    (rec(1, TC_WRITE, 8, 4096, 1 << 63), f"byte 96: time {1 << 63} ns (past 2^63: a damaged record)"),
    (rec(1, TC_WRITE, (1 << 54) - 8, 4096, 3),
     f"byte 96: 4096 bytes at sector {(1 << 54) - 8} (past 2^54 sectors, 2^63 bytes: a damaged record)"),
])
def test_bad_input_names_file_and_offset_and_keeps_the_good_records(tmp_path, tail, problem):
    f = tmp_path / "bad.blktrace.0"
    f.write_bytes(rec(1, TC_WRITE, 8, 4096, 1) + rec(7, TC_WRITE, 8, 4096, 2) + tail)
    with pytest.raises(blktrace.BlktraceError) as e:
        blktrace.read(f)
    assert str(e.value).startswith(f"{f}: {problem}")
    assert e.value.good.column("time_ns").to_pylist() == [1, 2]


def test_imported_records_pair_into_requests_like_btt(tmp_path):
    """Q G I D C, Q G D C (no insert), and a requeue (D R I D C) at three
    sectors, with plug/unplug records between: block_requests gives the
    exact phases, and what is not a request event is counted, not stored."""
    import nestrace
    W, R = TC_WRITE | TC_SYNC, 0x1
    f = tmp_path / "vda.blktrace.0"
    f.write_bytes(
        rec(1, W, 2048, 4096, 100) + rec(4, W, 2048, 4096, 110) + rec(9, 0, 0, 0, 115)
        + rec(12, W, 2048, 4096, 120) + rec(10, 0, 0, 0, 125)
        + rec(7, W, 2048, 4096, 150) + rec(1, R, 4096, 8192, 200) + rec(4, R, 4096, 8192, 205)
        + rec(7, R, 4096, 8192, 210) + rec(8, R, 4096, 8192, 300) + rec(8, W, 2048, 4096, 400)
        + rec(1, R, 8192, 512, 500) + rec(4, R, 8192, 512, 505) + rec(12, R, 8192, 512, 510)
        + rec(7, R, 8192, 512, 520) + rec(6, R, 8192, 512, 530) + rec(12, R, 8192, 512, 540)
        + rec(7, R, 8192, 512, 550) + rec(8, R, 8192, 512, 700))
    r = blkimport.import_files([f], tmp_path / "s", {}, "imp", "m1")
    assert r["not_imported"] == {"P": 1, "U": 1} and r["block_events"] == 17
    s = nestrace.open(tmp_path / "s")
    got = s.rows("SELECT level, sector, bytes, op, rwbs, q_ns, g_ns, i_ns, d_ns, c_ns, q2g_ns, "
                 "g2i_ns, i2d_ns, d2c_ns, q2c_ns FROM block_requests ORDER BY d_ns")
    n = None
    assert [tuple(x.values()) for x in got] == [
        ("disk", 2048, 4096, "write", "WS", 100, 110, 120, 150, 400, 10, 10, 30, 250, 300),
        ("disk", 4096, 8192, "read", "R", 200, 205, n, 210, 300, 5, n, n, 90, 100),
        ("disk", 8192, 512, "read", "R", 500, 505, 510, 520, n, 5, 5, 10, n, n),
        ("disk", 8192, 512, "read", "R", n, n, 540, 550, 700, n, n, 10, 150, n),
    ]
    # the requeued request keeps its id through R, I and D; its bio id is the Q's
    ids = s.rows("SELECT action, rq_id, bio_id FROM block_events WHERE sector = 8192 ORDER BY ts_ns")
    assert len({r["rq_id"] for r in ids if r["action"] in (5, 6, 7, 10)}) == 1
    assert len({r["bio_id"] for r in ids if r["action"] in (1, 4, 5, 6)}) == 1
    assert s.rows("SELECT machine, records_total, lost_total FROM capture_meta") == [
        {"machine": "m1", "records_total": 17, "lost_total": 0}]
    from test_requests import assert_stored_as_computed
    assert assert_stored_as_computed(tmp_path / "s") == 4


def test_imported_split_pieces_and_the_remainder_have_the_q_of_the_bio_they_were_cut_from(tmp_path):
    """A 12 KiB write queued at 100 and cut twice (X: the piece, with the
    remainder's sector in its payload): three requests, each with Q 100.
    A bio queued earlier at the second piece's sector keeps its own Q."""
    import nestrace
    W = TC_WRITE
    x = lambda t, sec, nxt: rec(13, W, sec, 4096, t, struct.pack(">Q", nxt))
    f = tmp_path / "vda.blktrace.0"
    f.write_bytes(
        rec(1, W, 8, 4096, 10) + rec(4, W, 8, 4096, 11) + rec(7, W, 8, 4096, 12)
        + rec(8, W, 8, 4096, 20)
        + rec(1, W, 0, 12288, 100) + x(101, 0, 8) + rec(4, W, 0, 4096, 102)
        + rec(7, W, 0, 4096, 103) + x(104, 8, 16) + rec(4, W, 8, 4096, 105)
        + rec(7, W, 8, 4096, 106) + rec(4, W, 16, 4096, 107) + rec(7, W, 16, 4096, 108)
        + rec(8, W, 0, 4096, 200) + rec(8, W, 8, 4096, 201) + rec(8, W, 16, 4096, 202))
    blkimport.import_files([f], tmp_path / "s", {}, "imp")
    s = nestrace.open(tmp_path / "s")
    got = s.rows("SELECT sector, q_ns, g_ns, q2c_ns FROM block_requests ORDER BY d_ns")
    assert got == [{"sector": 8, "q_ns": 10, "g_ns": 11, "q2c_ns": 10},
                   {"sector": 0, "q_ns": 100, "g_ns": 102, "q2c_ns": 100},
                   {"sector": 8, "q_ns": 100, "g_ns": 105, "q2c_ns": 101},
                   {"sector": 16, "q_ns": 100, "g_ns": 107, "q2c_ns": 102}]
    # (the import stored them: the SQL pairs the events the same way)
    from test_requests import assert_stored_as_computed
    assert assert_stored_as_computed(tmp_path / "s") == 4


def test_links_of_an_import_are_a_row_a_request_as_the_block_join_classes_them(tmp_path):
    """An import has no extent maps and no file-system level: links gives
    each request one row, classed by op and flags (_links_bare_rows),
    without the block-by-block join, and the join (made to take the
    capture) gives the same rows.  Two devices, reads plain, readahead
    and metadata, writes plain, sync, FUA and journal-like, a discard,
    12 KiB across three blocks and 1 KiB inside one."""
    import nestrace
    R, W = 0x1, TC_WRITE
    cats = [R, R | TC_AHEAD, R | 0x1000, W, W | TC_SYNC, W | TC_FUA | TC_SYNC, W | 0x1000,
            W | 0x2000]
    body, t = b"", 100
    for i, c in enumerate(cats):
        for dev in ((7 << 20) | 1, (7 << 20) | 2):
            sec, n = 64 * i + 2, (12288 if i % 2 else 1024)
            for a in (1, 4, 7, 8):      # Q G D C
                body += rec(a, c, sec, n, t, dev=dev)
                t += 10
    f = tmp_path / "loop.blktrace.0"
    f.write_bytes(body)
    blkimport.import_files([f], tmp_path / "s", {(7 << 20) | 1: "vdisk"}, "imp")
    cols = "capture_id, upper_level, lower_level, lower_id, upper_id, kind, bytes, lag_ns"
    s = nestrace.open(tmp_path / "s")
    assert s.rows("SELECT * FROM _links_bare") == [{"capture_id": "imp"}]
    bare = s.rows(f"SELECT {cols} FROM links ORDER BY ALL")
    assert len(bare) == 2 * len(cats)
    assert {r["kind"] for r in bare} >= {"other", "readahead", "metadata", "writeback",
                                         "journal", "discard"}, bare
    s = nestrace.open(tmp_path / "s")
    s.con.execute("CREATE OR REPLACE VIEW _links_bare AS SELECT NULL::VARCHAR AS capture_id "
                  "WHERE false")
    assert s.rows(f"SELECT {cols} FROM links ORDER BY ALL") == bare


def test_import_skips_a_record_from_an_impossible_cpu_names_it_and_keeps_the_rest(tmp_path):
    """A fuzzed file (one byte of a cpu field changed) imported, then
    correlated: the record was kept and every query over requests failed
    on a cast.  It is named by file and offset and left out, and the
    records around it pair as before."""
    import nestrace
    W = TC_WRITE
    f = tmp_path / "vda.blktrace.0"
    f.write_bytes(rec(1, W, 8, 4096, 10) + rec(7, W, 8, 4096, 12) + rec(8, W, 8, 4096, 20)
                  + rec(1, W, 64, 4096, 30, cpu=(1 << 16) | 1) + rec(1, W, 16, 4096, 40)
                  + rec(7, W, 16, 4096, 41) + rec(8, W, 16, 4096, 50))
    r = blkimport.import_files([f], tmp_path / "s", {}, "imp")
    assert r["problems"] == [f"{f}: byte 144: cpu 65537 (no kernel numbers CPUs past 65535: "
                             "a damaged record)"]
    assert r["block_events"] == 6
    s = nestrace.open(tmp_path / "s")
    assert s.rows("SELECT sector, q2c_ns FROM block_requests ORDER BY d_ns") == [
        {"sector": 8, "q2c_ns": 10}, {"sector": 16, "q2c_ns": 10}]
    assert s.links().num_rows == 2      # one (unattributed) row per request: it runs


def test_import_counts_records_missing_by_sequence_number(tmp_path):
    """relay blktrace numbers each CPU's records from 1: a gap is a loss."""
    def numbered(n, *a):
        b = bytearray(rec(*a))
        struct.pack_into("=I", b, 4, n)
        return bytes(b)
    f = tmp_path / "vda.blktrace.1"
    f.write_bytes(numbered(1, 1, TC_WRITE, 8, 4096, 1) + numbered(2, 7, TC_WRITE, 8, 4096, 2)
                  + numbered(5, 8, TC_WRITE, 8, 4096, 3))
    r = blkimport.import_files([f], tmp_path / "s", {}, "imp")
    assert r["lost"] == 2 and r["sequence_numbers"]


def test_import_counts_the_events_ftraces_notes_say_its_buffer_lost(tmp_path):
    """A saved trace_pipe of the ftrace blk tracer holds, where its buffer
    overwrote events before they were read, a note ("CPU:1 [LOST 1234
    EVENTS]", or with no count).  Not damage: every record around it is
    imported, the events counted lost per CPU (lost_events, lost_total),
    and said once."""
    import nestrace
    W = TC_WRITE
    f = tmp_path / "pipe.bin"
    f.write_bytes(rec(1, W, 8, 4096, 10, cpu=0) + rec(7, W, 8, 4096, 12, cpu=0)
                  + b"CPU:1 [LOST 1234 EVENTS]\n" + rec(8, W, 8, 4096, 20, cpu=1)
                  + b"CPU:0 [LOST EVENTS]\n" + rec(1, W, 16, 4096, 30, cpu=0)
                  + b"CPU:1 [LOST 6 EVENTS]\n" + rec(7, W, 16, 4096, 31, cpu=1)
                  + rec(8, W, 16, 4096, 40, cpu=1))
    r = blkimport.import_files([f], tmp_path / "s", {}, "imp")
    assert r["problems"] == [f"{f}: ftrace's buffer lost 1241 events before they were read from "
                             "trace_pipe (CPU 0: 1, CPU 1: 1240; its notes say so): counted as lost"]
    assert (r["block_events"], r["lost"], r["sequence_numbers"]) == (6, 1241, False)
    assert r["damage"].places == 0
    s = nestrace.open(tmp_path / "s")
    assert s.rows("SELECT cpu, emitted, received, ringbuf_drops FROM lost_events ORDER BY cpu") == [
        {"cpu": 0, "emitted": 4, "received": 3, "ringbuf_drops": 1},
        {"cpu": 1, "emitted": 1243, "received": 3, "ringbuf_drops": 1240}]
    assert s.rows("SELECT lost_total FROM capture_meta") == [{"lost_total": 1241}]
    assert s.rows("SELECT sector, q2c_ns FROM block_requests ORDER BY d_ns") == [
        {"sector": 8, "q2c_ns": 10}, {"sector": 16, "q2c_ns": 10}]
    # the strict reader stops at such a note, the file's records kept
    with pytest.raises(blktrace.BlktraceError, match="ftrace's buffer lost 1241 events") as e:
        blktrace.read(f)
    assert e.value.good.num_rows == 6


def test_import_of_a_file_that_is_not_blktrace_names_it(tmp_path):
    from nestrace.store.files import StoreError
    f = tmp_path / "notes.txt"
    f.write_text("not a trace at all, just some words" * 3)
    with pytest.raises(StoreError, match=f"{f}: byte 0: bad magic"):
        blkimport.import_files([f], tmp_path / "s", {}, "imp")


def test_import_refuses_a_vdisk_the_files_do_not_have(tmp_path):
    from nestrace.store.files import StoreError
    f = tmp_path / "vda.blktrace.0"
    f.write_bytes(rec(1, TC_WRITE, 8, 4096, 1))
    with pytest.raises(StoreError, match=r"^7:5: no request events of this device in .* \(it has 7:1\)"):
        blkimport.import_files([f], tmp_path / "s", {(7 << 20) | 5: "vdisk"}, "imp")
    assert not (tmp_path / "s").exists()


def _numbered_requests(n: int, cpu: int = 1) -> list[bytes]:
    """n write requests (Q D C at their own sector) numbered 1.. on one
    CPU, as relay blktrace writes them."""
    out = []
    for i in range(n):
        for k, (action, t) in enumerate(((1, 0), (7, 2), (8, 5))):
            b = bytearray(rec(action, TC_WRITE, 8 * (i + 1), 4096, 100 * i + t, cpu=cpu))
            struct.pack_into("=I", b, 4, 3 * i + k + 1)
            out.append(bytes(b))
    return out


def _lost(store) -> int:
    import nestrace
    return nestrace.open(store).rows("SELECT lost_total FROM capture_meta")[0]["lost_total"]


def test_a_duplicated_record_is_left_out_and_said_and_loses_nothing(tmp_path):
    recs = _numbered_requests(10)
    f = tmp_path / "vda.blktrace.1"
    f.write_bytes(b"".join(recs[:7] + [recs[6]] + recs[7:]))
    r = blkimport.import_files([f], tmp_path / "s", {}, "imp")
    assert r["block_events"] == 30 and r["lost"] == 0 and r["duplicates"] == 1
    assert r["problems"] == [f"{f}: 1 record(s) a second time (the same device, CPU and "
                             "sequence number): left out"]


def test_one_damaged_sequence_number_or_device_is_damage_not_loss(tmp_path):
    recs = _numbered_requests(10)
    seq = bytearray(recs[10])
    struct.pack_into("=I", seq, 4, 0xFFFFFF00)
    dev = bytearray(recs[20])
    struct.pack_into("=I", dev, 36, (9 << 20) | 9)
    f = tmp_path / "vda.blktrace.1"
    f.write_bytes(b"".join(recs[:10] + [bytes(seq)] + recs[11:20] + [bytes(dev)] + recs[21:]))
    r = blkimport.import_files([f], tmp_path / "s", {}, "imp")
    # (the record of the damaged device is left out: its number missing,
    # one record lost; the one of the damaged number is kept, none lost)
    assert r["lost"] == 1 and r["devices"] == {"7:1": "disk"} and r["block_events"] == 29, r
    assert r["problems"] == [f"{f}: byte {20 * 48}: device 9:9 between two records of 7:1 on "
                             "CPU 1: a damaged record"]
    assert _lost(tmp_path / "s") == 1


def test_a_damaged_payload_length_swallows_no_record_and_is_counted(tmp_path):
    """Without sequence numbers (the ftrace blk tracer's) a damaged record
    is the only trace of a loss: counted in lost_total.  A length past any
    kernel's, and one within bounds that would swallow the next records,
    are both damage; the records after them are kept."""
    plain = [bytes(b[:4]) + b"\0\0\0\0" + bytes(b[8:]) for b in _numbered_requests(10)]
    for bad_len, at in ((5000, 4), (96, 4)):
        recs = list(plain)
        b = bytearray(recs[at])
        struct.pack_into("=H", b, 46, bad_len)
        recs[at] = bytes(b)
        f = tmp_path / f"vda{bad_len}.blktrace.0"
        f.write_bytes(b"".join(recs))
        r = blkimport.import_files([f], tmp_path / f"s{bad_len}", {}, "imp")
        assert r["block_events"] == 29, (bad_len, r)
        assert len(r["problems"]) == 1 and r["problems"][0].startswith(
            f"{f}: byte {at * 48}: a payload of {bad_len} bytes"), r["problems"]
        assert r["lost"] >= 1 and _lost(tmp_path / f"s{bad_len}") == r["lost"]


REGRESS = Path(__file__).resolve().parents[1] / "data" / "regress"


@pytest.mark.parametrize("name", ["pdu-len-1", "pdu-len-96", "pdu-len-5000", "seq-damaged",
                                  "dev-damaged"])
def test_regression_inputs_keep_every_intact_record(name, tmp_path):
    """Damage the fuzzer found or the issue named, kept as files (of
    numbered.blktrace.base, 60 requests numbered per CPU): every record
    whose bytes are intact is read, the damage named, and no count is
    impossible."""
    base, bad = (REGRESS / "numbered.blktrace.base").read_bytes(), REGRESS / f"{name}.blktrace"
    data = bad.read_bytes()
    t, problems, damage = blktrace.read_damaged(bad)
    got = set(t.column("file_offset").to_pylist())
    intact = {o for o in range(0, len(base), 48) if data[o:o + 48] == base[o:o + 48]}
    assert intact <= got and len(intact) >= 178, (name, sorted(intact - got))
    r = blkimport.import_files([bad], tmp_path / "s", {}, "r")
    assert 0 <= r["lost"] <= 2 and r["devices"] == {"7:1": "disk"}, (name, r)
    assert all(p.startswith(f"{bad}: byte ") for p in r["problems"]), r["problems"]


def test_regression_a_duplicated_record(tmp_path):
    r = blkimport.import_files([REGRESS / "duplicate.blktrace"], tmp_path / "s", {}, "r")
    assert r["duplicates"] == 1 and r["lost"] == 0 and r["block_events"] == 180, r


def test_a_trace_pipe_split_by_cpu_as_blktrace_writes_it(tmp_path):
    """The ftrace blk tracer's one stream, a file per CPU (and one for
    every CPU up to the last, empty or not, as blkparse wants them); each
    file holds its CPU's records, whole and in order.  What is not a
    record (the note ftrace writes where its buffer lost events, a record
    cut short at the end) is left out and named; every whole record is
    kept."""
    import os
    recs = [rec(1, TC_WRITE, 8 * i, 4096, 10 + i, cpu=c)
            for i, c in enumerate([0, 2, 0, 2, 2])] + [rec(13, TC_WRITE, 80, 8192, 20, b"\0" * 8, cpu=0)]
    pipe = tmp_path / "pipe"
    pipe.write_bytes(b"".join(recs))
    files, n, problems = blktrace.split_by_cpu(pipe, tmp_path / "loop0")
    assert (n, problems) == (6, [])
    assert [f.name for f in files] == [f"loop0.blktrace.{c}"
                                       for c in range(max(3, os.cpu_count()))]
    assert files[0].read_bytes() == recs[0] + recs[2] + recs[5]
    assert files[1].read_bytes() == b""
    assert files[2].read_bytes() == recs[1] + recs[3] + recs[4]
    assert blktrace.read(*files).num_rows == 6
    # ftrace's note of lost events between records, and the reader
    # stopped mid-record
    lost = b"CPU:1 [LOST 1234 EVENTS]\n"
    pipe.write_bytes(b"".join(recs[:3]) + lost + b"".join(recs[3:]) + recs[1][:20])
    files, n, problems = blktrace.split_by_cpu(pipe, tmp_path / "cut")
    assert n == 6 and len(problems) == 2, problems
    at = len(b"".join(recs)) + len(lost)
    assert problems[0].startswith(f"{pipe}: byte {at}: record cut short (20 of 48")
    assert problems[1] == (f"{pipe}: ftrace's buffer lost 1234 events before they were read "
                           "from trace_pipe (CPU 1: 1234; its notes say so): counted as lost")
    assert files[0].read_bytes() == recs[0] + recs[2] + recs[5]
    assert files[2].read_bytes() == recs[1] + recs[3] + recs[4]
