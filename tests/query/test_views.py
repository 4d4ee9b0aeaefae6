"""Diff tests for the public views: hand-built rows, one query, exact rows."""
from __future__ import annotations

import duckdb
import pytest
from rows import DISK, blk, capture_meta, device_map, hostfs, vfs

from nestrace.query import sqlmod
from nestrace.query.session import Session


def session(**tables) -> Session:
    base = {"capture_meta": capture_meta(), "device_map": device_map()}
    return Session.from_tables(base | tables)


def test_every_public_view_column_is_documented():
    s = session()
    assert sqlmod.check_docs(s.con, s.modules) == []


def test_undocumented_column_is_caught(tmp_path, monkeypatch):
    d = tmp_path / "sql" / "foo"
    d.mkdir(parents=True)
    (d / "bar.sql").write_text("-- A view.\n-- @column a INTEGER the a\n"
                               "CREATE VIEW foo_bar AS SELECT 1 AS a, 2 AS b;\n")
    mods = sqlmod.discover(tmp_path / "sql")
    s = session()
    s.con.execute(mods["foo.bar"].text)
    assert sqlmod.check_docs(s.con, mods) == ["foo.bar: view foo_bar: column b is not documented"]


def test_module_with_side_effects_is_refused(tmp_path):
    d = tmp_path / "sql" / "foo"
    d.mkdir(parents=True)
    (d / "bar.sql").write_text("DROP TABLE x;\n")
    with pytest.raises(sqlmod.ModuleError, match="bar.sql:1: modules only create"):
        sqlmod.discover(tmp_path / "sql")


def test_a_macro_is_copied_under_the_names_a_module_asks_for():
    # DuckDB will not expand a table macro inside its own expansion: a use
    # whose argument is a view made with another use needs another name
    sql = ("-- COPIES _m: _m_2\nCREATE OR REPLACE MACRO _m(t) AS TABLE SELECT * FROM query_table(t);\n"
           "CREATE VIEW v1 AS SELECT 1 AS x;\nCREATE VIEW v2 AS SELECT * FROM _m('v1');\n"
           "CREATE VIEW v3 AS SELECT * FROM _m_2('v2');\n")
    s = session()
    s.con.execute(sqlmod.deferred(sql))
    assert s.rows("SELECT * FROM v3") == [{"x": 1}]
    with pytest.raises(Exception, match="recursi"):
        s.con.execute("CREATE OR REPLACE VIEW v3 AS SELECT * FROM _m('v2')")
    with pytest.raises(sqlmod.ModuleError, match="COPIES _n: no CREATE OR REPLACE MACRO _n"):
        sqlmod.deferred("-- COPIES _n: _n_2\nSELECT 1;\n")


def test_late_modules_load_last_and_nothing_includes_them(tmp_path):
    d = tmp_path / "sql" / "a"
    d.mkdir(parents=True)
    (d / "late.sql").write_text("-- INCLUDE a.z\n-- LATE\nCREATE VIEW a_late AS SELECT 1 AS x;\n")
    (d / "m.sql").write_text("CREATE VIEW a_m AS SELECT 1 AS x;\n")
    (d / "z.sql").write_text("CREATE VIEW a_z AS SELECT 1 AS x;\n")
    mods = sqlmod.discover(tmp_path / "sql")
    assert [m.name for m in sqlmod.load_order(mods)] == ["a.z", "a.m", "a.late"]
    (d / "m.sql").write_text("-- INCLUDE a.late\nCREATE VIEW a_m AS SELECT 1 AS x;\n")
    with pytest.raises(sqlmod.ModuleError, match="module a.m includes a.late, which loads late"):
        sqlmod.load_order(sqlmod.discover(tmp_path / "sql"))
    # the shipped follow_io is one: a session over a correlated store binds
    # it against the stored links (tests/test_phenomena.py opens one)
    assert [m.name for m in sqlmod.load_order(sqlmod.discover()) if m.late] == [
        "follow.io", "rate.timeline", "seek.cdf"]
    # created on first use (binding it on a store not yet correlated plans
    # links from the raw tables): not for a query that does not name it
    macros = ("SELECT function_name AS f FROM duckdb_functions() WHERE function_name IN "
              "('follow' || '_io', 'seek' || '_cdf', 'seek' || '_cdf_points') ORDER BY 1")
    s = Session(None)
    assert s.rows(macros) == []
    assert s.rows("SELECT count(*) AS n FROM seek_cdf('disk')") == [{"n": 0}]
    assert s.rows(macros) == [{"f": "seek_cdf"}, {"f": "seek_cdf_points"}]   # its module only
    assert s.rows("SELECT count(*) AS n FROM follow_io('c', 'vfs', 1)") == [{"n": 1}]
    assert s.rows(macros) == [{"f": "follow_io"}, {"f": "seek_cdf"}, {"f": "seek_cdf_points"}]
    s = Session(None, late_modules=False)     # correlate's and report's: never
    with pytest.raises(duckdb.CatalogException, match="follow_io"):
        s.rows("SELECT * FROM follow_io('c', 'vfs', 1)")


