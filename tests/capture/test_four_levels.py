"""Real captures: reads and writes found at all four levels of a
loop-device stack: synchronous and libaio, direct and unaligned, split
at the virtual disk.  (AIO and io_uring of each kind: test_async_io.py;
copies and hints: test_copies_and_hints.py.)"""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import (
    assert_losses_counted,
    prog_ids,
    requests_without_completion,
    run_cli,
)

import nestrace

pytestmark = pytest.mark.root
from tracethrough import (
    FIO_RANDREAD,
    assert_each_record_once,
    assert_traced_through,
    record_fio,
)


def test_concurrent_capture_with_a_1ms_flush_timer_stores_each_record_once(lab_factory, tmp_path):
    """The agent's flush runs on every CPU while programs fill the stages
    (QD32 on both CPUs): no record is lost or handed over twice."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=64M")
    r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", lab.mount, "--flush-ms", "1",
                "--", "fio", "--name=t", f"--directory={lab.mount}", "--rw=randwrite",
                "--bs=4k", "--direct=1", "--size=64M", "--time_based", "--runtime=6",
                "--ioengine=libaio", "--iodepth=32", "--numjobs=2", "--output=/dev/null")
    assert "duplicated" not in r.stderr
    s = nestrace.open(tmp_path / "s")
    # The load must be real: records from both CPUs, and more than one per
    # 1 ms flush on average over the 6 s.  (Not an IOPS target: this host
    # did 19k to 80k+ requests here, depending on its own load.)
    per_cpu = s.rows("SELECT cpu, count(*) AS n FROM block_events GROUP BY cpu ORDER BY cpu")
    assert len(per_cpu) == 2 and min(r["n"] for r in per_cpu) > 1_000, per_cpu
    assert s.rows("SELECT count(*) AS n FROM disk_io")[0]["n"] > 6_000
    assert_each_record_once(s)
    lost = s.rows("SELECT sum(ringbuf_drops) AS drops, sum(seq_gaps) AS gaps FROM lost_events")[0]
    assert lost == {"drops": 0, "gaps": 0}


def test_ext4_on_xfs_every_fio_read_is_seen_at_all_four_levels(lab_factory, tmp_path):
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    s, offsets, r = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD)
    assert_traced_through(s, offsets)
    assert_losses_counted(s, r.stdout)
    hooks = json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["block_rq_issue"] == "tp_btf"
    # on an xfs host the generic access hooks hostfs_io ignores are not attached
    assert hooks["xfs_file_direct_read"] == "tp_btf"
    assert hooks["iomap_dio_rw_begin"] == hooks["mm_filemap_get_pages"] == "skipped"


def test_unaligned_direct_writes_into_a_sparse_xfs_image_are_one_access_each(lab_factory, tmp_path):
    """Guest ext4 with 1 KiB blocks on a sparse image on xfs (4 KiB blocks),
    the guest's loop writing the image with O_DIRECT: its writes are not
    aligned to xfs's block, and where the image has holes xfs tries each
    twice (shared iolock, then exclusive).  The capture must show both
    tries, and hostfs_io one access per vdisk write, at its image offset."""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on", guest_block_size=1024)
    store = tmp_path / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=w",
            f"--directory={lab.mount}", "--rw=randwrite", "--bs=4k", "--size=16M",
            "--io_size=4M", "--direct=1", "--output=/dev/null")
    s = nestrace.open(store)
    tries = s.rows("SELECT iocb_flags & 32 <> 0 AS excl, count(*) AS n FROM hostfs_events "
                   "WHERE source = 4 GROUP BY ALL ORDER BY ALL")
    retried = {r["excl"]: r["n"] for r in tries}
    assert retried.get(True, 0) >= 100, tries       # the kernel did retry: the case is real
    # (a write whose C the kernel ran no program for has no window: counted apart)
    assert_losses_counted(s)
    no_c = requests_without_completion(s, "vdisk", "write")
    writes = s.rows("""
        SELECT count(*) AS vdisk,
               count(*) FILTER (WHERE (SELECT count(*) FROM hostfs_io h WHERE h.op = 'write'
                   AND h.offset_bytes = v.offset_bytes AND h.bytes = v.bytes
                   AND h.ts_ns BETWEEN v.d_ns AND v.c_ns) = 1) AS one_access
        FROM vdisk_io v WHERE v.op = 'write' AND v.c_ns IS NOT NULL""")[0]
    assert writes["vdisk"] + no_c >= 1024 and writes["one_access"] == writes["vdisk"], (writes, no_c)
    n = s.rows("SELECT count(*) AS n FROM hostfs_io WHERE op = 'write'")[0]["n"]
    assert n == s.rows("SELECT count(*) AS n FROM vdisk_io WHERE op = 'write'")[0]["n"]


@pytest.mark.parametrize("host_fs", ["ext4", "btrfs"])
def test_direct_reads_and_writes_of_the_image_keep_their_direction_at_hostfs(lab_factory, tmp_path, host_fs):
    """The loop device reads and writes the image with iocbs that carry no
    IOCB_WRITE: iomap_dio_rw_begin's direction must come from the iov_iter
    (it once came from the iocb, and every write on an ext2/3/4 host was a
    hostfs read).  Each vdisk read and write has one hostfs access of the
    same direction at its image offset, made while the request was out.
    btrfs takes direct reads the iomap way but writes them through its page
    cache, so its writes are the folios they dirty, with op write too."""
    lab = lab_factory("ext4", host_fs, guest_dio="on", host_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=32M")
    store = tmp_path / "s"
    run_cli("record", "-o", str(store), "--stack", lab.mount, "--", "fio", "--name=t",
            f"--directory={lab.mount}", "--rw=randrw", "--bs=4k", "--size=32M",
            "--io_size=4M", "--direct=1", "--output=/dev/null")
    s = nestrace.open(store)
    got = s.rows("""
        SELECT v.op, count(*) AS vdisk,
               count(*) FILTER (WHERE (SELECT count(*) FROM hostfs_io h WHERE h.op = v.op
                   AND h.offset_bytes = v.offset_bytes AND h.bytes = v.bytes
                   AND h.ts_ns BETWEEN v.d_ns AND v.c_ns) = 1) AS same_access
        FROM vdisk_io v WHERE v.op IN ('read', 'write') AND v.c_ns IS NOT NULL
        GROUP BY ALL ORDER BY ALL""")
    assert [r["op"] for r in got] == ["read", "write"], got
    for r in got:
        assert r["vdisk"] >= 400, got
        if host_fs == "ext4" or r["op"] == "read":
            assert r["same_access"] == r["vdisk"], got
    ops = {r["op"]: r["n"] for r in s.rows("SELECT op, count(*) AS n FROM hostfs_io GROUP BY ALL")}
    # all of them, also a request whose completion the kernel ran no program for
    vd = {r["op"]: r["n"] for r in s.rows("SELECT op, count(*) AS n FROM vdisk_io GROUP BY ALL")}
    assert ops["read"] == vd["read"], (ops, vd)
    if host_fs == "ext4":
        assert ops["write"] == vd["write"], (ops, vd)
    else:   # a folio dirtied again before write-back is not seen again
        assert 0.5 * vd["write"] <= ops["write"] <= vd["write"], (ops, vd)
    assert_losses_counted(s)


@pytest.mark.parametrize("per_request", [False, True], ids=["events", "per-request"])
def test_pieces_of_bios_split_at_the_virtual_disk_keep_their_q(lab_factory, tmp_path, per_request):
    """256 KiB O_DIRECT writes on a virtual disk that takes at most 64 KiB
    per request: each bio is cut into four pieces (three X events and the
    remainder), four requests that all have the write's Q, so Q2G and Q2C
    exist for every data request and sum up per write.  --per-request:
    the kernel gives each piece its parent's Q, and counts the Q once."""
    lab = lab_factory("ext4", "xfs", guest_dio="on")
    lab.fio("--rw=write", "--bs=1M", "--direct=1", "--size=8M")
    vdisk = Path(subprocess.run(["findmnt", "-no", "SOURCE", lab.mount], check=True,
                                capture_output=True, text=True).stdout.strip()).name
    limit = Path(f"/sys/block/{vdisk}/queue/max_sectors_kb")
    before = limit.read_text()
    limit.write_text("64\n")
    store = tmp_path / "s"
    try:
        run_cli("record", "-o", str(store), "--stack", lab.mount,
                *(["--per-request"] if per_request else []), "--", "fio", "--name=t",
                f"--directory={lab.mount}", "--ioengine=psync", "--output=/dev/null",
                "--rw=write", "--bs=256k", "--direct=1", "--size=8M")
    finally:
        limit.write_text(before)    # (the loop device keeps it after it is detached)
    s = nestrace.open(store)
    assert_losses_counted(s)
    splits = s.rows("SELECT count(*) AS n FROM block_events e JOIN device_map m "
                    "ON m.dev = e.dev AND m.level = 'vdisk' WHERE e.action = 8")[0]["n"]
    assert splits >= 3 * 32 or per_request
    data = s.rows("SELECT count(*) AS n, count(q_ns) AS q, count(q2g_ns) AS q2g, "
                  "max(bytes) AS most FROM vdisk_io WHERE op IN ('read', 'write')")[0]
    assert data["n"] >= 4 * 32 and data["q"] == data["n"] == data["q2g"], data
    assert data["most"] == 64 << 10
    # the fio writes: groups of four 64 KiB requests sharing one Q, in order
    whole = s.rows("SELECT count(*) AS n FROM (SELECT q_ns FROM vdisk_io WHERE op = 'write' "
                   "GROUP BY q_ns HAVING count(*) = 4 AND sum(bytes) = 256 * 1024 "
                   "AND max(sector) - min(sector) = 3 * 128 AND bool_and(g_ns >= q_ns))")[0]["n"]
    assert whole == 32
    # a bio's Q counted once (size_merge_ratio.queued), not once per piece:
    # the Q events of the 256 KiB writes, or what their pieces' rows count
    vdisk_dev = "(SELECT dev FROM device_map WHERE level = 'vdisk')"
    queued = s.rows(f"SELECT (SELECT count(*) FROM block_events WHERE action = 1 "
                    f"AND nr_sectors = 512 AND dev = {vdisk_dev}) AS events, "
                    f"(SELECT coalesce(sum(queued), 0) FROM block_request_records WHERE action = 7 "
                    f"AND nr_sectors = 128 AND req_op = 1 AND dev = {vdisk_dev}) AS requests")[0]
    assert queued == ({"events": 0, "requests": 32} if per_request else
                      {"events": 32, "requests": 0}), queued


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_libaio_reads_at_queue_depth_16_are_seen_at_all_four_levels(lab_factory, tmp_path, mode):
    """Linux AIO: one vfs_io row per iocb (io_submit to the io_getevents
    that reaped it), at fio's offset, and each traced down the stack.
    (io_getevents' events pointer is read from the registers at its exit,
    on both kinds of program.)"""
    lab = lab_factory("ext4", "xfs", guest_dio="on", host_dio="on")
    s, offsets, _ = record_fio(lab, tmp_path / "s", tmp_path, *FIO_RANDREAD,
                               "--ioengine=libaio", "--iodepth=16", extra=["--mode", mode])
    hooks = json.loads(s.rows("SELECT hooks_json FROM capture_meta")[0]["hooks_json"])
    assert hooks["sys_enter"] == hooks["sys_exit"] == mode
    assert_traced_through(s, offsets, syscall="aio_pread")
    assert s.rows("SELECT count(*) AS n FROM vfs_io WHERE syscall NOT LIKE 'aio_%' "
                  "AND op = 'read'") == [{"n": 0}]
    # up to 16 in flight at once: the rows overlap in time
    in_flight = s.rows("SELECT max(n) AS n FROM (SELECT count(*) AS n FROM vfs_io a JOIN vfs_io b "
                       "ON b.ts_ns <= a.ts_ns AND a.ts_ns < b.end_ns GROUP BY a.io_id)")[0]["n"]
    assert 2 <= in_flight <= 16, in_flight
    assert s.rows("SELECT fraction FROM links_to_vfs ORDER BY level") == [
        {"fraction": 1.0}, {"fraction": 1.0}]


