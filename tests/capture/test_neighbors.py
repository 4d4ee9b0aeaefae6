"""Real captures: other file systems, images and virtual disks beside the
traced stack."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import (
    NESTRACE,
    ROOT,
    assert_losses_counted,
    run_cli,
    until_recording,
)

import nestrace
from nestrace._paths import agent_path
from nestrace.capture.disks import RECORDER_ENV

pytestmark = pytest.mark.root
from tracethrough import FIO_RANDREAD, _tied_to_vdisk_by_cause, record_fio


@contextlib.contextmanager
def partitioned(img: Path, size: str, parts: list[tuple[int, int, str]], at: Path):
    """A loop device (direct I/O) on `img` with partitions (start, size in
    sectors, mkfs program), each file system mounted under `at`; yields
    (loop device, mount points).  Unmounted and detached whatever
    happens."""
    subprocess.run(["truncate", "-s", size, str(img)], check=True)
    loop = subprocess.run(["losetup", "-f", "--show", "-P", "--direct-io=on", str(img)],
                          check=True, capture_output=True, text=True).stdout.strip()
    mounted = []
    try:
        for n, (start, nr, _) in enumerate(parts, 1):
            subprocess.run(["addpart", loop, str(n), str(start), str(nr)], check=True)
        for n, (_, _, mkfs) in enumerate(parts, 1):
            for _ in range(100):
                if Path(f"{loop}p{n}").exists():
                    break
                time.sleep(0.02)
            mnt = at / f"p{n}"
            mnt.mkdir()
            subprocess.run([mkfs, "-q", f"{loop}p{n}"], check=True)
            subprocess.run(["mount", f"{loop}p{n}", str(mnt)], check=True)
            mounted.append(mnt)
        yield loop, mounted
    finally:
        for mnt in reversed(mounted):
            subprocess.run(["umount", str(mnt)], check=True)
        subprocess.run(["losetup", "-d", loop], check=True)


def _writes_by_part(s, level, part2_sector):
    """Bytes of `level`'s write requests per links kind, by partition (1,
    or 2 from part2_sector on)."""
    return {(r["part"], r["kind"]): r["bytes"] for r in s.rows(
        f"SELECT CASE WHEN b.sector >= {part2_sector} THEN 2 ELSE 1 END AS part, l.kind, "
        f"sum(l.bytes) AS bytes FROM links l JOIN {level}_io b ON b.io_id = l.lower_id "
        f"WHERE l.lower_level = '{level}' AND b.op = 'write' GROUP BY ALL")}


FIO_4M_WRITES = "fio --rw=randwrite --bs=4k --direct=1 --size=16M --io_size=4M --output=/dev/null"
# 4 MiB of O_DIRECT writes into each of two mounts, {a} and {b}, at once
WRITES_IN_BOTH = (f"{FIO_4M_WRITES} --name=a --filename={{a}}/f & "
                  f"{FIO_4M_WRITES} --name=b --filename={{b}}/g; wait")


def vm_disk_with_two_partitions(lab, tmp_path):
    """A VM's disk on the lab's host FS with / and /home on two ext4
    partitions (partitioned: loop device, mount points)."""
    return partitioned(Path(lab.mount).parent / "host" / "two.img", "256M",
                       [(2048, 200000, "mkfs.ext4"), (204800, 300000, "mkfs.ext4")], tmp_path)


def test_another_file_system_on_the_virtual_disk_is_said_and_its_writes_are_other(lab_factory,
                                                                                  tmp_path):
    """A virtual disk with two partitions and a file system on each (a VM's
    / and /home), `record --stack` of the first while fio writes 4 MiB
    with O_DIRECT into each.  The second's writes are requests on the
    traced virtual disk that no traced call explains, and not the traced
    FS's write-back: record names the other mount, and its requests are
    'other'.  The
    agent alone (--guest-capture) names it too, and so does import."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    work = WRITES_IN_BOTH
    with vm_disk_with_two_partitions(lab, tmp_path) as (loop, (a, b)):
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(a), "--", "sh", "-c",
                    work.format(a=a, b=b))
        # the same by the agent alone (a VM with no Python), imported
        g = subprocess.run([str(agent_path()), "--guest", str(a), "--guest-capture",
                            str(tmp_path / "g"), "--", "sh", "-c", work.format(a=a, b=b)],
                           capture_output=True, text=True)
        assert g.returncode == 0, g.stderr
    said = f"also holds {b} ({Path(loop).name}p2), not traced"
    assert said in r.stderr and said in g.stderr, (r.stderr, g.stderr)
    i = run_cli("import", str(tmp_path / "g"), "-o", str(tmp_path / "s2"))
    assert f"also held {b} ({Path(loop).name}p2), not traced" in i.stderr, i.stderr
    for store in ("s", "s2"):
        s = nestrace.open(tmp_path / store)
        dm = s.rows("SELECT part_start_bytes AS lo, size_sectors FROM device_map "
                    "WHERE level = 'vfs'")
        assert dm == [{"lo": 2048 * 512, "size_sectors": 200000}], (store, dm)
        got = _writes_by_part(s, "vdisk", 204800)
        assert got[(1, "sync")] == 4 << 20 and got[(2, "other")] >= 4 << 20, (store, got)
        # (and the write-zeroes of its inode tables, when ext4's lazy init
        # runs during the capture: 3 MiB in one CI run)
        assert {k for p, k in got if p == 2} <= {"other", "metadata", "zeroes"}, (store, got)
    # the report counts them, and says so
    rep = json.loads(run_cli("report", "--json", str(tmp_path / "s")).stdout)["partitions"]
    assert [(r["level"], r["part_start_bytes"], r["part_bytes"]) for r in rep] == \
        [("vdisk", 2048 * 512, 200000 * 512)] and rep[0]["outside_bytes"] >= 4 << 20, rep
    said = " ".join(run_cli("report", str(tmp_path / "s")).stdout.split())   # (rich wraps)
    assert "other file systems: requests wholly outside the traced file system's partition: " \
        "vdisk" in said, said


