"""A VM's image on a NAS, in the lab: the host FS served over sshfs on the
loopback address (sftp behind socat, or over ssh to the lab's own sshd)
and mounted back, the virtual disk reading the image through that mount.
Traced as vfs, vdisk, netfs (sshfs's FUSE requests), hostfs (the server's
file system, on the file it exports) and disk."""
from __future__ import annotations

import json

import pytest
from conftest import assert_losses_counted, run_cli
from tracethrough import FIO_RANDREAD, assert_each_record_once, record_fio

# Each fio call ($op at $syscall) followed down by the lab's own layout,
# not the correlator's maps: its piece of the virtual disk from the guest
# file's extents (the agent's FIEMAP, checked against the file systems'
# own tools in tests/capture); the image is raw on a loop device at 0, so
# the piece is at the same offset in the image, on both sides of the
# network; then the image's extents on the server's file system give the
# disk.  Each level must show a request of the same direction covering
# the piece (at netfs and below, each 512-byte sector of it: sshfs cuts
# requests into the sftp server's reads), at netfs while the call was in
# flight, at hostfs a read in flight and a write after the call began
# (sshfs answers a write before its server has made it: writes are
# asynchronous unless mounted -o sshfs_sync).  The disk: a read before the call ended (in flight,
# or earlier: the server reads through its page cache, and its readahead
# brings some of the pieces in for an earlier call); a write any time in
# the capture (written back when the workload syncs).
NET_THROUGH = """
WITH r AS (SELECT * FROM vfs_io WHERE syscall = $syscall AND op = $op),
gm AS (SELECT * FROM extent_maps WHERE role = 'guest_file' AND phase = 'end'),
im AS (SELECT * FROM extent_maps WHERE role = 'image' AND phase = 'end' AND ino = {ino}),
p AS ({pieces}),
s AS (SELECT io_id, ts_ns, end_ns, unnest(range(off::BIGINT, (off + bytes)::BIGINT, 512)) AS s
      FROM p),
n AS (SELECT io_id, bool_and(EXISTS (SELECT 1 FROM netfs_io n WHERE n.op = $op
        AND n.offset_bytes <= s.s AND s.s + 512 <= n.offset_bytes + n.bytes
        AND n.start_ns BETWEEN s.ts_ns AND s.end_ns)) AS ok FROM s GROUP BY io_id),
h AS (SELECT io_id, bool_and(EXISTS (SELECT 1 FROM hostfs_io h WHERE h.op = $op
        AND h.ino = {ino}
        AND h.offset_bytes <= s.s AND s.s + 512 <= h.offset_bytes + h.bytes
        AND h.ts_ns >= s.ts_ns AND ($op = 'write' OR h.ts_ns <= s.end_ns))) AS ok
      FROM s GROUP BY io_id),
d AS (SELECT io_id, bool_and(EXISTS (SELECT 1 FROM disk_io d WHERE d.op = $op
        AND d.offset_bytes <= im.physical_bytes + (s.s - im.logical_bytes)
        AND im.physical_bytes + (s.s - im.logical_bytes) + 512 <= d.offset_bytes + d.bytes
        AND ($op = 'write' OR d.ts_ns <= s.end_ns))) AS ok
      FROM s JOIN im ON im.logical_bytes <= s.s AND s.s < im.logical_bytes + im.length_bytes
      GROUP BY io_id)
SELECT (SELECT count(*) FROM p) AS mapped,
  ({vdisk}) AS vdisk,
  (SELECT count(*) FROM n WHERE ok) AS netfs,
  (SELECT count(*) FROM h WHERE ok) AS hostfs,
  (SELECT count(*) FROM d WHERE ok) AS disk
"""
IMAGE = {"pieces": """SELECT r.io_id, r.ts_ns, r.end_ns, r.bytes,
             gm.physical_bytes + (r.offset_bytes - gm.logical_bytes) AS off
      FROM r JOIN gm ON gm.ino = r.ino AND r.offset_bytes >= gm.logical_bytes
                    AND r.offset_bytes < gm.logical_bytes + gm.length_bytes""",
         "ino": "(SELECT image_ino FROM map_vdisk_image LIMIT 1)",
         "vdisk": """SELECT count(*) FROM p WHERE EXISTS (SELECT 1 FROM vdisk_io v
     WHERE v.op = $op AND v.offset_bytes <= p.off AND p.off + p.bytes <= v.offset_bytes + v.bytes
     AND v.ts_ns BETWEEN p.ts_ns AND p.end_ns)"""}
