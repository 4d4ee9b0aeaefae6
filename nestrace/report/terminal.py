"""The terminal report: the report's JSON document as tables (rich), in the
order a reader follows an I/O down the stack."""
from __future__ import annotations

import os

from nestrace.report.summary import STOPS

EXTENT_LINES = 8    # extent files of a split vmdk the terminal report names


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


def _header(con, rep, captures) -> None:
    """The capture, and what a reader must know before the numbers."""
    of = f" (of {captures} in the store; --capture picks one)" if captures > 1 else ""
    con.print(f"[bold]capture {rep['capture_id']}[/]{of} on {rep['machine']} ({rep['kernel']}), "
              f"{rep['duration_s']:.1f} s, {rep['records']} records")
    if rep.get("redacted"):
        con.print("[yellow]redacted (record --redact): file paths, mount points, process names "
                  "and the command line are hashes (h:...), one per name[/]")
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


def _levels(con, rep) -> None:
    """Each traced level's I/Os, bytes, sizes and seeks."""
    # (seeks in bytes at every level, as the sizes: the JSON keeps btt's
    # sectors for the block levels, seek_unit)
    levels = [lv for lv in rep["levels"] if lv.get("traced", True)]
    names = [lv["level"] for lv in levels]
    bottom = names[-1] if names else ""
    raw = "vdisk" in names and "disk" in names and "hostfs" not in names
    t = _table("Per level", ("level", "I/Os", "read", "written", "median\nsize", "sequential",
                             "seek\nmedian", "seek\np90"),
               caption="seek: |distance| from the end of the I/O before"
               + (f"; the chain stops at {bottom}: {STOPS[bottom]}" if bottom in STOPS else "")
               + ("; no hostfs level: the virtual disk is a host block device (the raw "
                  "baseline)" if raw else ""))
    for lv in levels:
        per = 512 if lv["seek_unit"] == "sectors" else 1
        seek = lambda d, per=per: _fmt_bytes(None if d is None else d * per)  # noqa: E731
        t.add_row(lv["level"], str(lv["requests"]), _fmt_bytes(lv["read_bytes"]),
                  _fmt_bytes(lv["write_bytes"]), _fmt_bytes(lv["median_size_bytes"]),
                  _fmt(lv["sequential_fraction"]), seek(lv["seek_median"]), seek(lv["seek_p90"]))
    con.print(t)


def _phases(con, rep) -> None:
    """btt's request phases per block level."""
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


def _depths(con, rep) -> None:
    """Queue depths per level and device."""
    levels = [lv for lv in rep["levels"] if lv.get("traced", True)]
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


def _latency(con, rep) -> None:
    """Where an application read's or write's time goes."""
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


def _files(con, rep) -> None:
    """The busiest files."""
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


def _processes(con, rep) -> None:
    """The busiest processes."""
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


def _amplification(con, rep) -> None:
    """Bytes per level against the level above and the application."""
    t = _table("Amplification: bytes, x level above, x app",
               ("op", "level", "requests", "bytes", "x above", "x app"), left=("op", "level"))
    for r in rep["amplification"]:
        t.add_row(r["op"], r["level"], str(r["requests"]), _fmt_bytes(r["bytes"]),
                  _fmt(r["ratio_to_above"]), _fmt(r["ratio_to_app"]))
    con.print(t)


def _attribution(con, rep) -> None:
    """Lower-level bytes by cause, and the journals and other file systems."""
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
            con.print("journal: unexplained writes in the journals found at the start: "
                      + "; ".join(
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


def _others(con, rep) -> None:
    """Read-modify-write, the page cache, syncs, discards and hints."""
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


def _lost(con, rep) -> None:
    """What the capture lost."""
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


def render(rep: dict, console=None, captures: int = 1) -> None:
    """The report as terminal tables; `captures`: how many the store holds
    (more than one: the header says so, and how to pick another)."""
    from rich.console import Console
    con = console or Console()
    _header(con, rep, captures)
    _levels(con, rep)
    _phases(con, rep)
    _depths(con, rep)
    _latency(con, rep)
    _files(con, rep)
    _processes(con, rep)
    _amplification(con, rep)
    _attribution(con, rep)
    _others(con, rep)
    _lost(con, rep)
