"""Sealing a damaged live capture: every whole batch is kept, the damage is
named by file and byte offset, and the records it held count as lost."""
from __future__ import annotations

import os
import subprocess
import time

import duckdb
import pyarrow as pa
import pytest
from conftest import NESTRACE, ROOT, run_cli

import nestrace
from nestrace.errors import StoreError
from nestrace.schema import RECORDS, record_schema
from nestrace.store.files import (
    LIVE,
    LiveCapture,
    init_store,
    read_ipc_tolerant,
    recorder_of,
    writing,
)
from nestrace.store.seal import damage_of

BATCH = 100


def block_batch(first_seq: int, issued: bool = False) -> pa.RecordBatch:
    """BATCH bios queued (Q); issued: every other row the D of the bio
    before it."""
    spec = RECORDS["block_event"]
    d = [issued and s % 2 == 0 for s in range(first_seq, first_seq + BATCH)]
    rows = [{"kind": spec["kind"], "version": spec["version"], "cpu": 0, "seq": s,
             "ts_ns": 1000 + s, "sector": 8 * (s - d[s - first_seq]),
             "rq_id": s if d[s - first_seq] else 0,
             "bio_id": s - d[s - first_seq], "aux_sector": 0, "dev": 7 << 20, "nr_sectors": 8,
             "pid": 1, "error": 0, "action": 6 if d[s - first_seq] else 1, "req_op": 1,
             "req_flags": 0, "comm": "fio"}
            for s in range(first_seq, first_seq + BATCH)]
    return pa.RecordBatch.from_pylist(rows, schema=record_schema("block_event"))


def message_offsets(path) -> list[int]:
    """Byte offset of each message (schema first) of an IPC stream."""
    src = pa.BufferReader(path.read_bytes())
    offs = []
    while True:
        o = src.tell()
        try:
            pa.ipc.read_message(src)
        except EOFError:
            return offs
        offs.append(o)


def live_store(tmp_path, batches: int, issued: bool = False):
    store = init_store(tmp_path / "s")
    live = LiveCapture(store, "c1")
    for i in range(batches):
        live.write(RECORDS["block_event"]["table"], block_batch(1 + i * BATCH, issued))
    live.close()
    return store, store / LIVE / "c1" / f"{RECORDS['block_event']['table']}.arrows"


def seqs(store) -> list[int]:
    return [r["seq"] for r in nestrace.open(store).rows("SELECT seq FROM block_events ORDER BY seq")]


def test_seal_skips_a_damaged_batch_and_keeps_the_batches_after_it(tmp_path):
    store, path = live_store(tmp_path, 3)
    schema_at, b1, b2, b3 = message_offsets(path)
    data = bytearray(path.read_bytes())
    data[b2 + 8:b2 + 24] = b"not a flatbuffer"      # batch 2's metadata
    path.write_bytes(bytes(data))

    r = run_cli("seal", str(store))
    assert f"{path}: offset {b2}: {b3 - b2} bytes unreadable" in r.stderr
    assert f"reading resumed at offset {b3}" in r.stderr
    assert seqs(store) == list(range(1, 101)) + list(range(201, 301))
    # the damaged batch's records are lost, and said so
    assert f"{BATCH} EVENTS LOST" in r.stderr
    lost = nestrace.open(store).rows("SELECT sum(seq_gaps) AS n FROM lost_events")
    assert lost[0]["n"] == BATCH


def test_a_batch_whose_buffers_do_not_fit_is_skipped_not_written(tmp_path):
    # the message parses, but a column's data is declared 8 bytes long
    # (it raised from the Parquet writer, after the other tables were written)
    import struct
    store, path = live_store(tmp_path, 3)
    _, b1, b2, b3 = message_offsets(path)
    data = bytearray(path.read_bytes())
    meta = bytes(data[b2 + 8:b2 + 8 + struct.unpack_from("<i", data, b2 + 4)[0]])
    at = b2 + 8 + meta.rfind(struct.pack("<q", 8 * BATCH))      # the last column's length
    data[at:at + 8] = struct.pack("<q", 8)
    path.write_bytes(bytes(data))
    r = run_cli("seal", str(store))
    assert f"{path}: offset {b2}: {b3 - b2} bytes unreadable (In column " in r.stderr, r.stderr
    assert "too small" in r.stderr
    assert seqs(store) == list(range(1, 101)) + list(range(201, 301))