def test_block_request_phases_from_q_g_i_d_c():
    ev = [blk("Q", 100, bio=1, sector=64), blk("G", 110, bio=1, sector=64),
          blk("I", 130, rq=9, bio=1, sector=64), blk("D", 160, rq=9, bio=1, sector=64),
          blk("C", 1160, rq=9, bio=1, sector=64)]
    s = session(block_events=ev)
    got = s.rows("SELECT level, q2g_ns, g2i_ns, i2d_ns, d2c_ns, q2c_ns, sector, offset_bytes, "
                 "bytes, op, rwbs FROM disk_io")
    assert got == [{"level": "disk", "q2g_ns": 10, "g2i_ns": 20, "i2d_ns": 30, "d2c_ns": 1000,
                    "q2c_ns": 1060, "sector": 64, "offset_bytes": 32768, "bytes": 4096,
                    "op": "read", "rwbs": "R"}]


def test_request_without_insert_has_null_insert_phases_and_stale_insert_is_ignored():
    ev = [blk("I", 10, rq=9, bio=5),              # an earlier life of request address 9
          blk("D", 20, rq=9, bio=5), blk("C", 30, rq=9, bio=5),
          blk("Q", 100, bio=1), blk("G", 105, bio=1),
          blk("D", 120, rq=9, bio=1, op=1, flags=1 | 8), blk("C", 220, rq=9, bio=1, op=1)]
    s = session(block_events=ev)
    got = s.rows("SELECT d_ns, i_ns, g2i_ns, i2d_ns, d2c_ns, q2c_ns, op, rwbs FROM disk_io "
                 "ORDER BY d_ns")
    assert got[1] == {"d_ns": 120, "i_ns": None, "g2i_ns": None, "i2d_ns": None,
                      "d2c_ns": 100, "q2c_ns": 120, "op": "write", "rwbs": "WFS"}


def test_requeued_request_completes_once_and_a_lost_completion_is_not_borrowed():
    ev = [blk("Q", 100, bio=1), blk("G", 105, bio=1), blk("I", 110, rq=9, bio=1),
          blk("D", 120, rq=9, bio=1),
          blk("R", 130, rq=9, bio=1), blk("I", 140, rq=9, bio=1),   # requeued, dispatched again
          blk("D", 150, rq=9, bio=1), blk("C", 250, rq=9, bio=1),
          # the same address later: dispatched, its completion never seen, used again
          blk("Q", 300, bio=2), blk("G", 305, bio=2), blk("D", 310, rq=9, bio=2),
          blk("Q", 400, bio=3), blk("G", 405, bio=3), blk("D", 410, rq=9, bio=3),
          blk("C", 500, rq=9, bio=3)]
    s = session(block_events=ev)
    got = s.rows("SELECT d_ns, q_ns, g_ns, i_ns, c_ns FROM disk_io ORDER BY d_ns")
    assert got == [
        {"d_ns": 120, "q_ns": 100, "g_ns": 105, "i_ns": 110, "c_ns": None},
        {"d_ns": 150, "q_ns": None, "g_ns": None, "i_ns": 140, "c_ns": 250},
        {"d_ns": 310, "q_ns": 300, "g_ns": 305, "i_ns": None, "c_ns": None},
        {"d_ns": 410, "q_ns": 400, "g_ns": 405, "i_ns": None, "c_ns": 500}]


