"""The raw baseline (`--host-fs none`): the virtual disk a loop device on a
partition of the host disk, no host file system; traced as vfs, vdisk
and disk, the virtual disk's bytes at the partition's start on the disk."""
from __future__ import annotations

import json

import pytest
from conftest import assert_losses_counted, run_cli
from tracethrough import FIO_RANDREAD, assert_each_record_once, record_fio

import nestrace
from nestrace.capture.lab import PART_START, LabConfig, LabError

# each fio read: its piece of the virtual disk from the guest file's
# extents (the agent's FIEMAP, checked against the file systems' own tools
# in tests/capture), then whether a virtual-disk read covers it in flight,
# and a host-disk read PART_START further on (the lab's partition, not
# nestrace's map)
RAW_THROUGH = """
WITH r AS (SELECT * FROM vfs_io WHERE syscall = 'pread64' AND op = 'read'),
gm AS (SELECT * FROM extent_maps WHERE role = 'guest_file' AND phase = 'end'),
p AS (SELECT r.io_id, r.ts_ns, r.end_ns, r.bytes,
             gm.physical_bytes + (r.offset_bytes - gm.logical_bytes) AS vdisk_off
      FROM r JOIN gm ON gm.ino = r.ino AND r.offset_bytes >= gm.logical_bytes
                    AND r.offset_bytes < gm.logical_bytes + gm.length_bytes)
SELECT count(*) AS mapped,
  count(*) FILTER (WHERE EXISTS (SELECT 1 FROM vdisk_io v WHERE v.op = 'read'
    AND v.offset_bytes <= p.vdisk_off AND p.vdisk_off + p.bytes <= v.offset_bytes + v.bytes
    AND v.ts_ns BETWEEN p.ts_ns AND p.end_ns)) AS vdisk,
  count(*) FILTER (WHERE EXISTS (SELECT 1 FROM disk_io d WHERE d.op = 'read'
    AND d.offset_bytes <= p.vdisk_off + $part
    AND p.vdisk_off + $part + p.bytes <= d.offset_bytes + d.bytes
    AND d.ts_ns BETWEEN p.ts_ns AND p.end_ns)) AS disk
FROM p"""


@pytest.mark.root
def test_the_raw_baseline_finds_every_read_at_vfs_vdisk_and_disk(lab_factory, tmp_path):
    lab = lab_factory("ext4", "none", guest_dio="on", host_dio="on")
    s, offsets, r = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD)
    assert len(offsets) == 4096
    got = s.con.execute(RAW_THROUGH, {"part": PART_START}).fetchone()
    assert dict(zip(("mapped", "vdisk", "disk"), got)) == {"mapped": 4096, "vdisk": 4096, "disk": 4096}
    assert_losses_counted(s, r.stdout)
    assert_each_record_once(s)
    # three levels, the disk right under the virtual disk, which reads a
    # partition of it
    assert s.rows("SELECT DISTINCT position, level, below FROM chain_levels ORDER BY position") == [
        dict(position=1, level="vfs", below="vdisk"), dict(position=2, level="vdisk", below="disk"),
        dict(position=5, level="disk", below=None)]
    dm = s.rows("SELECT level, backing_path FROM device_map ORDER BY level")
    assert {d["level"] for d in dm} == {"vfs", "vdisk", "disk"}
    part = next(d["backing_path"] for d in dm if d["level"] == "vdisk")
    assert part.startswith("/dev/loop") and part.endswith("p1"), dm
    assert s.rows("SELECT count(*) AS n FROM hostfs_events")[0]["n"] == 0
    hooks = json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["xfs_file_direct_read"] == hooks["iomap_dio_rw_begin"] == "skipped", hooks
    # the correlator's map and links carry the reads the same way
    # (the "image" is the partition: its offsets are the virtual disk's)
    m = s.rows("SELECT count(*) AS n, count(*) FILTER (WHERE disk_offset_bytes = "
               "image_offset_bytes + ?) AS at_part FROM map_vdisk", [PART_START])[0]
    assert m["n"] > 0 and m["at_part"] == m["n"], m
    reads = s.rows("SELECT sum(bytes)::BIGINT AS b FROM vdisk_io WHERE op = 'read'")[0]["b"]
    tied = s.rows("SELECT sum(l.bytes)::BIGINT AS b FROM links l JOIN vdisk_io v "
                  "ON v.io_id = l.upper_id WHERE l.upper_level = 'vdisk' AND l.lower_level = 'disk' "
                  "AND l.kind = 'sync' AND v.op = 'read'")[0]["b"]
    assert tied == reads > 0
    # amplification: the disk against the virtual disk above it
    amp = {r["level"]: r for r in s.rows("SELECT level, ratio_to_above FROM amplification "
                                         "WHERE op = 'read'")}
    assert set(amp) == {"vfs", "vdisk", "disk"} and amp["disk"]["ratio_to_above"] is not None
    assert s.rows("SELECT guest_fs, host_fs FROM compare_captures") == [
        {"guest_fs": "ext4", "host_fs": "none"}]
    # the summary's chain, the report's word for the missing level, and
    # where an app read's time goes (its host FS part: the loop's own path)
    assert "\nchain: vfs > vdisk > disk\n" in run_cli("summary", str(tmp_path / "s")).stdout + "\n"
    text = " ".join(run_cli("report", str(tmp_path / "s")).stdout.split())
    assert "no hostfs level: the virtual disk is a host block device (the raw baseline)" in text
    rep = json.loads(run_cli("report", "--json", str(tmp_path / "s")).stdout)
    assert [x["class"] for x in rep["latency"]] == ["read 4K"], rep["latency"]


@pytest.mark.parametrize("opt", [dict(host_block_size=4096), dict(partitions=True),
                                 dict(fragment_image=True), dict(host_discard=True)])
def test_the_raw_baseline_refuses_what_only_a_host_fs_has(opt):
    flag = "--" + next(iter(opt)).replace("_", "-")
    with pytest.raises(LabError, match=f"^{flag} and --host-fs none: the raw baseline has no "
                                       "host file system"):
        LabConfig(guest_fs="ext4", host_fs="none", **opt).validate()


@pytest.mark.root
def test_a_host_side_on_a_raw_partition_is_traced_and_merge_says_why_not(lab_factory, tmp_path):
    """`record --side host --image PARTITION`: the host side of a VM whose
    disk is a host partition (disk level only, no host FS); merge has no
    image accesses to pair a guest with, and says so."""
    from conftest import lab_state
    lab = lab_factory("ext4", "none", guest_dio="on", host_dio="on")
    part = lab_state(lab)["image"]
    g, h = tmp_path / "g", tmp_path / "h"
    run_cli("record", "-o", str(g), "--side", "guest", "--stack", lab.mount, "--",
            "dd", "if=/dev/zero", f"of={lab.mount}/f", "bs=64k", "count=16", "oflag=direct")
    r = run_cli("record", "-o", str(h), "--side", "host", "--image", part, "--duration", "0.5")
    assert "\nchain: disk\n" in r.stdout + "\n", r.stdout
    hs = nestrace.open(h)
    assert [d["level"] for d in hs.rows("SELECT level FROM device_map")] == ["disk"]
    assert json.loads(hs.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])["host_fs"] == "none"
    m = run_cli("merge", str(g), str(h), "-o", str(tmp_path / "m"), check=False)
    assert m.returncode == 2 and "is the host side of a virtual disk on a host block device (no " \
        "host FS): merge pairs a guest with an image file's accesses, and has none to pair here" \
        in m.stderr, m.stderr