def test_two_file_systems_of_the_virtual_disk_are_traced_together_with_two_stacks(lab_factory,
                                                                                   tmp_path):
    """The same two partitions (a VM's / and /home), `record --stack A
    --stack B`, fio writing 4 MiB with O_DIRECT into each: both are
    traced.  Each one's writes are tied to its own calls through its own
    partition (each its own journal, its own partition, its own files of
    the same inode numbers), none is another file system's; no warning
    of an untraced one.  The same by the agent alone (`--guest A --guest
    B`), imported.  A --guest on another disk is
    refused (the agent alone makes one capture: one agent per disk)."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    work = WRITES_IN_BOTH
    with vm_disk_with_two_partitions(lab, tmp_path) as (loop, (a, b)):
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(a), "--stack", str(b),
                    "--", "sh", "-c", work.format(a=a, b=b))
        g = subprocess.run([str(agent_path()), "--guest", str(a), "--guest", str(b),
                            "--guest-capture", str(tmp_path / "g"), "--", "sh", "-c",
                            work.format(a=b, b=a)], capture_output=True, text=True)
        assert g.returncode == 0, g.stderr
        bad_g = subprocess.run([str(agent_path()), "--guest", str(a), "--guest", lab.mount,
                                "--guest-capture", str(tmp_path / "g3"), "--", "true"],
                               capture_output=True, text=True)
        # the guest's side alone (in a VM, with Python): the same two
        side = run_cli("record", "-o", str(tmp_path / "s4"), "--side", "guest", "--stack", str(a),
                       "--stack", str(b), "--", "sh", "-c", f"echo x > {a}/h; echo y > {b}/h; sync")
    i = run_cli("import", str(tmp_path / "g"), "-o", str(tmp_path / "s2"))
    said = r.stderr + side.stderr + g.stderr + i.stderr
    assert "not traced" not in said and "left out" not in said, said
    assert nestrace.open(tmp_path / "s4").rows(
        "SELECT level, name FROM device_map ORDER BY level, name") == [
        {"level": "vdisk", "name": Path(loop).name}, {"level": "vfs", "name": str(a)},
        {"level": "vfs", "name": str(b)}]
    assert bad_g.returncode != 0 and f"--guest {lab.mount}: on " in bad_g.stderr \
        and not (tmp_path / "g3").exists(), bad_g.stderr
    for store in ("s", "s2"):
        s = nestrace.open(tmp_path / store)
        assert s.rows("SELECT name, part_start_bytes AS lo, size_sectors FROM device_map "
                      "WHERE level = 'vfs' ORDER BY lo") == [
            {"name": str(a), "lo": 2048 * 512, "size_sectors": 200000},
            {"name": str(b), "lo": 204800 * 512, "size_sectors": 300000}], store
        # fio's calls, in each file system
        assert s.rows("SELECT m.name, sum(v.ret_bytes) AS b FROM vfs_io v JOIN device_map m "
                      "ON m.dev = v.dev AND m.level = 'vfs' WHERE v.op = 'write' GROUP BY ALL "
                      "ORDER BY 1") == [{"name": str(a), "b": 4 << 20},
                                        {"name": str(b), "b": 4 << 20}], store
        got = _writes_by_part(s, "vdisk", 204800)
        assert got[(1, "sync")] == 4 << 20 and got[(2, "sync")] == 4 << 20, (store, got)
        assert not {k for _, k in got} & {"other", "rmw"}, (store, got)
        # each tied to a call of its own file system
        assert s.rows("SELECT count(*) AS n FROM links l JOIN vdisk_io b ON b.io_id = l.lower_id "
                      "JOIN vfs_io v ON v.io_id = l.upper_id JOIN device_map m ON m.dev = v.dev "
                      "AND m.level = 'vfs' WHERE l.kind = 'sync' AND b.offset_bytes NOT BETWEEN "
                      "m.part_start_bytes AND m.part_start_bytes + m.size_sectors * 512 - 1"
                      ) == [{"n": 0}], store
        rep = json.loads(run_cli("report", "--json", str(tmp_path / store)).stdout)
        vj = [j for j in rep["journals"] if j["level"] == "vdisk"]
        assert [(j["fs_type"], j["offset_bytes"] >= 204800 * 512) for j in vj] == \
            [("ext4", False), ("ext4", True)], (store, rep["journals"])
        assert [(r["part_start_bytes"], r["part_bytes"]) for r in rep["partitions"]
                if r["level"] == "vdisk"] == \
            [(2048 * 512, 200000 * 512), (204800 * 512, 300000 * 512)], (store, rep["partitions"])


@contextlib.contextmanager
def second_virtual_disk(lab, tmp_path):
    """Another VM's disk on the lab's host FS (or the VM's second disk): a
    256 MiB image, on a loop device of its own (direct I/O), with ext4
    mounted at tmp_path/o: (loop device, image, mount point)."""
    image = Path(lab.mount).parent / "host" / "other.img"
    subprocess.run(["truncate", "-s", "256M", str(image)], check=True)
    mp = tmp_path / "o"
    mp.mkdir()
    with contextlib.ExitStack() as undo:
        vdisk = subprocess.run(["losetup", "-f", "--show", "--direct-io=on", str(image)],
                               check=True, capture_output=True, text=True).stdout.strip()
        undo.callback(subprocess.run, ["losetup", "-d", vdisk], check=True)
        subprocess.run(["mkfs.ext4", "-q", vdisk], check=True)
        subprocess.run(["mount", vdisk, str(mp)], check=True)
        undo.callback(subprocess.run, ["umount", str(mp)], check=True)
        yield vdisk, image, mp


def test_another_vms_image_on_the_host_fs_is_named_and_its_writes_are_other(lab_factory,
                                                                          tmp_path):
    """Another virtual disk's image on the same host FS (a second loop
    device: another VM), fio writing 4 MiB with O_DIRECT in each guest.
    The other VM's host-disk writes are not the host's write-back:
    `record` names the other image, maps it (extent_maps role
    neighbor_image) and its writes are 'other'."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    with second_virtual_disk(lab, tmp_path) as (_, other, o):
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--", "sh", "-c",
                    WRITES_IN_BOTH.format(a=lab.mount, b=o))
    assert f"the host FS also holds 1 other virtual disk image(s) in use ({other})" in r.stderr, \
        r.stderr
    s = nestrace.open(tmp_path / "s")
    assert s.rows("SELECT DISTINCT phase, path FROM extent_maps WHERE role = 'neighbor_image' "
                  "ORDER BY 1") == [{"phase": "end", "path": str(other)},
                                    {"phase": "start", "path": str(other)}]
    got = {(r["kind"], r["tied"]): r["b"] for r in s.rows(
        "SELECT kind, attributed AS tied, sum(bytes) AS b FROM links_summary "
        "WHERE lower_level = 'disk' AND upper_level = 'vdisk' GROUP BY ALL")}
    # the host-disk bytes tied to a virtual-disk request: fio's 4 MiB, and
    # the guest FS's own writes (a `sync` elsewhere on the machine, such as
    # another CI run's, commits its journal mid-capture: 4 KiB more once in
    # CI; 1.2-1.4 MiB of journal and metadata beside a 10 ms sync loop),
    # and the inode table ext4 reads ahead when fio creates its file (12
    # KiB here, unless an earlier reader of the device left it cached)
    by = _tied_to_vdisk_by_cause(s, "disk")
    assert by.get("app") == 4 << 20 and set(by) <= {"app", "journal", "metadata", "readahead"} \
        and by.get("readahead", 0) <= 64 << 10, (by, got)
    assert got[("sync", True)] == sum(by.values()), (by, got)
    # (the other guest's 4 MiB are more at the disk: its 1 KiB blocks make
    # unaligned writes, which xfs pads to its own blocks)
    assert got[("other", False)] >= 4 << 20, got
    assert got.get(("writeback", False), 0) < 64 << 10, got


