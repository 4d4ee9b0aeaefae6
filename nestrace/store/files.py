"""The trace store: a directory of Parquet files per table, hive-partitioned
by capture, written live as Arrow IPC streams and sealed into Parquet.

    STORE/nestrace-store.json                    marker and format version
    STORE/_live/<capture>/<table>.arrows         during capture, one IPC stream per
                                                 table, flushed per batch
    STORE/_live/<capture>/capture.json           capture facts known so far
    STORE/_live/<capture>/recording.lock         flock held by the recorder and its agent
    STORE/<table>/capture=<capture>/data.parquet after sealing
    STORE/.write-lock                            flock held by whoever writes the tables

A capture killed mid-run leaves its `_live` directory; `seal()` (CLI
`nestrace seal STORE`) turns every readable batch in it into Parquet.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import platform
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from nestrace._version import __version__
from nestrace.errors import StoreError, json_object
from nestrace.schema import RECORDS, TABLES, kernel_tables, record_schema, table_schema

MARKER = "nestrace-store.json"
FORMAT = {"format": "nestrace-store", "version": 1}
LIVE = "_live"
WRITE_LOCK = ".write-lock"
RECORDING_LOCK = "recording.lock"


def init_store(path: str | os.PathLike) -> Path:
    """Create a store directory (or accept an existing store)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise StoreError(f"{p}: exists and is not a directory")
    if p.is_dir() and any(p.iterdir()) and not (p / MARKER).exists():
        raise StoreError(f"{p}: not empty and not a nestrace store (no {MARKER})")
    p.mkdir(parents=True, exist_ok=True)
    (p / MARKER).write_text(json.dumps(FORMAT) + "\n")
    return p


def check_store(path: str | os.PathLike) -> Path:
    """Return the store path, or raise StoreError saying why it is not one."""
    p = Path(path)
    marker = p / MARKER
    if p.exists() and not p.is_dir():
        raise StoreError(f"{p}: not a nestrace store (a store is a directory)")
    if not p.is_dir():
        raise StoreError(f"{p}: no such store directory")
    if not marker.exists():
        raise StoreError(f"{p}: not a nestrace store (no {MARKER})")
    try:
        fmt = json.loads(marker.read_text())
    except json.JSONDecodeError as e:
        raise StoreError(f"{marker}: offset {e.pos}: not JSON: {e.msg}") from None
    if fmt.get("format") != FORMAT["format"] or fmt.get("version") != FORMAT["version"]:
        raise StoreError(f"{marker}: offset 0: unsupported store format {fmt!r}")
    return p


def captures(store: Path) -> list[str]:
    """Sealed capture ids in a store."""
    d = store / "capture_meta"
    if not d.is_dir():
        return []
    return sorted(x.name.split("=", 1)[1] for x in d.iterdir() if x.name.startswith("capture="))


