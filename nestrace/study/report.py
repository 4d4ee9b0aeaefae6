"""A study's report, from its store alone: each stack's throughput
relative to the baseline per workload (the median over rounds and its
spread), and each claim checked round by round.

Two views are there for the claims' queries (beside every view of the
store): study_cells, a row per capture (round, workload, kind, guest_fs,
host_fs, capture_id, mib_s, p50_us, p99_us, disk_read_x_app,
disk_write_x_app, vdisk_sequential, disk_sequential), and study_relative,
a row per stack and round (round, workload, kind, guest_fs, host_fs,
relative: its mib_s over the baseline's, same guest FS, workload and
round).  The report also gives each level's queue idle time, the host
disk's seek-distance CDF and each block level's merge potential (seed
001: merge_potential) per stack and workload.  A claim holds when its value passes in every round, does not
hold when it passes in none, and is "not told apart" otherwise."""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import pyarrow as pa

from nestrace.query.session import Session
from nestrace.study.run import load_run

CELL_COLUMNS = {"mib_s": "app_mib_per_s", "p50_us": "app_median_ns", "p99_us": "app_p99_ns",
                "disk_read_x_app": "disk_read_x_app", "disk_write_x_app": "disk_write_x_app",
                "vdisk_sequential": "vdisk_sequential", "disk_sequential": "disk_sequential"}
# What the report reads of each capture, computed a few captures at a
# time (the intermediates of a whole study's captures do not fit in
# memory: the full nested-fs study is some 480 captures): name, SQL over
# the captures of one pass.  merge_potential's rows stand in for the view
# in the claims' queries.
PER_CAPTURE = {
    "_study_compare": "SELECT * FROM compare_captures",
    "_study_chain_levels": "SELECT DISTINCT capture_id, position, level FROM chain_levels",
    "_study_level_io": """
        SELECT capture_id, level, count(*) AS ios,
               count(*) FILTER (WHERE op = 'read') AS reads,
               count(*) FILTER (WHERE op = 'write') AS writes,
               count(*) FILTER (WHERE op = 'meta') AS meta,
               coalesce(sum(bytes) FILTER (WHERE op = 'read'), 0)::BIGINT AS read_bytes,
               coalesce(sum(bytes) FILTER (WHERE op = 'write'), 0)::BIGINT AS write_bytes,
               median(bytes) FILTER (WHERE op IN ('read', 'write')) AS median_bytes,
               median(bytes) FILTER (WHERE op = 'read') AS median_read_bytes
        FROM chain_io GROUP BY ALL""",
    "_study_netfs": "SELECT capture_id, 'netfs' AS level, "
                    "count(*) FILTER (WHERE opcode = 'getattr') AS getattrs, "
                    "count(*) FILTER (WHERE opcode = 'write' AND stable IN "
                    "('data_sync', 'file_sync')) AS stable_writes, "
                    "count(*) FILTER (WHERE opcode = 'commit') AS commits "
                    "FROM netfs_io GROUP BY ALL",
    "_study_depth": "SELECT capture_id, level, arg_max(busy_fraction, ios) AS busy "
                    "FROM depth_summary GROUP BY ALL",
    "_study_seeks": "SELECT capture_id, normalized FROM seek_distances "
                    "WHERE level = 'disk' AND normalized IS NOT NULL",
    "merge_potential": "SELECT * FROM merge_potential",
    "_study_memory": "SELECT capture_id, "
                     "(settings_json::JSON->>'$.memory.peak')::BIGINT AS peak, "
                     "(settings_json::JSON->>'$.memory.hits')::BIGINT AS hits "
                     "FROM capture_meta",
}
# captures a pass reads
CHUNK = 16
# computed once in a pass (Session.cache), lower first: several of
# PER_CAPTURE read them
REPORT_CACHE = ["_block_requests_core", "depth_summary", "seek_distances"]
OPS = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
       "<": lambda a, b: a < b}


