"""Sealing a capture (its live Arrow IPC batches into Parquet, with its
facts into capture_meta) and verifying a store's files."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nestrace._version import __version__
from nestrace.errors import json_object
from nestrace.schema import RECORDS, TABLES, kernel_tables, record_schema, table_schema
from nestrace.store.files import (
    LIVE,
    PAGE_CRC_KEY,
    check_store,
    live_captures,
    read_ipc_tolerant,
    with_capture_id,
    write_capture_table,
    writing,
)
from nestrace.store.manifest import clean_unpublished, publish
from nestrace.store.modes import redactor
from nestrace.store.seqs import missing_upto

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


def request_accounting(requests: pa.Table, start_ns: int, end_ns: int) -> tuple[int, int]:
    """completion_accounting's counts for a capture recorded --per-request:
    the kernel wrote a dispatch whose completion it did not see as action
    d when the request's next insert or dispatch ended it (missed by
    end_ns; unfinished after it).  The requests still dispatched at the
    end are the agent's to count (requests_in_flight), each with its row
    of action unfinished."""
    import pyarrow.compute as pc
    d = requests.filter(pc.and_(pc.equal(requests["action"], 6), pc.and_(
        pc.greater_equal(requests["d_ns"], start_ns), pc.less_equal(requests["d_ns"], end_ns))))
    missed = int(pc.sum(pc.less_equal(d["ts_ns"], end_ns)).as_py() or 0)
    return missed, d.num_rows - missed


@dataclass
class SealResult:
    capture_id: str
    records: int
    lost_total: int
    problems: list[str]
    completions_unseen: int = 0    # completions missed beyond the sequence gaps


AGENT_SETTINGS = ("agent_version", "ringbuf_bytes", "wakeup_bytes", "flush_ms", "ncpu",
                  "families", "mode", "block_records", "attach_ns", "ends_attached_ns")


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


# `record --redact`: the columns that name files and processes
REDACTED = {"comm": "process names", "path": "file paths", "name": "mount points",
            "backing_path": "image paths"}


def _redact(store: Path, facts: dict, tables: dict[str, list[pa.RecordBatch]]) -> dict:
    """A capture's process names, file paths, mount points, image paths and
    command line as hashes (store.modes.redactor: one value, one hash,
    within the store), in its tables and its facts (the stack's paths,
    the cgroup)."""
    import pyarrow.compute as pc
    hash_of = redactor(store)

    def col(a: pa.Array, paths: bool) -> pa.Array:
        uniq = pc.unique(a)
        hashed = [hash_of(v) if v and (not paths or v.startswith("/")) else v
                  for v in uniq.to_pylist()]
        return pc.take(pa.array(hashed, a.type), pc.index_in(a, uniq))

    for name, batches in tables.items():
        out = []
        for b in batches:
            for c in REDACTED:
                i = b.schema.get_field_index(c)
                if i >= 0:      # (a device's name, not a path, is kept: loop0, vda)
                    b = b.set_column(i, b.schema.field(i), col(b.column(i), c != "comm"))
            out.append(b)
        tables[name] = out

    def walk(v, key=""):
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, key) for x in v]
        if isinstance(v, str) and (v.startswith("/") or key in ("command", "cgroup")):
            return hash_of(v)
        return v
    return walk(facts)


def _read_live(live: Path, problems: list[str]) -> dict[str, list[pa.RecordBatch]]:
    """Every table's intact batches in a live capture directory."""
    tables: dict[str, list[pa.RecordBatch]] = {}
    kernel = kernel_tables()
    for p in sorted(live.glob("*.arrows")):
        expected = (record_schema(kernel[p.stem]) if p.stem in kernel else
                    table_schema(p.stem) if p.stem in TABLES else None)
        batches, problem = read_ipc_tolerant(p, expected)
        if problem:
            problems.append(problem)
        tables[p.stem] = batches
    return tables


def _write_records(store: Path, capture_id: str, tables: dict
                   ) -> tuple[int, dict[int, list], pa.Table, pa.Table]:
    """The kernel record tables written; their rows, each CPU's sequence
    numbers, and the block events and block requests (for completion
    accounting)."""
    seqs: dict[int, list] = {}   # cpu -> its records' sequence numbers, table by table
    records = 0
    block = record_schema("block_event").empty_table()
    requests = record_schema("block_request").empty_table()
    for table, rec_name in kernel_tables().items():
        if rec_name == "cpu_stats":
            continue
        schema = record_schema(rec_name)
        batches = tables.get(table, [])
        t = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
        records += t.num_rows
        if t.num_rows:
            cpu, seq = t.column("cpu").to_numpy(), t.column("seq").to_numpy()
            for c in np.unique(cpu):
                seqs.setdefault(int(c), []).append(seq[cpu == c])
        if rec_name == "block_event":
            block = t
        elif rec_name == "block_request":
            requests = t
        write_capture_table(store, table, capture_id, with_capture_id(t, capture_id))
    return records, seqs, block, requests


