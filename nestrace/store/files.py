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
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from nestrace.errors import StoreError
from nestrace.store.modes import group_id

MARKER = "nestrace-store.json"
FORMAT = {"format": "nestrace-store", "version": 1}
LIVE = "_live"
WRITE_LOCK = ".write-lock"
RECORDING_LOCK = "recording.lock"


def init_store(path: str | os.PathLike) -> Path:
    """Create a store directory (or accept an existing store).  A new one
    is its owner's alone (mode 0700, whatever the umask): it holds command
    lines, process names, file and host names."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise StoreError(f"{p}: exists and is not a directory")
    if p.is_dir() and any(p.iterdir()) and not (p / MARKER).exists():
        raise StoreError(f"{p}: not empty and not a nestrace store (no {MARKER})")
    if not p.is_dir():
        try:
            p.mkdir(parents=True, mode=0o700)
            p.chmod(0o700)
        except FileExistsError:     # (made meanwhile: another disk's recorder)
            if not p.is_dir():
                raise StoreError(f"{p}: exists and is not a directory") from None
    (p / MARKER).write_text(json.dumps(FORMAT) + "\n")
    return p


def share_with_group(store: Path, group: str) -> None:
    """`--group NAME`: the store readable by that group: its files and
    directories given to the group (g+r, g+rx), its directories setgid so
    what is made in them later is the group's too, and this process's
    umask 027 so that it is group-readable."""
    gid = group_id(group)
    os.umask(0o027)
    for d, dirs, files in os.walk(store):
        for name in [*dirs, *files]:
            q = Path(d) / name
            os.chown(q, -1, gid, follow_symlinks=False)
            mode = q.lstat().st_mode
            if not q.is_symlink():
                q.chmod((mode & 0o7777) | (0o2050 if q.is_dir() else 0o040))
    os.chown(store, -1, gid)
    store.chmod((store.stat().st_mode & 0o7777) | 0o2050)


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
    """Published capture ids in a store (manifest.published; a store written
    before manifests: those with a capture_meta)."""
    from nestrace.store.manifest import _legacy, has_manifests, published
    return published(store) if has_manifests(store) else _legacy(store)


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


def column_options(schema: pa.Schema) -> dict:
    """How each column is encoded: 64-bit integers (times, sectors,
    offsets, ids: nearly every value distinct, most in runs that grow) as
    deltas, the others with a dictionary.  Writing 2.4 M block events took
    0.41 s so, 0.55 s with plain 64-bit columns, 0.76 s with a dictionary
    tried on every column (the writer built each only to give it up), and
    DuckDB read the 64-bit columns in 0.045 s against 0.07."""
    wide = [f.name for f in schema if pa.types.is_int64(f.type) or pa.types.is_uint64(f.type)]
    floats = [f.name for f in schema if pa.types.is_floating(f.type)
              or pa.types.is_timestamp(f.type)]
    return {"use_dictionary": [f.name for f in schema if f.name not in wide + floats],
            "column_encoding": dict.fromkeys(wide, "DELTA_BINARY_PACKED")}


def write_parquet_file(t: pa.Table, path: Path) -> None:
    pq.write_table(t.replace_schema_metadata(with_crc_marker(t.schema).metadata), path,
                   **column_options(t.schema), **PARQUET_OPTIONS)


def write_capture_table(store: Path, table: str, capture_id: str, t: pa.Table) -> None:
    d = store / table / f"capture={capture_id}"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "data.parquet.tmp"
    try:
        write_parquet_file(t, tmp)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"{tmp}: cannot write: {e}") from None
    os.replace(tmp, d / "data.parquet")


@contextlib.contextmanager
def capture_table_parts(store: Path, table: str, capture_id: str, schema: pa.Schema):
    """Write a capture's table a part at a time: yields write(part), each
    part a table of `schema` that becomes one row group; the file is in
    place when the block ends, and none is left when it fails."""
    d = store / table / f"capture={capture_id}"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "data.parquet.tmp"
    marked = with_crc_marker(schema)
    try:
        with pq.ParquetWriter(tmp, marked, **column_options(schema), **PARQUET_OPTIONS) as w:
            yield lambda t: w.write_table(t.replace_schema_metadata(marked.metadata),
                                          row_group_size=max(t.num_rows, 1))
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"{tmp}: cannot write: {e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, d / "data.parquet")


def with_capture_id(t: pa.Table, capture_id: str) -> pa.Table:
    return t.append_column(pa.field("capture_id", pa.string()),
                           pa.repeat(pa.scalar(capture_id, pa.string()), t.num_rows))