# the gateway: the guest's file is the server's, at the same offsets; no
# virtual disk (its count is the calls')
GATEWAY = {"pieces": "SELECT io_id, ts_ns, end_ns, bytes, offset_bytes AS off FROM r",
           "ino": "(SELECT any_value(ino) FROM extent_maps WHERE role = 'image' "
                  "AND path LIKE '%/host/t.0.0')",
           "vdisk": "SELECT count(*) FROM p"}
LEVELS = ("mapped", "vdisk", "netfs", "hostfs", "disk")


def through(s, op: str, syscall: str, shape: dict = IMAGE) -> dict:
    q = NET_THROUGH
    for k, v in shape.items():
        q = q.replace("{" + k + "}", v)
    got = s.con.execute(q, {"op": op, "syscall": syscall}).fetchone()
    return dict(zip(LEVELS, got))


@pytest.mark.root
@pytest.mark.parametrize("net,host_fs", [("sshfs-socat", "xfs"), ("sshfs-ssh", "ext4")])
def test_every_read_and_write_is_found_at_every_level_through_sshfs(
        lab_factory, tmp_path, net, host_fs):
    # (4 KiB guest blocks, as in a VM's file system: each 4 KiB read is one
    # page of the server's.  With 1 KiB blocks, mkfs.ext4's choice on a
    # small image, a read spans two pages, and when the first was locked
    # by a readahead still in flight an ext4 server's first page lookup has
    # no event: docs/design/hostfs-hooks.md, ext2/ext3/ext4)
    lab = lab_factory("ext4", host_fs, image_size="256M", net=net, guest_block_size=4096)
    s, offsets, r = record_fio(lab, tmp_path / "r", tmp_path, *FIO_RANDREAD)
    assert len(offsets) == 4096
    assert through(s, "read", "pread64") == dict.fromkeys(LEVELS, 4096)
    assert_losses_counted(s, r.stdout)
    assert_each_record_once(s)
    assert s.rows("SELECT DISTINCT position, level, below FROM chain_levels ORDER BY position") == [
        dict(position=1, level="vfs", below="vdisk"), dict(position=2, level="vdisk", below="netfs"),
        dict(position=3, level="netfs", below="hostfs"),
        dict(position=4, level="hostfs", below="disk"), dict(position=5, level="disk", below=None)]
    dm = {d["level"]: d for d in s.rows("SELECT * FROM device_map")}
    assert dm["netfs"]["fs_type"] == "fuse.sshfs"
    assert dm["netfs"]["backing_path"] == f"127.0.0.1:{lab_state_host(lab)}" or \
        dm["netfs"]["backing_path"] == f"root@127.0.0.1:{lab_state_host(lab)}"
    assert dm["hostfs"]["fs_type"] == host_fs
    # the virtual disk's bytes are the server's file: the one traced at hostfs
    assert dm["vdisk"]["backing_dev"] == dm["hostfs"]["dev"]
    assert dm["vdisk"]["backing_path"].endswith("/net/image.raw")
    stack = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    assert stack["net"]["transport"] == net.removeprefix("sshfs-")
    # what the hop's processes cost: the client's (sshfs, and ssh) and the
    # server's (socat's child or sshd's session, and sftp-server)
    cpu = json.loads(s.rows("SELECT settings_json FROM capture_meta")[0]["settings_json"])["net_cpu"]
    assert cpu["client"] == (["ssh", "sshfs"] if net == "sshfs-ssh" else ["sshfs"]), cpu
    assert "sftp-server" in cpu["server"] and cpu["client_s"] + cpu["server_s"] > 0, cpu
    assert stack["image_path"].endswith("/host/image.raw")
    # the random reads are what the client sends: no metadata between
    # (the file was opened before), and each request one of fio's
    ops = {r["op"]: r["n"] for r in s.rows("SELECT op, count(*) AS n FROM netfs_io GROUP BY op")}
    assert ops.get("read", 0) == 4096, ops
    # each joined to the virtual-disk request it serves, by offset and time
    causes = s.rows("SELECT cause, count(*) AS n, count(DISTINCT upper_id) AS ups "
                    "FROM netfs_causes WHERE op = 'read' GROUP BY cause")
    assert causes == [{"cause": "vdisk", "n": 4096, "ups": 4096}], causes
    assert "\nchain: vfs > vdisk > netfs > hostfs > disk\n" in \
        run_cli("summary", str(tmp_path / "r")).stdout + "\n"

    w = assert_writes_found(lab, tmp_path, IMAGE)
    # (the loop device's flush reaches the server as FUSE's fsync, sftp's)
    assert w.rows("SELECT count(*) AS n FROM netfs_io WHERE opcode = 'fsync'")[0]["n"] >= 1