def test_a_damaged_schema_message_is_read_with_the_tables_own_schema(tmp_path):
    store, path = live_store(tmp_path, 3)
    _, b1, _, _ = message_offsets(path)
    data = bytearray(path.read_bytes())
    data[8:24] = b"not a flatbuffer"
    path.write_bytes(bytes(data))
    r = run_cli("seal", str(store))
    assert f"{path}: offset 0: the schema message is damaged (" in r.stderr, r.stderr
    assert f"the table's own schema used; reading resumed at offset {b1}" in r.stderr
    assert seqs(store) == list(range(1, 301))


def test_a_schema_message_of_an_unknown_type_is_named_not_read_as_a_schema(tmp_path):
    """pyarrow does not verify a message of an unknown type, and reading
    one as a schema crashed the process (SIGSEGV, found by fuzzing: the
    type byte and one byte after it changed): seal runs as a child here."""
    store, path = live_store(tmp_path, 3)
    _, b1, _, _ = message_offsets(path)
    data = bytearray(path.read_bytes())

    def message_type(d: bytes) -> str:
        try:
            return pa.ipc.read_message(pa.BufferReader(d)).type
        except OSError:     # (a flatbuffer that does not verify)
            return ""

    # the byte that makes the message's type 17 (the header type)
    at = next(i for i in range(8, b1)
              if message_type(bytes(data[:i]) + b"\x11" + bytes(data[i + 1:])) == "unknown")
    data[at] = 0x11
    data[40:b1 - 8] = b"\x80" * (b1 - 48)
    path.write_bytes(bytes(data))
    r = run_cli("seal", str(store), check=False)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert (f"{path}: offset 0: the schema message is damaged (a unknown message where the "
            "schema belongs)") in r.stderr, r.stderr
    assert f"reading resumed at offset {b1}" in r.stderr
    assert seqs(store) == list(range(1, 301))


def test_a_damaged_capture_json_is_named_and_the_records_sealed(tmp_path):
    store, path = live_store(tmp_path, 2)
    facts = path.parent / "capture.json"
    facts.write_bytes(b'{"machine": "m1", "start_ns": 12\xff}')
    r = run_cli("seal", str(store))
    assert f"{facts}: offset 32: not UTF-8: the capture's facts" in r.stderr, r.stderr
    assert seqs(store) == list(range(1, 201))
    store2, path2 = live_store(tmp_path / "b", 1)
    (path2.parent / "capture.json").write_text('{"machine": "m1", "start_ns": ')
    r = run_cli("seal", str(store2))
    assert f"{path2.parent / 'capture.json'}: offset 30: not JSON: Expecting value" in r.stderr
    assert seqs(store2) == list(range(1, 101))


def test_an_end_of_stream_marker_in_the_middle_does_not_end_the_read(tmp_path):
    _, path = live_store(tmp_path, 3)
    _, b1, b2, b3 = message_offsets(path)
    data = bytearray(path.read_bytes())
    data[b2 + 4:b2 + 8] = b"\0\0\0\0"                  # length 0: Arrow's end of stream
    path.write_bytes(bytes(data))

    batches, problem = read_ipc_tolerant(path)
    assert [b.column("seq")[0].as_py() for b in batches] == [1, 201]
    assert f"{path}: offset {b2}: {b3 - b2} bytes unreadable (an end-of-stream marker" in problem


def test_a_torn_tail_is_named_by_offset_and_the_whole_batches_kept(tmp_path):
    _, path = live_store(tmp_path, 2)
    _, b1, b2 = message_offsets(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 10)
    batches, problem = read_ipc_tolerant(path)
    assert [b.num_rows for b in batches] == [BATCH]
    assert problem.startswith(f"{path}: offset {b2}: the last {size - 10 - b2} bytes hold no whole batch")


def test_a_file_that_is_not_an_ipc_stream_is_named(tmp_path):
    p = tmp_path / "x.arrows"
    p.write_bytes(b"hello, not arrow")
    batches, problem = read_ipc_tolerant(p)
    assert batches == [] and problem.startswith(f"{p}: offset 0: no Arrow IPC schema")


