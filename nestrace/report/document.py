"""`nestrace report`: per-level and cross-level numbers of one capture, as
one JSON document (a stable interface, keys in docs/reference/report.md) or as
terminal tables."""
from __future__ import annotations

import json
import os
import time

import pyarrow.parquet as pq

from nestrace.query.session import LINKS_INPUTS, Session
from nestrace.store import manifest
from nestrace.store.files import check_store, writing

REPORT_VERSION = 1
LEVELS = ("vfs", "vdisk", "netfs", "hostfs", "disk")
# (rows of a level each: top down, as the levels are)
LEVEL_ORDER = "list_position(['vfs', 'vdisk', 'netfs', 'hostfs', 'disk'], level)"
VIEW = {"vfs": "vfs_io", "vdisk": "vdisk_io", "netfs": "netfs_io", "hostfs": "hostfs_io",
        "disk": "disk_io"}


def _side_span(meta: dict, side: str) -> list[float] | None:
    """[from, to] seconds of the merged capture one side recorded (NULL
    for stores merged before merge kept them)."""
    try:
        st = json.loads(meta.get("stack_json") or "{}")[side]
        return [round((st["start_ns"] - meta["start_ns"]) / 1e9, 3),
                round((st["end_ns"] - meta["start_ns"]) / 1e9, 3)]
    except (KeyError, TypeError, ValueError):
        return None


def _chain_files(stack_json: str | None) -> dict[str, bool]:
    """The host stack's files behind its image, in the order of its chain
    (a merged capture's host's): path -> whether it is an extent file of
    the image (a split vmdk) rather than a backing file."""
    try:
        st = json.loads(stack_json or "{}")
    except ValueError:
        return {}
    st = st.get("host", {}).get("stack", st) if st.get("side") == "merged" else st
    return {b["path"]: bool(b.get("extent")) for b in st.get("backing_files") or []}


def _one(s: Session, sql: str, params: list) -> dict:
    rows = s.rows(sql, params)
    return rows[0] if rows else {}


def _limits(settings_json: str | None) -> dict:
    """What the capture's settings say about its own edges: cut short at
    --max-size, and whether its store was on the traced stack (a merged
    capture: either side)."""
    st = json.loads(settings_json) if settings_json else {}
    sides = [st[k] for k in ("guest", "host") if isinstance(st.get(k), dict)] or [st]
    max_size = [x.get("max_size_bytes") for x in sides if x.get("max_size_reached")]
    traced = [x["store_traced_at"] for x in sides if x.get("store_traced_at")]
    # (the vfs level is the guest side's)
    vfs = st["guest"] if isinstance(st.get("guest"), dict) else st
    only = {k: vfs.get(k) for k in ("pid", "cgroup")}
    return {"max_size_reached": bool(max_size), "max_size_bytes": max_size[0] if max_size else None,
            "store_traced_at": traced[0] if traced else None,
            "start_snapshot_truncated": any(x.get("start_snapshot_truncated") for x in sides),
            "redacted": any(x.get("redact") for x in sides),
            "vfs_only": only if any(v is not None for v in only.values()) else None}


TOP_FILES = 10    # report's file and process lists: the busiest, by bytes


def _busiest(s: Session, view: str, columns: str, key: str, p: list) -> tuple[list[dict], int]:
    """The first TOP_FILES rows of a per-file or per-process view by bytes
    read and written (then calls), and how many rows it has."""
    rows = s.rows(f"SELECT {columns}, count(*) OVER () AS n FROM {view} WHERE capture_id = ? "
                  f"ORDER BY read_bytes + write_bytes DESC, calls DESC, {key} LIMIT {TOP_FILES}", p)
    total = rows[0]["n"] if rows else 0
    for r in rows:
        del r["n"]
    return rows, total


# the level views most of the report's queries read, computed once: each
# use of vfs_io or hostfs_io computes it from the events again (the seek
# table's hostfs branch alone took 1 s at 10 M events)
def _clock(s: Session, meta: dict, p: list) -> dict | None:
    """A merged capture's clock offset, and the span each side recorded."""
    if meta.get("clock_offset_ns") is not None:
        host = _one(s, "SELECT machine FROM base_levels WHERE capture_id = ? AND level = 'disk'", p)
        return {"host_machine": host.get("machine"), "offset_ns": meta["clock_offset_ns"],
                "err_ns": meta["clock_offset_err_ns"], "pairs": meta["clock_offset_pairs"],
                "guest_s": _side_span(meta, "guest"), "host_s": _side_span(meta, "host")}
    return None