def assert_writes_found(lab, tmp_path, shape: dict):
    """Seeded 4 KiB O_DIRECT writes, then an fsync that reaches the
    server's disk: each found at every level.  The session."""
    w, woffsets, r = record_fio(lab, tmp_path / "w", tmp_path, "--rw=randwrite", "--bs=4k",
                                "--direct=1", "--size=64M", "--io_size=2M", "--end_fsync=1",
                                "--randseed=7", log_op="write")
    assert len(woffsets) == 512
    assert through(w, "write", "pwrite64", shape) == dict.fromkeys(LEVELS, 512)
    assert_losses_counted(w, r.stdout)
    return w


@pytest.mark.root
@pytest.mark.parametrize("net,host_fs", [("sshfs-socat", "ext4"), ("sshfs-ssh", "xfs")])
def test_the_gateway_finds_every_read_and_write_at_every_level(lab_factory, tmp_path, net,
                                                               host_fs):
    """The guest's files on the network mount itself: vfs > netfs >
    hostfs > disk, the file's offsets the same on both sides."""
    lab = lab_factory("ext4", host_fs, image_size="64M", net=net, gateway=True)
    s, offsets, r = record_fio(lab, tmp_path / "r", tmp_path, *FIO_RANDREAD)
    assert len(offsets) == 4096
    assert through(s, "read", "pread64", GATEWAY) == dict.fromkeys(LEVELS, 4096)
    assert_losses_counted(s, r.stdout)
    assert s.rows("SELECT DISTINCT position, level, below FROM chain_levels ORDER BY position") == [
        dict(position=1, level="vfs", below="netfs"), dict(position=3, level="netfs", below="hostfs"),
        dict(position=4, level="hostfs", below="disk"), dict(position=5, level="disk", below=None)]
    dm = {d["level"]: d for d in s.rows("SELECT * FROM device_map")}
    assert dm["vfs"]["fs_type"] == dm["netfs"]["fs_type"] == "fuse.sshfs"
    assert dm["vfs"]["dev"] == dm["netfs"]["dev"] and "vdisk" not in dm
    # each read request joined to fio's call it serves (the same process)
    causes = s.rows("SELECT cause, count(*) AS n FROM netfs_causes WHERE op = 'read' "
                    "GROUP BY cause")
    assert causes == [{"cause": "app", "n": 4096}], causes
    assert "\nchain: vfs > netfs > hostfs > disk\n" in \
        run_cli("summary", str(tmp_path / "r")).stdout + "\n"
    assert_writes_found(lab, tmp_path, GATEWAY)


def lab_state_host(lab) -> str:
    from conftest import lab_state
    return lab_state(lab)["host_mount"]


@pytest.mark.root
def test_a_lab_net_hop_goes_down_whole_when_its_daemon_is_gone(lab_factory, tmp_path):
    """lab down after the server died under the mount: the mount, the
    loop devices and the lab go; lab_factory checks nothing is left."""
    import os
    import signal

    from conftest import lab_state
    lab = lab_factory("ext4", "xfs", image_size="64M", net="sshfs-socat")
    daemon = next(m for m in lab_state(lab)["made"] if m["kind"] == "daemon")
    os.killpg(daemon["pid"], signal.SIGKILL)
    r = run_cli("lab", "down", "--name", lab.name)
    assert "detached" in r.stderr and "stopped" not in r.stderr, r.stderr
    assert run_cli("lab", "list").stdout.split() == [] or lab.name not in run_cli("lab", "list").stdout


