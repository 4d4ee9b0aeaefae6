"""Figures (plotly).  Every function takes a Session or a store path (or
several, where it overlays stores) and returns a plotly Figure.  They only
draw: every number comes from a view of correlate/sql."""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nestrace.query.session import Session

LEVELS = ("vfs", "vdisk", "hostfs", "disk")
PARTS = (("guest_service_ns", "guest service"), ("guest_queue_ns", "guest queue"),
         ("host_fs_ns", "host FS"), ("host_queue_ns", "host queue"), ("device_ns", "device"))
DEPTH_BINS = ("1", "2", "4", "6", "8", "12", "16", "20", "24", "28", "32", "64", ">64")
DEPTH_LEVELS = ("vfs", "vdisk", "disk")     # hostfs accesses have no end: no depth
SIZE_BINS = ("512", "1K", "2K", "4K", "8K", "16K", "32K", "64K", "128K", "256K", "512K", ">512K")
StoreLike = Session | str | os.PathLike


def _session(x: StoreLike) -> Session:
    return x if isinstance(x, Session) else Session(x)


def _label(s: Session) -> str:
    """A store's stack ("ext4 on xfs"), else its name."""
    # (a capture may trace several guest file systems: "ext4+xfs on xfs")
    rows = s.rows("SELECT string_agg(DISTINCT fs_type, '+' ORDER BY fs_type) AS fs_type "
                  "FROM device_map WHERE level IN ('vfs', 'hostfs') "
                  "GROUP BY level ORDER BY level DESC LIMIT 2")
    fs = [r["fs_type"] for r in rows]
    if len(fs) == 2 and all(fs):
        return f"{fs[0]} on {fs[1]}"
    return s.store.name if s.store is not None else "capture"


def capture_labels(s: Session, rounds: bool = True) -> dict[str, str]:
    """A name per capture of a store: its stack ("ext4 on xfs"), with the
    loops' dio modes when the store's captures differ in them, and (with
    `rounds`) a round number when a stack was recorded more than once (lab
    run --repeat)."""
    rows = s.rows("SELECT capture_id, guest_fs, host_fs, guest_dio, host_dio "
                  "FROM compare_captures ORDER BY capture_id")
    onoff = lambda v: "-" if v is None else ("on" if v else "off")   # noqa: E731
    show_dio = len({(r["guest_dio"], r["host_dio"]) for r in rows}) > 1
    base = {}
    for r in rows:
        name = f"{r['guest_fs'] or '?'} on {r['host_fs'] or '?'}"
        if show_dio:
            name += f" (dio {onoff(r['guest_dio'])}/{onoff(r['host_dio'])})"
        base[r["capture_id"]] = name
    if not rounds:
        return base
    counts: dict[str, int] = {}
    out = {}
    for cid, name in base.items():
        counts[name] = counts.get(name, 0) + 1
        repeated = sum(1 for n in base.values() if n == name) > 1
        out[cid] = f"{name} #{counts[name]}" if repeated else name
    return out


def _one_or_each(s: Session, capture_id: str | None) -> tuple[str, list, dict[str, str]]:
    """(WHERE clause, its parameters, {capture: name}): one capture's rows
    when `capture_id` is given, else every capture's, named by its stack
    when there are several (a figure then draws them side by side instead
    of adding them up)."""
    if capture_id is not None:      # (ValueError naming the store's captures if not one)
        return "WHERE capture_id = ?", [s.capture(capture_id)], {}
    caps = s.rows("SELECT DISTINCT capture_id FROM capture_meta")
    return "", [], capture_labels(s) if len(caps) > 1 else {}


def _distinct(names: list[str], more: list[list[str]]) -> list[str]:
    """The names, each made unique by adding the first of its `more`
    qualifiers (the store, then the capture) that tells it apart."""
    out = list(names)
    for k in range(len(more[0]) if more else 0):
        seen = [n for n in out]
        dup = {n for n in seen if seen.count(n) > 1}
        out = [f"{n} ({m[k]})" if n in dup else n for n, m in zip(out, more)]
    return out