def test_vdisk_and_disk_views_split_by_device_level():
    dm = device_map()
    dm[1]["dev"] = (7 << 20) | 5      # a distinct virtual disk
    ev = [blk("D", 1, dev=(7 << 20) | 5, rq=1), blk("C", 2, dev=(7 << 20) | 5, rq=1),
          blk("D", 3, dev=DISK, rq=2), blk("C", 4, dev=DISK, rq=2),
          blk("D", 5, dev=(9 << 20), rq=3)]  # untraced device: in no view
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm, "block_events": ev})
    assert s.rows("SELECT d_ns FROM vdisk_io") == [{"d_ns": 1}]
    assert s.rows("SELECT d_ns FROM disk_io") == [{"d_ns": 3}]


def test_vfs_io_names_syscalls_and_ops():
    ev = [vfs(100, 50, off=4096, syscall=3), vfs(200, 10, off=0, syscall=4, ret=-5, f_flags=0o40000),
          vfs(300, 7, off=-1, req=0, ret=0, syscall=11)]
    s = session(vfs_events=ev)
    got = s.rows("SELECT ts_ns, end_ns, syscall, op, offset_bytes, ret_bytes, bytes, direct, machine "
                 "FROM vfs_io ORDER BY ts_ns")
    assert got == [
        {"ts_ns": 100, "end_ns": 150, "syscall": "pread64", "op": "read", "offset_bytes": 4096,
         "ret_bytes": 4096, "bytes": 4096, "direct": False, "machine": "m1"},
        {"ts_ns": 200, "end_ns": 210, "syscall": "pwrite64", "op": "write", "offset_bytes": 0,
         "ret_bytes": 0, "bytes": 0, "direct": True, "machine": "m1"},
        {"ts_ns": 300, "end_ns": 307, "syscall": "fsync", "op": "sync", "offset_bytes": -1,
         "ret_bytes": 0, "bytes": 0, "direct": False, "machine": "m1"}]