def _image(s: Session, meta: dict, p: list) -> dict | None:
    """The image behind the virtual disk, its map and backing files."""
    if "vdisk" in {r["level"] for r in s.rows(
            "SELECT level FROM device_map WHERE capture_id = ? AND backing_ino <> 0", p)}:
        image = _one(s, """
            SELECT any_value(d.backing_path) AS path,
                   coalesce(any_value(d.backing_format), 'raw') AS format,
                   any_value(m.source) AS map_source,
                   count(m.image_offset_bytes) AS map_extents,
                   coalesce(sum(m.length_bytes) FILTER (WHERE m.image_offset_bytes IS NOT NULL),
                            0)::BIGINT AS mapped_bytes
            FROM device_map d LEFT JOIN map_vdisk_image m USING (capture_id)
            WHERE d.capture_id = ? AND d.level = 'vdisk'""", p)
        # the files of its backing chain that serve part of the disk
        image["backing_files"] = s.rows("""
            SELECT any_value(e.path) AS path, any_value(m.bytes)::BIGINT AS mapped_bytes
            FROM (SELECT capture_id, image_ino, sum(length_bytes) AS bytes FROM map_vdisk_image
                  GROUP BY ALL) m
            JOIN extent_maps e ON e.capture_id = m.capture_id AND e.ino = m.image_ino
             AND e.role = 'vdisk_image'
            JOIN _base_image_files f ON f.capture_id = m.capture_id AND f.ino = m.image_ino
            WHERE m.capture_id = ? AND f.shift > 0
            GROUP BY m.image_ino ORDER BY any_value(f.shift)""", p)
        # a vmdk whose descriptor is a file of its own: the extent files
        # that hold the disk, apart from the parents it is read through
        # (in the chain's order, which record stored)
        chain = _chain_files(meta.get("stack_json"))
        order = {path: i for i, path in enumerate(chain)}
        files = sorted(image["backing_files"], key=lambda b: order.get(b["path"], len(order)))
        image["extent_files"] = [b for b in files if chain.get(b["path"])]
        image["backing_files"] = [b for b in files if not chain.get(b["path"])]
        return image
    return None


def _levels(s: Session, p: list) -> tuple[list[dict], set[str]]:
    """Each level's counts, seeks, phases and queue depths; and the levels
    the capture traced."""
    seek = {r["level"]: r for r in s.rows("SELECT * FROM seek_summary WHERE capture_id = ? "
                                          "ORDER BY level", p)}
    phases: dict = {}
    # (all of a level's devices together; in btt's order, so that the JSON
    # is the same document at each run)
    for r in s.rows("SELECT level, phase, n, min_ns, avg_ns, median_ns, p99_ns, max_ns "
                    "FROM phases_level_stats WHERE capture_id = ? ORDER BY level, "
                    "list_position(['q2g', 'g2i', 'i2d', 'd2c', 'q2c', 'q2m'], phase)", p):
        phases.setdefault(r.pop("level"), {})[r.pop("phase")] = r
    depth: dict = {}
    for r in s.rows("SELECT level, dev, ios, ios_unended, mean_depth, median_depth, p99_depth, "
                    "max_depth, "
                    "avg_in_flight, busy_fraction, interarrival_median_ns, latency_median_ns, "
                    "latency_p99_ns FROM depth_summary WHERE capture_id = ? ORDER BY dev", p):
        depth.setdefault(r.pop("level"), []).append(r)
    # one side of a VM (record --side) traces two levels; an older store
    # without a device map is taken to have traced all four
    traced = {r["level"] for r in s.rows(
        "SELECT DISTINCT level FROM device_map WHERE capture_id = ?", p)} or set(LEVELS)
    levels = []
    # (netfs only where a network hop was traced: no other report changes)
    for lv in [lv for lv in LEVELS if lv != "netfs" or lv in traced]:
        size = "ret_bytes" if lv == "vfs" else "bytes"
        r = _one(s, f"""
            SELECT count(*) AS requests,
                   count(*) FILTER (WHERE op = 'read') AS reads,
                   count(*) FILTER (WHERE op = 'write') AS writes,
                   coalesce(sum({size}) FILTER (WHERE op = 'read'), 0)::BIGINT AS read_bytes,
                   coalesce(sum({size}) FILTER (WHERE op = 'write'), 0)::BIGINT AS write_bytes,
                   median({size}) FILTER (WHERE op IN ('read', 'write'))::DOUBLE AS median_size_bytes
            FROM {VIEW[lv]} WHERE capture_id = ?""", p)
        sk = seek.get(lv, {})
        levels.append({
            "level": lv, "traced": lv in traced, **r,
            "sequential_fraction": sk.get("sequential_fraction"),
            "seek_median": sk.get("median_abs"), "seek_p90": sk.get("p90_abs"),
            "seek_unit": "sectors" if lv in ("vdisk", "disk") else "bytes",
            "phases": phases.get(lv, {}),
            "depth": depth.get(lv, []),
        })
    return levels, traced


