"""The clock offset `nestrace merge` estimates between a guest and a host
capture, from hand-built rows, and links' windows widened by its error."""
from __future__ import annotations

import pyarrow as pa
import pytest
from rows import DISK, VDISK, capture_meta, device_map, extents, hostfs, request, vfs

from nestrace.importers.merge import MergeError, estimate_offset
from nestrace.query.session import Session

MiB = 1 << 20
O = 5_000_000_000


def _g(*rows):
    return pa.Table.from_pylist([dict(zip(("d_ns", "c_ns", "offset_bytes", "op"), r)) for r in rows])


def _h(*rows):
    return pa.Table.from_pylist([dict(zip(("ts_ns", "offset_bytes", "op"), r)) for r in rows])


def test_offset_is_where_the_pairs_intervals_agree():
    """Each pair bounds host - guest to [h - c, h - d]; a later access of
    the same offset (a false pair) and an access of another op do not
    move the estimate: [O-10, O+5] -> O-3 ± 8."""
    g = _g((1000, 1100, 0, "read"), (2000, 2050, 4096, "read"), (3000, 3300, 8192, "read"))
    h = _h((O + 1010, 0, "read"), (O + 2040, 4096, "read"), (O + 3005, 8192, "read"),
           (O + 9000, 0, "read"), (O + 2020, 4096, "write"))
    est = estimate_offset(g, h)
    assert (est.offset_ns, est.err_ns, est.pairs, est.candidates, est.requests) == (O - 3, 8, 3, 3, 3)
    # the disk starts 1 MiB into the image: the host offsets say so
    h2 = _h((O + 1010, MiB, "read"), (O + 2040, MiB + 4096, "read"), (O + 3005, MiB + 8192, "read"))
    assert estimate_offset(g, h2, image_offset=MiB).offset_ns == O - 3


def _hd(*rows):
    return pa.Table.from_pylist([dict(zip(("ts_ns", "offset_bytes", "op", "done_ns"), r))
                                 for r in rows], schema=pa.schema(
        [("ts_ns", pa.uint64()), ("offset_bytes", pa.int64()), ("op", pa.string()),
         ("done_ns", pa.uint64())]))


def test_a_host_disk_completion_tightens_the_bound():
    """The guest completes after the host disk request that served the
    access: done - c bounds the offset from below much more tightly than
    h - c.  A done before the access (a wrong match) is not used."""
    g = _g((1000, 1100, 0, "read"), (2000, 2050, 4096, "read"), (3000, 3300, 8192, "read"))
    h = _hd((O + 1010, 0, "read", O + 1095), (O + 2040, 4096, "read", None),
            (O + 3005, 8192, "read", O + 3290), (O + 2040, 4096, "read", O + 1))
    # bounds: [O-90, O+10] [O-5, O+10]; [O-10, O+40]; [O-295, O+5] [O-10, O+5];
    # the last access's own [O-10, O+40] (its done is before it: unused)
    est = estimate_offset(g, h)
    assert (est.offset_ns, est.err_ns, est.pairs) == (O, 5, 6)
    without = estimate_offset(g, h.drop_columns(["done_ns"]))
    assert (without.offset_ns, without.err_ns) == (O - 3, 8)


def test_offset_drops_a_few_outlying_bounds():
    """With outliers=0.2 of 10 pairs, the two tightest bounds are left
    out: the interval ends where the third tightest does."""
    g = _g(*[(1000 * i, 1000 * i + 100 + i, 4096 * i, "read") for i in range(1, 11)])
    h = _h(*[(O + 1000 * i + i, 4096 * i, "read") for i in range(1, 11)])
    # pair i: [O + i - 100 - i, O + i] = [O - 100, O + i]
    assert estimate_offset(g, h).offset_ns == O + (-100 + 1) // 2
    est = estimate_offset(g, h, outliers=0.2)
    assert (est.offset_ns, est.err_ns) == (O + (-100 + 3) // 2, 52)


def test_offset_needs_pairs_that_agree():
    g = _g((1000, 1100, 0, "read"))
    with pytest.raises(MergeError, match="no host access"):
        estimate_offset(g, _h((O, 4096, "read")))
    with pytest.raises(MergeError, match="only 1 bounds agree"):
        estimate_offset(g, _h((O, 0, "read")))


def test_links_widen_cross_machine_windows_by_the_clock_error():
    """A host access and disk request seen 50 ns before the guest request
    started: outside its window on one clock, inside once the merged
    capture's clock error (60 ns) is allowed for."""
    def links(err):
        t = dict(capture_meta=capture_meta(clock_offset_ns=0 if err else None,
                                           clock_offset_err_ns=err),
                 device_map=device_map(), extent_maps=extents(),
                 vfs_events=[vfs(100, 900, off=8192, f_flags=0o40000)],
                 block_events=request(200, 210, 900, VDISK, 4 * MiB + 8192, 4096, rq=1, bio=11)
                 + request(150, 160, 800, DISK, 104 * MiB + 8192, 4096, rq=2, bio=12),
                 hostfs_events=[hostfs(150, 4 * MiB + 8192, 4096, source=3, flags=1)])
        return Session.from_tables(t).rows(
            "SELECT lower_level, kind FROM links WHERE upper_level = 'vdisk' ORDER BY 1")
    assert links(None) == [{"lower_level": "disk", "kind": "other"},
                           {"lower_level": "hostfs", "kind": "other"}]
    assert links(60) == [{"lower_level": "disk", "kind": "sync"},
                         {"lower_level": "hostfs", "kind": "sync"}]
