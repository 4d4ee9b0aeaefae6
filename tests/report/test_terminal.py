"""The terminal report: one unit per column, numbers without float noise,
rows in the levels' order, sentences that read."""
from __future__ import annotations

import io

from rich.console import Console
from rows import DISK, VDISK, capture_meta, device_map, extents, request, vfs

from nestrace.query.session import Session
from nestrace.report.document import build
from nestrace.report.terminal import render


def rendered(**t) -> str:
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": device_map(),
                             "extent_maps": extents()} | t)
    out = io.StringIO()
    render(build(s), console=Console(file=out, width=120, force_terminal=False))
    return out.getvalue()


def test_seek_columns_are_bytes_at_every_level_and_rows_follow_the_levels():
    """Disk distances 0, 84 and 108 sectors: the median is 84 sectors, 42
    KiB, and the p90 108 sectors, 54 KiB, in the same unit as the file
    levels' bytes beside them."""
    ev = (request(1, 2, 3, DISK, 0, 4096, rq=1, bio=1) + request(4, 5, 6, DISK, 4096, 4096, rq=2, bio=2)
          + request(7, 8, 9, DISK, 100 * 512, 4096, rq=3, bio=3)
          + request(10, 11, 12, DISK, 0, 4096, rq=4, bio=4)
          + request(20, 21, 22, VDISK, 0, 4096, rq=5, bio=5))
    text = rendered(block_events=ev, vfs_events=[vfs(100, 50, off=0), vfs(200, 50, off=8192)])
    disk = next(line for line in text.splitlines() if line.strip().startswith("disk ")
                and "KiB" in line)
    assert disk.split()[-4:] == ["42.0", "KiB", "54.0", "KiB"], disk
    assert "sectors" not in text and "0000000" not in text, text
    sync = [line.split()[1] for line in text.splitlines() if line.strip().startswith("sync ")]
    assert sync == ["vfs", "vdisk", "disk"], sync


def test_compare_names_each_capture_and_shows_no_stack_for_an_imported_trace():
    """An imported block trace has no file systems: its row says '-' for
    the stack, not '-/-', and every row names its capture."""
    from nestrace.capture import matrix
    dm = [r for r in device_map() if r["level"] == "disk"]
    s = Session.from_tables({"capture_meta": capture_meta(), "device_map": dm,
                             "extent_maps": extents(), "block_events": request(
                                 1, 2, 3, DISK, 0, 4096, rq=1, bio=1)})
    out = io.StringIO()
    matrix.render(matrix.compare(s, None), console=Console(file=out, width=160))
    row = next(line for line in out.getvalue().splitlines() if line.strip().startswith("c1"))
    assert "-/-" not in row and row.split()[1:3] == ["-", "-"], row


def test_a_network_hop_this_kernel_cannot_trace_is_named():
    """The Debian 6.1 guest's FUSE has no request tracepoints: a capture
    through sshfs there has an empty netfs level, and the summary says why
    (the hooks as the agent reported them, in capture_meta.hooks_json)."""
    import json

    from nestrace.report.summary import untraced
    sshfs = json.dumps({"net": {"kind": "sshfs", "transport": "socat"}})
    hooks = {"fuse_request_send": "missing", "fuse_request_end": "missing",
             "nfs_initiate_read": "tp_btf", "block_rq_issue": "tp_btf"}
    assert untraced(sshfs, json.dumps(hooks)) == (
        "not traced: netfs (this kernel has no fuse_request_send, fuse_request_end "
        "tracepoints: the sshfs client's requests are not seen)")
    hooks["fuse_request_send"] = hooks["fuse_request_end"] = "tp_btf"
    assert untraced(sshfs, json.dumps(hooks)) is None
    # (a stack with no network hop, or an import with no hooks: nothing to say)
    assert untraced(json.dumps({}), json.dumps(hooks)) is None
    assert untraced(sshfs, "{}") is None