def seek_cdf(stores: StoreLike | Sequence[StoreLike], level: str = "disk",
             labels: Sequence[str] | None = None, max_points: int = 2000,
             capture_id: str | None = None, distance: str = "auto",
             log_x: bool | None = None) -> go.Figure:
    """CDF of I/Os over seek distance at one level, one curve per store and
    capture (e.g. the same guest FS on several host FS), or of one capture.
    `distance`: "normalized" (|d| / the device's or file's size, the seed
    figure's axis), "absolute" (|d| in bytes, on a log axis unless
    `log_x` is False), or "auto": normalized where every curve's size is
    known, else absolute (an imported blktrace knows no device size).
    Curves with the same name get their store's, then their capture's, to
    tell them apart.  ValueError when no store has seek distances at the
    level."""
    if level not in LEVELS:     # (else an empty figure, as if nothing sought)
        raise ValueError(f"unknown level {level!r} (choose from {', '.join(LEVELS)})")
    if distance not in ("auto", "normalized", "absolute"):
        raise ValueError(f"distance {distance!r}: auto, normalized or absolute")
    if isinstance(stores, (Session, str, os.PathLike)):
        stores = [stores]
    sessions = [_session(st) for st in stores]
    if capture_id is not None and not any(
            s.rows("SELECT 1 FROM capture_meta WHERE capture_id = ? LIMIT 1", [capture_id])
            for s in sessions):
        raise ValueError(f"no capture {capture_id!r} in " + (
            "the store" if len(sessions) == 1 else f"any of the {len(sessions)} stores"))
    curves = []    # (name, store, capture, rows)
    for i, s in enumerate(sessions):
        rows = s.rows("SELECT capture_id, x, y FROM seek_cdf_points_of(?, ?, ?)",
                      [level, max_points, distance == "absolute"])
        every = sorted({r["capture_id"] for r in rows})
        caps = [c for c in every if capture_id in (None, c)]
        names = capture_labels(s) if len(every) > 1 else {}
        for cid in caps:
            name = labels[i] if labels else names.get(cid) or _label(s)
            if len(caps) > 1:
                name = f"{labels[i]}: {names[cid]}" if labels else names[cid]
            curves.append((name, s.store.name if s.store else f"store {i + 1}", cid,
                           [r for r in rows if r["capture_id"] == cid]))
    if not curves:
        held = seek_levels(sessions)
        raise ValueError(f"no seek distances at {level} in "
                         + ("the store" if len(sessions) == 1 else "any of the stores")
                         + f" (levels with some: {', '.join(held) or 'none'})")
    unsized = [c for c in curves if all(p["x"] is None for p in c[3])]
    if unsized and distance == "normalized":
        raise ValueError(f"{unsized[0][0]}: the {level} level's size is unknown (an imported "
                         "trace, say), so its seek distances cannot be normalized: draw "
                         "them absolute")
    if unsized and distance == "auto":
        # (a device or file of unknown size: its normalized distances are NULL)
        return seek_cdf(sessions, level, labels, max_points, capture_id, "absolute", log_x)
    log = distance == "absolute" and log_x is not False
    fig = go.Figure()
    names = _distinct([c[0] for c in curves], [[c[1], c[2]] for c in curves])
    for name, (_, _, _, pts) in zip(names, curves):
        pts = [p for p in pts if p["x"] is not None and not (log and p["x"] <= 0)]
        fig.add_trace(go.Scatter(x=[p["x"] for p in pts], y=[p["y"] for p in pts],
                                 mode="lines", line_shape="hv", name=name))
    if distance == "absolute":
        fig.update_layout(title=f"Seek distance CDF at {level} (absolute"
                          + ("; sequential I/Os, distance 0, are where each curve starts)"
                             if log else ")"),
                          xaxis_title="|seek distance| (bytes)", xaxis_type="log" if log else None,
                          yaxis_title="fraction of I/Os", yaxis_range=[0, 1.02])
    else:
        fig.update_layout(title=f"Seek distance CDF at {level}",
                          xaxis_title="normalized seek distance |d| / size",
                          yaxis_title="fraction of I/Os", xaxis_range=[0, 1],
                          yaxis_range=[0, 1.02])
    return fig


