"""Bad input: one clear error line, exit code 2, nothing left behind."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest
from conftest import NESTRACE, ROOT, loop_devices, our_mounts, run_cli

import nestrace
from nestrace._paths import agent_path


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("nestrace: error: ")
    return lines[0]


@pytest.fixture
def nothing_left():
    before = (loop_devices(), our_mounts())
    yield
    assert (loop_devices(), our_mounts()) == before


def test_sql_on_a_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "x").write_text("hello")
    line = one_error_line(run_cli("sql", str(tmp_path), "SELECT 1", check=False))
    assert str(tmp_path) in line and "not a nestrace store" in line


def test_report_on_a_file_says_a_store_is_a_directory(tmp_path):
    (tmp_path / "x").write_text("hello")
    line = one_error_line(run_cli("report", str(tmp_path / "x"), check=False))
    assert f"{tmp_path / 'x'}: not a nestrace store (a store is a directory)" in line, line


@pytest.mark.parametrize("cmd", [["export"], ["plot", "--kind", "sizes"], ["html"]])
def test_an_output_that_cannot_be_a_file_is_refused_before_any_work(tmp_path, cmd):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    d = tmp_path / "out"
    d.mkdir()
    line = one_error_line(run_cli(*cmd, str(tmp_path / "s"), "-o", str(d), check=False))
    assert line == f"nestrace: error: {d}: is a directory (give the file to write)", line
    f = tmp_path / "nope" / "x.html"
    line = one_error_line(run_cli(*cmd, str(tmp_path / "s"), "-o", str(f), check=False))
    assert line == f"nestrace: error: {f}: no such directory {f.parent}", line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s"]
    assert list(d.iterdir()) == []


def test_commands_that_show_a_capture_say_the_store_holds_none(tmp_path):
    from nestrace.store.files import init_store
    s = str(tmp_path / "s")
    init_store(s)
    cmds = [["summary", s], ["report", s], ["compare", s, "--json"], ["follow", s, "vfs"],
            ["export", s, "-o", str(tmp_path / "x.json")],
            ["plot", s, "-o", str(tmp_path / "x.html")], ["html", s, "-o", str(tmp_path / "y.html")]]
    for cmd in cmds:
        line = one_error_line(run_cli(*cmd, check=False))
        assert line == f"nestrace: error: {s}: the store holds no capture", (cmd, line)
    # one left unsealed by a crash: said, with what to run
    (tmp_path / "s" / "_live" / "c1").mkdir(parents=True)
    line = one_error_line(run_cli("summary", s, check=False))
    assert line.endswith(f"holds no capture (unsealed: c1; `nestrace seal {s}`)"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_csv_and_json_together_are_refused(tmp_path):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    for cmd in (["sql", str(tmp_path / "s"), "SELECT 1"], ["compare", str(tmp_path / "s")]):
        line = one_error_line(run_cli(*cmd, "--csv", "--json", check=False))
        assert line == "nestrace: error: --csv and --json: give one", (cmd, line)


def test_sql_on_a_missing_store(tmp_path):
    line = one_error_line(run_cli("sql", str(tmp_path / "nope"), "SELECT 1", check=False))
    assert "no such store" in line


def test_sql_bad_query_is_one_error_line_then_duckdbs_help_indented(tmp_path):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    r = run_cli("sql", str(tmp_path / "s"), "SELECT nope FROM vfs_io", check=False)
    first, *rest = r.stderr.splitlines()
    assert r.returncode == 2 and first.startswith("nestrace: error: ") and "nope" in first
    assert rest and all(line.startswith("  ") for line in rest), r.stderr


def test_sql_on_empty_store_answers_from_the_views(tmp_path):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    r = run_cli("sql", str(tmp_path / "s"), "SELECT count(*) AS n FROM disk_io", "--json")
    assert '"n": 0' in r.stdout


def test_a_session_on_a_store_with_missing_tables_keeps_their_types_and_needs_no_pandas(tmp_path):
    """Tables a store lacks are empty SQL views of the declared types (an
    empty Arrow table registered instead costs every command ~0.4 s: DuckDB
    imports pandas for it)."""
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    code = ("import sys, nestrace; s = nestrace.open(sys.argv[1]); "
            "print(s.rows('SELECT typeof(ino) AS t, count(*) AS n FROM vfs_events GROUP BY 1'), "
            "s.rows(\"SELECT data_type FROM information_schema.columns WHERE table_name = "
            "'block_events' AND column_name = 'sector'\"), 'pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["[]", "[{'data_type':", "'UBIGINT'}]", "False"], r.stdout


def test_a_query_reading_links_on_a_store_not_correlated_computes_it_once_first(tmp_path):
    """links re-planned at each use made one query on the demo's store
    take 5 s; a session computes it (and what it reads) into tables the
    first time a query names it or a view built on it, and not before."""
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    s = nestrace.open(tmp_path / "s")
    cached = "SELECT table_name AS t FROM duckdb_tables() WHERE temporary ORDER BY 1"
    assert s.rows("SELECT count(*) AS n FROM disk_io") == [{"n": 0}]
    assert s.rows(cached) == []
    assert s.rows("SELECT count(*) AS n FROM latency_breakdown_summary") == [{"n": 0}]
    tables = {r["t"] for r in s.rows(cached)}
    assert {"_cache_links", "_cache__block_requests_core", "_cache_map_extents"} <= tables, tables
    assert s.rows("SELECT count(*) AS n FROM links") == [{"n": 0}]
    assert {r["t"] for r in s.rows(cached)} == tables


def test_import_of_a_file_that_is_not_blktrace(tmp_path):
    f = tmp_path / "trace.txt"
    f.write_text("  fio-123  [001] ....  12.345: block_rq_issue: 7,1 W 4096 () 8 + 8\n")
    line = one_error_line(run_cli("import", "-o", str(tmp_path / "s"), str(f), check=False))
    assert line == f"nestrace: error: {f}: byte 0: bad magic 0x69662020 (not a blktrace record)"


def test_import_of_a_missing_file_and_a_bad_device(tmp_path):
    line = one_error_line(run_cli("import", "-o", str(tmp_path / "s"), str(tmp_path / "nope"),
                                  check=False))
    assert line == f"nestrace: error: {tmp_path / 'nope'}: no such file"
    (tmp_path / "t").write_bytes(b"")
    line = one_error_line(run_cli("import", "-o", str(tmp_path / "s"), "--vdisk", "7:x",
                                  str(tmp_path / "t"), check=False))
    assert line == "nestrace: error: --vdisk 7:x: not MAJ:MIN"


@pytest.mark.root
def test_unknown_file_system(nothing_left):
    line = one_error_line(run_cli("lab", "up", "--name", "tbad", "--guest-fs", "zfs", check=False))
    assert "unknown guest file system 'zfs'" in line


@pytest.mark.root
def test_a_block_size_that_is_not_a_power_of_two_is_refused(nothing_left):
    # (mkfs.ext4 would round 3000 down to 2048 without a word)
    for flag in ("--guest-block-size", "--host-block-size"):
        line = one_error_line(run_cli("lab", "up", "--name", "tbad3", flag, "3000", check=False))
        assert line == f"nestrace: error: {flag} 3000: not a power of two"
    assert "tbad3" not in run_cli("lab", "list").stdout


@pytest.mark.root
def test_an_image_too_small_for_the_guest_file_system_is_refused(nothing_left):
    for fs, least in (("ext4", 16), ("xfs", 300)):
        line = one_error_line(run_cli("lab", "up", "--name", "tbad4", "--guest-fs", fs,
                                      "--image-size", "1K", check=False))
        assert line == (f"nestrace: error: --image-size 1024 bytes is below the {fs} "
                        f"minimum of {least} MiB"), line
    assert "tbad4" not in run_cli("lab", "list").stdout


@pytest.mark.root
def test_an_image_no_file_system_can_hold_is_one_error_line(nothing_left):
    # (past 2**63 bytes: too large for every file system, and for truncate's off_t)
    line = one_error_line(run_cli("lab", "up", "--name", "tbad5", "--image-size", "9000000T",
                                  check=False))
    assert "tbad5/disk.raw: cannot make the host disk (9895604650298572800 bytes): " \
        "File too large" in line, line
    assert "tbad5" not in run_cli("lab", "list").stdout


@pytest.mark.root
def test_failure_half_way_up_leaves_nothing(nothing_left):
    # the disk loop device is attached before mkfs of the host FS fails
    # (xfs takes blocks of 64 KiB at most; a block below its minimum of 1
    # KiB, with metadata checksums, is refused before anything is made)
    line = one_error_line(run_cli("lab", "up", "--name", "tbad2", "--host-fs", "xfs",
                                  "--host-block-size", "131072", check=False))
    assert "mkfs.xfs (host) failed" in line
    line = one_error_line(run_cli("lab", "up", "--name", "tbad2", "--host-fs", "xfs",
                                  "--host-block-size", "512", check=False))
    assert line == "nestrace: error: --host-block-size 512: below the xfs minimum of 1024 bytes"
    assert not (ROOT / "x").exists()
    r = run_cli("lab", "list")
    assert "tbad2" not in r.stdout


@pytest.mark.root
def test_record_options_out_of_range_are_refused_before_tracing(tmp_path, nothing_left):
    # (a duration of 0 or less, or a ring buffer size of 0, were taken for
    # none; --duration with a command was ignored)
    for args, said in ((["--duration", "-1"], "-1.0 is not in the range x>0"),
                       (["--duration", "0"], "0.0 is not in the range x>0"),
                       (["--ringbuf-kb", "0"], "0: not a power of two >= 4"),
                       (["--ringbuf-kb", "24"], "24: not a power of two >= 4"),
                       (["--duration", "1", "--", "true"],
                        "--duration is for recording without CMD")):
        r = run_cli("record", "-o", str(tmp_path / "s"), "--stack", "/", *args, check=False)
        assert r.returncode == 2 and said in r.stderr, (args, r.stderr)
    assert not (tmp_path / "s").exists()


@pytest.mark.root
def test_mount_point_that_is_not_a_nested_stack(tmp_path, nothing_left):
    line = one_error_line(run_cli("record", "-o", str(tmp_path / "s"), "--stack", "/",
                                  "--duration", "1", check=False))
    assert "not a loop device: not a nested stack" in line
    line = one_error_line(run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(tmp_path),
                                  "--duration", "1", check=False))
    assert "not a mount point" in line


@pytest.mark.root
def test_an_image_on_a_file_system_with_no_disk_is_refused_by_name(tmp_path, nothing_left):
    """A guest FS on a loop device whose image is in tmpfs: no host disk to
    trace.  One line names the image and its file system; nothing is left."""
    shm, guest = tmp_path / "shm", tmp_path / "guest"
    shm.mkdir()
    guest.mkdir()
    image = shm / "img.raw"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "nestrace-test", str(shm)], check=True)
    loop = None
    try:
        subprocess.run(["truncate", "-s", "64M", str(image)], check=True)
        loop = subprocess.run(["losetup", "-f", "--show", str(image)], check=True,
                              capture_output=True, text=True).stdout.strip()
        subprocess.run(["mkfs.ext4", "-q", loop], check=True)
        subprocess.run(["mount", loop, str(guest)], check=True)
        line = one_error_line(run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(guest),
                                      "--", "true", check=False))
        assert line.startswith(f"nestrace: error: {image}: the disk image is on tmpfs at {shm} ")
        assert "no block device" in line and "--side guest" in line
        assert not (tmp_path / "s").exists()
    finally:
        subprocess.run(["umount", str(guest)], capture_output=True)
        if loop:
            subprocess.run(["losetup", "-d", loop], capture_output=True)
        subprocess.run(["umount", str(shm)], capture_output=True)


@pytest.mark.root
def test_a_guest_btrfs_on_two_virtual_disks_is_refused_by_name(tmp_path, nothing_left):
    """Only the virtual disk under the guest mount is traced: a guest btrfs
    on two would lose the other's bytes, so record names both and stops,
    and the agent alone (--guest-capture) stops too."""
    guest = tmp_path / "guest"
    guest.mkdir()
    loops: list[str] = []
    try:
        for i in range(2):
            img = tmp_path / f"img{i}.raw"
            subprocess.run(["truncate", "-s", "256M", str(img)], check=True)
            loops.append(subprocess.run(["losetup", "-f", "--show", str(img)], check=True,
                                        capture_output=True, text=True).stdout.strip())
        subprocess.run(["mkfs.btrfs", "-q", "-f", "-d", "raid1", "-m", "raid1", *loops],
                       check=True, capture_output=True)
        subprocess.run(["mount", loops[0], str(guest)], check=True)
        line = one_error_line(run_cli("record", "-o", str(tmp_path / "s"), "--stack", str(guest),
                                      "--", "true", check=False))
        names = [os.path.basename(x) for x in loops]
        assert line.startswith(f"nestrace: error: {guest}: a btrfs on 2 devices ("), line
        assert all(n in line for n in names), line
        assert not (tmp_path / "s").exists()
        # and so does the agent alone in a guest
        r = subprocess.run([str(agent_path()), "--guest", str(guest), "--guest-capture",
                            str(tmp_path / "g"), "--", "true"], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.strip() == (
            f"nestrace-agent: --guest {guest}: a btrfs on 2 devices ({', '.join(names)}): "
            "nestrace traces one virtual disk under the guest file system"), r.stderr
        assert not (tmp_path / "g").exists()
    finally:
        subprocess.run(["umount", str(guest)], capture_output=True)
        for dev in loops:
            subprocess.run(["losetup", "-d", dev], capture_output=True)


@pytest.mark.root
def test_no_btf_is_refused(tmp_path, nothing_left):
    env = os.environ | {"NESTRACE_BTF": "/nonexistent/vmlinux"}
    line = one_error_line(run_cli("record", "-o", str(tmp_path / "s"), "--stack", "/",
                                  check=False, env=env))
    assert "no kernel BTF" in line


@pytest.mark.root
def test_no_privileges_is_refused(tmp_path, nothing_left):
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        *NESTRACE, "lab", "up", "--name", "tnobody"],
                       capture_output=True, text=True, cwd="/")
    line = one_error_line(r)
    assert "needs root" in line


def test_every_cli_command_is_documented():
    """Each command and subcommand has its help in the generated reference
    and is named in the guide or the README."""
    from nestrace.cli.main import cli
    reference = (ROOT / "docs" / "reference" / "cli.md").read_text()
    prose = (ROOT / "README.md").read_text() + "".join(
        p.read_text() for p in (ROOT / "docs" / "guide").glob("*.md"))
    names, ctx = [], click.Context(cli)
    # (list_commands: those defined outside main too, imported when named)
    commands = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    assert {"lab", "record", "study", "report"} <= commands.keys() and None not in commands.values()
    for name, cmd in commands.items():
        names.append(name)
        if hasattr(cmd, "commands"):
            names += [f"{name} {sub}" for sub in cmd.commands]
    assert [n for n in names if f"## `nestrace {n}`" not in reference] == []
    assert [n for n in names if f"nestrace {n}" not in prose and f"`{n}" not in prose] == []
    assert all((cmd.help or "").strip() for cmd in commands.values())


def test_a_command_of_main_imports_no_capture_module():
    """`nestrace sql` (a command of main) runs without importing the lab
    and capture modules that only lab, record and study need."""
    code = ("import sys, runpy; sys.argv = ['nestrace', 'sql', '-h']\n"
            "try:\n    runpy.run_module('nestrace', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('nestrace.capture.lab', "
            "'nestrace.capture.stack', 'nestrace.cli.lab', 'nestrace.cli.record'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_sql_csv_and_interactive_shell(tmp_path):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    # bytes as written: Unix line ends, so that $(nestrace sql ... --csv | tail -1)
    # is the value and nothing more
    r = subprocess.run(NESTRACE + ["sql", str(tmp_path / "s"), "SELECT 1 AS x, 'a' AS y", "--csv"],
                       capture_output=True, check=True, cwd=ROOT)
    assert r.stdout == b"x,y\n1,a\n"
    r = subprocess.run(NESTRACE + ["sql", str(tmp_path / "s")], input="SELECT 41 + 1\n  AS answer;\nSELECT nope;\n",
                       capture_output=True, text=True, cwd=ROOT)
    # piped, as DuckDB's shell: no prompts in the output, every statement
    # run, and a non-zero exit when one failed
    assert r.returncode == 1
    assert "answer" in r.stdout and "42" in r.stdout and "nestrace>" not in r.stdout + r.stderr
    assert "error: " in r.stderr            # a bad query does not end the shell
    r = subprocess.run(NESTRACE + ["sql", str(tmp_path / "s")], input="SELECT 1;\n",
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stderr == ""


def test_sql_errors_keep_duckdbs_help_for_the_query(tmp_path):
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    q = "SELECT nope FROM range(2) t(nop)"
    r = subprocess.run(NESTRACE + ["sql", str(tmp_path / "s"), q], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 2
    first, *rest = r.stderr.splitlines()
    assert first == 'nestrace: error: Binder Error: Referenced column "nope" not found in ' \
        'FROM clause!', first
    assert '  Candidate bindings: "nop"' in rest and f"  LINE 1: {q}" in rest, rest
    assert rest[-1].strip() == "^^^^"
    r = subprocess.run(NESTRACE + ["sql", str(tmp_path / "s")], input=q + ";\n",
                       capture_output=True, text=True, cwd=ROOT)
    assert '  Candidate bindings: "nop"' in r.stderr.splitlines(), r.stderr


def test_the_shell_has_dot_commands(tmp_path):
    """The DuckDB shell's habits: .tables, .schema with what each column
    means, .mode, .timer, .quit; an unknown one is an error, not SQL."""
    from nestrace.store.files import init_store
    init_store(tmp_path / "s")
    script = (".tables\n.schema disk_io\n.schema nope\n.mode csv\nSELECT 1 AS x, 'a' AS y;\n"
              ".mode json\n.timer on\nSELECT 2 AS z;\n.mode xml\n.bogus\n.quit\nSELECT 3 AS never;\n")
    r = subprocess.run(NESTRACE + ["sql", str(tmp_path / "s")], input=script,
                       capture_output=True, text=True, cwd=ROOT, env=os.environ | {"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\ndisk_io\n" in out and "\nblock_events\n" in out and "\n_" not in out
    assert re.search(r"d2c_ns +BIGINT +C - D: device service time", out)
    assert "error: Catalog Error: Table with name nope does not exist!" in r.stderr
    assert "x,y\n1,a\n" in out
    assert '"z": 2' in out and re.search(r"time: \d+\.\d{3} s", r.stderr)
    assert "error: .mode table, csv or json" in r.stderr
    assert "error: .bogus: not a command here (.help lists them)" in r.stderr
    assert "never" not in out


INTERRUPTS = """\
           CPU0       CPU1       CPU2
 31:          0       1982          0 PCI-MSIX-0000:00:01.0   3-edge      virtio0-stats
 36:          3    5538575     120000 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
 41:     900000          0          0 PCI-MSIX-0000:00:03.0   1-edge      virtio3-rx
 50:          0          0     300000 PCI-MSIX-0000:00:04.0   2-edge      nvme0q1