def live_captures(store: Path) -> list[str]:
    d = store / LIVE
    # (a name beginning with "." is a capture being created: see LiveCapture)
    return sorted(x.name for x in d.iterdir() if not x.name.startswith(".")) if d.is_dir() else []


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def writing(store: Path, what: str, note=_note):
    """Hold STORE's write lock while `what` writes its tables.  The
    commands that write a store (seal, correlate, import, merge) take
    turns: a later one waits, and note() says for whom (two correlates at
    once wrote one temporary file, and the second died of DuckDB's "could
    not set lock")."""
    path = store / WRITE_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StoreError(f"{path}: cannot open the store's write lock: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another nestrace"
            note(f"nestrace: {store}: waiting for {holder} to finish writing the store")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({what})\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def recorder_of(store: Path, capture_id: str, wait: float = 30.0) -> int | None:
    """The pid of the nestrace recording live capture `capture_id`, or None
    when none is (it is then safe to seal).  The recorder's agent holds the
    capture's lock too: a recorder killed (SIGKILL) leaves an agent that
    exits with it (PR_SET_PDEATHSIG) after writing its last batch, and is
    given up to `wait` seconds for it."""
    path = store / LIVE / capture_id / RECORDING_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None                   # recorded before there were locks
    except OSError as e:
        raise StoreError(f"{path}: cannot open: {e.strerror}") from None
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return None
            except BlockingIOError:
                pass
            text = os.pread(fd, 64, 0).decode(errors="replace").split()
            pid = int(text[0]) if text and text[0].isdigit() else None
            if pid is not None and _alive(pid):
                return pid
            if time.monotonic() > deadline:
                raise StoreError(f"{path}: still locked {wait:.0f} s after its recorder "
                                 f"(pid {pid}) ended: is its agent still running?")
            time.sleep(0.05)
    finally:
        os.close(fd)


@dataclass
class LiveCapture:
    """Writes one capture's batches as Arrow IPC streams, flushed per batch.
    `recording`: hold the capture's lock (`recorder_of`) until release(), so
    that `nestrace seal` leaves it alone; pass lock_fd to the agent, and it
    holds the lock too while it lives."""
    store: Path
    capture_id: str
    writers: dict = field(default_factory=dict)
    recording: bool = False
    lock_fd: int | None = None

    @property
    def dir(self) -> Path:
        return self.store / LIVE / self.capture_id

    def __post_init__(self) -> None:
        if not self.recording:
            self.dir.mkdir(parents=True, exist_ok=True)
            return
        # made under a hidden name, locked, then renamed: seal never sees
        # the capture unlocked
        new = self.dir.with_name(f".{self.capture_id}.new")
        try:
            new.mkdir(parents=True)
        except FileExistsError:        # left by a crash before its rename
            shutil.rmtree(new, ignore_errors=True)
            new.mkdir()
        try:
            self.lock_fd = os.open(new / RECORDING_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            os.write(self.lock_fd, f"{os.getpid()}\n".encode())
            os.rename(new, self.dir)
        except OSError as e:
            self.release()
            shutil.rmtree(new, ignore_errors=True)
            raise StoreError(f"{new}: cannot create the live capture: {e.strerror}") from None

    def release(self) -> None:
        """Let go of the capture's lock (the agent may still hold it)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def write(self, table: str, batch: pa.RecordBatch) -> None:
        path = self.dir / f"{table}.arrows"
        try:
            w = self.writers.get(table)
            if w is None:
                sink = pa.OSFile(str(path), "wb")
                w = (sink, pa.ipc.new_stream(sink, batch.schema))
                self.writers[table] = w
            w[1].write_batch(batch)
            w[0].flush()
        except OSError as e:
            raise StoreError(f"{path}: cannot write: {e}") from None

    def write_table(self, table: str, t: pa.Table) -> None:
        for b in t.to_batches() or [pa.RecordBatch.from_pylist([], schema=t.schema)]:
            self.write(table, b)

    def update_facts(self, **facts) -> None:
        """Merge facts into capture.json (written atomically)."""
        p = self.dir / "capture.json"
        cur = json.loads(p.read_text()) if p.exists() else {}
        cur.update(facts)
        tmp = p.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(cur, indent=1, default=str))
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"{tmp}: cannot write: {e}") from None
        os.replace(tmp, p)

    def batches(self, table: str) -> list[pa.RecordBatch]:
        """A live table's readable batches so far."""
        p = self.dir / f"{table}.arrows"
        return read_ipc_tolerant(p)[0] if p.exists() else []

    def unique_values(self, table: str, column: str) -> set:
        """Distinct values of a column over a live table's readable batches."""
        out: set = set()
        for b in self.batches(table):
            out.update(b.column(column).unique().to_pylist())
        return out

    def close(self) -> None:
        failed = []
        for table, (sink, w) in self.writers.items():
            try:
                w.close()
            except OSError as e:
                failed.append(f"{self.dir / table}.arrows: cannot write: {e}")
            finally:
                sink.close()
        self.writers.clear()
        if failed:
            raise StoreError("; ".join(failed))


_CONTINUATION = b"\xff\xff\xff\xff"
# (pa.ArrowException: a damaged message can raise any of pyarrow's errors,
# e.g. ArrowNotImplementedError for a type field that became "int128")
_IPC_ERRORS = (pa.ArrowException, OSError, ValueError)


def _read_batch(src: pa.BufferReader, schema: pa.Schema, check: bool) -> pa.RecordBatch:
    """The record batch message at src's position (EOFError at a clean end)."""
    m = pa.ipc.read_message(src)
    if m.type != "record batch":
        raise ValueError(f"a {m.type} message where a record batch belongs")
    b = pa.ipc.read_record_batch(m, schema)
    if check:
        b.validate(full=True)
    return b


def _resync(data: mmap.mmap, src: pa.BufferReader, schema: pa.Schema, start: int) -> int | None:
    """Offset of the first message after `start` that reads as a whole,
    valid record batch of this schema; src is left after it.  Candidates
    are Arrow's continuation markers (0xFFFFFFFF); one inside a damaged
    batch's data fails to parse or to validate and is passed over."""
    at = data.find(_CONTINUATION, start + 1)
    while at >= 0:
        src.seek(at)
        try:
            _read_batch(src, schema, check=True)
        except (EOFError, *_IPC_ERRORS):
            at = data.find(_CONTINUATION, at + 1)
            continue
        src.seek(at)
        return at
    return None


def read_ipc_tolerant(path: Path, expected: pa.Schema | None = None
                      ) -> tuple[list[pa.RecordBatch], str | None]:
    """Read every readable batch of an IPC stream.  Damage is reported with
    the file and the byte offset, never fatal: a torn tail (a writer killed
    mid-batch) is dropped, and after a damaged message reading resumes at
    the next whole batch, so no good batch behind it is lost.  Each batch
    is validated (a damaged one could otherwise fail only when written).
    With `expected` (the table's schema), a schema message that is damaged
    or differs is reported and the batches are read with `expected`."""
    batches: list[pa.RecordBatch] = []
    problems: list[str] = []
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:     # ValueError: an empty file
        return batches, f"{path}: offset 0: no Arrow IPC schema: {e}"
    src = pa.BufferReader(pa.py_buffer(data))    # batches point into the map
    try:
        m = pa.ipc.read_message(src)
        if m.type != "schema":      # (pyarrow 26 crashes reading another as a schema)
            raise ValueError(f"a {m.type} message where the schema belongs")
        schema = pa.ipc.read_schema(m)
        if expected is not None and not schema.equals(expected, check_metadata=False):
            raise ValueError("a schema other than the table's")
    except (EOFError, *_IPC_ERRORS) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        if expected is None:
            return batches, f"{path}: offset 0: no Arrow IPC schema: {why}"
        schema = expected
        nxt = _resync(data, src, schema, 0)
        if nxt is None:
            return batches, (f"{path}: offset 0: the schema message is damaged ({why}) and no "
                             "whole batch of the table's schema follows: nothing read")
        problems.append(f"{path}: offset 0: the schema message is damaged ({why}): the "
                        f"table's own schema used; reading resumed at offset {nxt}")
    while True:
        off = src.tell()
        try:
            batches.append(_read_batch(src, schema, check=True))
            continue
        except EOFError:
            if len(data) - off <= 8:       # the end, or the end-of-stream marker
                break
            why = "an end-of-stream marker with data after it"
        except _IPC_ERRORS as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
        nxt = _resync(data, src, schema, off)
        if nxt is None:
            problems.append(f"{path}: offset {off}: the last {len(data) - off} bytes hold no "
                            f"whole batch (a writer killed mid-batch?), ignored: {why}")
            break
        problems.append(f"{path}: offset {off}: {nxt - off} bytes unreadable ({why}), "
                        f"skipped; reading resumed at offset {nxt}")
    return batches, "; ".join(problems) or None


# Parquet files nestrace writes carry a CRC32 per page, and say so in
# their key-value metadata, so that `verify` knows which files a damaged
# page would be caught in (DuckDB, which writes what `correlate` stores,
# neither writes nor checks page checksums).
PAGE_CRC_KEY = b"nestrace.page_crc32"
PARQUET_OPTIONS = {"compression": "zstd", "write_page_checksum": True}


def with_crc_marker(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({**(schema.metadata or {}), PAGE_CRC_KEY: b"1"})


def write_parquet_file(t: pa.Table, path: Path) -> None:
    pq.write_table(t.replace_schema_metadata(with_crc_marker(t.schema).metadata), path,
                   **PARQUET_OPTIONS)


def _write_parquet(store: Path, table: str, capture_id: str, t: pa.Table) -> None:
    d = store / table / f"capture={capture_id}"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "data.parquet.tmp"
    try:
        write_parquet_file(t, tmp)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"{tmp}: cannot write: {e}") from None
    os.replace(tmp, d / "data.parquet")


def _with_capture(t: pa.Table, capture_id: str) -> pa.Table:
    return t.append_column(pa.field("capture_id", pa.string()),
                           pa.repeat(pa.scalar(capture_id, pa.string()), t.num_rows))


# Block events of one request address in time order (I, D, C, requeue): a
# D followed by an I or D again completed unseen.  A D with nothing after
# it up to end_ns was in flight at the end, or completed unseen too.  Only
# the capture proper counts, from start_ns to end_ns, every program
# attached: the agent attaches them one by one, and a request dispatched
# before the completion's program was attached completes unseen; at the
# end it detaches them one by one after end_ns, and a request completing
# then is unseen while the next one at its address may still be recorded.
_COMPLETIONS_SQL = """
WITH e AS (SELECT action, ts_ns,
                  lead(action) OVER w AS next, lead(ts_ns) OVER w AS next_ns
           FROM block WHERE action IN (5, 6, 7, 10)
           WINDOW w AS (PARTITION BY dev, rq_id ORDER BY ts_ns, cpu, seq))
SELECT count(*) FILTER (WHERE next IN (5, 6) AND next_ns <= $end) AS missed,
       count(*) FILTER (WHERE next IS NULL OR (next IN (5, 6) AND next_ns > $end)) AS unfinished
FROM e WHERE action = 6 AND ts_ns >= $start AND ts_ns <= $end"""


def completion_accounting(block: pa.Table, start_ns: int, end_ns: int) -> tuple[int, int]:
    """(completions_missed, requests_unfinished) of one capture's block
    events (see capture_meta).  A completion is missed when the kernel
    runs no program for its tracepoint hit and counts no miss either: on
    some kernels, for hits in the context of tasks hidden from BPF."""
    import duckdb
    con = duckdb.connect()
    try:
        con.register("block", block.select(["action", "ts_ns", "dev", "rq_id", "cpu", "seq"]))
        missed, unfinished = con.execute(_COMPLETIONS_SQL, {"start": start_ns, "end": end_ns}).fetchone()
    finally:
        con.close()
    return int(missed), int(unfinished)


@dataclass
class SealResult:
    capture_id: str
    records: int
    lost_total: int
    problems: list[str]
    completions_unseen: int = 0    # completions missed beyond the sequence gaps


AGENT_SETTINGS = ("agent_version", "ringbuf_bytes", "wakeup_bytes", "flush_ms", "ncpu",
                  "families", "mode", "attach_ns", "ends_attached_ns")


def capture_settings(agent_start: dict, settings: dict) -> str | None:
    """capture_meta.settings_json: the agent's settings from its start
    message, and what record was told besides (CPUs, --all-hooks, --pid)."""
    if not agent_start and not settings:
        return None
    return json.dumps({k: agent_start[k] for k in AGENT_SETTINGS if k in agent_start} | settings)


def _live_facts(path: Path, problems: list[str]) -> dict:
    """A live capture's facts (capture.json); a damaged file is a problem,
    named with the offset, and the capture is sealed without them."""
    if not path.exists():
        return {}
    facts, problem = json_object(path.read_bytes())
    if facts is None:
        problems.append(f"{path}: {problem}: the capture's facts (start and end, "
                        "command, stack) are lost; its records are sealed without them")
    return facts or {}


def seal(store: Path, capture_id: str) -> SealResult:
    """Turn a live capture into Parquet tables plus lost_events and
    capture_meta; remove its live directory.  (The caller checks that no
    other process records it: `recorder_of`.)"""
    with writing(store, f"nestrace seal {capture_id}"):
        return _seal(store, capture_id)


def _seal(store: Path, capture_id: str) -> SealResult:
    live = store / LIVE / capture_id
    problems: list[str] = []
    facts = _live_facts(live / "capture.json", problems)
    tables: dict[str, list[pa.RecordBatch]] = {}
    kernel = kernel_tables()
    for p in sorted(live.glob("*.arrows")):
        expected = (record_schema(kernel[p.stem]) if p.stem in kernel else
                    table_schema(p.stem) if p.stem in TABLES else None)
        batches, problem = read_ipc_tolerant(p, expected)
        if problem:
            problems.append(problem)
        tables[p.stem] = batches

    # per-CPU sequence accounting over every kernel record
    seqs: dict[int, list[int]] = {}   # cpu -> [count, max_seq]
    records = 0
    block = record_schema("block_event").empty_table()
    for table, rec_name in kernel_tables().items():
        if rec_name == "cpu_stats":
            continue
        schema = record_schema(rec_name)
        batches = tables.get(table, [])
        t = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
        records += t.num_rows
        if t.num_rows:
            g = t.group_by("cpu").aggregate([("seq", "count"), ("seq", "max")])
            for cpu, n, mx in zip(g["cpu"].to_pylist(), g["seq_count"].to_pylist(),
                                  g["seq_max"].to_pylist()):
                c = seqs.setdefault(cpu, [0, 0])
                c[0] += n
                c[1] = max(c[1], mx)
        if rec_name == "block_event":
            block = t
        _write_parquet(store, table, capture_id, _with_capture(t, capture_id))

    stats_schema = record_schema("cpu_stats")
    sb = tables.get(RECORDS["cpu_stats"]["table"], [])
    stats = pa.Table.from_batches(sb, schema=stats_schema) if sb else stats_schema.empty_table()
    _write_parquet(store, RECORDS["cpu_stats"]["table"], capture_id, _with_capture(stats, capture_id))
    emitted = {r["cpu"]: r for r in stats.to_pylist()}
    if not emitted:
        problems.append(f"{live}: no agent_stats: the agent did not end cleanly, "
                        "ring-buffer drops unknown (sequence gaps still counted)")
    lost_rows = []
    for cpu in sorted(set(seqs) | set(emitted)):
        cnt, mx = seqs.get(cpu, [0, 0])
        st = emitted.get(cpu, {})
        # the agent's counter is the truth for the last sequence number taken
        last = max(mx, st.get("emitted", 0) + st.get("ringbuf_drops", 0))
        if cnt > last:
            problems.append(f"{live}: CPU {cpu}: {cnt} records but only {last} sequence "
                            f"numbers taken: {cnt - last} duplicated records")
        lost_rows.append({"capture_id": capture_id, "cpu": cpu,
                          "emitted": st.get("emitted", cnt), "received": cnt,
                          "ringbuf_drops": st.get("ringbuf_drops", 0),
                          "seq_gaps": max(last - cnt, 0)})
    lost = pa.Table.from_pylist(lost_rows, schema=table_schema("lost_events"))
    _write_parquet(store, "lost_events", capture_id, lost)
    end_meta = facts.get("agent_end", {})
    hook_misses = end_meta.get("hook_misses")
    end_ns = facts.get("end_ns", end_meta.get("end_ns", 0))
    start_ns = facts.get("start_ns", facts.get("agent_start", {}).get("start_ns", 0))
    missed, unfinished = completion_accounting(block, start_ns, end_ns or (1 << 64) - 1)
    gaps = sum(r["seq_gaps"] for r in lost_rows)
    # a completion record lost in a gap is counted there already
    unseen = max(missed - gaps, 0)
    lost_total = gaps + (hook_misses or 0) + unseen

    for name in ("extent_maps", "device_map"):
        schema = table_schema(name)
        batches = tables.get(name, [])
        t = pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()
        _write_parquet(store, name, capture_id, t)

    start_meta = facts.get("agent_start", {})
    meta = {
        "capture_id": capture_id,
        "machine": facts.get("machine", socket.gethostname()),
        "kernel": facts.get("kernel", platform.release()),
        "clock": "CLOCK_MONOTONIC",
        "start_ns": facts.get("start_ns", start_meta.get("start_ns", 0)),
        "end_ns": end_ns,
        "start_wall": facts.get("start_wall", ""),
        "command": facts.get("command", ""),
        "command_exit": facts.get("command_exit"),
        "hooks_json": json.dumps(start_meta.get("hooks", {})),
        "settings_json": capture_settings(start_meta, facts.get("settings", {})),
        "stack_json": json.dumps(facts.get("stack", {})),
        "lost_total": lost_total,
        "hook_misses": hook_misses,
        "hook_misses_json": json.dumps(end_meta.get("hook_misses_by_hook", {})),
        "completions_missed": missed,
        "requests_unfinished": unfinished,
        "records_total": records,
        "tool_version": __version__,
        "schema_version": json.dumps({n: s["version"] for n, s in RECORDS.items()}),
    }
    _write_parquet(store, "capture_meta", capture_id,
                   pa.Table.from_pylist([meta], schema=table_schema("capture_meta")))
    shutil.rmtree(live)
    try:
        (store / LIVE).rmdir()
    except OSError:                    # (other captures live, or being made)
        pass
    return SealResult(capture_id, records, lost_total, problems, unseen)


@dataclass
class FileCheck:
    path: Path
    rows: int
    checksummed: bool
    problem: str | None


def _footer_problem(f: Path) -> str:
    """Where a Parquet file's footer (its metadata, then its length and
    PAR1 at the very end) is broken, as a byte range."""
    size = f.stat().st_size
    if size < 12:
        return f"byte 0..{size}: {size} bytes, too short for a Parquet file"
    with open(f, "rb") as fh:
        fh.seek(size - 8)
        tail = fh.read(8)
    if tail[4:] != b"PAR1":
        return (f"byte {size - 4}..{size}: no PAR1 at the end of its {size} bytes (cut short, "
                "or overwritten there)")
    n = int.from_bytes(tail[:4], "little")
    if n > size - 12:
        return f"byte {size - 8}..{size - 4}: a footer length of {n} bytes, more than the file holds"
    return f"byte {size - 8 - n}..{size - 8}: the footer (the file's metadata)"


def check_file(f: Path) -> FileCheck:
    """Read back one Parquet file column chunk by column chunk, checking
    page CRCs where the file has them; a damaged chunk is named by byte
    range, row group and column."""
    try:
        pf = pq.ParquetFile(f, page_checksum_verification=True)
    except Exception as e:   # a footer that does not parse: pyarrow's many error types
        return FileCheck(f, 0, False, f"{f}: {_footer_problem(f)}: unreadable: "
                                      f"{str(e).splitlines()[0]}")
    md = pf.metadata
    crc = PAGE_CRC_KEY in (pf.schema_arrow.metadata or {})
    for rg in range(md.num_row_groups):
        for ci in range(md.num_columns):
            cc = md.row_group(rg).column(ci)
            try:
                pf.read_row_group(rg, columns=[cc.path_in_schema])
            except Exception as e:
                start = cc.dictionary_page_offset if cc.has_dictionary_page else cc.data_page_offset
                return FileCheck(f, md.num_rows, crc, (
                    f"{f}: byte {start}..{start + cc.total_compressed_size}: row group {rg}, "
                    f"column {cc.path_in_schema}: {str(e).splitlines()[0]}"))
    return FileCheck(f, md.num_rows, crc, None)


def verify(store: str | os.PathLike) -> tuple[list[FileCheck], list[str]]:
    """Read back every Parquet file of a store (check_file).  Also returns
    the captures left unsealed."""
    p = check_store(store)
    return [check_file(f) for f in sorted(p.glob("*/capture=*/data.parquet"))], live_captures(p)


# DuckDB's errors that name a file it could not read (its footer missing,
# say: "No magic bytes found at end of file '...'", or a page that does not
# decompress: 'Failed to read file "...": ZSTD Decompression failure').
# For damage it names no file for, it raised its generic Error ("Payload
# value bigger than allowed. Corrupted file?", "Parquet file is likely
# corrupted, dictionary offset out of range", "Out of buffer", "don't know
# what type" for a footer): only that one makes the whole store be read,
# not a query's own errors (error(), a bad regular expression, ...).
_NAMING_ERRORS = ("InvalidInputException", "IOException", "InternalException",
                  "SerializationException")
# how a damaged file is named in an error (the CLI) or an exception's note (a session)
DAMAGE_NOTE = "damaged store file: "
STORE_FILE_PATTERN = re.compile(r"""['"]([^'"]*/[^/'"]+/capture=[^/'"]+/[^/'"]+\.parquet)['"]""")


def damage_of(store: Path, err: Exception) -> str | None:
    """For a DuckDB error raised reading STORE: the damaged file(s), each
    with the byte range (and the row group and column) that does not read,
    or None when none is found.  DuckDB names the file only for some
    damage, and never the offset: a store file it names is read back
    alone; for its generic error, every footer (quick), then every file in
    turn until one is damaged (an error path: seconds for 10 M events)."""
    import duckdb
    msg = str(err).splitlines()[0] if str(err) else ""
    named = STORE_FILE_PATTERN.search(msg)
    if named and (type(err) is duckdb.Error or any(
            isinstance(err, getattr(duckdb, n)) for n in _NAMING_ERRORS)):
        return check_file(Path(named.group(1))).problem
    if named or type(err) is not duckdb.Error:
        return None
    files = sorted(store.glob("*/capture=*/data.parquet"))
    footers = []
    for f in files:
        try:
            pq.read_metadata(f)
        except Exception:   # (pyarrow's many error types)
            footers.append(f"{f}: {_footer_problem(f)}")
    if footers:
        return "; ".join(footers)
    for f in files:
        problem = check_file(f).problem
        if problem:
            return problem
    return None