def latency_breakdown(store: StoreLike, capture_id: str | None = None) -> go.Figure:
    """Mean application latency per request class, stacked by where it
    was spent (guest service, guest queue, host FS, host queue, device);
    a bar per class and capture in a store of several."""
    s = _session(store)
    where, p, names = _one_or_each(s, capture_id)
    rows = s.rows(f"SELECT * FROM latency_breakdown_summary {where} "
                  "ORDER BY capture_id, op, bin_max_bytes NULLS LAST", p)
    x = [f"{names[r['capture_id']]}: {r['class']}" if names else r["class"] for r in rows]
    fig = go.Figure()
    for col, name in PARTS:
        fig.add_trace(go.Bar(x=x, y=[r[col] / 1000 for r in rows], name=name))
    fig.update_layout(barmode="stack", title="Where application latency goes (mean per class)",
                      yaxis_title="µs", xaxis_title="request class")
    return fig


def phase_distributions(store: StoreLike, max_points: int = 5000,
                        capture_id: str | None = None) -> go.Figure:
    """Distribution of each btt phase per block level (box plots); in a
    store of several captures, a box per capture (max_points each)."""
    s = _session(store)
    _, _, names = _one_or_each(s, capture_id)     # sampled per capture below
    caps = list(names) or [capture_id]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("vdisk", "disk")) \
        if names else go.Figure()
    for i, cid in enumerate(caps):
        rows = s.rows(f"""
            SELECT level, phase, ns FROM (
              UNPIVOT (SELECT level, q2g_ns AS q2g, i2d_ns AS i2d, d2c_ns AS d2c, q2c_ns AS q2c
                       FROM block_requests {"WHERE capture_id = ?" if cid else ""})
              ON q2g, i2d, d2c, q2c INTO NAME phase VALUE ns)
            USING SAMPLE reservoir({int(max_points)} ROWS) REPEATABLE (7)""", [cid] if cid else [])
        for row, lv in enumerate(("vdisk", "disk"), 1):
            pts = [r for r in rows if r["level"] == lv]
            box = go.Box(x=[q["phase"] for q in pts], y=[q["ns"] / 1000 for q in pts],
                         name=names[cid] if names else lv, legendgroup=cid,
                         showlegend=not names or row == 1, marker_color=_color(i) if names else None)
            if names:
                fig.add_trace(box, row=row, col=1)
            else:
                fig.add_trace(box)
    fig.update_layout(boxmode="group", title="Block request phases (btt)")
    fig.update_yaxes(title_text="µs", type="log")
    return fig


def _color(i: int) -> str:
    import plotly.colors
    seq = plotly.colors.qualitative.Plotly
    return seq[i % len(seq)]


def amplification_chain(store: StoreLike, capture_id: str | None = None) -> go.Figure:
    """Bytes read and written at each level, app -> disk.  In a store of
    several captures: each level's bytes per application byte, a bar per
    capture, reads and writes side by side."""
    s = _session(store)
    where, p, names = _one_or_each(s, capture_id)
    rows = s.rows(f"SELECT capture_id, level, op, bytes, ratio_to_app FROM amplification {where} "
                  "ORDER BY capture_id, depth", p)
    if names:
        fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=("read", "write"))
        for i, (cid, name) in enumerate(names.items()):
            for col, op in enumerate(("read", "write"), 1):
                pts = [r for r in rows if r["capture_id"] == cid and r["op"] == op]
                fig.add_trace(go.Bar(x=[q["level"] for q in pts], y=[q["ratio_to_app"] for q in pts],
                                     name=name, legendgroup=cid, showlegend=col == 1,
                                     marker_color=_color(i)), row=1, col=col)
        fig.update_layout(barmode="group", title="Amplification chain (bytes per application byte)")
        fig.update_yaxes(title_text="x app", row=1, col=1)
        return fig
    fig = go.Figure()
    for op in ("read", "write"):
        pts = [r for r in rows if r["op"] == op]
        fig.add_trace(go.Bar(x=[q["level"] for q in pts], y=[q["bytes"] for q in pts], name=op,
                             text=[f"{q['ratio_to_app']:.2f}x" if q["ratio_to_app"] else ""
                                   for q in pts]))
    fig.update_layout(barmode="group", title="Amplification chain (bytes per level; x app)",
                      yaxis_title="bytes", xaxis_title="level")
    return fig