LOC:   19482340   20311562   10000000   Local timer interrupts
"""


def test_quiet_cpus_are_those_the_disk_interrupts_spare():
    from nestrace.capture.agent import quiet_cpus
    # virtio-blk on CPU 1, NVMe on CPU 2; the network and timers do not count
    assert quiet_cpus(INTERRUPTS, {0, 1, 2}) == {0}
    assert quiet_cpus(INTERRUPTS, {1, 2}) is None       # both take disk interrupts
    assert quiet_cpus(INTERRUPTS, {0}) is None          # one CPU: nothing to choose
    assert quiet_cpus(INTERRUPTS.replace("virtio1-req.0", "virtio1-cfg").replace(
        "nvme0q1", "eth0"), {0, 1, 2}) is None          # no disk interrupts seen


def test_status_lines_become_rates_per_level():
    from nestrace.capture.devices import BlockDev
    from nestrace.capture.stack import Stack
    from nestrace.capture.status import StatusLines
    disk = BlockDev("loop0", 7, 0, 1 << 21, 512)
    st = Stack(vdisk=BlockDev("loop1", 7, 1, 1 << 20, 512), disk=disk,
               more_disks=[BlockDev("loop2", 7, 2, 1 << 21, 512)])
    lines = StatusLines(st)
    assert lines.text("nestrace-agent: tracing (3 families, ring buffer 16384 KiB)") is None
    # 0.5 s in: 1000 calls of 4 KiB; the host disk's dispatches on two devices add up
    assert lines.text("nestrace-agent: status ms=500 records=9000 drops=0 vfs=1000:4096000 "
                      "hostfs=1000 cache=0 blk=7:1:1000:4096000,7:0:600:2457600,"
                      "7:2:400:1638400") == (
        "nestrace: 0.5 s | vfs 2.0k/s 7.8 MiB/s | vdisk 2.0k/s 7.8 MiB/s | "
        "hostfs 2.0k ev/s | disk 2.0k/s 7.8 MiB/s | lost 0")
    # rates since the line before; page cache only when there were events; a
    # device the stack does not name (the guest FS's own dev) is not a level
    assert lines.text("nestrace-agent: status ms=1500 records=9500 drops=7 vfs=1100:4505600 "
                      "hostfs=1000 cache=30 blk=7:1:1100:4505600,7:0:600:2457600,"
                      "7:2:400:1638400,7:9:5:5") == (
        "nestrace: 1.5 s | vfs 100/s 0.4 MiB/s | vdisk 100/s 0.4 MiB/s | "
        "hostfs 0 ev/s | disk 0/s 0.0 MiB/s | page cache 30 ev/s | LOST 7")
    assert lines.last["disk"] == (1000, 4096000) and lines.last["drops"] == 7
    # one side of a VM's stack: its two levels only
    guest = StatusLines(Stack(vdisk=BlockDev("vda", 253, 0, 1 << 20, 512), side="guest"))
    assert guest.text("nestrace-agent: status ms=1000 records=2 drops=-1 vfs=1:512 hostfs=0 "
                      "cache=0 blk=253:0:1:512") == (
        "nestrace: 1.0 s | vfs 1/s 0.0 MiB/s | vdisk 1/s 0.0 MiB/s | lost ?")


def test_an_overlays_layers_are_read_from_mountinfo_with_its_escapes():
    """mountinfo escapes a space, comma or backslash in an option's value
    as octal (\\040); lower layers are joined by colons, one in a name
    escaped by a backslash, itself shown as \\134 (as this kernel showed
    `mount -o 'lowerdir=/a b:/c\\:d'`: lowerdir=/a\\040b:/c\\134:d)."""
    from nestrace.capture.devices import Mount, overlay_dirs
    m = Mount("/c", 0, 40, "overlay", "overlay",
              r"rw,lowerdir=/a\040b/l1:/c\134:d/l2:/e\134\134f,upperdir=/u\054v,workdir=/w,"
              r"uuid=on")
    assert overlay_dirs(m) == ["/a b/l1", "/c:d/l2", "/e\\f", "/u,v", "/w"]


# (`lab up`, `lab down` and `lab list` run many times in a session; DuckDB,
# pyarrow and numpy took ~0.5 s of each run to import, twice what the rest
# of the command took)
LIGHT = """
import sys
from nestrace.cli.main import cli
try:
    cli.main(sys.argv[1:], prog_name="nestrace", standalone_mode=False)
