"""`nestrace report`: per-level and cross-level numbers of one capture, as
one JSON document (a stable interface, keys in docs/report.md) or as
terminal tables."""
from __future__ import annotations

import json
import os
import time

import pyarrow.parquet as pq

from nestrace.query.session import LINKS_INPUTS, Session
from nestrace.store.files import check_store, writing

REPORT_VERSION = 1
LEVELS = ("vfs", "vdisk", "hostfs", "disk")
EXTENT_LINES = 8    # extent files of a split vmdk the terminal report names
VIEW = {"vfs": "vfs_io", "vdisk": "vdisk_io", "hostfs": "hostfs_io", "disk": "disk_io"}


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
    clock = None
    if meta.get("clock_offset_ns") is not None:
        host = _one(s, "SELECT machine FROM base_levels WHERE capture_id = ? AND level = 'disk'", p)
        clock = {"host_machine": host.get("machine"), "offset_ns": meta["clock_offset_ns"],
                 "err_ns": meta["clock_offset_err_ns"], "pairs": meta["clock_offset_pairs"],
                 "guest_s": _side_span(meta, "guest"), "host_s": _side_span(meta, "host")}
    image = None
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
    for lv in LEVELS:
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
    amp = [r for r in s.rows("SELECT level, op, requests, bytes, ratio_to_above, ratio_to_app "
                             "FROM amplification WHERE capture_id = ? ORDER BY op, depth", p)
           if r["level"] in traced]
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
    rmw = s.rows("SELECT hop, partial_writes, rmw_writes, reads, read_bytes, write_bytes, "
                 "read_per_write, extra_ns FROM rmw_summary WHERE capture_id = ? ORDER BY hop", p)
    ra = s.rows("SELECT level, filled_bytes, readahead_bytes, used_bytes, unused_bytes, "
                "unused_fraction, read_filled_bytes, write_filled_bytes, fault_filled_bytes, other_filled_bytes "
                "FROM readahead_summary WHERE capture_id = ? ORDER BY level", p)
    sync = s.rows("SELECT level, writes, stable_writes, flushes, fsync_bound_writes, stable_fraction, "
                  "range_syncs, range_sync_bound_writes "
                  "FROM sync_transform WHERE capture_id = ? ORDER BY level", p)
    hints = s.rows("SELECT syscall, advice, reads, calls, failed, range_bytes, to_end_calls, tied_requests, "
                   "tied_bytes FROM hints_summary WHERE capture_id = ? "
                   "ORDER BY syscall, advice NULLS FIRST", p)
    discard = s.rows("SELECT level, requests, discard_bytes, zeroes_bytes, tied_bytes, tied_fraction, "
                     "lag_median_ns FROM discard_summary WHERE capture_id = ? "
                     "ORDER BY list_position(['vdisk', 'hostfs', 'disk'], level)", p)
    # where an app read's or write's time goes, level by level: only when
    # all four levels were traced (one side of a VM would put all of the
    # virtual disk's service time on the host FS) and the calls' requests
    # could be tied to them
    latency = []
    if traced == set(LEVELS) and {"vfs", "vdisk"} <= seen:
        latency = s.rows(
            "SELECT class, n AS calls, n_unended AS calls_unended, total_ns, guest_service_ns, "
            "guest_queue_ns, host_fs_ns, host_queue_ns, device_ns FROM latency_breakdown_summary "
            "WHERE capture_id = ? "
            "ORDER BY op, bin_max_bytes NULLS LAST", p)
    # where record found each file system's journal (links calls the
    # writes there journal, and on that disk no others)
    # (one per file system: a capture may trace several guest ones)
    journals = s.rows("""
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
    # a traced file system on a partition, and the requests of its disk
    # wholly outside it: other file systems' (links calls them other, or
    # metadata, readahead, discard by their flags); the host's only on one
    # disk, as links
    # (several on the virtual disk when record traced several guest file
    # systems: outside means outside all of them)
    partitions = s.rows("""
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


# what an attributed link's kind says (links' kind column, in short)
KIND_GLOSS = {
    "sync": "sync: in flight with the upper I/O",
    "writeback": "writeback: after a write that dirtied the range",
    "rmw": "rmw: a read a partial write caused",
    "discard": "discard: after the upper discard of the range",
    "hint": "hint: a read a readahead, WILLNEED or POPULATE_READ call asked for",
}


def _fmt_bytes(b) -> str:
    if b is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024:
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} PiB"


def _fmt_ns(ns) -> str:
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} us"