@pytest.mark.root
def test_a_server_that_dies_mid_capture_ends_it_sealed_with_what_came_before(
        lab_factory, tmp_path):
    """The sshfs server killed while fio reads through the image: record
    says the network mount went away, stops tracing there, seals the
    capture with every record taken before, and exits non-zero."""
    import os
    import signal
    import subprocess
    import time

    from conftest import NESTRACE, ROOT, lab_state
    lab = lab_factory("ext4", "xfs", image_size="256M", net="sshfs-socat")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    store = tmp_path / "s"
    marker = tmp_path / "started"
    job = ["sh", "-c", f"touch {marker}; exec fio --name=t --directory={lab.mount} "
           "--rw=randread --bs=4k --direct=1 --size=32M --time_based --runtime=60 "
           "--output=/dev/null"]
    proc = subprocess.Popen([*NESTRACE, "record", "-o", str(store), "--stack", lab.mount,
                             "--", *job], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        for _ in range(300):
            if marker.exists():
                break
            time.sleep(0.1)
        time.sleep(2)           # (reads under way through the mount)
        daemon = next(m for m in lab_state(lab)["made"] if m["kind"] == "daemon")
        killed_ns = time.monotonic_ns()
        os.killpg(daemon["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "nestrace: the network mount went away during the capture: " in err, err
    assert "the capture ends there and is sealed" in err
    s = nestrace_open(store)
    meta = s.rows("SELECT settings_json, end_ns FROM capture_meta")[0]
    lost = json.loads(meta["settings_json"])["net_lost"]
    assert lost["ns"] >= killed_ns and ("mount" in lost["why"] or "sshfs" in lost["why"]), lost
    # what came before is all there: the reads, at every level, none lost
    got = s.rows("SELECT level, count(*) AS n FROM chain_io WHERE op = 'read' GROUP BY level")
    got = {r["level"]: r["n"] for r in got}
    assert set(got) >= {"vfs", "vdisk", "netfs", "hostfs"} and got["vfs"] > 100, got
    assert s.rows("SELECT sum(ringbuf_drops) AS d FROM lost_events")[0]["d"] == 0
    run_cli("verify", str(store))        # (sealed whole: every sum checks)


def nestrace_open(store):
    import nestrace
    return nestrace.open(store)


@pytest.mark.root
@pytest.mark.parametrize("gateway", [False, True])
def test_a_server_that_is_not_this_machine_is_traced_down_to_the_client(
        lab_factory, tmp_path, gateway):
    """A server on 127.0.0.2 stands for a NAS nestrace cannot see into: the
    capture has the client's levels, and says the chain stops at netfs."""
    lab = lab_factory("ext4", "xfs", image_size="128M", net="sshfs-socat",
                      net_address="127.0.0.2", **({"gateway": True} if gateway else {}))
    s, offsets, r = record_fio(lab, tmp_path / "r", tmp_path, "--rw=randread", "--bs=4k",
                               "--direct=1", "--size=32M", "--io_size=1M")
    assert len(offsets) == 256
    want = ["vfs", "netfs"] if gateway else ["vfs", "vdisk", "netfs"]
    assert [r["level"] for r in s.rows("SELECT DISTINCT position, level FROM chain_levels "
                                       "ORDER BY position")] == want
    assert s.rows("SELECT count(*) AS n FROM netfs_io WHERE op = 'read'")[0]["n"] == 256
    # each read at the client at its offset in the image (or the file)
    if not gateway:
        assert through(s, "read", "pread64")["netfs"] == 256
    assert s.rows("SELECT count(*) AS n FROM hostfs_events")[0]["n"] == 0
    stop = ("stops at netfs: the network file system's server is not this machine: its "
            "file system and disks are not seen")
    assert stop in run_cli("summary", str(tmp_path / "r")).stdout
    assert stop in " ".join(run_cli("report", str(tmp_path / "r")).stdout.split())
    stack = json.loads(s.rows("SELECT stack_json FROM capture_meta")[0]["stack_json"])
    assert stack["net"]["host"] == "127.0.0.2" and not stack["net"]["local"]