def _journals(s: Session, p: list) -> list[dict]:
    # where record found each file system's journal (links calls the
    # writes there journal, and on that disk no others)
    # (one per file system: a capture may trace several guest ones)
    return s.rows("""
        SELECT d.level, any_value(f.fs_type) AS fs_type, nullif(any_value(e.ino), 0) AS ino,
               min(e.physical_bytes)::BIGINT AS offset_bytes, sum(e.length_bytes)::BIGINT AS bytes,
               count(*) AS extents
        FROM extent_maps e
        JOIN device_map d ON d.capture_id = e.capture_id AND d.dev = e.physical_dev
         AND d.level IN ('vdisk', 'disk')
        LEFT JOIN device_map f ON f.capture_id = e.capture_id AND f.dev = e.dev
         AND f.level = CASE d.level WHEN 'vdisk' THEN 'vfs' ELSE 'hostfs' END
        WHERE e.capture_id = ? AND e.role = 'fs_journal'
        GROUP BY d.level, e.dev
        ORDER BY list_position(['vdisk', 'disk'], d.level), offset_bytes""", p)


def _partitions(s: Session, p: list) -> list[dict]:
    # a traced file system on a partition, and the requests of its disk
    # wholly outside it: other file systems' (links calls them other, or
    # metadata, readahead, discard by their flags); the host's only on one
    # disk, as links
    # (several on the virtual disk when record traced several guest file
    # systems: outside means outside all of them)
    return s.rows("""
        WITH f AS (SELECT * FROM _base_fs_partitions WHERE capture_id = ?),
        o AS (
          SELECT b.level, count(*) AS n, sum(b.bytes)::BIGINT AS bytes
          FROM block_requests b
          WHERE b.capture_id = ? AND b.level IN (SELECT level FROM f)
            AND NOT EXISTS (SELECT 1 FROM f WHERE f.level = b.level
                            AND b.offset_bytes + b.bytes > f.lo AND b.offset_bytes < f.hi)
          GROUP BY b.level)
        SELECT f.level, f.fs_level, f.lo AS part_start_bytes, (f.hi - f.lo)::BIGINT AS part_bytes,
               coalesce(o.n, 0) AS outside_requests, coalesce(o.bytes, 0)::BIGINT AS outside_bytes
        FROM f LEFT JOIN o USING (level)
        ORDER BY list_position(['vdisk', 'disk'], f.level), f.lo""", p + p)


def _attribution(s: Session, levels: list[dict], p: list) -> tuple[list, list, set[str]]:
    """links_summary's and links_to_vfs's rows of the hops whose upper
    level saw something, and those levels."""
    links = s.rows("SELECT upper_level, lower_level, kind, attributed, requests, bytes, fraction "
                   "FROM links_summary WHERE capture_id = ? "
                   "ORDER BY lower_level, bytes DESC, upper_level, kind, attributed", p)
    to_app = s.rows("SELECT level, bytes, app_bytes, fraction FROM links_to_vfs WHERE capture_id = ? "
                    "ORDER BY list_position(['vdisk', 'disk'], level)", p)
    # Attribution needs the stack's offset maps and an upper level that saw
    # something: an imported blktrace has neither, and its hops would only
    # list every byte as unattributed.
    mapped = _one(s, "SELECT count(*) AS n FROM extent_maps WHERE capture_id = ?", p)["n"]
    seen = {lv["level"] for lv in levels if lv["requests"]} if mapped else set()
    links = [r for r in links if r["upper_level"] in seen]
    to_app = [r for r in to_app if "vfs" in seen]
    return links, to_app, seen