def test_verify_names_a_damaged_page(tmp_path):
    """Sealed files carry page CRCs: a few flipped bytes inside the ts_ns
    column are found and named by byte range, row group and column."""
    import pyarrow.parquet as pq
    # (bios issued: the report pairs them, reading every time; of bios
    # queued alone DuckDB knows from the file's statistics that no D is
    # there to pair, and reads none)
    store, _ = live_store(tmp_path, 3, issued=True)
    run_cli("seal", str(store))
    r = run_cli("verify", str(store))
    assert "0 read back without checksums" in r.stdout and "damaged" not in r.stdout
    f = next(store.glob("block_events/capture=c1/data.parquet"))
    cc = next(pq.ParquetFile(f).metadata.row_group(0).column(i) for i in range(17)
              if pq.ParquetFile(f).metadata.row_group(0).column(i).path_in_schema == "ts_ns")
    start = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
    end = start + cc.total_compressed_size
    data = bytearray(f.read_bytes())
    data[end - 6:end - 2] = bytes(b ^ 0x01 for b in data[end - 6:end - 2])   # the chunk's last page
    f.write_bytes(bytes(data))
    r = run_cli("verify", str(store), check=False)
    assert r.returncode == 2
    assert f"damaged: {f}: byte {start}..{end}: row group 0, column ts_ns: " in r.stdout
    assert "CRC checksum verification failed" in r.stdout
    assert r.stderr.strip() == f"nestrace: error: {store}: 1 damaged file"
    # the file is not the one the capture's manifest names: the commands
    # that read the store stop at once, naming it
    changed = f"nestrace: error: {f}: its SHA-256 is not the one written: changed or damaged"
    for cmd in (["report", str(store)], ["sql", str(store), "SELECT 1"]):
        r = run_cli(*cmd, check=False)
        assert r.returncode == 2 and r.stderr.startswith(changed), r.stderr
    with pytest.raises(StoreError, match="its SHA-256 is not the one written"):
        nestrace.open(store)
    # read anyway (a warning): DuckDB's error for it names no file and no
    # offset; the commands that read the store name both, and the Python
    # API adds them as a note
    damage = f"damaged store file: {f}: byte {start}..{end}: row group 0, column ts_ns: "
    warned = f"nestrace: warning: {f}: its SHA-256 is not the one written"
    for cmd in (["report", str(store)], ["sql", str(store), "SELECT sum(ts_ns) FROM block_events"]):
        r = run_cli("--read-anyway", *cmd, check=False)
        assert r.returncode == 2 and r.stderr.startswith(warned) and \
            f"\nnestrace: error: {damage}" in r.stderr, r.stderr
    # the shell says so and goes on (piped: exit 1 at the end, a statement failed)
    r = run_cli("--read-anyway", "sql", str(store),
                input="SELECT sum(ts_ns) FROM block_events;\nSELECT 41 + 1 AS a;\n", check=False)
    assert f"\n  {damage}" in r.stderr and "42" in r.stdout and r.returncode == 1
    s = nestrace.open(store, read_anyway=True)
    with pytest.raises(duckdb.Error) as e:
        s.query("SELECT sum(ts_ns) FROM block_events")
    assert e.value.__notes__[0].startswith(damage)
    # an error of the query itself gets no note, and no file is read for it
    for q in ("SELECT CAST('x' AS INTEGER)", "SELECT error('boom')"):
        with pytest.raises(duckdb.Error) as e:
            s.query(q)
        assert not getattr(e.value, "__notes__", None)
    # a file DuckDB names (either quotes) is the one read back
    assert damage_of(store, duckdb.InvalidInputException(
        f'Invalid Input Error: Failed to read file "{f}": ZSTD Decompression failure')).startswith(
        damage.removeprefix("damaged store file: "))
    other = next(store.glob("capture_meta/capture=c1/data.parquet"))
    assert damage_of(store, duckdb.InvalidInputException(f"No magic bytes found at end of file '{other}'")) is None
    assert nestrace.open(store, read_anyway=True).rows(
        "SELECT count(*) AS n FROM capture_meta") == [{"n": 1}]