def size_histograms(store: StoreLike, capture_id: str | None = None) -> go.Figure:
    """I/O size histograms per level side by side (size transformation).
    In a store of several captures: a panel per level, a bar per capture,
    as the share of that level's I/Os (captures differ in length)."""
    s = _session(store)
    where, p, names = _one_or_each(s, capture_id)
    rows = s.rows(f"SELECT capture_id, level, bin, sum(n) AS n FROM size_histogram {where} "
                  "GROUP BY ALL", p)
    if names:
        fig = make_subplots(rows=len(LEVELS), cols=1, shared_xaxes=True, subplot_titles=LEVELS)
        for i, (cid, name) in enumerate(names.items()):
            for row, lv in enumerate(LEVELS, 1):
                by_bin = {r["bin"]: r["n"] for r in rows if r["level"] == lv and r["capture_id"] == cid}
                total = sum(by_bin.values())
                fig.add_trace(go.Bar(x=list(SIZE_BINS),
                                     y=[by_bin.get(b, 0) / total if total else 0 for b in SIZE_BINS],
                                     name=name, legendgroup=cid, showlegend=row == 1,
                                     marker_color=_color(i)), row=row, col=1)
                fig.update_yaxes(title_text="share", row=row, col=1)
        fig.update_layout(barmode="group", title="I/O sizes per level (vscsiStats bins)",
                          height=250 * len(LEVELS))
        return fig
    fig = go.Figure()
    for lv in LEVELS:
        by_bin = {r["bin"]: r["n"] for r in rows if r["level"] == lv}
        fig.add_trace(go.Bar(x=list(SIZE_BINS), y=[by_bin.get(b, 0) for b in SIZE_BINS], name=lv))
    fig.update_layout(barmode="group", title="I/O sizes per level (vscsiStats bins)",
                      xaxis_title="size", yaxis_title="I/Os")
    return fig


def queue_depth(store: StoreLike, capture_id: str | None = None) -> go.Figure:
    """How many I/Os each I/O found in flight at its level when it arrived
    (vscsiStats' outstanding-I/O histogram), per level, as the share of
    that level's I/Os: where the nesting lets a queue drain.  In a store of
    several captures: a panel per level, a bar per capture."""
    s = _session(store)
    where, p, names = _one_or_each(s, capture_id)
    rows = s.rows("SELECT capture_id, level, bin, sum(n) AS n FROM depth_histogram "
                  f"{where} {'AND' if where else 'WHERE'} metric = 'outstanding' GROUP BY ALL", p)

    def shares(cid: str | None, lv: str) -> list[float]:
        by_bin = {r["bin"]: r["n"] for r in rows
                  if r["level"] == lv and (cid is None or r["capture_id"] == cid)}
        total = sum(by_bin.values())
        return [by_bin.get(b, 0) / total if total else 0 for b in DEPTH_BINS]

    title = "I/Os in flight at each arrival, per level (vscsiStats outstanding I/Os)"
    if names:
        fig = make_subplots(rows=len(DEPTH_LEVELS), cols=1, shared_xaxes=True,
                            subplot_titles=DEPTH_LEVELS)
        for i, (cid, name) in enumerate(names.items()):
            for row, lv in enumerate(DEPTH_LEVELS, 1):
                fig.add_trace(go.Bar(x=list(DEPTH_BINS), y=shares(cid, lv), name=name,
                                     legendgroup=cid, showlegend=row == 1,
                                     marker_color=_color(i)), row=row, col=1)
                fig.update_yaxes(title_text="share", row=row, col=1)
        fig.update_layout(barmode="group", title=title, height=250 * len(DEPTH_LEVELS))
        return fig
    fig = go.Figure()
    for lv in DEPTH_LEVELS:
        fig.add_trace(go.Bar(x=list(DEPTH_BINS), y=shares(None, lv), name=lv))
    fig.update_layout(barmode="group", title=title, xaxis_title="in flight (bin upper bound)",
                      yaxis_title="share of the level's I/Os")
    return fig


