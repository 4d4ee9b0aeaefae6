"""Each figure carries the numbers of the views it draws."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest
from rows import DISK, VDISK, capture_meta, device_map, extents, hostfs, request, vfs

from nestrace.query.session import Session
from nestrace.report import plots

MiB = 1 << 20


def session(**t) -> Session:
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                                "extent_maps": extents()} | t)


def test_seek_cdf_plots_the_cdf_of_known_distances():
    ev = (request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 4096, 4096, rq=2, bio=2)
          + request(7, 8, 9, DISK, 100 * 512, 4096, rq=3, bio=3)
          + request(10, 11, 12, DISK, 0, 4096, rq=4, bio=4))
    fig = plots.seek_cdf(session(block_events=ev), level="disk", labels=["hand-built"])
    assert isinstance(fig, go.Figure)
    (tr,) = fig.data
    size = float(1 << 21)
    # distances: 0, 84, -108 sectors -> |d| 0, 84, 108
    assert list(tr.x) == [0.0, 84 / size, 108 / size]
    assert list(tr.y) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert tr.name == "hand-built"


def test_seek_cdf_refuses_a_level_that_is_not_one():
    with pytest.raises(ValueError, match="unknown level 'disks' \\(choose from vfs, vdisk, hostfs, disk\\)"):
        plots.seek_cdf(session(), level="disks")


def test_a_capture_the_store_lacks_is_an_error_not_an_empty_figure_or_table():
    ev = request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 8192, 4096, rq=2, bio=2)
    s = session(block_events=ev, vfs_events=[vfs(1, 9, off=0)])
    for draw in (lambda: plots.seek_cdf(s, capture_id="c2"), lambda: plots.throughput(s, "c2"),
                 lambda: plots.queue_depth(s, "c2"), lambda: s.amplification("c2"),
                 lambda: s.seek_summary("c2")):
        with pytest.raises(ValueError, match="no capture 'c2' in the store \\(have: c1\\)"
                           "|no capture 'c2' in the store$"):
            draw()
    with pytest.raises(ValueError, match="no capture 'c2' in any of the 2 stores"):
        plots.seek_cdf([s, s], capture_id="c2")
    assert len(plots.seek_cdf(s, level="disk", capture_id="c1").data) == 1
    assert s.seek_summary("c1").num_rows == 1
    # follow_io: a level or an I/O the capture does not have
    with pytest.raises(ValueError, match="level 'disks': one of vfs, vdisk, hostfs, disk"):
        s.follow_io("disks", 1)
    (io,) = s.rows("SELECT io_id FROM disk_io ORDER BY ts_ns LIMIT 1")
    with pytest.raises(ValueError, match=f"capture c1 has no disk I/O with io_id {io['io_id'] + 1000}"):
        s.follow_io("disk", io["io_id"] + 1000)
    assert s.follow_io("disk", io["io_id"]).num_rows >= 1


def test_seek_cdf_overlays_one_curve_per_store():
    ev = request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 8192, 4096, rq=2, bio=2)
    a, b = session(block_events=ev), session(block_events=ev)
    fig = plots.seek_cdf([a, b], labels=["xfs", "btrfs"])
    assert [t.name for t in fig.data] == ["xfs", "btrfs"]


def test_latency_bars_stack_to_the_measured_latency():
    t = dict(vfs_events=[vfs(100, 900, off=8192)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
             + request(310, 320, 800, DISK, 104 * MiB + 8192, 4096, rq=2, bio=12),
             hostfs_events=[hostfs(300, 4 * MiB + 8192, 4096, source=3, flags=1)])
    fig = plots.latency_breakdown(session(**t))
    parts = {tr.name: tr.y[0] for tr in fig.data}
    # total 900 ns; vdisk Q..C 200..900; disk Q..C 310..800
    assert parts == pytest.approx({"guest service": 0.2, "guest queue": 0.01, "host FS": 0.2,
                                   "host queue": 0.01, "device": 0.48})
    assert sum(parts.values()) == pytest.approx(0.9)        # µs: the syscall's 900 ns
    assert fig.layout.barmode == "stack"


def test_amplification_chain_and_size_histograms_carry_bytes_and_counts():
    t = dict(vfs_events=[vfs(100, 900, off=8192)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
             + request(310, 320, 800, DISK, 104 * MiB, 32768, rq=2, bio=12))
    s = session(**t)
    fig = plots.amplification_chain(s)
    read = next(tr for tr in fig.data if tr.name == "read")
    assert list(read.x) == ["vfs", "vdisk", "hostfs", "disk"]
    assert list(read.y) == [4096, 4096, 0, 32768]
    sizes = {tr.name: dict(zip(tr.x, tr.y)) for tr in plots.size_histograms(s).data}
    assert sizes["vfs"]["4K"] == 1 and sizes["disk"]["32K"] == 1 and sizes["disk"]["4K"] == 0


def test_queue_depth_draws_each_levels_share_of_arrivals_per_bin():
    """Two overlapping reads then one alone at vfs (depths 1, 2, 1); one
    virtual-disk request (depth 1); no host-disk I/O."""
    t = dict(vfs_events=[vfs(100, 900), vfs(200, 100, off=4096), vfs(2000, 100, off=8192)],
             block_events=request(200, 210, 900, VDISK, 4 * MiB, 4096, rq=1, bio=11))
    fig = plots.queue_depth(session(**t))
    bars = {tr.name: dict(zip(tr.x, tr.y)) for tr in fig.data}
    assert list(bars) == ["vfs", "vdisk", "disk"]
    assert list(fig.data[0].x) == list(plots.DEPTH_BINS)
    assert bars["vfs"]["1"] == pytest.approx(2 / 3) and bars["vfs"]["2"] == pytest.approx(1 / 3)
    assert bars["vdisk"]["1"] == 1 and sum(bars["vdisk"].values()) == 1
    assert sum(bars["disk"].values()) == 0


def test_offset_scatter_is_downsampled():
    ev = []
    for i in range(50):
        ev += request(10 * i, 10 * i + 1, 10 * i + 2, DISK, i * 4096, 4096, rq=i + 1, bio=i + 1)
    fig = plots.offset_scatter(session(block_events=ev), max_points=20)
    disk_pts = sum(len(tr.x) for tr in fig.data if tr.yaxis == "y4")   # (the 4th row: disk)
    assert disk_pts == 20


def test_phase_distributions_draw_each_request_phase():
    ev = request(100, 130, 1130, DISK, 0, 4096, rq=1, bio=1) + request(200, 210, 710, VDISK, 0, 4096, rq=2, bio=2)
    fig = plots.phase_distributions(session(block_events=ev))
    by = {tr.name: dict(zip(tr.x, tr.y)) for tr in fig.data}
    assert by["disk"]["d2c"] == pytest.approx(1.0) and by["disk"]["q2c"] == pytest.approx(1.03)
    assert by["vdisk"]["d2c"] == pytest.approx(0.5)


def test_a_matrix_store_names_each_capture_by_its_stack_and_compares_them():
    """Three captures: ext4 on xfs twice (two rounds), xfs on xfs once with
    the virtual disk through the host page cache; each with its own seek
    curve and bars."""
    def cap(cid, guest_fs, vdisk_dio, disk_sectors, nbytes, dur=999):
        dm = [r | {"capture_id": cid} | ({"dio": vdisk_dio, "backing_path": "/h/image.raw"}
                                         if r["level"] == "vdisk" else {})
              for r in device_map(guest_fs=guest_fs)]
        ev = (request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1)
              + request(4, 5, 6, DISK, disk_sectors * 512, nbytes, rq=2, bio=2))
        return dm, [r | {"capture_id": cid} for r in ev + [vfs(1, dur, ret=2048)]]
    parts = [cap("a", "ext4", True, 8, 4096), cap("b", "xfs", False, 16, 4096),
             cap("c", "ext4", True, 8, 8192, dur=1998)]
    meta = [r | {"capture_id": cid} for cid in "abc" for r in capture_meta()]
    s = Session.from_tables({"capture_meta": meta, "device_map": sum((p[0] for p in parts), []),
                             "extent_maps": [], "block_events": sum((p[1][:-1] for p in parts), []),
                             "vfs_events": [p[1][-1] for p in parts]})
    names = {"a": "ext4 on xfs (dio on/-) #1", "b": "xfs on xfs (dio off/-)",
             "c": "ext4 on xfs (dio on/-) #2"}
    assert plots.capture_labels(s) == names
    fig = plots.seek_cdf(s, level="disk")
    # one distance each: 8 - 8 = 0, 16 - 8 = 8, 8 - 8 = 0 sectors
    assert [(t.name, list(t.x)) for t in fig.data] == [
        (names["a"], [0.0]), (names["b"], [8 / float(1 << 21)]), (names["c"], [0.0])]
    bars = plots.compare_bars(s, by_stack=False)
    by = {t.name: list(t.y) for t in bars.data}
    assert list(bars.data[0].x) == [names["a"], names["b"], names["c"]]
    assert by["read x app"] == [4.0, 4.0, 6.0]      # (4096 + nbytes) / 2048
    assert by["p50 us"] == [0.999, 0.999, 1.998]
    # a stack recorded twice (a, c): by default a bar per stack at the
    # rounds' median, MiB/s whiskers to the lowest and highest round
    stacks = plots.compare_bars(s)
    by = {t.name: list(t.y) for t in stacks.data}
    assert list(stacks.data[0].x) == ["ext4 on xfs (dio on/-)", names["b"]]
    assert by["read x app"] == [5.0, 4.0]
    fast, slow = 2048 / MiB / 999e-9, 2048 / MiB / 1998e-9
    assert by["MiB/s"] == pytest.approx([(fast + slow) / 2, fast])
    err = stacks.data[0].error_y
    assert list(err.array) == pytest.approx([(fast - slow) / 2, 0])
    assert list(err.arrayminus) == pytest.approx([(fast - slow) / 2, 0])
    # the per-store figures draw the captures side by side, not added up
    amp = plots.amplification_chain(s)
    reads = {t.name: dict(zip(t.x, t.y)) for t in amp.data if t.xaxis == "x"}
    assert {n: r["disk"] for n, r in reads.items()} == {names["a"]: 4.0, names["b"]: 4.0,
                                                        names["c"]: 6.0}
    sizes = {t.name: dict(zip(t.x, t.y)) for t in plots.size_histograms(s).data
             if t.yaxis == "y4"}                   # the disk panel: shares of its I/Os
    assert sizes[names["a"]]["4K"] == 1.0 and sizes[names["c"]]["8K"] == 0.5
    lat = plots.latency_breakdown(s).data[0]
    assert list(lat.x) == [f"{names[c]}: read 2K" for c in "abc"]
    # or one capture: the store's one-capture figure of it
    one = {t.name: list(t.y) for t in plots.amplification_chain(s, capture_id="c").data}
    assert one["read"] == [2048, 0, 0, 4096 + 8192]
    assert [(t.name, list(t.x)) for t in plots.seek_cdf(s, capture_id="b").data] == \
        [(names["b"], [8 / float(1 << 21)])]
    off = plots.offset_scatter(s, capture_id="a")
    assert sorted(y for t in off.data if t.yaxis == "y4" for y in t.y) == [0.0, 4096 / MiB]


def unsized_disk_session(**t) -> Session:
    """A store whose disk's size is unknown, as an imported blktrace's."""
    dm = device_map()
    for r in dm:
        r["size_sectors"] = 0
    return Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                                "extent_maps": extents()} | t)


SEEKS = (request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 4096, 4096, rq=2, bio=2)
         + request(7, 8, 9, DISK, 100 * 512, 4096, rq=3, bio=3)
         + request(10, 11, 12, DISK, 0, 4096, rq=4, bio=4))


def test_seek_cdf_of_a_device_of_unknown_size_draws_absolute_distances_on_a_log_axis():
    """Distances 0, 84 and 108 sectors: absolute, in bytes; the 0 is where
    the curve starts (a third of the I/Os), not a point on the log axis."""
    fig = plots.seek_cdf(unsized_disk_session(block_events=SEEKS), level="disk")
    (tr,) = fig.data
    assert list(tr.x) == [84 * 512, 108 * 512]
    assert list(tr.y) == pytest.approx([2 / 3, 1.0])
    assert fig.layout.xaxis.type == "log" and "absolute" in fig.layout.title.text
    linear = plots.seek_cdf(unsized_disk_session(block_events=SEEKS), distance="absolute",
                            log_x=False)
    assert list(linear.data[0].x) == [0, 84 * 512, 108 * 512]
    with pytest.raises(ValueError, match="size is unknown .* cannot be normalized"):
        plots.seek_cdf(unsized_disk_session(block_events=SEEKS), distance="normalized")


def test_seek_cdf_of_a_level_without_seeks_says_so_instead_of_drawing_empty_axes():
    with pytest.raises(ValueError, match="no seek distances at vfs in the store "
                                         "\\(levels with some: disk\\)"):
        plots.seek_cdf(session(block_events=SEEKS), level="vfs")


def test_curves_of_two_stores_of_the_same_stack_get_distinct_names(tmp_path):
    a, b = session(block_events=SEEKS), session(block_events=SEEKS)
    names = [t.name for t in plots.seek_cdf([a, b]).data]
    assert len(set(names)) == 2 and all(n.startswith("ext4 on xfs") for n in names), names