def _cells(compared: pa.Table, doc: dict) -> pa.Table:
    """study_cells: a row per capture whose workload ran, from its
    compare_captures row."""
    kinds = {w["name"]: w["kind"] for w in doc["workloads"]}
    got = {r["capture_id"]: r for r in compared.to_pylist()}
    rows = []
    for c in doc["cells"]:
        r = got.get(c["capture_id"])
        if r is None or c["error"] or c["command_exit"]:
            continue
        row = {"round": c["round"], "workload": c["workload"], "kind": kinds[c["workload"]],
               # (a run kept before stacks had names: the product's)
               "stack": c.get("stack", f"{c['guest_fs']} on {c['host_fs']}"),
               "base": c.get("base", f"{c['guest_fs']} on {doc['baseline']}"),
               "guest_fs": c["guest_fs"], "host_fs": c["host_fs"], "capture_id": c["capture_id"]}
        for k, col in CELL_COLUMNS.items():
            v = r.get(col)
            row[k] = None if v is None else float(v) / (1000 if k.endswith("_us") else 1)
        rows.append(row)
    schema = pa.schema([("round", pa.int32()), ("workload", pa.string()), ("kind", pa.string()),
                        ("stack", pa.string()), ("base", pa.string()), ("guest_fs", pa.string()), ("host_fs", pa.string()),
                        ("capture_id", pa.string())]
                       + [(k, pa.float64()) for k in CELL_COLUMNS])
    return pa.Table.from_pylist(rows, schema=schema)


def _views(s: Session, rnd: int | None) -> None:
    where = "" if rnd is None else f"WHERE round = {int(rnd)}"
    s.con.execute(f"CREATE OR REPLACE TEMP VIEW study_cells AS SELECT * FROM _study_cells {where}")
    s.con.execute(
        "CREATE OR REPLACE TEMP VIEW study_relative AS "
        "SELECT c.round, c.workload, c.kind, c.stack, c.guest_fs, c.host_fs, "
        "       c.mib_s / b.mib_s AS relative "
        "FROM study_cells c JOIN study_cells b ON b.workload = c.workload "
        "AND b.stack = c.base AND b.round = c.round AND b.mib_s > 0")
    s.con.execute(STUDY_LEVELS)


# Every level of every capture of the study, in chain order: its I/Os,
# reads and writes and their bytes, the median size, the metadata
# requests (netfs) and the GETATTRs among them, the stable writes and
# the COMMITs (NFS), and the capture's
# application MiB/s: the seeds' tables of bytes at each level ([[table]]
# queries read it).
STUDY_LEVELS = """
CREATE OR REPLACE TEMP VIEW study_levels AS
WITH io AS (SELECT * FROM _study_level_io)
SELECT c.round, c.workload, c.kind, c.stack, c.capture_id, c.mib_s, l.position, l.level,
       coalesce(io.ios, 0) AS ios, coalesce(io.reads, 0) AS reads,
       coalesce(io.writes, 0) AS writes, coalesce(io.meta, 0) AS meta,
       coalesce(io.read_bytes, 0) AS read_bytes, coalesce(io.write_bytes, 0) AS write_bytes,
       io.median_bytes, io.median_read_bytes, coalesce(g.getattrs, 0) AS getattrs,
       coalesce(g.stable_writes, 0) AS stable_writes, coalesce(g.commits, 0) AS commits
FROM study_cells c
JOIN _study_chain_levels l USING (capture_id)
LEFT JOIN io ON io.capture_id = c.capture_id AND io.level = l.level
LEFT JOIN _study_netfs g ON g.capture_id = c.capture_id AND g.level = l.level
"""


def _value(s: Session, query: str) -> tuple[float | None, str | None]:
    try:
        cur = s.con.execute(query)
        names = [d[0] for d in cur.description]
        row = cur.fetchone()
    except Exception as e:      # (duckdb.Error: the claim's SQL is the user's)
        return None, str(e).splitlines()[0]
    if "value" not in names:
        return None, "the query gives no column named value"
    v = row[names.index("value")] if row else None
    return (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)), None