finally:
    print(sorted(m for m in ("duckdb", "pyarrow", "numpy") if m in sys.modules))
"""


@pytest.mark.parametrize("args", [["lab", "list"], ["lab", "down", "--name", "nolab"],
                                  ["--version"]])
def test_commands_that_query_nothing_import_neither_duckdb_nor_pyarrow(args, tmp_path):
    env = dict(os.environ, NESTRACE_LAB_STATE=str(tmp_path / "state"),
               NESTRACE_LAB_DATA=str(tmp_path / "data"))
    r = subprocess.run([sys.executable, "-c", LIGHT, *args], capture_output=True, text=True,
                       cwd=ROOT, env=env)
    assert r.stdout.splitlines()[-1] == "[]", (r.stdout, r.stderr)


MAIN = """
import sys
from nestrace.cli.main import main
sys.argv[0] = "nestrace"
try:
    main()
except SystemExit as e:
    print("exit", e.code)
print(sorted(m for m in ("pyarrow", "pandas") if m in sys.modules))
"""


def test_a_command_that_builds_arrow_tables_does_not_import_pandas(tmp_path):
    """pyarrow imports pandas at the first array it builds, if it can:
    ~0.4 s of the start-up of record, import, merge...  The command line
    says pandas is not there; plot and html, which draw with plotly, may
    still import it, and so may a program that imports nestrace."""
    from nestrace.importers import blktrace
    f = tmp_path / "vda.blktrace.0"
    f.write_bytes(b"".join(
        blktrace.HEADER.pack(blktrace.MAGIC | 7, 0, t, 2048, 4096, (0x1 << 16) | a, 123,
                             (7 << 20) | 1, 0, 0, 0) for t, a in ((100, 1), (110, 4), (150, 7),
                                                                   (300, 8))))
    store = tmp_path / "s"
    r = subprocess.run([sys.executable, "-c", MAIN, "import", "-o", str(store), str(f)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.splitlines()[-2:] == ["exit 0", "['pyarrow']"], (r.stdout, r.stderr)
    s = nestrace.open(store)
    assert s.rows("SELECT op, bytes FROM disk_io") == [{"op": "read", "bytes": 4096}]
    assert len(s.df("SELECT * FROM disk_io")) == 1      # pandas, in a program


def test_usage_errors_are_one_line_naming_the_option_and_the_help(tmp_path):
    from nestrace.store.files import init_store
    s = str(tmp_path / "s")
    init_store(s)
    assert one_error_line(run_cli("report", check=False)) == \
        "nestrace: error: Missing argument 'STORE'. (`nestrace report --help`)"
    line = one_error_line(run_cli("report", s, "--no-such-option", check=False))
    assert "--no-such-option" in line and line.endswith("(`nestrace report --help`)"), line
    line = one_error_line(run_cli("plot", s, "--level", "disks", "-o", str(tmp_path / "x.html"),
                                  check=False))
    assert "'--level': 'disks' is not one of" in line, line


def test_option_values_are_checked_where_they_are_parsed(tmp_path):
    from nestrace.store.files import init_store
    s = str(tmp_path / "s")
    init_store(s)
    for cmd in (["report", s], ["correlate", s]):
        line = one_error_line(run_cli(*cmd, "--memory-limit", "-4GB", check=False))
        assert "Invalid value for '--memory-limit': '-4GB': a size such as 4GB" in line, line
    f = tmp_path / "trace.blktrace.0"
    f.write_bytes(b"")
    line = one_error_line(run_cli("import", str(f), "-o", s, "--vdisk", "banana", check=False))
    assert line == "nestrace: error: --vdisk banana: No such file or directory (give a block " \
        "device, or MAJ:MIN for a device not on this machine)", line
    line = one_error_line(run_cli("import", str(f), "-o", s, "--vdisk", "7:99999999", check=False))
    assert line.startswith("nestrace: error: --vdisk 7:99999999: no such device number"), line