def test_vfs_io_names_every_syscall_code_the_code_table_declares():
    """schemas/ declares the codes the BPF programs write (enum
    vfs_syscall): vfs_io, or vfs_hints for the hints, must name each by
    its call, and vfs_io give each the op of its table row (the two sides
    of a copy: read and write)."""
    from nestrace.schema import ENUMS
    table = ENUMS["vfs_syscall"]
    assert table["columns"] == ("call", "op")
    declared = {code: (call, op) for code, _, call, op in table["values"]}
    assert sorted(declared) == list(range(1, len(declared) + 1)), declared
    assert declared[33] == ("splice", "read") and declared[34] == ("splice", "write")
    ev = [vfs(100 * c, 1, off=0, ret=0, syscall=c) for c in declared]
    s = session(vfs_events=ev)
    got = {r["ts_ns"] // 100: r for r in s.rows("SELECT ts_ns, syscall, op FROM vfs_io")}
    hints = {r["ts_ns"] // 100: r["syscall"] for r in s.rows("SELECT ts_ns, syscall FROM vfs_hints")}
    assert {c: r["syscall"] for c, r in got.items()} | hints == {c: v[0] for c, v in declared.items()}
    assert sorted(hints) == [c for c, v in declared.items() if v[1] == "hint"] == [35, 36, 40, 41, 43]
    for c, (call, op) in declared.items():
        if op in ("read", "write", "sync"):
            assert got[c]["op"] == op, (c, call, got[c])



def test_msync_is_op_sync_with_ms_sync_and_counts_as_a_flush():
    """msync's flags in iov_count: MS_SYNC (4) fsyncs the range; MS_ASYNC
    (1) does nothing on Linux: op other, no flush."""
    ev = [vfs(100, 7, off=8192, req=4096, ret=0, syscall=37) | {"iov_count": 4, "fd": -1},
          vfs(200, 3, off=0, req=65536, ret=0, syscall=37) | {"iov_count": 1 | 2, "fd": -1}]
    s = session(vfs_events=ev)
    assert s.rows("SELECT syscall, op, offset_bytes, req_bytes, fd FROM vfs_io ORDER BY ts_ns") == [
        {"syscall": "msync", "op": "sync", "offset_bytes": 8192, "req_bytes": 4096, "fd": -1},
        {"syscall": "msync", "op": "other", "offset_bytes": 0, "req_bytes": 65536, "fd": -1}]
    assert s.rows("SELECT flushes FROM sync_transform WHERE level = 'vfs'") == [{"flushes": 1}]


def test_vfs_hints_are_fadvise_and_readahead_calls_and_not_io():
    """fadvise64's advice by name (POSIX_FADV_* 0..5), readahead with its
    range; neither is a row of vfs_io."""
    ev = [vfs(10 * a, 1, off=0, req=0, ret=0, syscall=35) | {"iov_count": a} for a in range(6)]
    ev += [vfs(100, 1, off=4096, req=65536, ret=0, syscall=36), vfs(200, 5, syscall=3)]
    s = session(vfs_events=ev)
    got = s.rows("SELECT ts_ns, end_ns, syscall, advice, offset_bytes, req_bytes, ret "
                 "FROM vfs_hints ORDER BY ts_ns")
    assert [(r["syscall"], r["advice"]) for r in got] == [
        ("fadvise64", a) for a in ("normal", "random", "sequential", "willneed", "dontneed",
                                   "noreuse")] + [("readahead", None)]
    assert got[-1] == {"ts_ns": 100, "end_ns": 101, "syscall": "readahead", "advice": None,
                       "offset_bytes": 4096, "req_bytes": 65536, "ret": 0}, got
    assert s.rows("SELECT ts_ns, syscall FROM vfs_io") == [{"ts_ns": 200, "syscall": "pread64"}]
    # which read their range in (willneed, readahead), and which run to the file's end
    flags = s.rows("SELECT reads, to_end FROM vfs_hints ORDER BY ts_ns")
    assert flags == [{"reads": a == 3, "to_end": True} for a in range(6)] + [
        {"reads": True, "to_end": False}], flags


def test_madvise_of_a_mapped_file_is_a_hint_with_its_advice_by_name():
    """MADV_* codes: 3 willneed, 9 remove, 22 populate_read; 100
    (hwpoison) has no name here: its number."""
    ev = [vfs(10 * a, 1, off=4096, req=8192, ret=0, syscall=40) | {"iov_count": a, "fd": -1}
          for a in (3, 9, 22, 100)]
    s = session(vfs_events=ev)
    got = s.rows("SELECT syscall, advice, offset_bytes, req_bytes, fd FROM vfs_hints ORDER BY ts_ns")
    assert got == [{"syscall": "madvise", "advice": a, "offset_bytes": 4096, "req_bytes": 8192,
                    "fd": -1} for a in ("willneed", "remove", "populate_read", "100")], got
    assert s.rows("SELECT count(*) AS n FROM vfs_io") == [{"n": 0}]


@pytest.mark.parametrize("host_fs,expected", [
    ("xfs", ["xfs_file_direct_read"]),
    ("ext4", ["iomap_dio_rw_begin", "mm_filemap_get_pages"]),
])
def test_hostfs_io_uses_exact_xfs_events_and_generic_ones_elsewhere(host_fs, expected):
    ev = [hostfs(10, 0, 4096, source=3, flags=1), hostfs(11, 0, 4096, source=5, flags=1),
          hostfs(20, 8192, 8192, source=6)]
    s = Session.from_tables({"capture_meta": capture_meta(),
                             "device_map": device_map(host_fs=host_fs), "hostfs_events": ev})
    got = [r["source"] for r in s.rows("SELECT source FROM hostfs_io ORDER BY ts_ns")]
    assert got == expected


@pytest.mark.parametrize("host_fs", ["xfs", "ext2", "ext3", "ext4", "btrfs", "f2fs"])
def test_hostfs_io_keeps_exactly_the_access_hooks_record_attaches(host_fs):
    """One table (schemas/, enum hostfs_source) decides both what `record`
    leaves unattached and which rows hostfs_io keeps: an event of every
    source, and the view must keep those of the attached hooks only."""
    from nestrace.capture.agent import unused_hooks
    from nestrace.schema import ENUMS
    values = ENUMS["hostfs_source"]["values"]
    ev = [hostfs(10 * v, 4096 * v, 4096, source=v) for v, _, _ in values]
    s = Session.from_tables({"capture_meta": capture_meta(),
                             "device_map": device_map(host_fs=host_fs), "hostfs_events": ev})
    kept = {r["source"] for r in s.rows("SELECT source FROM hostfs_io")}
    skipped = set(unused_hooks(host_fs))
    assert kept == {hook for _, hook, _ in values} - skipped
    assert kept and skipped


def test_session_query_returns_arrow_and_metric_methods_too():
    import pyarrow as pa
    ev = [vfs(100, 50, off=4096, syscall=3)]
    s = session(vfs_events=ev)
    t = s.query("SELECT ts_ns, op FROM vfs_io")
    assert isinstance(t, pa.Table) and t.to_pylist() == [{"ts_ns": 100, "op": "read"}]
    amp = s.amplification()
    assert isinstance(amp, pa.Table) and amp.num_rows == 8
    assert s.df("SELECT count(*) AS n FROM vfs_io")["n"][0] == 1


def test_flush_request_without_a_position_has_no_offset():
    ev = [blk("D", 1, rq=1, sector=2**64 - 1, nr=0, op=2, flags=16),
          blk("C", 2, rq=1, sector=2**64 - 1, nr=0, op=2)]
    s = session(block_events=ev)
    assert s.rows("SELECT op, offset_bytes, bytes, rwbs FROM disk_io") == [
        {"op": "flush", "offset_bytes": None, "bytes": 0, "rwbs": "FF"}]
    assert s.rows("SELECT count(*) AS n FROM seek_distances") == [{"n": 0}]


def test_hostfs_io_leaves_out_an_xfs_direct_write_tried_again_under_the_exclusive_lock():
    """xfs tries an unaligned direct write under the shared iolock first
    (iocb_flags without 32) and, where it needs allocation, again under
    the exclusive lock (32): one write, two events.  An aligned write, a
    shared-lock write that was not tried again, and a rewrite of the same
    range much later are each kept."""
    W, D, X = 4, 1, 1 | 32        # source xfs_file_direct_write; direct; direct + exclusive
    ev = [hostfs(100, 1024, 4096, source=W, op=1, flags=D),      # failed try...
          hostfs(105, 1024, 4096, source=W, op=1, flags=X),      # ...and the write
          hostfs(200, 8192, 4096, source=W, op=1, flags=D),      # aligned: one try
          hostfs(300, 9216, 1024, source=W, op=1, flags=D),      # overwrite, done at once
          hostfs(400, 20480, 1024, source=W, op=1, flags=D),     # failed try...
          hostfs(410, 20480, 1024, source=W, op=1, flags=X),     # ...the write
          hostfs(50_000_000, 20480, 1024, source=W, op=1, flags=X),   # written again, later
          hostfs(60_000_000, 9216, 1024, source=W, op=1, flags=D),
          hostfs(80_000_000, 9216, 1024, source=W, op=1, flags=X)]    # 20 ms on: not a retry
    s = session(hostfs_events=ev)
    got = s.rows("SELECT ts_ns, offset_bytes, bytes FROM hostfs_io ORDER BY ts_ns")
    assert [r["ts_ns"] for r in got] == [105, 200, 300, 410, 50_000_000, 60_000_000, 80_000_000]


def test_hostfs_io_makes_one_row_of_a_buffered_read_asked_for_in_batches():
    """filemap_read asks for 31 pages at a time, and each ask's event
    carries what is left of the read: a read of 64 pages at page 2 is
    three asks, all ending at page 66.  Another task's ask, and the same
    task's next reads, which end elsewhere, are reads of their own."""
    G, P = 6, 4096                 # source mm_filemap_get_pages; a page
    other = hostfs(25, 40 * P, 8 * P, source=G) | {"pid": 2}
    ev = [hostfs(10, 2 * P, 64 * P, source=G), hostfs(20, 33 * P, 33 * P, source=G), other,
          hostfs(30, 64 * P, 2 * P, source=G),
          hostfs(40, 66 * P, 8 * P, source=G), hostfs(50, 70 * P, 8 * P, source=G)]
    s = session(device_map=device_map(host_fs="ext4"), hostfs_events=ev)
    got = s.rows("SELECT ts_ns, offset_bytes, bytes, pid FROM hostfs_io ORDER BY ts_ns")
    assert got == [{"ts_ns": 10, "offset_bytes": 2 * P, "bytes": 64 * P, "pid": 1},
                   {"ts_ns": 25, "offset_bytes": 40 * P, "bytes": 8 * P, "pid": 2},
                   {"ts_ns": 40, "offset_bytes": 66 * P, "bytes": 8 * P, "pid": 1},
                   {"ts_ns": 50, "offset_bytes": 70 * P, "bytes": 8 * P, "pid": 1}]


@pytest.mark.parametrize("source", [7, 8])   # ext4_write_begin, ext4_da_write_begin
def test_hostfs_io_makes_one_row_of_a_buffered_write_begun_folio_by_folio(source):
    """With large folios each write_begin event carries what is left of the
    write: a 64 KiB write that lands in a 32 KiB and two 16 KiB folios is
    three events ending at the same place.  The events of a write of 4 KiB
    folios (one page each, end to end) and the task's read over the same
    range are rows of their own; after the read, the next write's folios
    make one row again."""
    K = 1024
    ev = [hostfs(10, 0, 64 * K, source=source, op=1), hostfs(11, 32 * K, 32 * K, source=source, op=1),
          hostfs(12, 48 * K, 16 * K, source=source, op=1),
          hostfs(20, 64 * K, 4 * K, source=source, op=1), hostfs(21, 68 * K, 4 * K, source=source, op=1),
          hostfs(30, 0, 72 * K, source=6),
          hostfs(40, 8 * K, 64 * K, source=source, op=1), hostfs(50, 16 * K, 56 * K, source=source, op=1)]
    s = session(device_map=device_map(host_fs="ext4"), hostfs_events=ev)
    got = s.rows("SELECT ts_ns, offset_bytes, bytes, op FROM hostfs_io ORDER BY ts_ns")
    assert got == [{"ts_ns": 10, "offset_bytes": 0, "bytes": 64 * K, "op": "write"},
                   {"ts_ns": 20, "offset_bytes": 64 * K, "bytes": 4 * K, "op": "write"},
                   {"ts_ns": 21, "offset_bytes": 68 * K, "bytes": 4 * K, "op": "write"},
                   {"ts_ns": 30, "offset_bytes": 0, "bytes": 72 * K, "op": "read"},
                   {"ts_ns": 40, "offset_bytes": 8 * K, "bytes": 64 * K, "op": "write"}]


def test_hostfs_io_makes_one_discard_row_of_an_xfs_hole_punched_in_several_transactions():
    """xfs unmaps a punched range a few extents per transaction and traces
    the whole range each time (xfs_bunmap, 9): the same task's same range
    again within 10 ms is the same hole.  Another range, the same range
    from another task or much later, and ext4's punch_hole (10) are rows
    of their own."""
    M = 1 << 20
    ev = [hostfs(1_000, 8 * M, 120 * M, source=9, op=3), hostfs(1_030, 8 * M, 120 * M, source=9, op=3),
          hostfs(1_060, 8 * M, 120 * M, source=9, op=3), hostfs(2_000, 128 * M, 64 * M, source=9, op=3),
          hostfs(50_000_000, 128 * M, 64 * M, source=9, op=3)]
    other = hostfs(1_050, 8 * M, 120 * M, source=9, op=3)
    other["pid"] = 2
    s = session(device_map=device_map(host_fs="xfs"), hostfs_events=ev + [other])
    got = s.rows("SELECT ts_ns, offset_bytes, bytes, op, source, pid FROM hostfs_io ORDER BY ts_ns")
    assert got == [
        {"ts_ns": 1_000, "offset_bytes": 8 * M, "bytes": 120 * M, "op": "discard", "source": "xfs_bunmap", "pid": 1},
        {"ts_ns": 1_050, "offset_bytes": 8 * M, "bytes": 120 * M, "op": "discard", "source": "xfs_bunmap", "pid": 2},
        {"ts_ns": 2_000, "offset_bytes": 128 * M, "bytes": 64 * M, "op": "discard", "source": "xfs_bunmap", "pid": 1},
        {"ts_ns": 50_000_000, "offset_bytes": 128 * M, "bytes": 64 * M, "op": "discard", "source": "xfs_bunmap",
         "pid": 1}]
    s = session(device_map=device_map(host_fs="ext4"),
                hostfs_events=[hostfs(10, 0, M, source=10, op=3), hostfs(20, 0, M, source=10, op=3)])
    assert s.rows("SELECT ts_ns, op, source FROM hostfs_io ORDER BY ts_ns") == [
        {"ts_ns": 10, "op": "discard", "source": "ext4_punch_hole"},
        {"ts_ns": 20, "op": "discard", "source": "ext4_punch_hole"}]