def _table(title: str, columns, left=("level",), caption: str | None = None):
    """A report table: no vertical rules and one space's padding between
    columns (room for the per-level and phase tables in 80 columns: rich
    wraps a cell, not a header, where a table is too wide), numbers
    right-aligned."""
    from rich import box
    from rich.table import Table
    t = Table(title=title, box=box.SIMPLE_HEAD, caption=caption, caption_justify="left",
              pad_edge=False, collapse_padding=True)
    for c in columns:
        t.add_column(c, justify="left" if c in left else "right")
    return t


def _fmt(v, digits=2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def render(rep: dict, console=None, captures: int = 1) -> None:
    """The report as terminal tables; `captures`: how many the store holds
    (more than one: the header says so, and how to pick another)."""
    from rich.console import Console
    con = console or Console()
    of = f" (of {captures} in the store; --capture picks one)" if captures > 1 else ""
    con.print(f"[bold]capture {rep['capture_id']}[/]{of} on {rep['machine']} ({rep['kernel']}), "
              f"{rep['duration_s']:.1f} s, {rep['records']} records")
    if rep.get("max_size_reached"):
        con.print(f"[yellow]tracing stopped at --max-size ({_fmt_bytes(rep['max_size_bytes'])} of "
                  "records): what ran after it is not in this capture[/]")
    if rep.get("store_traced_at"):
        con.print(f"[yellow]the store was on the traced stack: nestrace's own writes to it "
                  f"(comm nestrace-agent) are in this capture from {rep['store_traced_at']} down[/]")
    if rep.get("vfs_only"):
        only = rep["vfs_only"]
        who = " and ".join(w for w in (
            f"process {only['pid']}" if only.get("pid") is not None else "",
            f"the tasks of cgroup {only['cgroup']} (and below)" if only.get("cgroup") else "")
            if w)
        con.print(f"[yellow]vfs: only the calls of {who} were recorded; the levels below carry "
                  "every process's I/O, and what the others caused is unattributed there[/]")
    if rep.get("start_snapshot_truncated"):
        con.print("[yellow]the guest FS had more regular files than the start snapshot takes: "
                  "a file past them read or written before a rewrite moved it is mapped where "
                  "the end snapshot has it[/]")
    ck = rep.get("clock")
    if ck:
        con.print(f"hostfs and disk recorded on {ck['host_machine']}, moved onto this clock: "
                  f"host - guest = {ck['offset_ns']} ns ± {ck['err_ns']} ns "
                  f"({ck['pairs']} bounds agree); times across the two carry ± {ck['err_ns']} ns")
        g, h = ck.get("guest_s"), ck.get("host_s")
        if g and h and (abs(g[0] - h[0]) > 1 or abs(g[1] - h[1]) > 1):
            con.print(f"[yellow]the guest recorded {g[0]:.1f}–{g[1]:.1f} s and the host "
                      f"{h[0]:.1f}–{h[1]:.1f} s of this capture: each level's totals are over its "
                      "own side's span[/]")
    im = rep.get("image")
    if im and im["format"] != "raw":
        # (a LUKS image holds the disk after its header: no clusters)
        how = "header's payload offset" if im["format"] == "luks" else "cluster map"
        con.print(f"image {im['path']}: {im['format']}, the virtual disk mapped into it by its "
                  f"{how} ({im['map_source']}): {im['map_extents']} extents, "
                  f"{_fmt_bytes(im['mapped_bytes'])} with a place in a file")
        ext = im.get("extent_files") or []
        for b in ext[:EXTENT_LINES]:
            con.print(f"  in its extent file {b['path']}: "
                      f"{_fmt_bytes(b['mapped_bytes'])} of the disk")
        if len(ext) > EXTENT_LINES:   # (a split disk can have hundreds; --json lists all)
            rest = ext[EXTENT_LINES:]
            con.print(f"  and {len(rest)} more extent files: "
                      f"{_fmt_bytes(sum(b['mapped_bytes'] for b in rest))} of the disk")
        for b in im.get("backing_files") or []:
            con.print(f"  through its backing file {b['path']}: "
                      f"{_fmt_bytes(b['mapped_bytes'])} of the disk read from it")
    # block levels' seeks in sectors, as btt counts them (the unit once,
    # under the table: the columns then fit 80 at ten million I/Os)
    levels = [lv for lv in rep["levels"] if lv.get("traced", True)]
    units = {lv["seek_unit"] for lv in levels}
    t = _table("Per level", ("level", "I/Os", "read", "written", "median\nsize", "sequential",
                             "seek\nmedian", "seek\np90"),
               caption="seek: block levels in 512-byte sectors, files in bytes"
               if "sectors" in units and len(units) > 1 else
               "seek: in 512-byte sectors" if "sectors" in units else None)
    for lv in levels:
        seek = (lambda d: "-" if d is None else str(d)) if lv["seek_unit"] == "sectors" \
            else _fmt_bytes
        t.add_row(lv["level"], str(lv["requests"]), _fmt_bytes(lv["read_bytes"]),
                  _fmt_bytes(lv["write_bytes"]), _fmt_bytes(lv["median_size_bytes"]),
                  _fmt(lv["sequential_fraction"]), seek(lv["seek_median"]), seek(lv["seek_p90"]))
    con.print(t)
    # phases no level has (no I/O scheduler: no insert; no merges) are
    # named under the table rather than given a column of dashes
    phases = ("q2g", "g2i", "i2d", "d2c", "q2c", "q2m")
    blk = [lv for lv in rep["levels"] if lv["phases"]]
    seen = [ph for ph in phases if any(lv["phases"].get(ph) for lv in blk)]
    unseen = [ph.upper() for ph in phases if ph not in seen]
    # (a row per statistic, as btt prints them: six phases of two numbers
    # each would not fit 80 columns side by side)
    t = _table("Block phases (btt)", ("level", "", *(ph.upper() for ph in seen)), left=("level", ""),
               caption=f"not seen: {', '.join(unseen)}" if unseen else None)
    for lv in blk:
        for stat, key in (("median", "median_ns"), ("p99", "p99_ns")):
            t.add_row(lv["level"] if stat == "median" else "", stat,
                      *("-" if not lv["phases"].get(ph) else _fmt_ns(lv["phases"][ph][key])
                        for ph in seen))
    if blk:
        con.print(t)
    # queues per device: a level of several devices (a btrfs host on two
    # disks) gets a row each, named by the device
    rows = [(lv, d) for lv in levels for d in lv.get("depth") or []]
    t = _table("Queue depth: I/Os in flight, and for how long",
               ("level", "at arrival\nmedian", "p99", "max", "mean in\nflight", "busy",
                "arrivals\nevery", "latency\nmedian", "latency\np99"),
               caption="at arrival: the I/O itself included; mean in flight: iostat's aqu-sz; "
                       "busy: %util; block levels: dispatch to completion (latency: D2C)")
    unended = {f"{lv['level']} {d['ios_unended']}" for lv, d in rows if d.get("ios_unended")}
    if unended:
        t.caption += ("; I/Os whose end was not seen (completion lost, or in flight at the "
                      f"end), counted in no depth: {', '.join(sorted(unended))}")
    for lv, d in rows:
        many = sum(1 for x, _ in rows if x is lv) > 1
        t.add_row(lv["level"] + (f" {d['dev'] >> 20}:{d['dev'] & 0xfffff}" if many else ""),
                  str(d["median_depth"]), str(d["p99_depth"]), str(d["max_depth"]),
                  _fmt(d["avg_in_flight"], 1), _fmt(d["busy_fraction"]),
                  _fmt_ns(d["interarrival_median_ns"]), _fmt_ns(d["latency_median_ns"]),
                  _fmt_ns(d["latency_p99_ns"]))
    if rows:
        con.print(t)
    t = _table("Where an app I/O's time goes: mean per call",
               ("class", "calls", "total", "guest", "vdisk\nqueue", "host FS", "host\nqueue",
                "device"), left=("class",),
               caption="guest: the guest FS and the syscall, outside its virtual-disk requests; "
                       "vdisk queue and host queue: Q to D; host FS: the virtual disk's D to C "
                       "not spent at the host disk (host FS, page cache, loop or hypervisor); "
                       "device: the host disk's D to C. Means: the parts add up to the total")
    unended = sum(r.get("calls_unended") or 0 for r in rep.get("latency") or [])
    if unended:
        t.caption += (f". Calls left out, a request they caused not seen to end (a lost "
                      f"completion): {unended}")
    for r in rep.get("latency") or []:
        t.add_row(r["class"], str(r["calls"]), *(_fmt_ns(r[k]) for k in (
            "total_ns", "guest_service_ns", "guest_queue_ns", "host_fs_ns", "host_queue_ns",
            "device_ns")))
    if t.row_count:
        con.print(t)
    files = rep.get("files") or []
    # (the paths' common directory said once, in the caption)
    paths = [f["path"] for f in files if f["path"]]
    under = os.path.commonpath([os.path.dirname(x) for x in paths]) if paths else "/"
    t = _table(f"Files: the {len(files)} busiest by bytes read and written"
               + (f", of {rep['files_total']}" if rep["files_total"] > len(files) else ""),
               ("file", "calls", "read", "written", "syncs", "mean call", "processes"),
               left=("file",), caption=(f"files under {under}; " if under != "/" else "")
               + "calls: the file's rows in vfs_io; view vfs_files has every file, and what "
                 "each cost at the levels below")
    for f in files:
        t.add_row(os.path.relpath(f["path"], under) if f["path"] else
                  f"{f['dev'] >> 20}:{f['dev'] & 0xfffff} inode {f['ino']}",
                  str(f["calls"]), _fmt_bytes(f["read_bytes"]), _fmt_bytes(f["write_bytes"]),
                  str(f["syncs"]), _fmt_ns(f["busy_ns"] / f["calls"]), str(f["processes"]))
    t.columns[0].overflow = "fold"     # (a path whole, over lines)
    if files:
        con.print(t)
    procs = rep.get("processes") or []
    t = _table(f"Processes: the {len(procs)} busiest by bytes read and written"
               + (f", of {rep['processes_total']}" if rep["processes_total"] > len(procs) else ""),
               ("pid", "comm", "threads", "files", "calls", "read", "written", "syncs",
                "mean call"), left=("comm",),
               caption="their calls on the traced file system; view vfs_processes has every "
                       "process, and what each cost at the levels below")
    for r in procs:
        t.add_row(str(r["pid"]), r["comm"], str(r["threads"]), str(r["files"]), str(r["calls"]),
                  _fmt_bytes(r["read_bytes"]), _fmt_bytes(r["write_bytes"]), str(r["syncs"]),
                  _fmt_ns(r["busy_ns"] / r["calls"]))
    if procs:
        con.print(t)
    t = _table("Amplification: bytes, x level above, x app",
               ("op", "level", "requests", "bytes", "x above", "x app"), left=("op", "level"))
    for r in rep["amplification"]:
        t.add_row(r["op"], r["level"], str(r["requests"]), _fmt_bytes(r["bytes"]),
                  _fmt(r["ratio_to_above"]), _fmt(r["ratio_to_app"]))
    con.print(t)
    t = _table("Attribution: lower-level bytes by cause", ("hop", "kind", "requests", "bytes", "share"),
               left=("hop", "kind"))
    kinds = [KIND_GLOSS[k] for k in dict.fromkeys(r["kind"] for r in rep["attribution"]["links"]
                                                   if r["attributed"]) if k in KIND_GLOSS]
    if any(r["kind"] == "nestrace" for r in rep["attribution"]["links"]):
        kinds.append("nestrace: nestrace's own writes to its store, on a traced disk")
    t.caption = "; ".join(kinds) or None
    for r in rep["attribution"]["links"]:
        t.add_row(f"{r['upper_level']}->{r['lower_level']}",
                  r["kind"] + ("" if r["attributed"] else " (unattributed)"),
                  str(r["requests"]), _fmt_bytes(r["bytes"]), _fmt(r["fraction"], 3))
    for r in rep["attribution"]["to_app"]:
        t.add_row(f"app->{r['level']}", "traced to an app syscall", "", _fmt_bytes(r["app_bytes"]),
                  _fmt(r["fraction"], 3))
    if t.row_count:
        con.print(t)
        if rep["journals"]:
            con.print("journal: the unexplained writes into the journals record found: " + "; ".join(
                " ".join(filter(None, [j["level"], j["fs_type"],
                                       f"journal inode {j['ino']}" if j["ino"] else "log",
                                       f"{_fmt_bytes(j['bytes'])} at "
                                       f"{_fmt_bytes(j['offset_bytes'])}"]))
                for j in rep["journals"]))
        elif any(r["kind"] == "journal" for r in rep["attribution"]["links"]):
            con.print("journal: by the requests' flags (no journal's place was found: ext2, "
                      "btrfs, an external journal, or a device record could not read)")
        # (a level's counts are on each of its partitions' rows: said once)
        outside: dict[str, list[dict]] = {}
        for r in rep.get("partitions", []):
            if r["outside_requests"]:
                outside.setdefault(r["level"], []).append(r)
        if outside:
            con.print("other file systems: requests wholly outside the traced file system's "
                      "partition: " + "; ".join(
                          f"{level} {rs[0]['outside_requests']} "
                          f"({_fmt_bytes(rs[0]['outside_bytes'])}) outside " + " and ".join(
                              f"{_fmt_bytes(r['part_bytes'])} at {_fmt_bytes(r['part_start_bytes'])}"
                              for r in rs) for level, rs in outside.items()))
    else:
        con.print("Attribution: none (it needs two traced levels and the stack's offset maps, "
                  "which `nestrace record` stores)")
    t = _table("Read-modify-write, page cache, sync, discard, hints", ("what", "numbers"),
               left=("what", "numbers"))
    for r in rep["rmw"]:
        t.add_row(f"RMW {r['hop']}", f"{r['rmw_writes']}/{r['partial_writes']} partial writes caused "
                  f"{r['reads']} reads ({_fmt_bytes(r['read_bytes'])}, {_fmt(r['read_per_write'])}/write), "
                  f"extra {_fmt_ns(r['extra_ns'])}")
    for r in rep["readahead"]:
        t.add_row(f"page cache {r['level']}", f"{_fmt_bytes(r['filled_bytes'])} filled: "
                  f"{_fmt_bytes(r['readahead_bytes'])} by readahead "
                  f"({_fmt_bytes(r['unused_bytes'])} never used, {_fmt(r['unused_fraction'])}), "
                  f"{_fmt_bytes(r['read_filled_bytes'])} by reads, "
                  f"{_fmt_bytes(r['write_filled_bytes'])} by writes, "
                  f"{_fmt_bytes(r['fault_filled_bytes'])} by page faults, "
                  f"{_fmt_bytes(r['other_filled_bytes'])} other")
    for r in rep["sync"]:
        t.add_row(f"sync {r['level']}", f"{r['stable_writes']}/{r['writes']} stable writes, "
                  f"{r['flushes']} flushes, {r['fsync_bound_writes']} fsync-bound"
                  + (f", {r['range_syncs']} sync_file_range" if r.get("range_syncs") else "")
                  + (f", {r['range_sync_bound_writes']} sync_file_range-bound"
                     if r.get("range_sync_bound_writes") else ""))
    for r in rep.get("discard", []):
        above = "vfs" if r["level"] == "vdisk" else "vdisk"
        tied = "" if r["level"] == "vdisk" and not r["tied_bytes"] else (
            f", {_fmt_bytes(r['tied_bytes'])} tied to {above} ({_fmt(r['tied_fraction'], 3)})"
            + (f", median lag {_fmt_ns(r['lag_median_ns'])}" if r["lag_median_ns"] is not None else ""))
        t.add_row(f"discard {r['level']}", f"{r['requests']} requests: "
                  f"{_fmt_bytes(r['discard_bytes'])} discarded, "
                  f"{_fmt_bytes(r['zeroes_bytes'])} write-zeroes{tied}")
    for r in rep.get("hints", []):
        what = r["syscall"] + (f" {r['advice']}" if r["advice"] else "")
        t.add_row(f"hint {what}", f"{r['calls']} call{'' if r['calls'] == 1 else 's'}"
                  + (f" ({r['failed']} failed)" if r["failed"] else "")
                  + (f", {_fmt_bytes(r['range_bytes'])} asked" if r["range_bytes"] else "")
                  + (f", {r['to_end_calls']} to the file's end" if r["to_end_calls"] else "")
                  + (f", {_fmt_bytes(r['tied_bytes'])} read at vdisk in {r['tied_requests']} "
                     "requests" if r["reads"] else ""))
    con.print(t)
    lost = rep["lost"]
    style = "bold red" if lost["total"] else "green"
    misses = "" if lost.get("hook_misses") is None else \
        f", tracepoint hits missed {lost['hook_misses']}"
    if lost.get("completions_missed") is not None:
        misses += f", completions missed {lost['completions_missed']}"
    con.print(f"[{style}]lost events: {lost['total']} (ring-buffer drops {lost['ringbuf_drops']}, "
              f"sequence gaps {lost['seq_gaps']}{misses})[/]")
    if lost.get("requests_unfinished"):
        con.print(f"{lost['requests_unfinished']} block requests dispatched without a completion "
                  "before the end: in flight at the end, or completions missed")


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
                s.con.execute(f"COPY (SELECT * FROM {src} WHERE capture_id = ?) TO "
                              f"'{path}' (FORMAT parquet, COMPRESSION zstd)", [cid])
                os.replace(tmp, d / "data.parquet")
                n = pq.ParquetFile(d / "data.parquet").metadata.num_rows
                rows += n
                if view == "links":
                    out[cid] = n
            if len(caps) > 1:
                s.con.execute(f"DROP TABLE temp._correlate_{view}")
            s._use_stored_views()   # later views read what was just stored
            if progress:
                progress(view, rows, time.monotonic() - t0)
    return out
