"""Merge a guest capture and a host capture of one VM into one four-level
capture (DESIGN: "Real VM" deployment).

In a VM the guest agent sees vfs and vdisk (`record --side guest`) and the
host agent sees hostfs and disk (`record --side host --image FILE`), each on
its own CLOCK_MONOTONIC.  `merge` estimates offset = host clock - guest
clock from the I/Os both sides saw: a vdisk request (dispatched at guest
time d, completed at c) and the host's access to the same image offset at
host time h.  Causality puts h - offset inside [d, c], so each such pair
bounds the offset to [h - c, h - d].  Pairs are matched by image offset
alone, so some are wrong (an offset accessed again later); the estimate is
where the most intervals agree, widened by dropping a few of the tightest
bounds (outliers).  The host's times are then moved onto the guest's clock
(host events from before it started, i.e. before the VM booted, are left
out and counted), and the result is an ordinary capture that every view
and `correlate` read as they read a lab capture; capture_meta keeps the
offset and its error.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nestrace._version import __version__
from nestrace.capture.devices import kdev
from nestrace.images.base import FOLLOWED, MAPPED
from nestrace.schema import kernel_tables, table_schema
from nestrace.store.files import captures, check_store, init_store, write_capture_table, writing
from nestrace.store.manifest import publishing

# CPUs of the host side are renumbered from here in a merged capture, so
# that (cpu, seq), and the io_ids made of it, stay unique across machines.
HOST_CPU_BASE = 1 << 15
# a host device whose number the guest also uses gets major 4095 (unused)
REMAP_MAJOR = 4095


class MergeError(ValueError):
    pass


@dataclass
class ClockOffset:
    offset_ns: int        # host - guest
    err_ns: int           # half-width of the interval it lies in
    pairs: int            # bounds (intervals) that contain the estimate
    candidates: int       # guest requests that had a host access at the same offset
    requests: int         # guest requests considered

    def describe(self) -> str:
        return (f"host clock - guest clock = {self.offset_ns} ns ± {self.err_ns} ns "
                f"({self.pairs} bounds from {self.candidates} matched guest requests agree)")


def estimate_offset(guest: pa.Table, host: pa.Table, *, image_offset: int = 0,
                    outliers: float = 0.001) -> ClockOffset:
    """Offset host - guest from guest vdisk requests (columns d_ns, c_ns,
    offset_bytes, op) and host accesses to the image (ts_ns, offset_bytes,
    op, and optionally done_ns: when the host disk request that served a
    direct access completed).  A pair shares the image offset and the op.
    Its access bounds the offset to [h - c, h - d]; a completed disk
    request adds [done - c, h - d] (the guest's completion follows the
    host disk's), which is much tighter.  The estimate is the stretch
    covered by the most intervals (m), widened to where all but
    floor(m * outliers) of them agree: the tightest few bounds are taken
    for outliers.  Its midpoint and half-width are returned."""
    if "done_ns" not in host.column_names:
        host = host.append_column("done_ns", pa.nulls(host.num_rows, pa.uint64()))
    con = duckdb.connect()
    con.register("g", guest)
    con.register("h", host)
    con.execute("""
        CREATE TEMP TABLE j AS
        SELECT g.d_ns::HUGEINT AS d, g.c_ns::HUGEINT AS c, g.offset_bytes AS off,
               h.ts_ns::HUGEINT AS ts, h.done_ns::HUGEINT AS done
        FROM g JOIN h ON h.offset_bytes = g.offset_bytes + ? AND h.op = g.op""", [image_offset])
    (pairs, cands), = con.execute(
        "SELECT count(*), count(DISTINCT (d, off)) FROM j").fetchall()
    if not pairs:
        raise MergeError("no host access to the image is at the offset of a guest request: "
                         "are these captures of the same disk image, recorded at the same time?")
    # coverage of every point by the intervals: +1 where one starts, -1 just
    # after one ends (closed intervals: at one x, starts count first)
    rows = con.execute("""
        WITH p AS (
          SELECT ts - c AS lo, ts - d AS hi FROM j
          UNION ALL SELECT done - c, ts - d FROM j WHERE done >= ts),
        ev AS (SELECT lo AS x, 1 AS d FROM p UNION ALL SELECT hi AS x, -1 AS d FROM p),
        cov AS (SELECT x, d, sum(d) OVER (ORDER BY x, d DESC ROWS UNBOUNDED PRECEDING) AS c,
                       lead(x) OVER (ORDER BY x, d DESC) AS nx FROM ev),
        best AS (SELECT max(c) AS m FROM cov)
        SELECT (SELECT m FROM best) AS m, min(x) AS lo, max(nx) AS hi
        FROM cov, best
        WHERE c >= best.m - floor(best.m * ?)::BIGINT
        """, [outliers]).fetchall()
    m, lo, hi = rows[0]
    if m is None or m < 3:
        raise MergeError(f"only {m or 0} bounds agree on a clock offset: the captures "
                         "do not overlap in time, or are not of the same image; give --offset-ns")
    lo, hi = int(lo), int(hi)
    return ClockOffset(offset_ns=(lo + hi) // 2, err_ns=math.ceil((hi - lo) / 2),
                       pairs=int(m), candidates=int(cands), requests=guest.num_rows)


# the host's direct accesses to the image, each with the completion of the
# host disk request that served it (the first one at its mapped disk
# offset dispatched after it)
HOST_ACCESSES = """
WITH a AS (SELECT io_id, ts_ns, ino, offset_bytes, op, direct FROM hostfs_io
           WHERE capture_id = $cid AND list_contains($inos, ino) AND op IN ('read', 'write')),
m AS (SELECT a.io_id, a.ts_ns, a.ino, a.offset_bytes, a.op,
             CASE WHEN a.direct THEN min(e.physical_bytes + (a.offset_bytes - e.logical_bytes)) END
               AS disk_off
      FROM a LEFT JOIN map_extents e
        ON e.capture_id = $cid AND e.role = 'image' AND e.ino = a.ino
       AND a.offset_bytes >= e.logical_bytes AND a.offset_bytes < e.logical_bytes + e.length_bytes
      GROUP BY a.io_id, a.ts_ns, a.ino, a.offset_bytes, a.op, a.direct)
-- (the files of a backing chain each in a stretch of their own: the
-- image at 0, file k of $inos at k << 50, as _cluster_map puts them)
SELECT m.ts_ns, ((list_position($inos, m.ino) - 1)::BIGINT << 50) + m.offset_bytes AS offset_bytes,
       m.op, d.c_ns AS done_ns
FROM m ASOF LEFT JOIN (SELECT offset_bytes::BIGINT AS off, op, start_ns, c_ns FROM disk_io
                       WHERE capture_id = $cid AND c_ns IS NOT NULL) d
  ON d.off = m.disk_off AND d.op = m.op AND d.start_ns >= m.ts_ns
"""


# ---- reading one capture --------------------------------------------------

def read_capture_table(store: Path, table: str, capture_id: str, schema: pa.Schema) -> pa.Table:
    """One capture's rows of a table, in the current schema (columns added
    since the store was written are NULL)."""
    files = sorted((store / table / f"capture={capture_id}").glob("*.parquet"))
    if not files:
        return schema.empty_table()
    parts = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (pa.ArrowInvalid, OSError) as e:
            raise MergeError(f"{f}: unreadable: {e}") from None
        cols = [t.column(n).cast(fld.type) if n in t.column_names else pa.nulls(t.num_rows, fld.type)
                for n, fld in zip(schema.names, schema)]
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(parts)


def _one_capture(store: Path, capture_id: str | None, what: str) -> str:
    caps = captures(store)
    if capture_id:
        if capture_id not in caps:
            raise MergeError(f"{store}: no capture {capture_id} (has: {', '.join(caps) or 'none'})")
        return capture_id
    if len(caps) != 1:
        raise MergeError(f"{store}: {len(caps)} captures; name the {what} one with "
                         f"--{what}-capture ({', '.join(caps) or 'none'})")
    return caps[0]


def _levels(dm: pa.Table) -> set[str]:
    return set(dm.column("level").to_pylist())


# ---- the merge ----------------------------------------------------------------

def _set_column(t: pa.Table, name: str, arr) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, t.schema.field(i), pa.array(arr, t.schema.field(i).type))


def _remap(t: pa.Table, name: str, mapping: dict[int, int]) -> pa.Table:
    if name not in t.column_names or not mapping or not t.num_rows:
        return t
    a = t.column(name).to_numpy(zero_copy_only=False).copy()
    for old, new in mapping.items():
        a[a == old] = new
    return _set_column(t, name, a)


def _shift_ts(t: pa.Table, offset_ns: int, clamp: bool) -> tuple[pa.Table, int]:
    """Host times onto the guest's clock: ts - offset.  An event from
    before the guest's clock started (before the VM booted: QEMU opening
    the image, the host's own I/O) has no time there and no guest I/O to
    belong to: it is left out and counted (the host store keeps it).  With
    `clamp` (the agent's end-of-capture counters) it is kept at time 0."""
    if "ts_ns" not in t.column_names or not t.num_rows:
        return t, 0
    ts = t.column("ts_ns").to_numpy().astype(np.int64)
    out = ts - np.int64(offset_ns)
    before = out < 0
    if clamp:
        return _set_column(t, "ts_ns", np.maximum(out, 0).astype(np.uint64)), 0
    if before.any():
        t, out = t.filter(pa.array(~before)), out[~before]
    for name in REQUEST_TIMES:     # (a block_request's phase times; 0: not seen)
        if name in t.column_names:
            v = t.column(name).to_numpy().astype(np.int64)
            t = _set_column(t, name, np.where((v != 0) & (v > offset_ns), v - offset_ns,
                                              0).astype(np.uint64))
    return _set_column(t, "ts_ns", out.astype(np.uint64)), int(before.sum())


# the times a block_request record (record --per-request) carries besides ts_ns
REQUEST_TIMES = ("q_ns", "g_ns", "i_ns", "d_ns")


def _hooks(meta: dict) -> dict:
    try:
        return json.loads(meta.get("hooks_json") or "{}")
    except json.JSONDecodeError:
        return {}


def _merged_hooks(host: dict, guest: dict) -> dict:
    """Both sides' hooks as one: a hook one side attached is attached (the
    guest skips the host FS's image-access hooks, which the host uses)."""
    out = {**host, **guest}
    for name, how in host.items():
        if how in ("tp_btf", "raw_tp") and out[name] not in ("tp_btf", "raw_tp"):
            out[name] = how
    return out


@dataclass
class MergeResult:
    capture_id: str
    offset: ClockOffset | None
    offset_ns: int
    remapped: dict[int, int]
    records: int
    before_guest: dict[str, int]   # host events from before the guest's clock started, left out


def _both(gmeta: dict, hmeta: dict, col: str) -> int | None:
    """A count over both sides; NULL if neither side counted it."""
    g, h = gmeta.get(col), hmeta.get(col)
    return None if g is None and h is None else (g or 0) + (h or 0)


def merge(guest_store, host_store, out_store, *, guest_capture: str | None = None,
          host_capture: str | None = None, image_offset: int = 0,
          offset_ns: int | None = None, outliers: float = 0.001) -> MergeResult:
    """Write the guest and host captures as one capture of `out_store`."""
    from nestrace.query.session import raw_tables
    gs, hs = check_store(guest_store), check_store(host_store)
    gid = _one_capture(gs, guest_capture, "guest")
    hid = _one_capture(hs, host_capture, "host")
    schemas = raw_tables()
    g = {t: read_capture_table(gs, t, gid, s) for t, s in schemas.items()}
    h = {t: read_capture_table(hs, t, hid, s) for t, s in schemas.items()}
    gmeta, hmeta = g["capture_meta"].to_pylist()[0], h["capture_meta"].to_pylist()[0]
    image = _image_of(g, h, gs, hs, gid, hid, gmeta, hmeta, image_offset)
    est = None
    if offset_ns is None:
        est = _estimate(gs, hs, gid, hid, image, image_offset, outliers)
        offset_ns = est.offset_ns
    remapped = _remapped_devs(g, h)
    cid = f"{gid}+{hid}"
    out = init_store(out_store)
    with writing(out, f"nestrace merge {cid}"):
        if cid in captures(out):
            raise MergeError(f"{out}: already has capture {cid}")
        with publishing(out, cid):
            records, before_guest = _write_tables(out, cid, schemas, g, h, hs, offset_ns,
                                                  remapped, image, image_offset, gmeta, hmeta)
            meta = _merged_meta(cid, gs, hs, gid, hid, gmeta, hmeta, image, image_offset,
                                offset_ns, est, remapped, before_guest, records)
            write_capture_table(out, "capture_meta", cid,
                                pa.Table.from_pylist([meta], schema=table_schema("capture_meta")))
    return MergeResult(cid, est, offset_ns, remapped, records, before_guest)


def _image_of(g, h, gs, hs, gid, hid, gmeta: dict, hmeta: dict, image_offset: int) -> dict:
    """The two captures checked to be a guest's and a host's, and the image
    the host side traced: its inode, path, format, chain and cluster map."""
    gl, hl = _levels(g["device_map"]), _levels(h["device_map"])
    if gl != {"vfs", "vdisk"}:
        raise MergeError(f"{gs}: capture {gid} has levels {sorted(gl)}: a guest capture has "
                         "vfs and vdisk only (`nestrace record --side guest`)")
    if hl == {"disk"} and json.loads(hmeta.get("stack_json") or "{}").get("host_fs") == "none":
        raise MergeError(f"{hs}: capture {hid} is the host side of a virtual disk on a host "
                         "block device (no host FS): merge pairs a guest with an image file's "
                         "accesses, and has none to pair here")
    if hl != {"hostfs", "disk"}:
        raise MergeError(f"{hs}: capture {hid} has levels {sorted(hl)}: a host capture has "
                         "hostfs and disk only (`nestrace record --side host --image FILE`)")
    if gmeta["schema_version"] != hmeta["schema_version"]:
        raise MergeError(f"record layouts differ: guest {gmeta['schema_version']}, "
                         f"host {hmeta['schema_version']}: record both with one nestrace version")
    host_stack = json.loads(hmeta.get("stack_json") or "{}")
    image_ino, image_path = host_stack.get("image_ino"), host_stack.get("image_path", "")
    if not image_ino:
        raise MergeError(f"{hs}: capture {hid} names no image file in its stack_json")
    fmt = host_stack.get("image_format", "raw")
    inos = [image_ino, *(b["ino"] for b in host_stack.get("backing_files", []))]
    clusters = None
    if fmt in MAPPED:
        clusters = _cluster_map(h["extent_maps"], inos)
        if clusters is None:
            raise MergeError(f"{hs}: capture {hid}: the {fmt} image {image_path} has no cluster "
                             "map stored (`record --side host` could not read it, and said why)")
        if image_offset:
            raise MergeError("--image-offset is for a raw image's partition or loop offset; "
                             f"{image_path} is {fmt}, whose cluster map places the guest's bytes")
    elif fmt != "raw":
        raise MergeError(f"{hs}: capture {hid}: the image {image_path} is {fmt}, and a {fmt} "
                         "image puts guest offsets where its own tables say: nestrace maps "
                         f"{FOLLOWED} images only")
    return {"ino": image_ino, "path": image_path, "format": fmt, "inos": inos,
            "clusters": clusters, "host_stack": host_stack}


def _estimate(gs, hs, gid, hid, image: dict, image_offset: int, outliers: float) -> ClockOffset:
    """The clock offset from the guest's virtual-disk requests and the
    host's accesses to the image."""
    from nestrace.query.session import Session
    with Session(gs) as s:
        greq = s.query("SELECT d_ns, c_ns, offset_bytes, op FROM block_requests "
                       "WHERE capture_id = ? AND level = 'vdisk' AND c_ns IS NOT NULL "
                       "AND offset_bytes IS NOT NULL AND op IN ('read', 'write')", [gid])
    with Session(hs) as s:
        hacc = s.query(HOST_ACCESSES, {"cid": hid, "inos": image["inos"]})
    if image["clusters"] is not None:
        greq = _through_clusters(greq, image["clusters"])
    return estimate_offset(greq, hacc, image_offset=image_offset, outliers=outliers)


def _remapped_devs(g, h) -> dict[int, int]:
    """Host devices the guest also uses get numbers of their own."""
    gdevs = set(g["device_map"].column("dev").to_pylist())
    hdevs = sorted(set(h["device_map"].column("dev").to_pylist()))
    remapped, n = {}, 0
    for d in hdevs:
        if d in gdevs:
            while kdev(REMAP_MAJOR, n) in gdevs | set(hdevs):
                n += 1
            remapped[d] = kdev(REMAP_MAJOR, n)
            n += 1

    return remapped


def _write_tables(out, cid, schemas, g, h, hs, offset_ns, remapped, image, image_offset,
                  gmeta, hmeta) -> tuple[int, dict]:
    """Every record table but capture_meta: the host's moved onto the
    guest's clock, its CPUs and clashing devices renumbered."""
    records, before_guest = 0, {}
    cpu_tables = set(kernel_tables()) | {"lost_events"}
    for table, schema in schemas.items():
        if table == "capture_meta":
            continue
        gt, ht = g[table], h[table]
        ht, n_before = _shift_ts(ht, offset_ns, clamp=table == "agent_stats")
        if n_before:
            before_guest[table] = n_before
            if table == "hostfs_events" and not ht.num_rows:
                raise MergeError(f"{hs}: every host event of {table} is from before the guest's "
                                 f"clock started (offset {offset_ns} ns): the offset is wrong "
                                 "or the captures are of different runs")
        if table in cpu_tables:
            ht = _set_column(ht, "cpu", ht.column("cpu").to_numpy().astype(np.uint32) + HOST_CPU_BASE) \
                if ht.num_rows else ht
        # (every column naming a device, physical_dev too: where the
        # image's extents are)
        for col in ("dev", "backing_dev", "physical_dev"):
            ht = _remap(ht, col, remapped)
        if table == "device_map":
            gt = _vdisk_backing(gt, ht, image["ino"], image["path"], image_offset,
                                image["format"], gmeta)
            ht = _fill(ht, "machine", hmeta["machine"])
        t = pa.concat_tables([gt, ht])
        t = _set_column(t, "capture_id", [cid] * t.num_rows)
        if table in kernel_tables() and table != "agent_stats":
            records += t.num_rows
        write_capture_table(out, table, cid, t)
    return records, before_guest


def _merged_meta(cid, gs, hs, gid, hid, gmeta, hmeta, image, image_offset, offset_ns, est,
                 remapped, before_guest, records) -> dict:
    """The merged capture's capture_meta row."""
    starts = [gmeta["start_ns"], hmeta["start_ns"] - offset_ns]
    ends = [gmeta["end_ns"], hmeta["end_ns"] - offset_ns]
    meta = dict(gmeta)
    meta.update({
        "capture_id": cid,
        "start_ns": max(min(starts), 0), "end_ns": max(ends),
        "command": gmeta["command"] or hmeta["command"],
        "command_exit": (gmeta.get("command_exit") if gmeta["command"]
                         else hmeta.get("command_exit")),
        "hooks_json": json.dumps(_merged_hooks(_hooks(hmeta), _hooks(gmeta))),
        "settings_json": json.dumps({side: json.loads(m.get("settings_json") or "null")
                                     for side, m in (("guest", gmeta), ("host", hmeta))}),
        "stack_json": json.dumps({
            "side": "merged",
            "guest": {"capture_id": gid, "store": str(gs), "machine": gmeta["machine"],
                      "kernel": gmeta["kernel"], "start_ns": gmeta["start_ns"],
                      "end_ns": gmeta["end_ns"],
                      "stack": json.loads(gmeta.get("stack_json") or "{}")},
            "host": {"capture_id": hid, "store": str(hs), "machine": hmeta["machine"],
                     "kernel": hmeta["kernel"], "stack": image["host_stack"],
                     # on the guest's clock
                     "start_ns": max(hmeta["start_ns"] - offset_ns, 0),
                     "end_ns": max(hmeta["end_ns"] - offset_ns, 0),
                     "cpu_base": HOST_CPU_BASE,
                     "remapped_devs": {str(k): v for k, v in remapped.items()},
                     "events_before_guest_clock": before_guest},
            "image_offset_bytes": image_offset}),
        "lost_total": (gmeta["lost_total"] or 0) + (hmeta["lost_total"] or 0),
        "hook_misses": _both(gmeta, hmeta, "hook_misses"),
        "completions_missed": _both(gmeta, hmeta, "completions_missed"),
        "requests_unfinished": _both(gmeta, hmeta, "requests_unfinished"),
        "hook_misses_json": json.dumps({"guest": json.loads(gmeta["hook_misses_json"] or "{}"),
                                        "host": json.loads(hmeta["hook_misses_json"] or "{}")}),
        "records_total": records,
        "tool_version": __version__,
        "clock_offset_ns": offset_ns,
        "clock_offset_err_ns": est.err_ns if est else 0,
        "clock_offset_pairs": est.pairs if est else 0,
    })
    return meta


def _cluster_map(extent_maps: pa.Table, inos: list[int]) -> pa.Table | None:
    """The host capture's image cluster map (the snapshot at end, else at
    start) as (lo, ph, len), or None when it has none.  ph is in the file
    the byte is read from: the image (`inos[0]`), or file k of its backing
    chain, at k << 50."""
    rows = [r for r in extent_maps.to_pylist() if r["role"] == "vdisk_image"]
    phase = "end" if any(r["phase"] == "end" for r in rows) else "start"
    rows = [r for r in rows if r["phase"] == phase and r["ino"] in inos]
    if not rows:
        return None
    return pa.table({"lo": [r["logical_bytes"] for r in rows],
                     "ph": [(inos.index(r["ino"]) << 50) + r["physical_bytes"] for r in rows],
                     "len": [r["length_bytes"] for r in rows]})


def _through_clusters(greq: pa.Table, clusters: pa.Table) -> pa.Table:
    """Guest requests with their start offset carried into the image
    (requests starting in a cluster with no place in the image dropped)."""
    con = duckdb.connect()
    con.register("g", greq)
    con.register("m", clusters)
    from nestrace.query.session import arrow_of
    return arrow_of(con.sql("""
        SELECT g.d_ns, g.c_ns, (m.ph + (g.offset_bytes - m.lo))::UBIGINT AS offset_bytes, g.op
        FROM g JOIN m ON g.offset_bytes >= m.lo AND g.offset_bytes < m.lo + m.len"""))


def _fill(t: pa.Table, name: str, value) -> pa.Table:
    """Fill NULLs of a column with value."""
    col = pc.fill_null(t.column(name), pa.scalar(value, t.schema.field(name).type))
    return t.set_column(t.schema.get_field_index(name), t.schema.field(name), col)


def _vdisk_backing(gdm: pa.Table, hdm: pa.Table, image_ino: int, image_path: str,
                   image_offset: int, image_format: str, gmeta: dict) -> pa.Table:
    """The guest's virtual disk is backed by the host's image: what a loop
    device's row says in a one-kernel capture (dio: unknown, NULL)."""
    hostfs_dev = [r["dev"] for r in hdm.to_pylist() if r["level"] == "hostfs"][0]
    rows = gdm.to_pylist()
    for r in rows:
        r["machine"] = r["machine"] or gmeta["machine"]
        if r["level"] == "vdisk":
            r.update(backing_dev=hostfs_dev, backing_ino=image_ino, backing_path=image_path,
                     backing_offset_bytes=image_offset, dio=None, backing_format=image_format)
    return pa.Table.from_pylist(rows, schema=gdm.schema)