def kernel_has_kfunc(name: str) -> bool:
    out = subprocess.run(["bpftool", "btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
                         check=True, capture_output=True, text=True).stdout
    return f"FUNC '{name}' " in out


@pytest.mark.parametrize("mode", ["tp_btf", "raw_tp"])
def test_open_files_fields_are_plain_loads_where_the_kernel_has_bpf_rdonly_cast(lab_factory, mode):
    """The syscall programs read the open file behind an fd (its inode,
    device, flags, position) through bpf_rdonly_cast, a load each, where
    the kernel has that kfunc (Linux 6.2+) and the programs are tp_btf;
    elsewhere a probe read each, the cast's path dead code the verifier
    removed.  Which one the kernel kept shows in the loaded program's line
    info.  (The libaio test above checks the rows both ways give.)"""
    from nestrace.capture.agent import agent_args, side_families
    from nestrace.capture.stack import discover
    lab = lab_factory("ext4", "xfs")
    stack = discover(lab.mount)
    agent = subprocess.Popen(agent_args(stack, None, mode, side_families(stack))
                             + ["-o", "/dev/null"], stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        for line in agent.stderr:
            if line.startswith("nestrace-agent: tracing"):
                break
        assert line.startswith("nestrace-agent: tracing"), line
        ours = prog_ids(agent.pid)
        progs = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                          capture_output=True, text=True).stdout)
        name = {"tp_btf": "sys_enter_btf", "raw_tp": "sys_enter_raw"}[mode]
        ids = [p["id"] for p in progs if p["id"] in ours and p.get("name") == name]
        assert len(ids) == 1, [(p["id"], p.get("name")) for p in progs if p["id"] in ours]
        xlated = subprocess.run(["bpftool", "prog", "dump", "xlated", "id", str(ids[0])],
                                check=True, capture_output=True, text=True).stdout
    finally:
        agent.send_signal(signal.SIGINT)
        err = agent.communicate(timeout=60)[1]
    assert agent.returncode == 0, err
    assert "inode = RD1(cast, f, f_inode);" in xlated     # the lookup, either way
    cast = "f = bpf_rdonly_cast(f, bpf_core_type_id_kernel(struct file));" in xlated
    assert cast == (mode == "tp_btf" and kernel_has_kfunc("bpf_rdonly_cast")), mode