def _series(names: dict[str, str]) -> list[tuple[tuple[str | None, str | None], str, str]]:
    """The lines of a per-level figure: ((capture, op), name, colour), a
    capture each where a store has several (`names`), else read and write."""
    if names:
        return [((cid, None), name, _color(i)) for i, (cid, name) in enumerate(names.items())]
    return [((None, "read"), "read", "#1f77b4"), ((None, "write"), "write", "#d62728")]


def offset_scatter(store: StoreLike, max_points: int = 20000,
                   capture_id: str | None = None) -> go.Figure:
    """Offset over time per level (seekwatcher view), at most max_points I/Os
    per level and capture.  In a store of several captures each is drawn
    from its own first I/O, in its own colour."""
    s = _session(store)
    where, p, names = _one_or_each(s, capture_id)
    rows = s.rows(f"SELECT * FROM seek_offsets_sample(?) {where}", [max_points] + p)
    t0: dict[str, int] = {}
    for r in rows:
        t0[r["capture_id"]] = min(t0.get(r["capture_id"], r["ts_ns"]), r["ts_ns"])
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, subplot_titles=LEVELS)
    series = _series(names)
    for i, lv in enumerate(LEVELS, 1):
        for (cid, op), name, color in series:
            pts = [r for r in rows if r["level"] == lv and (cid is None or r["capture_id"] == cid)
                   and (op is None or r["op"] == op)]
            fig.add_trace(go.Scattergl(x=[(q["ts_ns"] - t0[q["capture_id"]]) / 1e9 for q in pts],
                                       y=[q["offset_bytes"] / (1 << 20) for q in pts],
                                       mode="markers", marker={"size": 3, "color": color},
                                       name=name, legendgroup=name,
                                       showlegend=(i == 1)), row=i, col=1)
        fig.update_yaxes(title_text="MiB", row=i, col=1)
    fig.update_xaxes(title_text="seconds" + (" from each capture's first I/O" if names else ""),
                     row=4, col=1)
    fig.update_layout(title="Offset over time per level", height=900)
    return fig


def _bucket_ns(span_ns: int, buckets: int = 200) -> int:
    """A round bucket (1, 2 or 5 x 10^k ns, at least 1 ms) that cuts
    `span_ns` into at most about `buckets` pieces."""
    want = max(span_ns // buckets, 1_000_000)
    step = 1_000_000
    while True:
        for m in (1, 2, 5):
            if step * m >= want:
                return step * m
        step *= 10


def throughput(store: StoreLike, capture_id: str | None = None) -> go.Figure:
    """MiB/s over time per level (rate_timeline), reads and writes; in a
    store of several captures, a line per capture (reads and writes
    together), each from its own start."""
    s = _session(store)
    where, p, names = _one_or_each(s, capture_id)
    span = s.rows(f"SELECT max(end_ns - start_ns) AS d FROM capture_meta {where}", p)[0]["d"] or 0
    bucket = _bucket_ns(span)
    rows = s.rows(f"SELECT capture_id, level, op, bucket, bytes FROM rate_timeline(?) {where}",
                  [bucket] + p)
    last = max((r["bucket"] for r in rows), default=0)
    xs = [b * bucket / 1e9 for b in range(last + 1)]
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, subplot_titles=LEVELS)
    series = _series(names)
    for i, lv in enumerate(LEVELS, 1):
        for (cid, op), name, color in series:
            y = [0.0] * (last + 1)
            for r in rows:
                if r["level"] == lv and (cid is None or r["capture_id"] == cid) \
                        and (op is None or r["op"] == op) and 0 <= r["bucket"] <= last:
                    y[r["bucket"]] += r["bytes"] / (1 << 20) / (bucket / 1e9)
            fig.add_trace(go.Scatter(x=xs, y=y, mode="lines", line={"color": color, "shape": "hv"},
                                     name=name, legendgroup=name,
                                     showlegend=(i == 1)), row=i, col=1)
        fig.update_yaxes(title_text="MiB/s", row=i, col=1)
    fig.update_xaxes(title_text="seconds from the capture's start", row=4, col=1)
    fig.update_layout(title=f"Throughput per level ({bucket / 1e6:g} ms buckets)", height=900)
    return fig