def test_verify_names_a_truncated_file(tmp_path):
    store, _ = live_store(tmp_path, 1)
    run_cli("seal", str(store))
    f = next(store.glob("capture_meta/capture=c1/data.parquet"))
    data = f.read_bytes()
    f.write_bytes(data[:-20])
    r = run_cli("verify", str(store), check=False)
    n = len(data) - 20
    assert r.returncode == 2
    assert f"damaged: {f}: byte {n - 4}..{n}: no PAR1 at the end of its {n} bytes (cut short, " \
           "or overwritten there): unreadable: " in " ".join(r.stdout.split())
    # a footer whose own bytes are damaged is named by its range
    footer = int.from_bytes(data[-8:-4], "little")
    f.write_bytes(data[:-8 - footer] + b"\xff" * footer + data[-8:])
    r = run_cli("verify", str(store), check=False)
    assert f"damaged: {f}: byte {len(data) - 8 - footer}..{len(data) - 8}: the footer (the file's " \
           "metadata): unreadable: " in " ".join(r.stdout.split())
    # a command that reads the store stops at the manifest; read anyway, it
    # names the file and the range (DuckDB's own error for this footer
    # names neither) and points to verify
    r = run_cli("report", str(store), check=False)
    assert r.returncode == 2 and r.stderr.startswith(
        f"nestrace: error: {f}: its SHA-256 is not the one written"), r.stderr
    r = run_cli("--read-anyway", "report", str(store), check=False)
    err = r.stderr.splitlines()[-1]
    assert r.returncode == 2 and err.startswith(
        f"nestrace: error: damaged store file: {f}: byte {len(data) - 8 - footer}..{len(data) - 8}: "
        "the footer (the file's metadata) (DuckDB: "), r.stderr
    assert err.endswith(f"`nestrace verify {store}` checks every file")
    assert err.isprintable()      # DuckDB's control bytes escaped
    f.write_bytes(data[:-20])
    r = run_cli("sql", str(store), "SELECT * FROM capture_meta", check=False)
    assert r.returncode == 2 and r.stderr.startswith(
        f"nestrace: error: {f}: {n} bytes, its manifest says {len(data)}"), r.stderr
    r = run_cli("--read-anyway", "sql", str(store), "SELECT * FROM capture_meta", check=False)
    assert r.returncode == 2 and r.stderr.splitlines()[-1].startswith(
        f"nestrace: error: damaged store file: {f}: byte {n - 4}..{n}: no PAR1 at the end")


def test_tracepoint_hits_the_kernel_skipped_count_as_lost(tmp_path):
    """The agent's end report carries the programs' recursion misses (hits
    the kernel ran no program for): seal stores them and counts them in
    lost_total, and the report says so."""
    store = init_store(tmp_path / "s")
    live = LiveCapture(store, "c1")
    live.write(RECORDS["block_event"]["table"], block_batch(1))
    live.update_facts(agent_end={"end_ns": 2000, "hook_misses": 3,
                                 "hook_misses_by_hook": {"block_rq_complete": 3}})
    live.close()
    r = run_cli("seal", str(store))
    assert "3 EVENTS LOST" in r.stderr
    s = nestrace.open(store)
    assert s.rows("SELECT lost_total, hook_misses, hook_misses_json FROM capture_meta") == [
        {"lost_total": 3, "hook_misses": 3, "hook_misses_json": '{"block_rq_complete": 3}'}]
    assert "tracepoint hits missed 3" in run_cli("report", str(store)).stdout


def rq_events(events) -> pa.RecordBatch:
    """Block events (action, ts_ns, rq_id) on one CPU, seq in order."""
    spec = RECORDS["block_event"]
    rows = [{"kind": spec["kind"], "version": spec["version"], "cpu": 0, "seq": i + 1,
             "ts_ns": ts, "sector": 8, "rq_id": rq, "bio_id": 0, "aux_sector": 0,
             "dev": 7 << 20, "nr_sectors": 8, "pid": 0, "error": 0, "action": a, "req_op": 0,
             "req_flags": 0, "comm": ""}
            for i, (a, ts, rq) in enumerate(events)]
    return pa.RecordBatch.from_pylist(rows, schema=record_schema("block_event"))


