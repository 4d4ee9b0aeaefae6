"""Two-machine captures: a guest side and a host side, recorded apart and
merged onto one clock (`record --side`, `nestrace merge`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import test_qcow2
from conftest import (
    assert_losses_counted,
    drop_caches,
    host_side_recording,
    journal_unreadable_here,
    run_cli,
)
from tracethrough import (
    FIO_RANDREAD,
    TRACE_THROUGH,
    TRACE_THROUGH_MAPPED,
    fio_log_offsets,
)

import nestrace
from nestrace._paths import agent_path
from nestrace.store.files import write_parquet_file

MiB = 1 << 20


# ---- real captures ----------------------------------------------------------

SHIFT = 3_141_592_653_589   # the "host" booted ~52 minutes before the "guest"


def shift_store(store: Path, shift_ns: int, machine: str) -> None:
    """Make a capture look recorded on another machine: every time moved
    by shift_ns, another host name; its manifest written anew (as the
    other machine's record wrote it)."""
    for f in store.glob("*/capture=*/*.parquet"):
        t = pq.read_table(f)
        table = f.parent.parent.name
        # (a block_request's phase times too, those seen: 0 is none)
        for col in ("ts_ns", "start_ns", "end_ns", "q_ns", "g_ns", "i_ns", "d_ns"):
            if col in t.column_names:
                i = t.schema.get_field_index(col)
                t = t.set_column(i, t.schema.field(i),
                                 pa.array([v + shift_ns if v or col in ("ts_ns", "start_ns", "end_ns")
                                           else v for v in t.column(col).to_pylist()],
                                          t.schema.field(i).type))
        if table in ("capture_meta", "device_map") and "machine" in t.column_names:
            i = t.schema.get_field_index("machine")
            t = t.set_column(i, t.schema.field(i), pa.array([machine] * t.num_rows, pa.string()))
        write_parquet_file(t, f)
    _republish(store)


def record_both_sides(lab, tmp_path: Path, guest_by: str = "record", host_extra=()
                      ) -> tuple[Path, Path, list[int], str, str]:
    """The host side records in the background (until SIGINT) while the
    guest side records an fio job: two agents, two stores.  guest_by
    "agent": the guest side is the agent alone (`--guest-capture`, no
    Python), made a store by `nestrace import`.  host_extra: the host
    side's record options.  Returns the stores, fio's offsets, and what
    the host side and the guest side (record, or import) printed."""
    from nestrace.capture.stack import discover
    image = discover(lab.mount).image_path
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    drop_caches(lab)
    gstore, hstore, log = tmp_path / "guest", tmp_path / "host", tmp_path / "fio.iolog"
    fio = ["fio", "--name=t", f"--directory={lab.mount}", "--ioengine=psync",
           "--output=/dev/null", f"--write_iolog={log}", *FIO_RANDREAD]
    with host_side_recording(hstore, image, extra=host_extra) as host:
        if guest_by == "agent":
            r = subprocess.run([str(agent_path()), "--guest", lab.mount, "--guest-capture",
                                str(tmp_path / "gdir"), "--", *fio], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert "fio exited 0" in r.stderr, r.stderr
        else:
            g = run_cli("record", "-o", str(gstore), "--side", "guest", "--stack", lab.mount,
                        "--", *fio)
    if guest_by == "agent":
        g = run_cli("import", str(tmp_path / "gdir"), "-o", str(gstore))
    # (losses: assert_losses_counted, against the guest side's output; a
    # warning only with them)
    assert "lost events: 0" not in g.stdout or "warning" not in g.stderr, (g.stdout, g.stderr)
    # each side's chain, and where it stops
    assert "\nchain: vfs > vdisk; it stops at vdisk: the host side was not traced" in g.stdout, \
        g.stdout
    assert "\nchain: hostfs > disk\n" in host["stdout"], host["stdout"]
    return gstore, hstore, fio_log_offsets(log), host["stdout"], g.stdout


@pytest.mark.root
@pytest.mark.parametrize("guest_by, guest_fs", [("record", "ext4"), ("agent", "ext4"),
                                               ("agent", "btrfs")])
def test_guest_and_host_sides_merge_into_one_capture_that_traces_through(lab_factory, tmp_path,
                                                                         guest_by, guest_fs):
    """ext4 on xfs, direct I/O: the guest side (vfs, vdisk) and the host
    side (hostfs, disk) recorded by two agents; the host store's clock
    moved by SHIFT as if recorded on another machine.  merge finds SHIFT
    within its error bound, and in the merged capture every fio read is
    followed to a vdisk request, a host access and a disk request.
    guest_by "agent": the guest side is the agent alone, on file systems
    on partitions (as in a real VM image), imported on "the host"; a
    btrfs guest's extents mapped through the chunk tree the agent read.
    guest_by "record": the host side records --per-request, and merge
    moves the times its disk requests carry onto the guest's clock too."""
    lab = lab_factory(guest_fs, "xfs", guest_dio="on", host_dio="on",
                      **({"partitions": True} if guest_by == "agent" else {}))
    per_request = guest_by == "record"
    gstore, hstore, offsets, host_out, guest_out = record_both_sides(
        lab, tmp_path, guest_by, host_extra=["--per-request"] if per_request else [])
    if guest_by == "agent":
        # record takes the guest side's snapshot from the agent too:
        # the same rows, and the journal's where the guest's fs has one
        from nestrace.capture.snapshots import snapshot_extents
        from nestrace.capture.stack import guest_side
        cols = ["phase", "role", "path", "dev", "ino", "logical_bytes", "physical_bytes",
                "length_bytes", "flags", "physical_dev"]
        py = snapshot_extents(guest_side(lab.mount), "x", "start")[0].select(cols).to_pylist()
        assert any(r["role"] == "fs_journal" for r in py) == (guest_fs == "ext4"), py
        with nestrace.open(gstore) as s:
            got = s.rows(f"SELECT {', '.join(cols)} FROM extent_maps WHERE phase = 'start'")
            dm = s.rows("SELECT level, name, part_start_bytes, size_sectors FROM device_map "
                        "ORDER BY level")
        assert py and sorted(got, key=str) == sorted(py, key=str)
        assert [(r["level"], r["part_start_bytes"]) for r in dm] == [("vdisk", 0), ("vfs", MiB)]
        # (the partition's size, from the agent too: the image but its first MiB)
        assert dm[1]["size_sectors"] * 512 == dm[0]["size_sectors"] * 512 - MiB, dm
    counted = {}
    with nestrace.open(gstore) as s:
        assert_losses_counted(s, guest_out)
        counted["guest"] = s.rows("SELECT lost_total, completions_missed AS c, "
                                  "requests_unfinished AS u FROM capture_meta")[0]
        assert {r["level"] for r in s.rows("SELECT level FROM device_map")} == {"vfs", "vdisk"}
        assert s.rows("SELECT count(*) AS n FROM hostfs_events")[0]["n"] == 0
    with nestrace.open(hstore) as s:
        assert_losses_counted(s, host_out)
        counted["host"] = s.rows("SELECT lost_total, completions_missed AS c, "
                                 "requests_unfinished AS u FROM capture_meta")[0]
        assert {r["level"] for r in s.rows("SELECT level FROM device_map")} == {"hostfs", "disk"}
        assert s.rows("SELECT count(*) AS n FROM vfs_events")[0]["n"] == 0
    # each side's report is of its own two levels
    rep = json.loads(run_cli("report", "--json", str(gstore)).stdout)
    assert {lv["level"]: lv["traced"] for lv in rep["levels"]} == \
        {"vfs": True, "vdisk": True, "hostfs": False, "disk": False}
    assert {r["level"] for r in rep["amplification"]} == {"vfs", "vdisk"}
    assert rep["latency"] == []     # (the host's part of the time is not in it)
    text = " ".join(run_cli("report", str(gstore)).stdout.split())
    assert "; the chain stops at vdisk: the host side was not traced" in text, text
    shift_store(hstore, SHIFT, "hostbox")

    merged = tmp_path / "merged"
    r = run_cli("merge", str(gstore), str(hstore), "-o", str(merged))
    assert "clock: host clock - guest clock =" in r.stdout
    assert "\nchain: vfs > vdisk > hostfs > disk\n" in run_cli("summary", str(merged)).stdout
    s = nestrace.open(merged)
    m = s.rows("SELECT clock_offset_ns AS o, clock_offset_err_ns AS e, clock_offset_pairs AS n "
               "FROM capture_meta")[0]
    # the image is read with O_DIRECT: each access's host disk request
    # bounds the offset too, to within ~1 µs here (~20 µs without)
    assert abs(m["o"] - SHIFT) <= m["e"] < 20_000, m
    # each side's settings, as each agent ran
    settings = json.loads(s.rows("SELECT settings_json FROM capture_meta")[0]["settings_json"])
    assert {side: settings[side]["families"] for side in ("guest", "host")} == \
        {"guest": "vfs,block,hostfs", "host": "block,hostfs"}, settings
    # (the guest's hostfs family: its page cache and mappings, no image
    # access hooks; the merged capture's hooks say what the host attached)
    with nestrace.open(gstore) as g:
        hooks = json.loads(g.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["xfs_file_buffered_read"] == "skipped", hooks
    assert hooks["mm_filemap_add_to_page_cache"] in ("tp_btf", "raw_tp"), hooks
    hooks = json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["xfs_file_direct_read"] in ("tp_btf", "raw_tp"), hooks
    assert m["n"] >= 4096
    assert {r["level"]: r["machine"] for r in s.rows("SELECT level, machine FROM base_levels")} == \
        {"vfs": os.uname().nodename, "vdisk": os.uname().nodename, "hostfs": "hostbox", "disk": "hostbox"}

    assert sorted(r["offset_bytes"] for r in s.rows(
        "SELECT offset_bytes FROM vfs_io WHERE syscall = 'pread64'")) == sorted(offsets)
    if guest_by == "agent":
        # each read's pieces in map_vfs (which adds the partitions' starts;
        # the small partitioned guest FS has 1 KiB blocks, so a read may be
        # two pieces) are in a request or access of each level in flight
        got = s.con.execute(TRACE_THROUGH_MAPPED, {"err": m["e"]}).fetchone()
        assert got[0] == 4096 and got[1] == got[2] == got[3] == got[4], got
    else:
        got = s.con.execute(TRACE_THROUGH, {"syscall": "pread64", "err": m["e"]}).fetchone()
        assert dict(zip(("mapped", "vdisk", "hostfs", "disk"), got)) == \
            {"mapped": 4096, "vdisk": 4096, "hostfs": 4096, "disk": 4096}
    # each read tied across the machines; the host side also saw what the
    # guest wrote after its agent stopped (the end snapshot's sync) and its
    # own journal: classified, not attributed
    # (a vdisk request whose completion the guest never recorded, see
    # assert_losses_counted, is tied too: its window ends at the next use of
    # its request id or at the capture's end, block_requests.done_by_ns)
    # and the merged capture's loss counts are both sides'
    assert s.rows("SELECT lost_total, completions_missed AS c, requests_unfinished AS u "
                  "FROM capture_meta")[0] == {k: counted["guest"][k] + counted["host"][k]
                                               for k in ("lost_total", "c", "u")}
    # the vdisk requests: fio's reads, and a btrfs guest's reads of its own
    # metadata (checksums), each served by a host access and disk request;
    # any write is the guest FS's own, no call's (an ext4 journal commit
    # can fall in the capture)
    nvd = s.rows("SELECT count(*) AS n FROM vdisk_io")[0]["n"]
    nrd = s.rows("SELECT count(*) AS n FROM vdisk_io WHERE op = 'read'")[0]["n"]
    assert nrd == 4096 or (guest_fs == "btrfs" and 4096 < nrd < 4096 + 64), nrd
    own = s.rows("SELECT DISTINCT l.kind FROM links l JOIN vdisk_io v ON v.capture_id = "
                 "l.capture_id AND v.io_id = l.lower_id WHERE l.lower_level = 'vdisk' "
                 "AND v.op <> 'read'")
    assert {r["kind"] for r in own} <= {"journal", "metadata"} and nvd - nrd < 64, (own, nvd)
    # (a flush has no host access; the guest FS's own writes may each be
    # several disk requests)
    nrw = s.rows("SELECT count(*) AS n FROM vdisk_io WHERE op IN ('read', 'write')")[0]["n"]
    synced = {(r["upper_level"], r["lower_level"]): r["requests"] for r in s.rows(
        "SELECT * FROM links_summary WHERE kind = 'sync'")}
    # a read split across two image extents is two disk requests
    reads_disk = (got[1] if guest_by == "agent" else 4096) + nrd - 4096
    assert synced == {("vfs", "vdisk"): 4096, ("vdisk", "hostfs"): nrw,
                      ("vdisk", "disk"): reads_disk} or (
        nvd > nrd and synced[("vfs", "vdisk")] == 4096 and synced[("vdisk", "hostfs")] == nrw
        and synced[("vdisk", "disk")] >= reads_disk + nrw - nrd), (synced, nvd, nrd, nrw)
    to_app = {r["level"]: r for r in s.rows("SELECT * FROM links_to_vfs")}
    # (all of it but a btrfs guest's metadata reads)
    assert to_app["vdisk"]["fraction"] == 16 * MiB / to_app["vdisk"]["bytes"]
    assert to_app["vdisk"]["fraction"] == 1.0 or guest_fs == "btrfs" or nvd > nrd
    # the disk's bytes tied to the application are the vdisk's, and what
    # else it did while the guest side traced is under 1 % of its bytes:
    # the rest came before or after, seen by the host side alone (a btrfs
    # guest's commit at its agent's end snapshot: up to 280 KiB, so no
    # bound over the whole capture holds; the write-back of what the
    # guest wrote in the second before its side started: 192 KiB with a
    # file made and synced in the guest every 0.3 s)
    assert to_app["disk"]["app_bytes"] == to_app["vdisk"]["app_bytes"], to_app
    with nestrace.open(gstore) as g:
        window = g.rows("SELECT start_ns, end_ns FROM capture_meta")[0]
    other = s.rows("SELECT sum(l.bytes) FILTER (WHERE d.ts_ns BETWEEN ? AND ?) AS during, "
                   "sum(l.bytes) AS outside_too FROM links l JOIN disk_io d "
                   "ON d.capture_id = l.capture_id AND d.io_id = l.lower_id "
                   "WHERE l.lower_level = 'disk' AND l.upper_id IS NULL",
                   [window["start_ns"], window["end_ns"]])[0]
    assert (other["during"] or 0) <= 0.01 * to_app["disk"]["bytes"], (other, to_app)
    lost = s.rows("SELECT sum(ringbuf_drops) AS drops, sum(seq_gaps) AS gaps FROM lost_events")[0]
    assert lost == {"drops": 0, "gaps": 0}
    # (cpu, seq) stay unique: the host's CPUs are renumbered
    assert s.rows("SELECT count(*) AS n FROM (SELECT cpu, seq FROM block_events "
                  "GROUP BY ALL HAVING count(*) > 1)")[0]["n"] == 0
    rep = json.loads(run_cli("report", "--json", str(merged)).stdout)
    assert rep["clock"]["host_machine"] == "hostbox" and rep["clock"]["err_ns"] == m["e"]
    # where the reads' time went, across the two machines: the parts add up
    # to the whole, and each part is the level's own time, read from the
    # requests themselves (not a share of the whole: the guest's parts grow
    # when other tests load the machine; the device's does not)
    lat = {r["class"]: r for r in rep["latency"]}["read 4K"]
    parts = ("guest_service_ns", "guest_queue_ns", "host_fs_ns", "host_queue_ns", "device_ns")
    # (a call whose request's completion the kernel lost, counted in
    # completions_missed, has no parts and is counted apart)
    missed = s.rows("SELECT sum(completions_missed + requests_unfinished) AS n "
                    "FROM capture_meta")[0]["n"]
    assert lat["calls"] + lat["calls_unended"] >= 4096 and lat["calls_unended"] <= missed, lat
    assert abs(sum(lat[k] for k in parts) - lat["total_ns"]) < 1, lat
    assert all(lat[k] > 0 for k in parts), lat
    d2c = {r["level"]: r["d2c"] for r in s.rows(
        "SELECT level, avg(d2c_ns) AS d2c FROM block_requests WHERE op = 'read' "
        "AND ts_ns BETWEEN ? AND ? GROUP BY level", [window["start_ns"], window["end_ns"]])}
    # the device's part is the host disk's D -> C (a btrfs guest's own
    # metadata reads are a few more, untied to a call), inside the guest's
    # virtual-disk D -> C across the two clocks
    assert abs(lat["device_ns"] - d2c["disk"]) < 0.02 * d2c["disk"], (lat, d2c)
    assert lat["device_ns"] < d2c["vdisk"], (lat, d2c)
    assert "Where an app I/O's time goes" in run_cli("report", str(merged)).stdout
    run_cli("verify", str(merged))
    # the same capture merged twice into one store is refused, and a
    # guest capture is not taken for a host one
    again = run_cli("merge", str(gstore), str(hstore), "-o", str(merged), check=False)
    assert again.returncode == 2 and "already has capture" in again.stderr
    wrong = run_cli("merge", str(hstore), str(gstore), "-o", str(tmp_path / "x"), check=False)
    assert wrong.returncode == 2 and "a guest capture has vfs and vdisk only" in wrong.stderr


def recode_devs(store: Path, old: int, new: int) -> None:
    """Make a capture look recorded where device `old` is numbered `new`:
    every column naming a device."""
    for f in store.glob("*/capture=*/*.parquet"):
        t = pq.read_table(f)
        for col in ("dev", "backing_dev", "physical_dev"):
            if col in t.column_names:
                i = t.schema.get_field_index(col)
                t = t.set_column(i, t.schema.field(i), pa.array(
                    [new if v == old else v for v in t.column(col).to_pylist()],
                    t.schema.field(i).type))
        write_parquet_file(t, f)
    _republish(store)


def _republish(store: Path) -> None:
    """A capture's manifest written anew, as the machine that recorded the
    capture (changed here by hand) wrote it."""
    from nestrace.store.files import captures
    from nestrace.store.manifest import publish
    for cid in captures(store):
        publish(store, cid)


@pytest.mark.root
def test_a_host_device_numbered_as_a_guest_one_is_renumbered_everywhere(lab_factory, tmp_path):
    """A VM on a host whose own disk has the number of the guest's virtual
    disk (a nested VM: both virtio vda, 254:0): merge renumbers the host's
    device, in every column that names it: the image's extents on the host
    disk (extent_maps.physical_dev) too, or no virtual-disk request would
    reach the host disk (all 4096 were kind other there)."""
    from nestrace.capture.stack import discover
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    st = discover(lab.mount)
    gstore, hstore, offsets, _, _ = record_both_sides(lab, tmp_path)
    recode_devs(hstore, st.disk.kdev, st.vdisk.kdev)     # the host disk takes the vdisk's number
    with nestrace.open(hstore) as s:
        assert {r["dev"] for r in s.rows("SELECT dev FROM device_map WHERE level = 'disk'")} == \
            {st.vdisk.kdev}
    shift_store(hstore, SHIFT, "hostbox")
    merged = tmp_path / "merged"
    run_cli("merge", str(gstore), str(hstore), "-o", str(merged))
    s = nestrace.open(merged)
    disk = s.rows("SELECT dev FROM device_map WHERE level = 'disk'")[0]["dev"]
    assert disk != st.vdisk.kdev
    assert {r["physical_dev"] for r in s.rows(
        "SELECT DISTINCT physical_dev FROM extent_maps WHERE role = 'image'")} == {disk}
    got = {(r["upper_level"], r["lower_level"]): r["requests"] for r in s.rows(
        "SELECT * FROM links_summary WHERE kind = 'sync'")}
    # fio's 4096 reads, and the guest FS's own writes if it made any during
    # the capture (a journal commit):
    # every one reaches the host file and the renumbered host disk
    nrd, nrw = s.con.execute("SELECT count(*) FILTER (WHERE op = 'read'), "
                             "count(*) FILTER (WHERE op IN ('read', 'write')) FROM vdisk_io").fetchone()
    assert nrd == 4096 and nrw - nrd < 64, (nrd, nrw)
    to_disk = got.pop(("vdisk", "disk"))
    assert got == {("vfs", "vdisk"): 4096, ("vdisk", "hostfs"): nrw}, got
    # (a guest FS write across two image extents is two disk requests)
    assert to_disk == nrw or (nrw > nrd and to_disk > nrw), (to_disk, nrw)


@pytest.mark.root
@pytest.mark.parametrize("guest_by", ["record", "agent"])
def test_guest_side_on_this_machines_own_virtio_disk(tmp_path, guest_by):
    """This machine is a VM: its root file system is on virtio-blk.  The
    guest side traces fio's O_DIRECT reads there, each to a vda request at
    the sector the file's extent map gives, in flight with the read.
    guest_by "agent": the agent alone records (as in a guest without
    nestrace's Python), `nestrace import` makes the store."""
    d = Path("/var/tmp") / f"nestrace-virtio-{os.getpid()}"
    d.mkdir()
    try:
        subprocess.run(["fio", "--name=t", f"--directory={d}", "--rw=write", "--bs=1M",
                        "--size=16M", "--direct=1", "--output=/dev/null"], check=True)
        ino = next(d.iterdir()).stat().st_ino
        store = tmp_path / "s"
        fio = ["fio", "--name=t", f"--directory={d}", "--rw=randread", "--bs=4k",
               "--size=16M", "--io_size=4M", "--direct=1", "--ioengine=psync",
               "--output=/dev/null"]
        if guest_by == "agent":
            a = subprocess.run([str(agent_path()), "--guest", "/", "--guest-capture",
                                str(tmp_path / "gdir"), "--", *fio], capture_output=True, text=True)
            assert a.returncode == 0 and "fio exited 0" in a.stderr, a.stderr
            r = run_cli("import", str(tmp_path / "gdir"), "-o", str(store))
        else:
            r = run_cli("record", "-o", str(store), "--side", "guest", "--stack", "/", "--", *fio)
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=True)
    s = nestrace.open(store)
    assert_losses_counted(s, r.stdout)
    vd = s.rows("SELECT name FROM device_map WHERE level = 'vdisk'")[0]["name"]
    assert vd.startswith("vd"), f"root is on {vd}, not a virtio disk"
    got = s.rows(f"""
        WITH r AS (SELECT * FROM vfs_io WHERE ino = {ino} AND syscall = 'pread64'),
        gm AS (SELECT * FROM map_extents WHERE role = 'guest_file' AND ino = {ino}),
        p AS (SELECT r.ts_ns, r.end_ns, r.bytes,
                     gm.physical_bytes + (r.offset_bytes - gm.logical_bytes) AS off
              FROM r JOIN gm ON r.offset_bytes >= gm.logical_bytes
                            AND r.offset_bytes + r.bytes <= gm.logical_bytes + gm.length_bytes)
        SELECT (SELECT count(*) FROM r) AS reads, count(*) AS mapped,
          count(*) FILTER (WHERE EXISTS (SELECT 1 FROM vdisk_io v WHERE v.op = 'read'
            AND v.offset_bytes <= p.off AND p.off + p.bytes <= v.offset_bytes + v.bytes
            AND v.ts_ns BETWEEN p.ts_ns AND p.end_ns)) AS vdisk
        FROM p""")
    assert got == [{"reads": 1024, "mapped": 1024, "vdisk": 1024}]


def other_warnings(stderr: str, store: Path) -> list[str]:
    """Warnings but the one that the store is on the traced stack (here
    the image and the store are both on the disk under /tmp, which the
    host side traces), and that the journal of a file system on a device
    this machine does not let us open is unknown (conftest)."""
    own = f"nestrace: warning: the store {store} is on the traced stack"
    assert own in stderr                  # (its writes are at the disk level)
    return [line for line in stderr.splitlines()
            if "warning" in line and own not in line and not journal_unreadable_here(line)]


@pytest.mark.root
def test_side_options_are_checked(tmp_path):
    r = run_cli("record", "-o", str(tmp_path / "s"), "--side", "host", "--duration", "1",
                check=False)
    assert r.returncode == 2 and "--side host needs --image FILE" in r.stderr
    r = run_cli("record", "-o", str(tmp_path / "s"), "--side", "host", "--image", "/dev/null",
                "--duration", "1", check=False)
    assert r.returncode == 2 and "/dev/null: not a regular file" in r.stderr
    r = run_cli("record", "-o", str(tmp_path / "s"), "--side", "guest", "--image", "/x",
                "--stack", "/", "--duration", "1", check=False)
    assert r.returncode == 2 and "not --image or --disk" in r.stderr


@pytest.mark.root
def test_the_host_side_traces_an_images_backing_chain_on_its_file_system(tmp_path):
    """An overlay on a qcow2 base on a raw file, all three beside it: the
    host side traces the three files (stack_json, their extents) and
    stores the map with the file each part of the disk is read from; a
    vmdk snapshot's parent likewise.  A
    backing file on another file system (tmpfs) is named in a warning and
    left out."""
    raw, mid, top = tmp_path / "base.raw", tmp_path / "mid.qcow2", tmp_path / "top.qcow2"
    subprocess.run(["truncate", "-s", "4M", str(raw)], check=True)
    subprocess.run(["qemu-io", "-f", "raw", "-c", "write -P 2 0 1M", str(raw)], check=True,
                   capture_output=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.raw", "-F", "raw",
                    str(mid), "8M"], cwd=tmp_path, check=True)
    subprocess.run(["qemu-io", "-c", "write -P 1 5M 64k", str(mid)], check=True,
                   capture_output=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2",
                    str(top)], cwd=tmp_path, check=True)
    r = run_cli("record", "-o", str(tmp_path / "h"), "--side", "host", "--image", str(top),
                "--duration", "0.5")
    assert other_warnings(r.stderr, tmp_path / "h") == [], r.stderr
    s = nestrace.open(tmp_path / "h")
    st = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    ino = {p.name: p.stat().st_ino for p in (raw, mid, top)}
    assert st["image_ino"] == ino["top.qcow2"]
    assert [(b["path"], b["fmt"], b["ino"]) for b in st["backing_files"]] == \
        [(str(mid), "qcow2", ino["mid.qcow2"]), (str(raw), "raw", ino["base.raw"])]
    assert {r["ino"] for r in s.rows("SELECT DISTINCT ino FROM extent_maps WHERE role = 'image'")} \
        == set(ino.values())
    assert [tuple(r.values()) for r in s.rows(
        "SELECT logical_bytes, ino, length_bytes, cluster_bytes FROM extent_maps "
        "WHERE role = 'vdisk_image' AND phase = 'end' ORDER BY 1")] == [
        (0, ino["base.raw"], 4 << 20, 65536), (5 << 20, ino["mid.qcow2"], 65536, 65536)]

    # a vmdk snapshot: its parent is followed the same way
    vb, vs = tmp_path / "base.vmdk", tmp_path / "snap.vmdk"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", str(vb), "8M"], check=True)
    subprocess.run(["qemu-io", "-f", "vmdk", "-c", "write -P 2 0 1M", str(vb)], check=True,
                   capture_output=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", "-b", "base.vmdk", "-F", "vmdk",
                    str(vs)], cwd=tmp_path, check=True)
    subprocess.run(["qemu-io", "-f", "vmdk", "-c", "write -P 1 5M 64k", str(vs)], check=True,
                   capture_output=True)
    r = run_cli("record", "-o", str(tmp_path / "v"), "--side", "host", "--image", str(vs),
                "--duration", "0.5")
    assert other_warnings(r.stderr, tmp_path / "v") == [], r.stderr
    s = nestrace.open(tmp_path / "v")
    st = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    assert (st["image_format"], st["backing_files"]) == \
        ("vmdk", [{"path": str(vb), "fmt": "vmdk", "ino": vb.stat().st_ino}])
    assert [tuple(r.values()) for r in s.rows(
        "SELECT logical_bytes, ino, length_bytes FROM extent_maps "
        "WHERE role = 'vdisk_image' AND phase = 'end' ORDER BY 1")] == [
        (0, vb.stat().st_ino, 1 << 20), (5 << 20, vs.stat().st_ino, 65536)]

    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(shm / "b.qcow2"), "8M"],
                       check=True)
        over = tmp_path / "over.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(shm / "b.qcow2"),
                        "-F", "qcow2", str(over)], check=True)
        r = run_cli("record", "-o", str(tmp_path / "h2"), "--side", "host", "--image", str(over),
                    "--duration", "0.5")
    finally:
        shutil.rmtree(shm)
    assert f"{over}'s backing file {shm / 'b.qcow2'} is not on /: guest reads that go to it " \
           "are not traced" in " ".join(r.stderr.split())
    st = json.loads(nestrace.open(tmp_path / "h2").rows("SELECT stack_json FROM capture_meta")[0]
                    ["stack_json"])
    assert st["backing_files"] == []


