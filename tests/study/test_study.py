"""Study files (nestrace.study): parsing, every error named by file, line
and key; the nested-fs study's --quick run end to end, and its report
rebuilt from the store alone; a workload that fails."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import job_stopped, run_cli, start_job

import nestrace
from nestrace.study.spec import StudyError, load

REPO = Path(__file__).resolve().parents[2]
GOOD = """\
[study]
name = "t"
rounds = 2

[matrix]
guest_fs = ["ext4"]
host_fs = ["xfs"]

[quick]
rounds = 1

[[workload]]
name = "w"
job = "w.fio"
prepare = true

[[claim]]
id = "c"
words = "some words"
query = "SELECT 1 AS value"
holds = ">= 1"
"""


def study(tmp_path: Path, text: str) -> Path:
    (tmp_path / "w.fio").write_text("[w]\nrw=read\nsize=1m\n")
    p = tmp_path / "s.toml"
    p.write_text(text)
    return p


def test_a_study_file_reads_with_its_quick_changes(tmp_path):
    s = load(study(tmp_path, GOOD))
    assert (s.name, s.rounds, s.baseline) == ("t", 2, "none")
    assert [(x.guest_fs, x.host_fs, x.name, x.base) for x in s.stacks()] == [
        ("ext4", "xfs", "ext4 on xfs", "ext4 on none"), ("ext4", "none", "ext4 on none", "ext4 on none")]
    assert s.workloads[0].prepare == s.workloads[0].job == tmp_path / "w.fio"
    assert (s.claims[0].op, s.claims[0].threshold) == (">=", 1.0)
    assert load(study(tmp_path, GOOD), quick=True).rounds == 1
    assert load(study(tmp_path, GOOD)).memory is None
    held = GOOD.replace('host_fs = ["xfs"]', 'host_fs = ["xfs"]\nmemory = "32M"').replace(
        "rounds = 1", 'rounds = 1\nmemory = "16M"')
    assert load(study(tmp_path, held)).memory == 32 << 20
    assert load(study(tmp_path, held), quick=True).memory == 16 << 20
    with pytest.raises(StudyError, match=r"line 12: \[quick\] memory: bad size 'lots'"):
        load(study(tmp_path, held.replace('"16M"', '"lots"')), quick=True)
    # the study shipped reads, and its --quick is its small subset
    q = load(REPO / "studies" / "nested-fs.toml", quick=True)
    assert [(x.guest_fs, x.host_fs) for x in q.stacks()] == [("ext4", "xfs"), ("ext4", "none")]
    assert q.rounds == 1
    assert len(load(REPO / "studies" / "nested-fs.toml").stacks()) == 30


@pytest.mark.parametrize("change, error", [
    (("rounds = 2", "rounds = 2\ncolour = 1"), r"line 4: \[study\] colour: unknown key"),
    (("[quick]", "[extra]\n\n[quick]"), r"line 9: unknown section \[extra\]"),
    (('host_fs = ["xfs"]', 'host_fs = ["xfs", "zfs"]'),
     r"line 7: \[matrix\] host_fs: zfs: no such file system here"),
    (('job = "w.fio"', 'job = "nope.fio"'), r"line 14: \[workload\] job: .*nope.fio: no such fio job file"),
    (('holds = ">= 1"', 'holds = "about 1"'), r"line 21: \[claim\] holds: a comparison"),
    (("rounds = 2", "rounds = 0"), r"line 3: \[study\] rounds: a whole number from 1 to 50"),
    (('name = "w"', 'name = "w"\nkind = "mixed"'), r"line 14: \[workload\] kind: 'mixed': read or write"),
    (('host_fs = ["xfs"]', 'host_fs = ["xfs"]\nmemory = "2M"'),
     r"line 8: \[matrix\] memory: '2M': at least 4M"),
    (("[matrix]", "[matrix\n"), r"line 5: column 8: Expected '\]' at the end of a table "
                                 r"declaration \(not TOML\)$"),
])
def test_each_error_names_the_file_the_line_and_the_key(tmp_path, change, error):
    p = study(tmp_path, GOOD.replace(*change, 1))
    with pytest.raises(StudyError, match=rf"^{p}: {error}"):
        load(p)


NAMED = """\
[study]
name = "n"

[matrix]
baseline = "B"

[[stack]]
name = "A"
net = "sshfs-socat"
gateway = true

[[stack]]
name = "B"
guest_fs = "xfs"

[quick]
stacks = ["A"]

[[workload]]
name = "w"
job = "w.fio"