REPORT_CACHE = ["vfs_io", "hostfs_io"]


def build(s: Session, capture_id: str | None = None) -> dict:
    cid = s.capture(capture_id)
    p = [cid]
    s.cache(REPORT_CACHE)   # (before links: on a store not correlated, links reads them too)
    s.cache_links()
    meta = _one(s, "SELECT machine, kernel, start_ns, end_ns, lost_total, records_total, hook_misses, "
                   "completions_missed, requests_unfinished, "
                   "clock_offset_ns, clock_offset_err_ns, clock_offset_pairs, stack_json, settings_json "
                   "FROM capture_meta WHERE capture_id = ?", p)
    clock = _clock(s, meta, p)
    image = _image(s, meta, p)
    levels, traced = _levels(s, p)
    amp = [r for r in s.rows("SELECT level, op, requests, bytes, ratio_to_above, ratio_to_app "
                             "FROM amplification WHERE capture_id = ? ORDER BY op, depth", p)
           if r["level"] in traced]
    links, to_app, seen = _attribution(s, levels, p)
    rmw = s.rows("SELECT hop, partial_writes, rmw_writes, reads, read_bytes, write_bytes, "
                 "read_per_write, extra_ns FROM rmw_summary WHERE capture_id = ? ORDER BY hop", p)
    ra = s.rows("SELECT level, filled_bytes, readahead_bytes, used_bytes, unused_bytes, "
                "unused_fraction, read_filled_bytes, write_filled_bytes, fault_filled_bytes, other_filled_bytes "
                "FROM readahead_summary WHERE capture_id = ? ORDER BY " + LEVEL_ORDER, p)
    sync = s.rows("SELECT level, writes, stable_writes, flushes, fsync_bound_writes, stable_fraction, "
                  "range_syncs, range_sync_bound_writes "
                  "FROM sync_transform WHERE capture_id = ? ORDER BY " + LEVEL_ORDER, p)
    hints = s.rows("SELECT syscall, advice, reads, calls, failed, range_bytes, to_end_calls, tied_requests, "
                   "tied_bytes FROM hints_summary WHERE capture_id = ? "
                   "ORDER BY syscall, advice NULLS FIRST", p)
    discard = s.rows("SELECT level, requests, discard_bytes, zeroes_bytes, tied_bytes, tied_fraction, "
                     "lag_median_ns FROM discard_summary WHERE capture_id = ? "
                     "ORDER BY list_position(['vdisk', 'hostfs', 'disk'], level)", p)
    # where an app read's or write's time goes, level by level: only when
    # the levels from the calls to the host disk were traced (one side of a
    # VM would put all of the virtual disk's service time on the host FS;
    # the raw baseline has no host FS, its host_fs part is the loop's own
    # path) and the calls' requests could be tied to them
    latency = []
    if {"vfs", "vdisk", "disk"} <= traced and {"vfs", "vdisk"} <= seen:
        latency = s.rows(
            "SELECT class, n AS calls, n_unended AS calls_unended, total_ns, guest_service_ns, "
            "guest_queue_ns, host_fs_ns, host_queue_ns, device_ns FROM latency_breakdown_summary "
            "WHERE capture_id = ? "
            "ORDER BY op, bin_max_bytes NULLS LAST", p)
    journals = _journals(s, p)
    partitions = _partitions(s, p)
    # the files and the processes the application used most, by bytes
    # (the vfs level alone: views vfs_files and vfs_processes have what
    # each cost below)
    files, files_total = _busiest(s, "_vfs_files_app", "path, dev, ino, calls, reads, writes, "
                                  "syncs, read_bytes, write_bytes, busy_ns, processes", "dev, ino", p)
    procs, procs_total = _busiest(s, "_vfs_processes_app", "pid, comm, threads, files, calls, "
                                  "reads, writes, syncs, read_bytes, write_bytes, busy_ns", "pid", p)
    lost = _one(s, "SELECT coalesce(sum(ringbuf_drops), 0)::BIGINT AS ringbuf_drops, "
                   "coalesce(sum(seq_gaps), 0)::BIGINT AS seq_gaps FROM lost_events "
                   "WHERE capture_id = ?", p)
    return {
        "report_version": REPORT_VERSION,
        "capture_id": cid,
        "machine": meta.get("machine"),
        "kernel": meta.get("kernel"),
        "duration_s": ((meta.get("end_ns") or 0) - (meta.get("start_ns") or 0)) / 1e9,
        "records": meta.get("records_total"),
        "clock": clock,
        **_limits(meta.get("settings_json")),
        "image": image,
        "lost": {"total": meta.get("lost_total"), **lost, "hook_misses": meta.get("hook_misses"),
                 "completions_missed": meta.get("completions_missed"),
                 "requests_unfinished": meta.get("requests_unfinished")},
        "levels": levels,
        "amplification": amp,
        "attribution": {"to_app": to_app, "links": links},
        "journals": journals,
        "partitions": partitions,
        "rmw": rmw,
        "readahead": ra,
        "sync": sync,
        "discard": discard,
        "hints": hints,
        "latency": latency,
        "files": files,
        "files_total": files_total,
        "processes": procs,
        "processes_total": procs_total,
    }