def compare_bars(store: StoreLike, by_stack: bool | None = None) -> go.Figure:
    """A store's captures side by side (compare_captures): application
    MiB/s, median latency, and host-disk bytes per application byte.  By
    stack (compare_stacks; the default when a stack was recorded more than
    once, lab run --repeat): a bar per stack at the rounds' median, MiB/s
    with whiskers to the lowest and highest round."""
    s = _session(store)
    stacks = s.compare_stacks().to_pylist() if by_stack is not False else []
    if by_stack is None:
        by_stack = any(len(r["capture_ids"]) > 1 for r in stacks)
    if by_stack:
        names = capture_labels(s, rounds=False)
        rows = stacks
        x = [names[r["capture_ids"][0]] for r in rows]
        err = {"type": "data", "symmetric": False,
               "array": [None if r["app_mib_per_s"] is None else r["app_mib_per_s_max"] - r["app_mib_per_s"]
                         for r in rows],
               "arrayminus": [None if r["app_mib_per_s"] is None
                              else r["app_mib_per_s"] - r["app_mib_per_s_min"] for r in rows]}
        title = "Stacks over their rounds (median; MiB/s from the lowest to the highest round)"
    else:
        names = capture_labels(s)
        rows = s.rows("SELECT * FROM compare_captures ORDER BY capture_id")
        x = [names[r["capture_id"]] for r in rows]
        err, title = None, "Captures side by side"
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "application MiB/s", "median application latency (us)", "host-disk bytes per app byte"))
    fig.add_trace(go.Bar(x=x, y=[r["app_mib_per_s"] for r in rows], name="MiB/s", error_y=err),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=[None if r["app_median_ns"] is None else r["app_median_ns"] / 1000
                                 for r in rows], name="p50 us"), row=1, col=2)
    for op, col in (("read", "disk_read_x_app"), ("write", "disk_write_x_app")):
        fig.add_trace(go.Bar(x=x, y=[r[col] for r in rows], name=f"{op} x app"), row=1, col=3)
    fig.update_layout(barmode="group", title=title)
    return fig


KINDS = {"seek-cdf": seek_cdf, "latency": latency_breakdown, "phases": phase_distributions,
         "amplification": amplification_chain, "sizes": size_histograms, "offsets": offset_scatter,
         "throughput": throughput, "depth": queue_depth, "compare": compare_bars}


def all_figures(store: StoreLike) -> list[tuple[str, go.Figure]]:
    s = _session(store)
    return [(k, fn(s)) for k, fn in KINDS.items()]


def seek_levels(sessions: Sequence[Session]) -> list[str]:
    """The levels, top down, at which some store has seek distances."""
    held = {r["level"] for s in sessions
            for r in s.rows("SELECT DISTINCT level FROM seek_distances")}
    return [lv for lv in LEVELS if lv in held]


def html_report(stores: Iterable[StoreLike], path: str | os.PathLike) -> None:
    """One self-contained HTML page (plotly.js embedded, no network): the
    report's tables and every figure, per store; one seek CDF overlays all."""
    import html

    from nestrace.report.document import build
    sessions = [_session(s) for s in stores]
    parts, first = [], True

    def fig_html(fig: go.Figure) -> str:
        nonlocal first
        out = fig.to_html(full_html=False, include_plotlyjs=bool(first), config={"responsive": True})
        first = False
        return out

    parts.append("<h2>Seek distance CDFs</h2>")
    for lv in seek_levels(sessions):
        parts.append(fig_html(seek_cdf(sessions, level=lv)))
    for s in sessions:
        caps = s.captures()
        if len(caps) <= 1:
            rep = build(s)
            parts.append(f"<h2>{html.escape(_label(s))}: capture {html.escape(rep['capture_id'])}</h2>")
            parts.append(_tables_html(rep) + _slowest_html(s, rep["capture_id"]))
            for name, fn in KINDS.items():
                if name not in ("seek-cdf", "compare"):
                    parts.append(fig_html(fn(s)))
            continue
        # several captures (lab run): side by side, then each one's tables
        # and figures
        names = capture_labels(s)
        parts.append(f"<h2>{html.escape(str(s.store))}: {len(caps)} captures</h2>")
        for fn in (compare_bars, amplification_chain, size_histograms, queue_depth):
            parts.append(fig_html(fn(s)))
        for cid in caps:
            parts.append(f"<h2>{html.escape(names.get(cid, cid))}: capture {html.escape(cid)}</h2>")
            parts.append(_tables_html(build(s, cid)) + _slowest_html(s, cid))
            for name, fn in KINDS.items():
                if name not in ("seek-cdf", "compare"):
                    parts.append(fig_html(fn(s, capture_id=cid)))
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>nestrace report</title>"
            "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;"
            "margin:1em 0} td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
            "th{background:#eee}</style></head><body><h1>nestrace report</h1>"
            + "\n".join(parts) + "</body></html>")
    with open(path, "w") as f:
        f.write(page)