def test_host_side_image_maps_and_what_merge_refuses(tmp_path):
    """The host side of a VM whose image is QEMU's first qcow stores its
    map.  A format nestrace does not know (here a store edited to say so,
    as one a later nestrace wrote might) is refused by merge: a guest
    offset is not the image offset there.  A qcow2 or dynamic VHD image
    whose header cannot be read, or a vmdk descriptor naming an extent
    nestrace does not read, records with a warning naming the file and
    offset; a flat vmdk is read through its descriptor."""
    image = tmp_path / "vm.qcow"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow", str(image), "16M"], check=True)
    test_qcow2.qemu_io(image, "write -P 7 1M 4k", fmt="qcow")
    r = run_cli("record", "-o", str(tmp_path / "h"), "--side", "host", "--image", str(image),
                "--duration", "0.5")
    assert other_warnings(r.stderr, tmp_path / "h") == [], r.stderr
    s = nestrace.open(tmp_path / "h")
    st = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    assert st["image_format"] == "qcow"
    assert [tuple(r.values()) for r in s.rows(
        "SELECT logical_bytes, physical_bytes, length_bytes FROM extent_maps "
        "WHERE role = 'vdisk_image' AND phase = 'end'")] == test_qcow2.qemu_map(image)
    s.close()
    meta = next((tmp_path / "h" / "capture_meta").glob("capture=*/*.parquet"))
    t = pq.read_table(meta)
    i = t.schema.get_field_index("stack_json")
    t = t.set_column(i, t.schema.field(i), pa.array(
        [json.dumps(st | {"image_format": "bochs"})], pa.string()))
    write_parquet_file(t, meta)
    run_cli("record", "-o", str(tmp_path / "g"), "--side", "guest", "--stack", "/",
            "--duration", "0.5")
    r = run_cli("merge", str(tmp_path / "g"), str(tmp_path / "h"), "-o", str(tmp_path / "m"),
                check=False)
    assert r.returncode == 2 and "is bochs" in r.stderr
    assert "raw, qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels and luks images only" \
        in r.stderr

    desc = tmp_path / "flat.vmdk"
    subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", "-o", "subformat=monolithicFlat",
                    str(desc), "16M"], check=True)
    r = run_cli("record", "-o", str(tmp_path / "h3"), "--side", "host", "--image", str(desc),
                "--duration", "0.5")
    assert other_warnings(r.stderr, tmp_path / "h3") == [], r.stderr
    s = nestrace.open(tmp_path / "h3")
    flat = tmp_path / "flat-flat.vmdk"
    st = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    assert (st["image_format"], st["backing_files"]) == \
        ("vmdk", [{"path": str(flat), "fmt": "raw", "ino": flat.stat().st_ino, "extent": True}])
    assert [tuple(r.values()) for r in s.rows(
        "SELECT logical_bytes, ino, physical_bytes, length_bytes FROM extent_maps "
        "WHERE role = 'vdisk_image' AND phase = 'end'")] == [(0, flat.stat().st_ino, 0, 16 << 20)]
    # an extent of a kind nestrace does not read
    text = desc.read_text()
    desc.write_text(text.replace(" FLAT ", " SESPARSE "))
    r = run_cli("record", "-o", str(tmp_path / "h4"), "--side", "host", "--image", str(desc),
                "--duration", "0.5")
    assert f"{desc}: offset {text.index('RW ')}: a SESPARSE extent" in " ".join(r.stderr.split())

    for name, head, want in (("vm.vhd", b"conectix", "offset 64: footer checksum 0x0"),
                             ("vm.qcow2", b"QFI\xfb\0\0\0\7", "offset 4: qcow2 version 7")):
        bad = tmp_path / name
        bad.write_bytes(head + bytes(4096))
        r = run_cli("record", "-o", str(tmp_path / f"h-{bad.suffix[1:]}"), "--side", "host",
                    "--image", str(bad), "--duration", "0.5")
        assert f"{bad}: {want}" in r.stderr
    assert nestrace.open(tmp_path / "h-qcow2").rows(
        "SELECT count(*) AS n FROM extent_maps WHERE role = 'vdisk_image'") == [{"n": 0}]
    r = run_cli("merge", str(tmp_path / "g"), str(tmp_path / "h-qcow2"), "-o",
                str(tmp_path / "m2"), check=False)
    assert r.returncode == 2 and "has no cluster map stored" in r.stderr