def test_stacks_on_two_virtual_disks_are_recorded_side_by_side_a_capture_each(lab_factory,
                                                                             tmp_path):
    """A VM's second virtual disk (another image on the lab's host FS, on
    a loop device of its own), `record --stack A --stack B`, fio writing
    4 MiB with O_DIRECT into each: one recorder per disk, started before
    fio and stopped after it, a capture each in the one store.  Each
    capture is its disk's whole stack: its own file system's calls, its
    own virtual disk, its writes tied down to the host disk they share,
    where the other disk's writes are 'other' (its image named a
    neighbor).  Each names the command record ran, and its exit status.
    The same without CMD, stopped by Ctrl-C, and by record killed: its
    recorders stop and seal (a second SIGINT to a recorder, as a killed
    record's threads send, does not stop its sealing).  `--side guest`
    (a VM with two disks) the same, and `--side host --image A --image
    B`.  --vdisk, --image or --disk with a --stack on another virtual
    disk are refused."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    with second_virtual_disk(lab, tmp_path) as (vdisk, image, o):
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--stack", str(o),
                    "--", "sh", "-c", WRITES_IN_BOTH.format(a=lab.mount, b=o))
        bad = run_cli("record", "-o", str(tmp_path / "s3"), "--stack", lab.mount,
                      "--stack", str(o), "--vdisk", vdisk, "--duration", "1", check=False)
        # the guest's side alone (in a VM with two disks): the same
        run_cli("record", "-o", str(tmp_path / "s4"), "--side", "guest", "--stack", lab.mount,
                "--stack", str(o), "--", "sh", "-c", f"echo x > {lab.mount}/h; echo y > {o}/h")
        # the host's side of the two images (two VMs, or a VM's two disks)
        lab_image = str(Path(lab.mount).parent / "host" / "image.raw")
        run_cli("record", "-o", str(tmp_path / "s8"), "--side", "host", "--image",
                str(Path(lab.mount).parent / "host" / "image.raw"),
                "--image", str(image), "--", "sh", "-c", WRITES_IN_BOTH.format(a=lab.mount, b=o))
        twice = run_cli("record", "-o", str(tmp_path / "s9"), "--side", "host", "--image",
                        str(image), "--image", str(image), "--duration", "1", check=False)
        # without CMD: until Ctrl-C; and when record is killed, its
        # recorders stop and seal all the same
        for stop, store in ((signal.SIGINT, tmp_path / "s5"), (signal.SIGKILL, tmp_path / "s6")):
            p = subprocess.Popen(NESTRACE + ["record", "-o", str(store), "--stack", lab.mount,
                                             "--stack", str(o)], cwd=ROOT, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            until_recording(p)
            subprocess.run(["sh", "-c", f"echo x > {lab.mount}/h; echo y > {o}/h; "
                            f"sync -f {lab.mount} {o}"],
                           check=True)
            p.send_signal(stop)
            out, err = p.communicate(timeout=120)
            if stop == signal.SIGINT:
                assert p.returncode == 0 and out.count("records ->") == 2, (out, err)
            deadline = time.monotonic() + 120   # (the recorders outlive a killed record)
            while subprocess.run(["pgrep", "-f", f"record -o {store}"],
                                 capture_output=True).returncode == 0:
                assert time.monotonic() < deadline, f"recorders of {store} still running"
                time.sleep(0.5)
            assert nestrace.open(store).rows(
                "SELECT count(DISTINCT capture_id) AS n, bool_and(end_ns > 0) AS ended "
                "FROM capture_meta") == [{"n": 2, "ended": True}], (stop, err)
        # a recorder gets its parent-death signal once per thread of the
        # dying record: a second SIGINT while it seals is not the end of it
        # (it was: "Aborted!", its capture left unsealed)
        p = subprocess.Popen(NESTRACE + ["record", "-o", str(tmp_path / "s7"), "--stack", str(o)],
                             cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, RECORDER_ENV: "1"})
        p.stdin.write('{"command": "x"}\n')
        p.stdin.flush()
        until_recording(p)
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(input="", timeout=120)
        assert p.returncode == 0 and not (tmp_path / "s7" / "_live").exists(), err
    assert "tracing 2 virtual disks, a capture each" in r.stderr, r.stderr
    assert r.stdout.count(f"records -> {tmp_path / 's'}") == 2, r.stdout
    assert bad.returncode == 2 and "with --stack on several virtual disks" in bad.stderr \
        and not (tmp_path / "s3").exists(), bad.stderr
    s = nestrace.open(tmp_path / "s")
    caps = {x["vfs"]: x for x in s.rows(
        "SELECT capture_id, any_value(name) FILTER (WHERE level = 'vfs') AS vfs, "
        "any_value(name) FILTER (WHERE level = 'vdisk') AS vdisk, "
        "any_value(backing_path) FILTER (WHERE level = 'vdisk') AS image "
        "FROM device_map GROUP BY capture_id")}
    assert sorted(caps) == sorted([lab.mount, str(o)]), caps
    assert caps[str(o)]["vdisk"] == Path(vdisk).name and caps[str(o)]["image"] == str(image), caps
    assert caps[lab.mount]["image"] == lab_image, caps
    assert twice.returncode == 2 and "given twice" in twice.stderr \
        and not (tmp_path / "s9").exists(), twice.stderr
    # each host side: its image's accesses at the host FS (4 MiB of writes
    # at least: the second image's ext4 has 1 KiB blocks, padded), the
    # shared disk
    assert nestrace.open(tmp_path / "s8").rows(
        "SELECT e.path, string_agg(DISTINCT d.level, ',' ORDER BY d.level) AS levels, "
        "(SELECT sum(bytes) >= 4 << 20 FROM hostfs_io h WHERE h.capture_id = e.capture_id "
        "AND h.op = 'write' AND h.ino = e.ino) AS written "
        "FROM extent_maps e JOIN device_map d USING (capture_id) "
        "WHERE e.role = 'image' GROUP BY e.capture_id, e.path, e.ino ORDER BY e.path") == sorted(
        [{"path": p, "levels": "disk,hostfs", "written": True} for p in (lab_image, str(image))],
        key=lambda r: r["path"])
    assert {r["m"] for r in nestrace.open(tmp_path / "s4").rows(
        "SELECT string_agg(level || ' ' || name, ', ' ORDER BY level) AS m FROM device_map "
        "GROUP BY capture_id")} == {f"vdisk {caps[lab.mount]['vdisk']}, vfs {lab.mount}",
                                    f"vdisk {Path(vdisk).name}, vfs {o}"}
    work = WRITES_IN_BOTH.format(a=lab.mount, b=o)
    for mp, c in caps.items():
        cid, neighbor = c["capture_id"], caps[lab.mount if mp == str(o) else str(o)]["image"]
        # the workload record ran, named in each
        assert s.rows("SELECT command, command_exit FROM capture_meta WHERE capture_id = ?",
                      [cid]) == [{"command": f"sh -c {work}", "command_exit": 0}], mp
        # its own file system's calls only
        assert s.rows("SELECT sum(ret_bytes) AS b FROM vfs_io WHERE capture_id = ? "
                      "AND op = 'write'", [cid]) == [{"b": 4 << 20}], mp
        got = {(r["h"], r["kind"]): r["b"] for r in s.rows(
            "SELECT upper_level || '>' || lower_level AS h, kind, sum(bytes) AS b "
            "FROM links_summary WHERE capture_id = ? GROUP BY ALL", [cid])}
        assert got[("vfs>vdisk", "sync")] == 4 << 20, (mp, got)
        # (the second disk's 1 KiB blocks make unaligned writes, which xfs
        # pads to its own blocks: more at the host disk)
        assert got[("vdisk>disk", "sync")] >= 4 << 20, (mp, got)
        assert got[("vdisk>disk", "other")] >= 4 << 20, (mp, got)
        assert s.rows("SELECT DISTINCT path FROM extent_maps WHERE capture_id = ? "
                      "AND role = 'neighbor_image'", [cid]) == [{"path": neighbor}], mp


def test_another_file_system_on_the_host_disk_has_its_writes_other(tmp_path):
    """The host FS (xfs, the image on it) on the first partition of the
    host disk, another (ext4: the host's root, say) on the second, fio
    writing 4 MiB with O_DIRECT into each, the guest's and the host's.
    The host's own writes, outside the host FS holding the image, are
    'other', not write-back.  (Built by hand: the lab's host disk holds the one file
    system.)"""
    with partitioned(tmp_path / "disk.img", "1G", [(2048, 1228800, "mkfs.xfs"),
                                                  (1232896, 800000, "mkfs.ext4")],
                     tmp_path) as (_, (host, root)):
        (tmp_path / "g").mkdir()
        with contextlib.ExitStack() as undo:
            subprocess.run(["truncate", "-s", "256M", f"{host}/vm.img"], check=True)
            vdisk = subprocess.run(["losetup", "-f", "--show", "--direct-io=on",
                                    f"{host}/vm.img"], check=True, capture_output=True,
                                   text=True).stdout.strip()
            undo.callback(subprocess.run, ["losetup", "-d", vdisk], check=True)
            subprocess.run(["mkfs.ext4", "-q", vdisk], check=True)
            subprocess.run(["mount", vdisk, str(tmp_path / "g")], check=True)
            undo.callback(subprocess.run, ["umount", str(tmp_path / "g")], check=True)
            g = tmp_path / "g"
            run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(g), "--", "sh", "-c",
                    f"{FIO_4M_WRITES} --name=a --filename={g}/f & "
                    f"{FIO_4M_WRITES} --name=b --filename={root}/g; wait")
    s = nestrace.open(tmp_path / "s")
    dm = s.rows("SELECT part_start_bytes AS lo, size_sectors FROM device_map "
                "WHERE level = 'hostfs'")
    assert dm == [{"lo": 2048 * 512, "size_sectors": 1228800}], dm
    got = _writes_by_part(s, "disk", 1232896)
    # (the guest's 4 MiB are more at the disk: its 1 KiB blocks make
    # unaligned writes, which xfs pads to its own blocks)
    assert got[(1, "sync")] >= 4 << 20 and got[(2, "other")] >= 4 << 20, got
    assert {k for p, k in got if p == 2} <= {"other", "metadata", "zeroes"}, got
    rep = json.loads(run_cli("report", "--json", str(tmp_path / "s")).stdout)["partitions"]
    assert [(r["level"], r["fs_level"]) for r in rep] == [("disk", "hostfs")], rep
    assert rep[0]["outside_bytes"] >= 4 << 20, rep

def test_btrfs_on_partitions_maps_through_its_chunk_tree_on_the_partition(lab_factory, tmp_path):
    """btrfs extents are logical addresses, carried to device offsets
    through the chunk tree, which `record` reads from the file system's
    own device: the partition, not the whole disk (which has no btrfs
    superblock at its start)."""
    lab = lab_factory("btrfs", "btrfs", guest_dio="on", host_dio="on", partitions=True)
    s, offsets, _ = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD)
    assert sorted(r["offset_bytes"] for r in s.rows("SELECT offset_bytes FROM vfs_io")) == sorted(offsets)
    to_app = {r["level"]: r["fraction"] for r in s.rows("SELECT level, fraction FROM links_to_vfs")}
    assert to_app["vdisk"] > 0.95 and to_app["disk"] > 0.95, to_app
    assert_losses_counted(s)


@pytest.mark.parametrize("by", ["record", "agent"])
def test_btrfs_inline_files_have_no_place_and_are_not_warned_of_one_by_one(lab_factory, tmp_path,
                                                                          by):
    """A small btrfs file's data is inline, in its metadata tree: FIEMAP
    gives it physical 0 and no flag saying the place is unknown.  No
    warning per file (a btrfs root file system has thousands): the row is
    stored
    with FIEMAP_EXTENT_UNKNOWN added to its flags, and the offset maps
    leave it out, as any extent without a place; the other files map."""
    lab = lab_factory("btrfs", "xfs", guest_dio="on", host_dio="on")
    small = [Path(lab.mount, f"small{i}") for i in range(20)]
    for p in small:
        p.write_bytes(b"x" * 100)
    Path(lab.mount, "big").write_bytes(os.urandom(256 << 10))
    subprocess.run(["sync", "-f", lab.mount], check=True)
    cmd = ["sh", "-c", f"cat {lab.mount}/small* {lab.mount}/big > /dev/null && "
                       f"printf y > {lab.mount}/new && sync -f {lab.mount}"]
    store = tmp_path / "s"
    if by == "record":
        r = run_cli("record", "-o", str(store), "--stack", lab.mount, "--", *cmd)
    else:
        r = subprocess.run([str(agent_path()), "--guest", lab.mount, "--guest-capture",
                            str(tmp_path / "g"), "--", *cmd], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = run_cli("import", str(tmp_path / "g"), "-o", str(store))
    assert "in no chunk" not in r.stderr, r.stderr
    s = nestrace.open(store)
    inline = {p.stat().st_ino for p in [*small, Path(lab.mount, "new")]}
    big = Path(lab.mount, "big").stat().st_ino
    rows = s.rows("SELECT phase, ino, flags, logical_bytes, length_bytes FROM extent_maps "
                  "WHERE role = 'guest_file'")
    by_phase = {ph: {r["ino"] for r in rows if r["phase"] == ph} for ph in ("start", "end")}
    assert inline - {max(inline)} <= by_phase["start"] and inline <= by_phase["end"], by_phase
    for r in rows:
        if r["ino"] in inline:       # FIEMAP_EXTENT_DATA_INLINE, and UNKNOWN added
            assert r["flags"] & 0x200 and r["flags"] & 0x2, r
    mapped = {r["ino"] for r in s.rows("SELECT DISTINCT ino FROM map_extents "
                                       "WHERE role = 'guest_file'")}
    assert big in mapped and not mapped & inline, (big, mapped & inline)
    assert_losses_counted(s)