[[table]]
title = "t"
query = "SELECT 1"
transpose = true
"""


def test_named_stacks_and_tables_read_and_their_errors_name_the_line(tmp_path):
    s = load(study(tmp_path, NAMED))
    assert [(x.name, x.base, x.guest_fs, x.host_fs, x.net, x.gateway) for x in s.stacks()] == [
        ("A", "B", "ext4", "xfs", "sshfs-socat", True), ("B", "B", "xfs", "xfs", "", False)]
    assert (s.tables[0].title, s.tables[0].transpose) == ("t", True)
    assert [x.name for x in load(study(tmp_path, NAMED), quick=True).stacks()] == ["A", "B"]
    for change, error in [
            (('baseline = "B"', 'baseline = "C"'),
             r"line 5: \[matrix\] baseline: 'C': with \[\[stack\]\]s, the name of one"),
            (('net = "sshfs-socat"', 'net = "nfs"'), r"line 9: \[stack\] net: 'nfs': one of"),
            (('name = "B"', 'name = "A"'), r"\[stack\] name: two stacks of one name"),
            (('net = "sshfs-socat"\n', ''), r"line 9: \[stack\] gateway: a gateway is on a "
                                             r"network mount"),
            (('stacks = ["A"]', 'stacks = ["Z"]'), r"line 17: \[quick\] stacks: a list of")]:
        with pytest.raises(StudyError, match=error):
            load(study(tmp_path, NAMED.replace(*change)), quick=True)


@pytest.mark.root
def test_the_nested_fs_study_runs_quick_and_reports_from_its_store(tmp_path, nothing_left):
    store = tmp_path / "s"
    r = run_cli("study", "run", str(REPO / "studies" / "nested-fs.toml"), "--quick", "-o", str(store),
                "--json", check=False, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    names = [w["name"] for w in rep["workloads"]]
    assert len(names) == 8 and rep["captures"] == 16 and rep["failed"] == [] and rep["quick"]
    # each workload on the nested stack and on the baseline, relative to it
    s = nestrace.open(store)
    mib = {r["capture_id"]: r["app_mib_per_s"] for r in s.rows(
        "SELECT capture_id, app_mib_per_s FROM compare_captures")}
    run = json.loads((store / "_study.json").read_text())
    by = {(c["workload"], c["host_fs"]): mib[c["capture_id"]] for c in run["cells"]}
    for w in names:
        rows = {x["host_fs"]: x for x in rep["relative"] if x["workload"] == w}
        assert set(rows) == {"xfs", "none"}, rows
        assert rows["none"]["relative"] == 1.0
        assert rows["xfs"]["relative"] == pytest.approx(by[(w, "xfs")] / by[(w, "none")])
    # every claim checked: a verdict and the number behind it
    verdicts = {c["id"]: c["verdict"] for c in rep["claims"]}
    assert len(verdicts) == 7 and set(verdicts.values()) <= {
        "holds", "does not hold", "not told apart", "no data"}, verdicts
    assert verdicts["host-matters"] == "no data"        # (one host FS in --quick)
    assert all(c["value"] is not None for c in rep["claims"] if c["verdict"] != "no data")
    # rebuilt from the store alone: the same document; the page and the
    # JSON beside the captures, their owner's alone
    again = run_cli("study", "report", str(store), "--json")
    assert json.loads(again.stdout) == rep
    # each stack's queue idle time per level, and its host-disk seek CDF
    stacks = {(w, h) for w in names for h in ("xfs", "none")}
    assert {(x["workload"], x["host_fs"], x["level"]) for x in rep["idle"]} == \
        {(w, h, lv) for w, h in stacks for lv in ("vfs", "vdisk", "disk")}
    assert all(0 <= x["idle"] <= 1 for x in rep["idle"]), rep["idle"]
    assert rep["seek_cdf"] and {(x["workload"], x["host_fs"]) for x in rep["seek_cdf"]} <= stacks
    for x in rep["seek_cdf"]:
        q = x["normalized"]
        assert len(q) == 21 and q == sorted(q) and 0 <= q[0] and q[-1] <= 1, x
    # seed 001's merge potential per stack, workload, block level and
    # class: never fewer requests than a discontiguous transfer would need
    mp = rep["merge_potential"]
    assert {x["class"] for x in mp} <= {"readahead", "writeback"} and mp, mp
    assert {x["level"] for x in mp} <= {"vdisk", "disk"}, mp
    assert all(x["ratio"] >= 1 and x["saved"] >= 0 for x in mp), mp
    # the readahead windows beside the readahead claim: each stack's
    # virtual disk's and host disk's, as the kernel had them
    ra = {r["stack"]: r for r in rep["readahead_kb"]}
    assert set(ra) == {"ext4 on xfs", "ext4 on none"}, ra
    assert all(r[lv] is not None and r[lv] > 0 for r in ra.values() for lv in ("vdisk", "disk")), ra
    text = run_cli("study", "report", str(store)).stdout
    assert "readahead (read_ahead_kb, beside the readahead claims)" in text
    # the readahead at the hypervisor: per read workload and stack, the
    # bytes each disk read per byte the application read
    hyper = {(r["workload"], r["stack"]): r for r in rep["hypervisor_readahead"]}
    reads = {w for w in names if w in ("webserver", "database", "randread-8k", "seqread-8k")}
    assert set(hyper) == {(w, x) for w in reads for x in ("ext4 on xfs", "ext4 on none")}, hyper
    seq = hyper[("seqread-8k", "ext4 on xfs")]
    assert seq["disk_x_app"] > 0 and seq["vdisk_x_app"] > 0 and seq["disk_ra_kb"] > 0, seq
    assert "Readahead at the hypervisor" in text
    page = (store / "study-report.html").read_text()
    # (a heat map per workload, a CDF figure per workload with seeks)
    assert page.count("Plotly.newPlot") == 8 + len({x["workload"] for x in rep["seek_cdf"]}) and \
        "hypervisor-readahead" in page and "Queue idle per level" in page and \
        "Readahead at the hypervisor" in page
    for f in ("study-report.html", "study-report.json", "_study.json"):
        assert stat.S_IMODE(os.stat(store / f).st_mode) == 0o600, f


@pytest.mark.root
def test_the_vm_on_nas_study_prints_the_seeds_tables_and_their_directions(tmp_path,
                                                                          nothing_left):
    """Seed 003 in one command: named stacks (the image on an sshfs mount,
    and the mount itself), the seed's tables of bytes at each level, and
    its claims checked."""
    store = tmp_path / "s"
    r = run_cli("study", "run", str(REPO / "studies" / "vm-on-nas.toml"), "--quick", "-o",
                str(store), "--json", check=False, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["captures"] == 8 and rep["failed"] == [] and rep["named"]
    assert {(x["workload"], x["stack"]) for x in rep["relative"]} == {
        (w, st) for w in ("randread-2k", "seqwrite-2k", "create", "stat")
        for st in ("VM-NAS", "NAS")}
    reads, writes, meta = rep["tables"]
    assert reads["problem"] is None and [row[0] for row in reads["rows"]] == ["VM-NAS", "NAS"]
    got = {row[0]: dict(zip(reads["columns"], row)) for row in reads["rows"]}
    vm, nas = got["VM-NAS"], got["NAS"]
    # the app asked 64 MiB (half the 128 MiB file), held to 16 MiB of
    # memory: the image's virtual disk reads whole pages, and again those
    # the cache let go; the server's file system reads all of that: more
    # than the app asked
    assert vm["app reads MiB"] == nas["app reads MiB"] == 64
    assert vm["file reads MiB"] > vm["app reads MiB"] and vm["block reads MiB"] > 0
    assert nas["virtual disk reads MiB"] is None and vm["virtual disk reads MiB"] > 64
    assert rep["memory"]["limit"] == 16 << 20 and rep["memory"]["hits"] > 0, rep["memory"]
    # 2 KiB writes reach the server as 2 KiB writes into 4 KiB pages it
    # does not hold: it reads each page first, on both stacks
    w = {row[0]: dict(zip(writes["columns"], row)) for row in writes["rows"]}
    for st in ("VM-NAS", "NAS"):
        assert w[st]["file write bytes"] == 2048, w[st]
        assert w[st]["block reads MiB (read-modify-write)"] >= 8, w[st]
    # 500 files made, then 500 stat()ed: through the image, the guest's
    # metadata reaches the server as writes of the image (reads, for the
    # stats: a few blocks of inodes); on the mount itself, as metadata
    # calls, one or more a file
    m = {row[0]: dict(zip(meta["columns"], row)) for row in meta["rows"]}
    assert m["create, VM-NAS"]["client writes"] > 0 and m["create, VM-NAS"]["file writes KiB"] > 0
    assert m["create, NAS"]["client metadata calls"] >= 500, m["create, NAS"]
    assert m["stat, NAS"]["client metadata calls"] >= 500, m["stat, NAS"]
    verdicts = {c["id"]: c for c in rep["claims"]}
    assert verdicts["metadata-becomes-data"]["verdict"] == "holds"
    assert verdicts["nas-metadata-calls"]["verdict"] == "holds"
    assert verdicts["small-reads-double"]["verdict"] == "holds"
    assert verdicts["server-rmw"]["verdict"] == "holds"
    assert verdicts["vm-nas-reads-more"]["value"] is not None
    text = run_cli("study", "report", str(store)).stdout
    assert "Random 2 KB reads (seed 003" in text and "file reads MiB" in text


@pytest.mark.root
def test_the_gateways_study_gives_throughput_and_cpu_per_gib_of_each_transport(tmp_path,
                                                                              nothing_left):
    """Seed 002 in one command: sshfs over ssh and over socat as gateways,
    iozone's patterns, MiB/s and the CPU each side's processes spent."""
    store = tmp_path / "s"
    r = run_cli("study", "run", str(REPO / "studies" / "gateways.toml"), "--quick", "-o",
                str(store), "--json", check=False, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["captures"] == 8 and rep["failed"] == []
    mib, cpu = rep["tables"]
    assert mib["columns"] == ["stack", "write", "read", "random read", "random write"]
    assert [row[0] for row in mib["rows"]] == ["sshfs-socat", "sshfs-ssh"]
    assert all(v > 0 for row in mib["rows"] for v in row[1:]), mib["rows"]
    assert len(cpu["rows"]) == 8 and all(row[3] == pytest.approx(row[1] + row[2])
                                         for row in cpu["rows"]), cpu["rows"]
    # the CPU is the hop's own processes', measured in the capture
    s = nestrace.open(store)
    for m in s.rows("SELECT settings_json FROM capture_meta"):
        got = json.loads(m["settings_json"])["net_cpu"]
        assert "sshfs" in got["client"] and "sftp-server" in got["server"], got
    # (--quick leaves NFS out: this kernel has none)
    assert {c["id"]: c["verdict"] == "no data" for c in rep["claims"]} == {
        "socat-faster": False, "socat-cheaper": False, "socat-beats-nfs": True}


@pytest.mark.root
def test_a_workload_that_fails_is_reported_and_the_study_exits_1(tmp_path, nothing_left):
    p = study(tmp_path, GOOD.replace("[[claim]]", "[[workload]]\nname = \"ok\"\njob = \"ok.fio\"\n\n"
                                     "[[claim]]"))
    (tmp_path / "w.fio").write_text("[w]\nrw=bogus\nsize=1m\n")
    (tmp_path / "ok.fio").write_text("[ok]\ndirectory=${NESTRACE_GUEST}\nrw=write\nsize=1m\n")
    store = tmp_path / "s"
    r = run_cli("study", "run", str(p), "--quick", "-o", str(store), check=False, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stdout.count("failed: round 1 w ext4 on ") == 2, r.stdout
    rep = json.loads(run_cli("study", "report", str(store), "--json").stdout)
    assert rep["captures"] == 2 and {x["workload"] for x in rep["relative"]} == {"ok"}


@pytest.mark.root
def test_ctrl_c_mid_study_keeps_what_ran_and_the_report_covers_it(tmp_path, nothing_left):
    """Ctrl-C (SIGINT to the whole job) while the second workload runs on
    its first stack: that capture is sealed with the workload's exit code
    and named as failed, the stacks not run are said, and the report
    covers the first workload's captures."""
    import signal
    import sys
    import time
    mark = tmp_path / "started"
    p = study(tmp_path, GOOD.replace('prepare = true\n', 'prepare = true\n\n[[workload]]\n'
                                     'name = "slow"\njob = "slow.fio"\n')
              .replace("[quick]", f'[env]\nMARK = "{mark}"\n\n[quick]'))
    (tmp_path / "w.fio").write_text("[w]\ndirectory=${NESTRACE_GUEST}\nrw=write\nsize=1m\n")
    (tmp_path / "slow.fio").write_text("[slow]\ndirectory=${NESTRACE_GUEST}\nrw=write\nsize=1m\n"
                                       "exec_prerun=touch ${MARK}\ntime_based=1\nruntime=60\n")
    store = tmp_path / "s"
    proc = start_job([sys.executable, "-m", "nestrace", "study", "run", str(p), "--quick",
                      "-o", str(store), "--json"], mark, "the slow workload", wait=180)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = job_stopped(proc, 120, "the study")
    assert proc.returncode == 1, err[-3000:]
    assert "interrupted: 1 of 2 stacks not run" in err, err[-3000:]
    rep = json.loads(out)
    assert rep["interrupted"] and rep["captures"] == 2, rep
    assert {x["workload"] for x in rep["relative"]} == {"w"}
    (failed,) = rep["failed"]
    # (fio, stopped by a SIGINT, exits 128)
    assert failed["workload"] == "slow" and failed["command_exit"] not in (0, None), failed
    assert failed["capture_id"] and (store / "_manifests" / f"{failed['capture_id']}.json").exists()