def claim(s: Session, c: dict, rounds: list[int]) -> dict:
    """A claim of the run's document checked on all rounds together and
    round by round (`register` made the study's views): its value, each
    round's, and the verdict."""
    _views(s, None)
    value, problem = _value(s, c["query"])
    per = {}
    for r in rounds:
        _views(s, r)
        per[r], _ = _value(s, c["query"])
    _views(s, None)
    passed = [OPS[c["op"]](v, c["threshold"]) for v in per.values() if v is not None]
    verdict = ("query failed: " + problem if problem else
               "no data" if not passed else
               "holds" if all(passed) and len(passed) == len(rounds) else
               "does not hold" if not any(passed) else "not told apart")
    return {"id": c["id"], "words": c["words"], "test": f"value {c['op']} {c['threshold']:g}",
            "value": value, "rounds": {str(k): v for k, v in per.items()}, "verdict": verdict}


def _passes(store: str | Path, ids: list[str]) -> dict[str, pa.Table]:
    """PER_CAPTURE's tables over the study's captures, CHUNK captures a
    pass (a session on those alone), put together."""
    parts: dict[str, list[pa.Table]] = {k: [] for k in PER_CAPTURE}
    for i in range(0, max(len(ids), 1), CHUNK):
        with Session(store, captures=ids[i:i + CHUNK]) as s:
            s.cache(s.views_to_cache(REPORT_CACHE))
            for k, q in PER_CAPTURE.items():
                parts[k].append(s.query(q))
    return {k: pa.concat_tables(v, promote_options="default") for k, v in parts.items()}


def register(s: Session, cells: pa.Table, got: dict[str, pa.Table]) -> None:
    """The study's views in session s: study_cells from cells, the others
    from PER_CAPTURE's tables (got; merge_potential's stands in for the
    view)."""
    for k, t in got.items():
        s.con.register(k, t)
    s.con.register("_study_cells", cells)
    _views(s, None)


def build(store: str | Path) -> dict:
    """The study report of `store` (a dict: the JSON document)."""
    doc = load_run(store)
    ids = sorted({c["capture_id"] for c in doc["cells"] if c["capture_id"]})
    got = _passes(store, ids)
    cells = _cells(got.pop("_study_compare"), doc)
    with Session(store) as s:
        register(s, cells, got)
        order = [x["name"] for x in doc.get("stacks", [])]
        rel = s.rows(
            "SELECT * FROM (SELECT c.workload, c.stack, c.guest_fs, c.host_fs, "
            "count(*) AS rounds, median(c.mib_s) AS mib_s, median(r.relative) AS relative, "
            "min(r.relative) AS relative_min, max(r.relative) AS relative_max "
            "FROM study_cells c LEFT JOIN study_relative r USING (round, workload, stack) "
            "GROUP BY ALL) ORDER BY workload, list_position(?, stack), stack", [order])
        rounds = sorted({c["round"] for c in doc["cells"]})
        claims = [claim(s, c, rounds) for c in doc["claims"]]
        tables = [_table(s, t) for t in doc.get("tables", [])]
        idle, seeks, ra, merge = _idle(s), _seek_cdfs(s), _readahead(s), _merge(s)
        hyper = _hypervisor_readahead(s)
        memory = None if doc.get("memory") is None else {"limit": doc["memory"], **s.rows(
            "SELECT max(peak) AS peak, sum(hits)::BIGINT AS hits FROM _study_memory")[0]}
    failed = [c for c in doc["cells"] if c["error"] or c["command_exit"]]
    return {"study": doc["name"], "title": doc["title"], "seeds": doc["seeds"],
            "quick": doc["quick"], "baseline": doc["baseline"], "rounds": rounds,
            "interrupted": doc["interrupted"], "workloads": doc["workloads"],
            "captures": cells.num_rows, "failed": failed, "relative": rel, "claims": claims,
            "tables": tables, "idle": idle, "seek_cdf": seeks, "readahead_kb": ra,
            "hypervisor_readahead": hyper,
            "merge_potential": merge, "memory": memory,
            "named": doc.get("named", False)}