def _write_losses(store: Path, capture_id: str, live: Path, tables: dict,
                  seqs: dict[int, list[int]], problems: list[str]) -> list[dict]:
    """The agent's per-CPU counters and the lost_events rows: ring-buffer
    drops, and sequence gaps against the records received."""
    stats_schema = record_schema("cpu_stats")
    sb = tables.get(RECORDS["cpu_stats"]["table"], [])
    stats = pa.Table.from_batches(sb, schema=stats_schema) if sb else stats_schema.empty_table()
    write_capture_table(store, RECORDS["cpu_stats"]["table"], capture_id,
                        with_capture_id(stats, capture_id))
    emitted = {r["cpu"]: r for r in stats.to_pylist()}
    if not emitted:
        problems.append(f"{live}: no agent_stats: the agent did not end cleanly, "
                        "ring-buffer drops unknown (sequence gaps still counted)")
    lost_rows = []
    for cpu in sorted(set(seqs) | set(emitted)):
        q = np.concatenate(seqs[cpu]) if cpu in seqs else np.zeros(0, np.uint64)
        cnt = len(q)
        st = emitted.get(cpu)
        # the agent's counter is the truth for the last sequence number
        # taken; without it the numbers tell, damage not taken for loss
        last = st["emitted"] + st["ringbuf_drops"] if st else None
        gaps, damaged, dups = missing_upto(q, last)
        if dups or damaged:
            problems.append(f"{live}: CPU {cpu}: of {cnt} records, {dups} a second time and "
                            f"{damaged} with a sequence number that is damage (not counted "
                            "as losses)")
        lost_rows.append({"capture_id": capture_id, "cpu": cpu,
                          "emitted": st["emitted"] if st else cnt, "received": cnt,
                          "ringbuf_drops": st["ringbuf_drops"] if st else 0, "seq_gaps": gaps})
    write_capture_table(store, "lost_events", capture_id,
                        pa.Table.from_pylist(lost_rows, schema=table_schema("lost_events")))
    return lost_rows


def _seal(store: Path, capture_id: str) -> SealResult:
    live = store / LIVE / capture_id
    problems: list[str] = []
    clean_unpublished(store, capture_id)
    facts = _live_facts(live / "capture.json", problems)
    tables = _read_live(live, problems)
    if facts.get("settings", {}).get("redact"):
        facts = _redact(store, facts, tables)
    records, seqs, block, requests = _write_records(store, capture_id, tables)
    lost_rows = _write_losses(store, capture_id, live, tables, seqs, problems)
    end_meta = facts.get("agent_end", {})
    hook_misses = end_meta.get("hook_misses")
    end_ns = facts.get("end_ns", end_meta.get("end_ns", 0))
    start_ns = facts.get("start_ns", facts.get("agent_start", {}).get("start_ns", 0))
    gaps = sum(r["seq_gaps"] for r in lost_rows)
    settings = facts.get("settings", {})
    if "requests_dispatched" in end_meta:   # --from-completions: the kernel counted them
        missed = max(end_meta["requests_dispatched"] - end_meta["requests_ended"], 0)
        unfinished = 0
        settings = settings | {k: end_meta[k] for k in ("requests_dispatched", "requests_ended")}
    elif "requests_lost" in end_meta:     # --per-request: the kernel ended each dispatch
        missed, unfinished = request_accounting(requests, start_ns, end_ns or (1 << 64) - 1)
        unfinished += end_meta["requests_in_flight"]
        settings = settings | {k: end_meta[k] for k in ("requests_expired", "requests_in_flight")}
    else:
        missed, unfinished = completion_accounting(block, start_ns, end_ns or (1 << 64) - 1)
    # a completion record lost in a gap is counted there already
    unseen = max(missed - gaps, 0)
    lost_total = gaps + (hook_misses or 0) + unseen + end_meta.get("requests_lost", 0)

    for name in ("extent_maps", "device_map"):
        schema = table_schema(name)
        batches = tables.get(name, [])
        t = pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()
        write_capture_table(store, name, capture_id, t)

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
        "settings_json": capture_settings(start_meta, settings),
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
    write_capture_table(store, "capture_meta", capture_id,
                        pa.Table.from_pylist([meta], schema=table_schema("capture_meta")))
    publish(store, capture_id)
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
        mode = f.stat().st_mode
        if not stat.S_ISREG(mode):
            return FileCheck(f, 0, False, f"{f}: not a regular file (a "
                                          f"{'directory' if stat.S_ISDIR(mode) else 'FIFO' if stat.S_ISFIFO(mode) else 'device or socket'}"
                                          "): a table file was written there")
        with open(f, "rb"):
            pass
    except OSError as e:
        return FileCheck(f, 0, False, f"{f}: cannot read: {e.strerror}")
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
