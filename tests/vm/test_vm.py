"""A real VM: QEMU runs a Debian guest (its own kernel, 6.1) whose virtio-blk
disk is a raw image on an xfs host file system; nestrace records inside
the guest (vfs, vdisk) and on the host (hostfs, disk), and `merge` puts
the two captures on one clock.  The static agent copied into the guest
runs, CO-RE-relocated, on a kernel it was not built on."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import guestvm
import pyarrow as pa
import pytest
import test_qcow2
import test_vhdx
import test_vmdk
from conftest import (
    ROOT,
    assert_losses_counted,
    host_side_recording,
    loop_devices,
    run_cli,
)
from tracethrough import TRACE_THROUGH, TRACE_THROUGH_VIA, fio_log_offsets

import nestrace
from nestrace.images.vhdx import bat_map

pytestmark = pytest.mark.root

READS = 512
WRITES = 16     # 64 KiB each, into a new sparse file: blocks the image never held


# qcow2-chain: an empty qcow2 overlay on a qed base that holds the
# guest's file system and the file fio reads (the reads go through the
# base's cluster map, the writes allocate clusters in the overlay: it
# stands for the plain qcow2 and qed images too, which more disks made
# CI ~100-300 s slower)
# vmdk-split: a vmdk whose descriptor is a file of its own, the disk in
# 64 extent files of 4 MiB, sparse and flat in turn (VMware's split disks
# are 2 GiB extents, too big for this disk; it stands for the one-file
# sparse vmdk too, whose grain map is the same code)
FORMATS = ("raw", "vmdk-split", "vdi", "vhdx", "vpc", "parallels", "qcow", "qcow2-chain")


@pytest.fixture
def host_images(request, tmp_path):
    """An xfs host file system on a loop device (direct I/O: the host disk
    is uncached) holding a 256 MiB image with ext4 on it (1 KiB blocks,
    mkfs's choice for so small a disk) in each format asked for: a sparse
    raw file, or that file converted to qcow2, a one-file sparse vmdk, a
    vdi, a vhdx, a dynamic VHD (vpc), a Parallels image or a qcow (version 1)
    image (only the clusters mkfs wrote
    allocated, packed in the file in disk order; the guest's own writes
    then allocate more at its end), or an empty qcow2 overlay whose
    backing file, a qed image, holds the file system with fio's 16 MiB
    file already written (`qcow2-chain`).  Torn down whatever happens."""
    if why := guestvm.missing():
        pytest.fail(f"cannot boot a guest: {why}; ci/setup installs what is needed")
    backing, mnt = tmp_path / "host.img", tmp_path / "host"
    mnt.mkdir()
    before = loop_devices()
    loop = None
    try:
        subprocess.run(["truncate", "-s", "2G", str(backing)], check=True)
        loop = subprocess.run(["losetup", "--direct-io=on", "--find", "--show", str(backing)],
                              check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mkfs.xfs", "-q", "-f", loop], check=True)
        subprocess.run(["mount", loop, str(mnt)], check=True)
        raw = mnt / "vm.raw"
        subprocess.run(["truncate", "-s", "256M", str(raw)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(raw)], check=True)
        images = {}
        for fmt in request.param:
            if fmt == "qcow2-chain":
                images[fmt] = _chain(raw, mnt)
            elif fmt == "vmdk-split":
                images[fmt] = _split_vmdk(raw, mnt)
            elif fmt != "raw":
                images[fmt] = mnt / f"vm.{fmt}"
                subprocess.run(["qemu-img", "convert", "-O", fmt, str(raw), str(images[fmt])],
                               check=True)
        if "raw" in request.param:
            images["raw"] = raw
        else:
            raw.unlink()
        yield {fmt: images[fmt] for fmt in request.param}
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["umount", str(mnt)], check=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], check=True)
        assert loop_devices() <= before, "a loop device was left attached"


def _chain(raw, mnt):
    """A copy of the raw image with fio's file written into its file
    system (as fio would lay it out), converted to a qed base, and an
    empty qcow2 overlay on it (the base named relative to it)."""
    filled, fsmnt = mnt / "filled.raw", mnt.parent / "filled"
    # (not a reflink: a raw image on xfs sharing its extents is a
    # copy-on-write inode, whose direct I/O xfs aligns to its 4 KiB block,
    # and QEMU then turned each 4 KiB guest read at a 1 KiB offset into an
    # 8 KiB read of the raw image)
    subprocess.run(["cp", "--reflink=never", "--sparse=always", str(raw), str(filled)],
                   check=True)
    fsmnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(filled), str(fsmnt)], check=True)
    try:
        subprocess.run(["dd", "if=/dev/urandom", f"of={fsmnt}/t.0.0", "bs=1M", "count=16",
                        "status=none"], check=True)
    finally:
        subprocess.run(["umount", str(fsmnt)], check=True)
    subprocess.run(["qemu-img", "convert", "-O", "qed", str(filled), str(mnt / "base.qed")],
                   check=True)
    filled.unlink()
    top = mnt / "vm.qcow2-chain"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qed", "-F", "qed",
                    str(top)], cwd=mnt, check=True)
    return top


SPLIT_EXTENT = 4 << 20


def _split_vmdk(raw, mnt):
    """The raw image as a vmdk descriptor and its extent files: 4 MiB
    each, in turn a sparse extent (only the grains mkfs wrote allocated)
    and a flat file (sparse where the raw image is)."""
    desc = mnt / "vm.vmdk-split"
    lines = []
    for k in range(raw.stat().st_size // SPLIT_EXTENT):
        piece = mnt / f"vm-{k}.raw"
        subprocess.run(["dd", f"if={raw}", f"of={piece}", f"bs={SPLIT_EXTENT}", f"skip={k}",
                        "count=1", "conv=sparse", "status=none"], check=True)
        if k % 2:
            lines.append(f'RW {SPLIT_EXTENT // 512} FLAT "{piece.name}" 0')
            continue
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o",
                        "subformat=twoGbMaxExtentSparse", str(piece), str(mnt / "x.vmdk")],
                       check=True)
        (mnt / "x-s001.vmdk").rename(mnt / f"vm-s{k}.vmdk")
        (mnt / "x.vmdk").unlink()
        piece.unlink()
        lines.append(f'RW {SPLIT_EXTENT // 512} SPARSE "vm-s{k}.vmdk"')
    desc.write_text('# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\n'
                    'createType="twoGbMaxExtentSparse"\n\n# Extent description\n'
                    + "\n".join(lines) + '\n\n# The Disk Data Base\n#DDB\n\n'
                    'ddb.adapterType = "virtio"\n')
    return desc


# the guest's disks mounted, and the file fio reads laid out on each
# (where the image does not hold it already: qcow2-chain) by one fio run
# (fio takes ~4 s to start on this emulated CPU)
MOUNT = "mkdir -p /run/data{i}\nmount /dev/{disk} /run/data{i}\n"
LAYOUT = "fio --rw=write --bs=1M --size=16M --direct=1 --output=/dev/null {jobs}\n"
LAYOUT_JOB = "--name=t{i} --directory=/run/data{i} --filename=t.0.0"
# the run on one of them: one fio under the recorder, whose capture it
# copies out; its two jobs read, then (stonewall) write
GUEST_DISK = """cd {root}
{recorder} -- \\
    fio --ioengine=psync --direct=1 --output=/dev/null \\
        --name=t --directory=/run/data{i} --rw=randread --bs=4k --size=16M \\
        --io_size={io_size} --write_iolog=/run/out/fio{i}.iolog \\
        --name=w --stonewall --directory=/run/data{i} --rw=randwrite --bs=64k --size=8M \\
        --io_size={write_size} --fallocate=none
cp -a /run/tmp/guest{i} /run/out/
umount /run/data{i}
"""
# the guest side: nestrace's Python, or the static agent alone (a guest
# without Python), whose capture directory the host imports
RECORDER = {
    "record": ".venv/bin/python -m nestrace record -o /run/tmp/guest{i} --side guest "
              "--stack /run/data{i}",
    "agent": "tracers/build/nestrace-agent --guest /run/data{i} --guest-capture /run/tmp/guest{i}",
}


# One boot (the emulated guest is slow to boot and slower to start
# Python): eight disks, one per format, used in turn, the raw one by
# nestrace's Python recorder and the others by the agent alone, while eight
# host sides record the eight images at once.
@pytest.mark.parametrize("host_images", [FORMATS], indirect=True, ids=["all-formats"])
def test_a_qemu_guest_and_its_host_recorded_apart_merge_into_four_levels(host_images, tmp_path):
    """fio in the guest reads 512 x 4 KiB with O_DIRECT; QEMU reads the
    image with O_DIRECT (cache=none).  The merged capture follows every
    read from the guest syscall to the guest's virtio request, QEMU's read
    of the image and the host disk request, across two kernels' clocks.
    On the raw disk the guest records with nestrace's Python; on the others
    it runs the static agent alone, no Python, and its capture directories
    are imported on the host."""
    disks = [(img, fmt) for fmt, img in host_images.items()]
    by = ["record" if fmt == "raw" else "agent" for _, fmt in disks]
    script = "set -e\n" + "".join(MOUNT.format(i=i, disk=f"vd{chr(ord('a') + i)}")
                                   for i in range(len(disks)))
    script += LAYOUT.format(jobs=" ".join(LAYOUT_JOB.format(i=i) for i, (_, fmt) in
                                          enumerate(disks) if fmt != "qcow2-chain"))
    script += "".join(GUEST_DISK.format(
        i=i, root=ROOT, io_size=READS * 4096, write_size=WRITES * 65536,
        recorder=RECORDER[by[i]].format(i=i)) for i in range(len(disks)))
    with contextlib.ExitStack() as hosts:
        recordings = [hosts.enter_context(host_side_recording(
            tmp_path / f"host{i}.store", img, stop=signal.SIGTERM)) for i, (img, _) in
            enumerate(disks)]
        booted_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        rc, log, console = guestvm.boot(tmp_path / "vm", script,
                                        [(img, fmt.split("-")[0]) for img, fmt in disks])
        assert rc == 0, f"guest script failed ({rc}):\n{log}\n{console[-3000:]}"
    for i, (img, fmt) in enumerate(disks):
        check_disk(tmp_path / f"d{i}", i, img, fmt, by[i], tmp_path / f"host{i}.store",
                   recordings[i]["stdout"], tmp_path / "vm" / "out", log, booted_ns)


def check_disk(tmp_path, i, host_image, fmt, guest_by, hstore, hout, out, log, booted_ns):
    """The checks of one of the guest's disks, its image in format fmt."""
    tmp_path.mkdir()
    gstore = out / f"guest{i}"
    if guest_by == "agent":
        assert "fio exited 0" in log, log
        gstore = tmp_path / "guest.store"
        r = run_cli("import", str(out / f"guest{i}"), "-o", str(gstore))
        assert "warning" not in r.stderr, r.stderr
    offsets = fio_log_offsets(out / f"fio{i}.iolog")
    assert len(offsets) == READS

    with nestrace.open(gstore) as s:
        meta = s.rows("SELECT machine, kernel FROM capture_meta")[0]
        hooks = s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"]
        assert_losses_counted(s)
        devs = s.rows("SELECT level, name FROM device_map ORDER BY level")
    # the guest's own kernel, and its virtio disk as the vdisk level
    assert meta["machine"] == guestvm.HOSTNAME and meta["kernel"] != os.uname().release
    assert meta["kernel"] == (guestvm.KERNEL_DIR / "release").read_text().strip()
    assert '"block_rq_issue": "tp_btf"' in hooks
    # the guest's page-cache and mapping programs load on its kernel too
    # (its 6.1 refused a CO-RE relocation of folio->flags, and the agent
    # went on with nothing, exit 0); the image-access ones are skipped
    assert json.loads(hooks)["mm_filemap_add_to_page_cache"] in ("tp_btf", "raw_tp"), hooks
    assert json.loads(hooks)["xfs_file_direct_read"] == "skipped", hooks
    assert {d["level"]: d["name"] for d in devs}["vdisk"] == f"vd{chr(ord('a') + i)}"
    with nestrace.open(hstore) as s:
        assert_losses_counted(s, hout)

    merged = tmp_path / "vm.store"
    r = run_cli("merge", str(gstore), str(hstore), "-o", str(merged))
    run_cli("correlate", str(merged))   # (links computed once for the queries below)
    s = nestrace.open(merged)
    # where each file system's journal is: the host's xfs log, and the
    # guest's ext4 journal (record's Python, or the agent alone, found it)
    journals = {r["level"]: r["b"] for r in s.rows(
        "SELECT d.level, sum(e.length_bytes) AS b FROM extent_maps e JOIN device_map d "
        "ON d.capture_id = e.capture_id AND d.dev = e.physical_dev "
        "WHERE e.role = 'fs_journal' GROUP BY ALL")}
    assert journals.get("disk", 0) >= 1 << 20, journals
    assert journals.get("vdisk", 0) >= 1 << 20, journals
    m = s.rows("SELECT clock_offset_ns AS o, clock_offset_err_ns AS e, clock_offset_pairs AS n "
               "FROM capture_meta")[0]
    # the guest's CLOCK_MONOTONIC starts when its kernel boots, after QEMU
    # started (booted_ns, on this clock) and its firmware ran
    assert booted_ns < m["o"] < booted_ns + 120_000_000_000, (m, booted_ns)
    assert m["e"] < 1_000_000 and m["n"] >= READS, m
    # the host recorded from before QEMU started: its I/O from before the
    # guest's clock began (the firmware reading the disk) has no guest time
    # and is left out, counted
    assert "left out host events from before the guest's clock started" in r.stdout
    left = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    assert sum(left["host"]["events_before_guest_clock"].values()) > 0
    assert {r["level"]: r["machine"] for r in s.rows("SELECT level, machine FROM base_levels")} == \
        {"vfs": guestvm.HOSTNAME, "vdisk": guestvm.HOSTNAME,
         "hostfs": os.uname().nodename, "disk": os.uname().nodename}
    assert sorted(r["offset_bytes"] for r in s.rows(
        "SELECT offset_bytes FROM vfs_io WHERE syscall = 'pread64'")) == sorted(offsets)
    if fmt != "raw":
        # QEMU's own map of the image, as the oracle (vhdx: QEMU gives no
        # file offsets; the map read from the image now, checked against
        # the disk QEMU reads out of it)
        ino = os.stat(host_image).st_ino
        if fmt == "vhdx":
            qm = bat_map(str(host_image))
            test_vhdx.assert_map_reads_as_qemu(host_image, tmp_path, qm)
            qm = [(*e, ino) for e in qm.extents]
        elif fmt == "vmdk-split":    # (each extent file's)
            qm = [(g, f, n, os.stat(host_image.parent / name).st_ino)
                  for g, f, n, name in test_vmdk.qemu_file_map(host_image)]
            assert len({e[3] for e in qm}) > 2
        elif fmt == "qcow2-chain":   # (depth 0: the overlay, 1: its base)
            inos = [ino, os.stat(host_image.parent / "base.qed").st_ino]
            qm = [(g, f, n, inos[d]) for g, d, f, n in test_qcow2.qemu_chain_map(host_image)]
            assert {e[3] for e in qm} == set(inos)
        else:
            qm = [(*e, ino) for e in test_qcow2.qemu_map(host_image)]
        s.con.register("qm", pa.table(dict(zip(("lo", "ph", "len", "ino"), zip(*qm)))))
        got = s.con.execute(TRACE_THROUGH_VIA.replace("{image_map}", "SELECT * FROM qm"),
                            {"syscall": "pread64", "err": m["e"]}).fetchone()
        # the reads' clusters are not where they are on the virtual disk (a
        # read may span two: ext4's 1 KiB blocks need not align to them)
        moved = {r["syscall"]: r["n"] for r in s.rows(
            "SELECT r.syscall, count(DISTINCT io_id) AS n FROM map_vfs v JOIN vfs_io r "
            "USING (io_id) WHERE v.image_offset_bytes <> v.vdisk_offset_bytes GROUP BY 1")}
        assert moved == {"pread64": READS, "pwrite64": WRITES}, moved
        # QEMU's reads and writes of the image's own tables (the L2 and
        # refcount updates of the guest's first writes, say; a vmdk's grain
        # table entries, a vdi's block map, a vhdx's log and BAT, a VHD's bitmaps, footer
        # and BAT, a Parallels image's header and BAT, a qcow's L2 tables) are metadata
        assert s.rows("SELECT count(*) AS n FROM links WHERE lower_level = 'hostfs' "
                      "AND kind = 'metadata'")[0]["n"] > 0
        if fmt == "vmdk-split":
            # the reads and the writes, in sparse extents and in flat ones
            kinds = {(r["syscall"], r["path"][-4:]) for r in s.rows(
                "SELECT DISTINCT r.syscall, e.path FROM map_vfs v JOIN vfs_io r USING (io_id) "
                "JOIN extent_maps e ON e.ino = v.image_ino AND e.role = 'image'")}
            assert kinds == {(c, x) for c in ("pread64", "pwrite64") for x in (".raw", "vmdk")}, \
                kinds
        if fmt == "qcow2-chain":
            # the guest's reads are of the base, its writes in the overlay
            files = {(r["syscall"], r["f"]): r["n"] for r in s.rows(
                "SELECT r.syscall, CASE v.image_ino WHEN ? THEN 'overlay' ELSE 'base' END AS f, "
                "count(DISTINCT io_id) AS n FROM map_vfs v JOIN vfs_io r USING (io_id) "
                "WHERE v.image_ino IS NOT NULL GROUP BY ALL", [ino])}
            assert files == {("pread64", "base"): READS, ("pwrite64", "overlay"): WRITES}, files
    else:
        got = s.con.execute(TRACE_THROUGH, {"syscall": "pread64", "err": m["e"]}).fetchone()
    assert dict(zip(("mapped", "vdisk", "hostfs", "disk"), got)) == \
        {"mapped": READS, "vdisk": READS, "hostfs": READS, "disk": READS}
    # the correlator ties each read's virtual-disk request to QEMU's read
    # of the image and that to the host disk request
    # (and each write: the new blocks' clusters allocated in a mapped image)
    tied = {(r["syscall"], r["lower_level"]): r["n"] for r in s.rows(
        "SELECT r.syscall, l.lower_level, count(DISTINCT r.io_id) AS n FROM vfs_io r "
        "JOIN links a ON a.upper_level = 'vfs' AND a.upper_id = r.io_id AND a.kind = 'sync' "
        "JOIN links l ON l.upper_level = 'vdisk' AND l.upper_id = a.lower_id AND l.kind = 'sync' "
        "GROUP BY ALL")}
    assert tied == {("pread64", "hostfs"): READS, ("pread64", "disk"): READS,
                    ("pwrite64", "hostfs"): WRITES, ("pwrite64", "disk"): WRITES}, tied
    # QEMU is the host process that reads the image
    assert {r["comm"] for r in s.rows("SELECT DISTINCT comm FROM hostfs_io WHERE op = 'read'")} \
        <= {"qemu-system-x86"}
    # the guest's vdisk bytes are fio's reads, but for its own journal and
    # metadata writes (the end-of-capture sync), which are classified
    hop = {(r["kind"], r["attributed"]): r for r in s.rows(
        "SELECT * FROM links_summary WHERE upper_level = 'vfs' AND lower_level = 'vdisk'")}
    assert hop[("sync", True)]["requests"] >= READS + WRITES
    assert hop[("sync", True)]["fraction"] >= 0.99
    assert {k for k, attributed in hop if not attributed} <= {"journal", "metadata", "readahead"}
    # readahead: ext4lazyinit prefetching block bitmaps after the mount,
    # caught when tracing starts within seconds of it (the agent alone
    # starts sooner than Python on this emulated CPU)
    assert {r["comm"] for r in s.rows(
        "SELECT v.comm FROM links l JOIN vdisk_io v ON v.io_id = l.lower_id "
        "WHERE l.lower_level = 'vdisk' AND l.kind = 'readahead'")} <= {"ext4lazyinit"}
    # the host recorded before and after the guest did: report says so
    rep = run_cli("report", str(merged)).stdout
    doc = json.loads(run_cli("report", "--json", str(merged)).stdout)
    spans = doc["clock"]
    assert spans["host_s"][0] < spans["guest_s"][0] < spans["guest_s"][1] < spans["host_s"][1]
    assert "the guest recorded" in rep and "each level's totals are over its own" in " ".join(
        rep.split())
    # and names the image and how guest offsets are carried into it
    im = doc["image"]
    fmt = fmt.split("-")[0]   # (qcow2-chain: a qcow2 image)
    assert im["path"] == str(host_image) and im["format"] == fmt
    if fmt != "raw":
        assert im["map_source"] == f"{fmt}_end" and 0 < im["mapped_bytes"] < 256 << 20
        assert f"{fmt}, the virtual disk mapped into it by its cluster map" in " ".join(rep.split())
        base = host_image.parent / "base.qed"
        assert [b["path"] for b in im["backing_files"]] == \
            ([str(base)] if host_image.name.endswith("chain") else [])
        # a split vmdk's extent files that hold the bytes mapped, in disk order
        files = [b["path"].rsplit("/", 1)[1] for b in im["extent_files"]]
        assert (len(files) > 2 and files == sorted(files, key=lambda f: int(f.strip("vm-s.rawdk")))
                and sum(b["mapped_bytes"] for b in im["extent_files"]) == im["mapped_bytes"]) \
            if host_image.name.endswith("split") else files == [], im
        if files:   # (the terminal names the first 8)
            assert f"in its extent file {host_image.parent / files[0]}" in " ".join(rep.split())
            assert f"{host_image.parent / files[8]}" not in " ".join(rep.split())
            assert f"and {len(files) - 8} more extent files" in " ".join(rep.split())
        if im["backing_files"]:
            assert f"through its backing file {base}" in " ".join(rep.split())
    else:
        assert im == {"path": str(host_image), "format": "raw", "map_source": "raw",
                      "map_extents": 1, "mapped_bytes": 256 << 20, "backing_files": [],
                      "extent_files": []}
    run_cli("verify", str(merged))