def _html_table(rows: list[dict], cols: list[str]) -> str:
    import html
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table class='nestrace-table'><tr>{head}</tr>{body}</table>"


def _tables_html(rep: dict) -> str:
    table = _html_table
    levels = [{k: v for k, v in lv.items() if k not in ("phases", "depth")} for lv in rep["levels"]]
    return ("<h3>Per level</h3>" + table(levels, ["level", "requests", "read_bytes", "write_bytes",
                                                  "median_size_bytes", "sequential_fraction",
                                                  "seek_median", "seek_p90", "seek_unit"])
            + "<h3>Queue depth</h3>" + table(
                [{"level": lv["level"], **d} for lv in rep["levels"] for d in lv.get("depth") or []],
                ["level", "dev", "ios", "mean_depth", "median_depth", "p99_depth", "max_depth",
                 "avg_in_flight", "busy_fraction", "interarrival_median_ns", "latency_median_ns",
                 "latency_p99_ns"])
            + ("<h3>Files: the busiest by bytes</h3>" + table(rep["files"], [
                "path", "calls", "reads", "writes", "syncs", "read_bytes", "write_bytes", "busy_ns",
                "processes"]) if rep.get("files") else "")
            + ("<h3>Processes: the busiest by bytes</h3>" + table(rep["processes"], [
                "pid", "comm", "threads", "files", "calls", "reads", "writes", "syncs",
                "read_bytes", "write_bytes", "busy_ns"]) if rep.get("processes") else "")
            + "<h3>Amplification</h3>" + table(rep["amplification"], ["op", "level", "requests", "bytes",
                                                                    "ratio_to_above", "ratio_to_app"])
            + "<h3>Attribution</h3>" + table(rep["attribution"]["links"],
                                             ["upper_level", "lower_level", "kind", "attributed",
                                              "requests", "bytes", "fraction"])
            + "<h3>Read-modify-write</h3>" + table(rep["rmw"], ["hop", "partial_writes", "rmw_writes",
                                                               "reads", "read_bytes", "extra_ns"])
            + "<h3>Page cache and readahead</h3>" + table(rep["readahead"], [
                "level", "filled_bytes", "readahead_bytes", "used_bytes", "unused_bytes", "unused_fraction",
                "read_filled_bytes", "write_filled_bytes", "fault_filled_bytes", "other_filled_bytes"])
            + ("<h3>Discards and write-zeroes</h3>" + table(rep["discard"], [
                "level", "requests", "discard_bytes", "zeroes_bytes", "tied_bytes", "tied_fraction",
                "lag_median_ns"]) if rep.get("discard") else "")
            + ("<h3>Application hints</h3>" + table(rep["hints"], [
                "syscall", "advice", "calls", "failed", "range_bytes", "to_end_calls",
                "tied_requests", "tied_bytes"]) if rep.get("hints") else "")
            + f"<p>lost events: {rep['lost']['total']}</p>")


def _slowest_html(s: Session, cid: str) -> str:
    """The capture's slowest application read or write followed down the
    stack (nestrace follow), or nothing where no vfs level was traced."""
    import html

    from nestrace.report.follow import follow, timed_rows
    try:
        _, what, rows = follow(s, "vfs", None, cid)
    except ValueError:
        return ""
    cols = ["depth", "level", "io_id", "op", "offset_bytes", "bytes", "start_us", "latency_us",
            "in_flight", "kind", "link_bytes", "comm"]
    return f"<h3>Followed down the stack: {html.escape(what)}</h3>" + _html_table(timed_rows(rows), cols)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)