def _memory_words(m: dict) -> str:
    """[matrix] memory, in words: the limit, the highest peak, how often reached."""
    mib = 1 << 20
    return (f"each workload held to {m['limit'] / mib:g} MiB of memory (peak "
            + ("unknown" if m["peak"] is None else f"{m['peak'] / mib:.1f} MiB")
            + f", reached {m['hits'] or 0:,} times)")


def _readahead(s: Session) -> list[dict]:
    """Each stack's readahead windows (KiB) as its captures found them:
    the virtual disk's and the host disk's (NULL for a level it lacks, and
    in captures made before they were kept)."""
    return s.rows(
        "SELECT c.stack, "
        "max(json_extract(m.settings_json, '$.read_ahead_kb.vdisk')::INTEGER) AS vdisk, "
        "max(json_extract(m.settings_json, '$.read_ahead_kb.disk')::INTEGER) AS disk "
        "FROM study_cells c JOIN capture_meta m USING (capture_id) GROUP BY c.stack "
        "ORDER BY c.stack")


def _hypervisor_readahead(s: Session) -> list[dict]:
    """Per read workload and stack: the bytes the virtual disk and the
    host disk read per byte the application read (median over rounds),
    beside the levels' read_ahead_kb: the readahead at the hypervisor."""
    return s.rows(
        "WITH x AS (SELECT l.workload, l.stack, l.capture_id, "
        "  sum(l.read_bytes) FILTER (WHERE l.level = 'vdisk') "
        "    / nullif(sum(l.read_bytes) FILTER (WHERE l.level = 'vfs'), 0) AS vdisk_x, "
        "  sum(l.read_bytes) FILTER (WHERE l.level = 'disk') "
        "    / nullif(sum(l.read_bytes) FILTER (WHERE l.level = 'vfs'), 0) AS disk_x "
        "  FROM study_levels l WHERE l.kind = 'read' GROUP BY ALL) "
        "SELECT x.workload, x.stack, median(x.vdisk_x) AS vdisk_x_app, "
        "median(x.disk_x) AS disk_x_app, "
        "max(json_extract(m.settings_json, '$.read_ahead_kb.vdisk')::INTEGER) AS vdisk_ra_kb, "
        "max(json_extract(m.settings_json, '$.read_ahead_kb.disk')::INTEGER) AS disk_ra_kb "
        "FROM x JOIN capture_meta m USING (capture_id) GROUP BY ALL ORDER BY ALL")


def _merge(s: Session) -> list[dict]:
    """Per workload, stack, block level and class (readahead, writeback):
    seed 001's merge potential (merge_potential), the median over rounds
    of the requests per batch and of requests / needed."""
    return s.rows(
        "SELECT c.workload, c.stack, p.level, p.class, median(p.requests_per_batch) AS "
        "requests_per_batch, median(p.ratio) AS ratio, sum(p.saved)::BIGINT AS saved "
        "FROM study_cells c JOIN merge_potential p USING (capture_id) "
        "GROUP BY ALL ORDER BY ALL")


def _table(s: Session, t: dict) -> dict:
    """A [[table]]'s rows (its query over the study's views), or why not."""
    out = {"title": t["title"], "words": t["words"], "transpose": t["transpose"],
           "columns": [], "rows": [], "problem": None}
    try:
        cur = s.con.execute(t["query"])
        out["columns"] = [d[0] for d in cur.description]
        out["rows"] = [list(r) for r in cur.fetchall()]
    except Exception as e:      # (duckdb.Error: the table's SQL is the user's)
        out["problem"] = str(e).splitlines()[0]
    return out


def _idle(s: Session) -> list[dict]:
    """Per workload, stack and level: the share of the capture with no I/O
    in flight (1 - depth_summary.busy_fraction, the level's busiest
    device; 1 for a level that saw none), the median over rounds."""
    return [{k: v for k, v in r.items() if k != "k"} for r in s.rows(
        "WITH d AS (SELECT * FROM _study_depth), "
        "l AS (SELECT DISTINCT capture_id, level FROM _study_chain_levels "
        "      WHERE level IN ('vfs', 'vdisk', 'disk')) "
        # (a level that saw no I/O in the capture was idle all along)
        "SELECT c.workload, c.stack, c.guest_fs, c.host_fs, l.level, "
        "       median(coalesce(1 - d.busy, 1.0)) AS idle, "
        "       list_position(['vfs', 'vdisk', 'disk'], l.level) AS k "
        "FROM study_cells c JOIN l USING (capture_id) "
        "LEFT JOIN d ON d.capture_id = c.capture_id AND d.level = l.level "
        "GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, k")]