def test_completions_that_happened_unseen_count_as_lost(tmp_path):
    """A request address dispatched (D=6) and then inserted (I=5) or
    dispatched again with no completion (C=7) between completed without a
    record: counted as lost.  A requeue (10) between two dispatches is no
    loss, and a D with nothing after it before the end was in flight (or
    missed): counted apart, not as lost.  D events after end_ns are not, nor
    D events before start_ns: the agent attaches its programs one by one,
    and a request dispatched before the completion's program was attached
    completes unseen.  It detaches them one by one after end_ns: an insert
    after end_ns is no evidence of a missed completion (it was in flight)."""
    store = init_store(tmp_path / "s")
    live = LiveCapture(store, "c1")
    live.write(RECORDS["block_event"]["table"], rq_events([
        (6, 100, 0xA), (7, 150, 0xA), (6, 200, 0xA), (6, 300, 0xA), (7, 350, 0xA),  # one missed
        (6, 110, 0xB), (10, 160, 0xB), (6, 210, 0xB), (7, 260, 0xB),              # requeued: fine
        (6, 120, 0xC), (5, 400, 0xC), (6, 410, 0xC),                              # missed; then unfinished
        (6, 130, 0xD), (7, 180, 0xD), (6, 2500, 0xD),                             # after the end
        (6, 40, 0xE), (6, 70, 0xE), (7, 190, 0xE),                  # before the start: attaching
        (6, 1990, 0xF), (5, 2100, 0xF),                 # completed while detaching: unfinished
        (6, 1995, 0x10), (7, 2050, 0x10),               # completed after the end: seen, fine
    ]))
    live.update_facts(start_ns=90,
                      agent_end={"end_ns": 2000, "hook_misses": 0, "hook_misses_by_hook": {}})
    live.close()
    r = run_cli("seal", str(store))
    assert "2 block request completions in capture c1 happened without a record" in r.stderr
    assert "EVENTS LOST" not in r.stderr        # nothing else was lost
    s = nestrace.open(store)
    assert s.rows("SELECT lost_total, completions_missed, requests_unfinished FROM capture_meta") == [
        {"lost_total": 2, "completions_missed": 2, "requests_unfinished": 2}]
    rep = run_cli("report", str(store)).stdout
    assert "completions missed 2" in rep and "2 block requests dispatched without a completion" in rep


@pytest.mark.parametrize("command", ["correlate", "seal"])
def test_a_command_that_writes_a_store_waits_for_the_one_writing_it(tmp_path, command):
    """Two commands writing one store take turns (two correlates at once
    wrote one temporary file, and the second died of DuckDB's "could not
    set lock"): the later one says whom it waits for, writes nothing while
    it waits, and does its work after."""
    store, _ = live_store(tmp_path, 2)
    if command == "correlate":
        run_cli("seal", str(store))
    done = store / ("block_requests" if command == "correlate" else "capture_meta")
    with writing(store, "the test"):
        proc = subprocess.Popen(NESTRACE + [command, str(store)], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = proc.stderr.readline()     # (EOF: it ended without waiting)
        assert f"{store}: waiting for pid {os.getpid()} (the test) to finish writing" in line, \
            line + proc.stderr.read()
        time.sleep(0.5)
        assert proc.poll() is None and not done.exists()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert done.is_dir()
    assert nestrace.open(store).rows("SELECT count(*) AS n FROM block_events") == [{"n": 2 * BATCH}]


def test_seal_leaves_a_capture_its_recorder_still_holds(tmp_path):
    """A live capture made by a recorder (record, import) is locked while it
    lives: `nestrace seal` leaves it, and seals it once the recorder is gone
    (the lock goes with the process, a SIGKILL too)."""
    store = init_store(tmp_path / "s")
    holder = subprocess.Popen(
        NESTRACE[:1] + ["-c", "import sys, time; from pathlib import Path\n"
                        "from nestrace.store.files import LiveCapture\n"
                        "LiveCapture(Path(sys.argv[1]), 'c1', recording=True)\n"
                        "print('ready', flush=True); time.sleep(600)", str(store)],
        cwd=ROOT, text=True, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == "ready\n"
        assert recorder_of(store, "c1") == holder.pid
        r = run_cli("seal", str(store))
        assert f"capture c1 is being recorded (nestrace pid {holder.pid}): left to it" in r.stdout
        assert (store / LIVE / "c1").is_dir() and not (store / "capture_meta").exists()
        r = run_cli("report", str(store), check=False)
        assert (r.returncode, r.stderr.strip()) == (2, f"nestrace: error: {store}: the store holds no "
                                                    f"capture (being recorded: c1 (nestrace pid {holder.pid}))")
    finally:
        holder.kill()
        holder.wait()
    assert recorder_of(store, "c1") is None
    r = run_cli("report", str(store), check=False)
    assert r.stderr.strip().endswith(f"(unsealed: c1; `nestrace seal {store}`)")
    r = run_cli("seal", str(store))
    assert "capture c1" in r.stdout and not (store / LIVE).exists()
    assert nestrace.open(store).captures() == ["c1"]