def correlate(store: str | os.PathLike, memory_limit: str | None = None,
              progress=None) -> dict[str, int]:
    """Store the expensive intermediates per capture (block_requests, then
    links, then rmw) in STORE/<view>/capture=<id>/ so later sessions read them
    instead of recomputing.  Idempotent.  Returns links rows per capture.
    progress(view, rows, seconds) after each view is stored."""
    from nestrace.query.session import MATERIALIZED
    p = check_store(store)
    out = {}
    # (without the late modules: binding follow_io would plan links from
    # the raw tables before they are stored, ~0.6 s for nothing)
    with writing(p, "nestrace correlate"), \
            Session(p, memory_limit=memory_limit, late_modules=False) as s:
        caps = s.captures()
        for view in MATERIALIZED:
            t0, rows = time.monotonic(), 0
            if view == "links":
                s.cache(LINKS_INPUTS)
            elif view == "rmw":     # (its other map; LINKS_INPUTS are still cached)
                s.cache(["_map_disk"])
            src = f"_{view}_computed"
            if len(caps) > 1:
                # computed once for every capture, then written capture by
                # capture: the filter on the capture is not pushed through
                # links' joins, and each capture's COPY computed them all
                # (8 captures of 82k events: links 0.58 s per capture,
                # against 0.26 s for one alone)
                s.con.execute(f"CREATE OR REPLACE TEMP TABLE _correlate_{view} AS SELECT * FROM {src}")
                src = f"temp._correlate_{view}"
            for cid in caps:
                d = p / view / f"capture={cid}"
                d.mkdir(parents=True, exist_ok=True)
                tmp = d / "data.parquet.tmp"
                path = str(tmp).replace("'", "''")
                # (PARQUET_VERSION V2: its integers as deltas, as the capture's
                # own tables are, store.files.column_options: 10 M events'
                # requests written in 0.60 s, not 0.93, and read in half the time)
                s.con.execute(f"COPY (SELECT * FROM {src} WHERE capture_id = ?) TO "
                              f"'{path}' (FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2)",
                              [cid])
                # (out of the manifest while replaced: a correlate killed
                # here leaves the capture without it, computed when read)
                manifest.update(p, cid, drop=[d / "data.parquet"])
                os.replace(tmp, d / "data.parquet")
                manifest.update(p, cid, add=[d / "data.parquet"])
                n = pq.ParquetFile(d / "data.parquet").metadata.num_rows
                rows += n
                if view == "links":
                    out[cid] = n
            if len(caps) > 1:
                s.con.execute(f"DROP TABLE temp._correlate_{view}")
            s._use_stored_views(refresh=True)   # later views read what was just stored
            if progress:
                progress(view, rows, time.monotonic() - t0)
    return out