# the quantiles a seek-distance CDF is drawn from
CDF_POINTS = 21


def _seek_cdfs(s: Session) -> list[dict]:
    """Per workload and stack, the host disk's normalized seek distances
    (|distance| / the disk's size) at CDF_POINTS quantiles, all rounds
    together: the seed's CDF of disk I/Os over normalized seek distance."""
    qs = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
    return s.rows(
        "SELECT c.workload, c.stack, c.guest_fs, c.host_fs, "
        f"quantile_cont(x.normalized, {qs}) AS normalized "
        "FROM study_cells c JOIN _study_seeks x USING (capture_id) GROUP BY ALL ORDER BY ALL")


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def render(rep: dict, console=None) -> None:
    """The report on the terminal (rich tables)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    con = console or Console()
    con.print(f"study {rep['study']}: {rep['title']}" + (" (--quick)" if rep["quick"] else "")
              + f"; {rep['captures']} captures, rounds {', '.join(map(str, rep['rounds']))}; "
              f"baseline: {'' if rep.get('named') else 'host '}{rep['baseline']}"
              + (f"; {_memory_words(rep['memory'])}" if rep.get("memory") else ""))
    for w in rep["workloads"] if not rep.get("named") else []:
        t = Table(title=escape(f"{w['name']} ({w['kind']}): throughput relative to the "
                               "baseline (median over rounds, [min, max])"), box=box.SIMPLE_HEAD)
        rows = [r for r in rep["relative"] if r["workload"] == w["name"]]
        hosts = list(dict.fromkeys(r["host_fs"] for r in rows))
        t.add_column("guest \\ host")
        for h in hosts:
            t.add_column(h, justify="right")
        for g in dict.fromkeys(r["guest_fs"] for r in rows):
            by = {r["host_fs"]: r for r in rows if r["guest_fs"] == g}
            t.add_row(g, *(escape(f"{_fmt(by[h]['relative'])} [{_fmt(by[h]['relative_min'])}, "
                                  f"{_fmt(by[h]['relative_max'])}] "
                                  f"{_fmt(by[h]['mib_s'], '.1f')} MiB/s")
                           if h in by else "-" for h in hosts))
        con.print(t)
    if rep.get("named"):
        t = Table(title=escape("Throughput relative to the baseline (median over rounds, "
                               "[min, max])"), box=box.SIMPLE_HEAD)
        for col in ("workload", "stack", "MiB/s", "relative"):
            t.add_column(col, justify="right" if col in ("MiB/s", "relative") else "left")
        for r in rep["relative"]:
            t.add_row(r["workload"], escape(r["stack"]), _fmt(r["mib_s"], ".2f"),
                      escape(f"{_fmt(r['relative'])} [{_fmt(r['relative_min'])}, "
                             f"{_fmt(r['relative_max'])}]"))
        con.print(t)
    for tb in rep.get("tables", []):
        con.print(_rich_table(tb, Table, box, escape))
    t = Table(title="Claims", box=box.SIMPLE_HEAD)
    for col in ("claim", "the seed's words", "test", "value", "per round", "verdict"):
        t.add_column(col)
    for c in rep["claims"]:
        t.add_row(c["id"], escape(c["words"]), c["test"], _fmt(c["value"], ".3g"),
                  " ".join(_fmt(v, ".3g") for v in c["rounds"].values()), c["verdict"])
    con.print(t)
    for c in rep["failed"]:
        con.print(f"failed: round {c['round']} {c['workload']} "
                  f"{c.get('stack', c['guest_fs'] + ' on ' + c['host_fs'])}: "
                  f"{c['error'] or 'the workload exited with code ' + str(c['command_exit'])}")
    if rep.get("readahead_kb"):
        con.print("readahead (read_ahead_kb, beside the readahead claims): " + "; ".join(
            f"{escape(r['stack'])}: virtual disk {_fmt(r['vdisk'], 'd')}, "
            f"host disk {_fmt(r['disk'], 'd')}" for r in rep["readahead_kb"]))
    if rep.get("hypervisor_readahead"):
        t = Table(title="Readahead at the hypervisor: bytes read per application byte read "
                  "(median over rounds), read workloads", box=box.SIMPLE_HEAD)
        for col in ("workload", "stack", "virtual disk", "host disk", "read_ahead_kb"):
            t.add_column(col, justify="left" if col in ("workload", "stack") else "right")
        for r in rep["hypervisor_readahead"]:
            t.add_row(escape(r["workload"]), escape(r["stack"]), _fmt(r["vdisk_x_app"]),
                      _fmt(r["disk_x_app"]), f"{_fmt(r['vdisk_ra_kb'], 'd')} / "
                      f"{_fmt(r['disk_ra_kb'], 'd')}")
        con.print(t)
    merge = [m for m in rep.get("merge_potential", []) if m["saved"] > 0]
    if merge:
        t = Table(title="Merge potential (seed 001): readahead and write-back batches split "
                  "at the gaps between pages (median over rounds)", box=box.SIMPLE_HEAD)
        for col in ("workload", "stack", "level", "class", "requests/batch", "requests/needed"):
            t.add_column(col, justify="right" if col.startswith("requests") else "left")
        for m in merge:
            t.add_row(m["workload"], escape(m["stack"]), m["level"], m["class"],
                      _fmt(m["requests_per_batch"], ".1f"), _fmt(m["ratio"], ".2f"))
        con.print(t)
    con.print("queue idle time per level and the host disk's seek-distance CDFs: in the "
              "JSON (idle, seek_cdf) and on the html page")
    if rep["interrupted"]:
        con.print("interrupted: the report covers the captures made before")


def _cell(v) -> str:
    return "-" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}" \
        if isinstance(v, int) else str(v)


def table_rows(tb: dict) -> tuple[list[str], list[list[str]]]:
    """A [[table]]'s header and rows as text (transposed: a row per
    column of the query, the first column's values as the header)."""
    head, rows = tb["columns"], [[_cell(v) for v in r] for r in tb["rows"]]
    if not tb["transpose"] or not rows:
        return head, rows
    return ([""] + [r[0] for r in rows],
            [[c] + [r[i] for r in rows] for i, c in enumerate(head) if i > 0])


def _rich_table(tb: dict, Table, box, escape):
    t = Table(title=escape(tb["title"]), caption=escape(tb["words"] or "") or None,
              box=box.SIMPLE_HEAD)
    if tb["problem"]:
        t.add_column("query failed")
        t.add_row(escape(tb["problem"]))
        return t
    head, rows = table_rows(tb)
    for i, h in enumerate(head):
        t.add_column(escape(str(h)), justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*map(escape, r))
    return t


def _html_table(tb: dict) -> str:
    e = html.escape
    if tb["problem"]:
        return f"<h2>{e(tb['title'])}</h2><p>query failed: {e(tb['problem'])}</p>"
    head, rows = table_rows(tb)
    return (f"<h2>{e(tb['title'])}</h2><p>{e(tb['words'] or '')}</p><table border='1'><tr>"
            + "".join(f"<th>{e(str(h))}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
            + "</table>")


def to_html(rep: dict) -> str:
    """A self-contained page: the relative throughput as a heat map per
    workload (plotly, inlined once), the claims as a table."""
    import plotly.graph_objects as go
    parts, first = [_html_table(tb) for tb in rep.get("tables", [])], True
    for w in rep["workloads"] if not rep.get("named") else []:
        rows = [r for r in rep["relative"] if r["workload"] == w["name"]]
        guests = list(dict.fromkeys(r["guest_fs"] for r in rows))
        hosts = list(dict.fromkeys(r["host_fs"] for r in rows))
        by = {(r["guest_fs"], r["host_fs"]): r for r in rows}
        z = [[by.get((g, h), {}).get("relative") for h in hosts] for g in guests]
        text = [[(f"{by[(g, h)]['relative']:.2f} [{_fmt(by[(g, h)]['relative_min'])}, "
                  f"{_fmt(by[(g, h)]['relative_max'])}]") if by.get((g, h), {}).get("relative")
                 is not None else "-" for h in hosts] for g in guests]
        fig = go.Figure(go.Heatmap(z=z, x=hosts, y=guests, text=text, texttemplate="%{text}",
                                   colorscale="RdBu", zmid=1.0))
        fig.update_layout(title=f"{w['name']}: throughput relative to host {rep['baseline']}",
                          xaxis_title="host FS", yaxis_title="guest FS", height=420)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
        first = False
    for w in rep["workloads"]:
        curves = [r for r in rep.get("seek_cdf", []) if r["workload"] == w["name"]]
        if not curves:
            continue
        fig = go.Figure()
        for r in curves:
            ys = [i / (len(r["normalized"]) - 1) for i in range(len(r["normalized"]))]
            fig.add_trace(go.Scatter(x=r["normalized"], y=ys, mode="lines", name=r["stack"]))
        fig.update_layout(title=f"{w['name']}: host-disk seek distances",
                          xaxis_title="normalized seek distance (|d| / disk size)",
                          yaxis_title="CDF of disk I/Os", height=420)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
        first = False
    e = html.escape
    idle = "".join(f"<tr><td>{e(r['workload'])}</td><td>{e(r['stack'])}"
                   f"</td><td>{e(r['level'])}</td><td>{_fmt(r['idle'])}</td></tr>"
                   for r in rep.get("idle", []))
    hyper = "".join(
        f"<tr><td>{e(r['workload'])}</td><td>{e(r['stack'])}</td><td>{_fmt(r['vdisk_x_app'])}"
        f"</td><td>{_fmt(r['disk_x_app'])}</td><td>{_fmt(r['vdisk_ra_kb'], 'd')} / "
        f"{_fmt(r['disk_ra_kb'], 'd')}</td></tr>" for r in rep.get("hypervisor_readahead", []))
    claims = "".join(
        f"<tr><td>{e(c['id'])}</td><td>{e(c['words'])}</td><td>{e(c['test'])}</td>"
        f"<td>{_fmt(c['value'], '.3g')}</td><td>{e(c['verdict'])}</td></tr>" for c in rep["claims"])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(rep['study'])}</title>"
            f"</head><body><h1>{e(rep['study'])}: {e(rep['title'])}</h1>"
            f"<p>{rep['captures']} captures; baseline: host {e(rep['baseline'])}"
            f"{' (--quick)' if rep['quick'] else ''}"
            f"{'; ' + e(_memory_words(rep['memory'])) if rep.get('memory') else ''}</p>"
            f"{''.join(parts)}"
            "<h2>Claims</h2><table border='1'><tr><th>claim</th><th>the seed's words</th>"
            f"<th>test</th><th>value</th><th>verdict</th></tr>{claims}</table>"
            "<h2>Readahead at the hypervisor</h2><p>bytes read per application byte read, "
            "read workloads (median over rounds), and read_ahead_kb (virtual disk / host "
            "disk)</p><table border='1'><tr><th>workload</th><th>stack</th><th>virtual disk"
            f"</th><th>host disk</th><th>read_ahead_kb</th></tr>{hyper}</table>"
            "<h2>Queue idle per level</h2><p>the share of each capture with no I/O in flight "
            "(the level's busiest device; median over rounds)</p><table border='1'><tr>"
            f"<th>workload</th><th>stack</th><th>level</th><th>idle</th></tr>{idle}</table>"
            f"<pre>{e(json.dumps(rep['failed'], indent=1)) if rep['failed'] else ''}</pre>"
            "</body></html>")
