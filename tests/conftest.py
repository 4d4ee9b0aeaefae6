"""Shared fixtures: lab stacks that are always torn down, fio, the CLI."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NESTRACE = [sys.executable, "-m", "nestrace"]

# Tests live in a folder per area (tests/<area>/test_*.py); a few take
# helpers from another area's tests (the VM test reads images as the image
# tests do), so every area's folder is importable from any of them.
sys.path[1:1] = [str(d) for d in sorted(Path(__file__).parent.iterdir())
                 if d.is_dir() and any(d.glob("test_*.py"))]


def _why_no_root() -> str | None:
    if os.geteuid() != 0:
        return "needs root (BPF programs, loop devices, mounts)"
    if not Path("/sys/kernel/btf/vmlinux").exists():
        return "needs kernel BTF (/sys/kernel/btf/vmlinux)"
    if not (ROOT / "tracers" / "build" / "nestrace-agent").exists():
        return "the agent is not built (make -C tracers; ci/test does it)"
    if not shutil.which("fio"):
        return "needs fio"
    return None


def pytest_collection_modifyitems(config, items):
    why = _why_no_root()
    if why:
        skip = pytest.mark.skip(reason=why)
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


# What this run of the tests owns: its pytest base directory and the labs'
# directories (nestrace.capture.lab's roots, which NESTRACE_LAB_STATE and
# NESTRACE_LAB_DATA move).  The loop devices reading files under them and
# the mounts on them are its own; ci/test runs two runs at once, each with
# roots of its own, and neither counts the other's devices as its leaks.
_OWN_ROOTS: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _own_basetemp(tmp_path_factory):
    _OWN_ROOTS.append(tmp_path_factory.getbasetemp().resolve())


def _owned(path: str) -> bool:
    from nestrace.capture import lab
    p = Path(path.removesuffix(" (deleted)"))
    return any(p.is_relative_to(r) for r in (lab.STATE_ROOT, lab.DATA_ROOT, *_OWN_ROOTS))


def loop_devices() -> set[str]:
    """The attached loop devices (/dev/loopN) that read a file this run owns."""
    out = set()
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            back = f.read_text().rstrip("\n")
        except OSError:         # detached meanwhile
            continue
        if _owned(back):
            out.add(f"/dev/{f.parent.parent.name}")
    return out


def our_mounts() -> set[str]:
    """The mount points under a directory this run owns."""
    return {line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if _owned(line.split()[1].replace("\\040", " "))}


NET_DAEMONS = {"socat", "sshd", "sftp-server", "sshfs", "ssh"}


def net_daemons() -> set[int]:
    """The network hop's processes of this run's labs that are running
    (not zombies: this sandbox's init reaps none), by pid: an sshfs, ssh,
    socat or sshd whose command line or environment names a directory
    this run owns (its mount point, its keys and config, the lab
    directory netlab gives its daemons), and what they started (the
    sftp-servers).  Another run's labs, beside this one, are not its."""
    from nestrace.capture import lab
    roots = [str(r).rstrip("/") + "/" for r in (lab.STATE_ROOT, lab.DATA_ROOT, *_OWN_ROOTS)]
    procs = {}
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit() or \
                    (p / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue
            procs[int(p.name)] = ((p / "comm").read_text().strip(),
                                  int((p / "stat").read_text().rpartition(")")[2].split()[1]),
                                  (p / "cmdline").read_bytes() + (p / "environ").read_bytes())
        except (OSError, IndexError):         # gone meanwhile
            continue
    ours = {pid for pid, (comm, _, text) in procs.items() if comm in NET_DAEMONS and
            any(r.encode() in text for r in roots)}
    grew = True
    while grew:                 # (and their descendants)
        more = {pid for pid, (_, ppid, _) in procs.items() if ppid in ours} - ours
        grew = bool(more)
        ours |= more
    return {pid for pid in ours if procs[pid][0] in NET_DAEMONS}


def prog_ids(pid: int) -> set[int]:
    """The BPF programs a process holds open, by id (their fds' fdinfo)."""
    ids = set()
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            info = fd.read_text()
        except OSError:
            continue
        ids |= {int(m) for m in re.findall(r"^prog_id:\s+(\d+)", info, re.M)}
    return ids


def until_recording(proc: subprocess.Popen) -> None:
    """Read a `nestrace record` run without CMD (text stderr piped) until it
    says it is tracing (workload.RECORDING); an AssertionError with what it
    said if it ends first."""
    from nestrace.capture.workload import RECORDING
    said = []
    for line in proc.stderr:
        if line.rstrip("\n") == RECORDING:
            return
        said.append(line)
    raise AssertionError(f"record did not start tracing: {''.join(said)}")


@contextlib.contextmanager
def host_side_recording(store, image, stop=signal.SIGINT, extra=()):
    """`nestrace record --side host --image IMAGE` (and `extra`) in the
    background while the block runs, stopped by `stop`; the dict it
    yields gets the host side's stdout once it has stopped and sealed."""
    host = subprocess.Popen(NESTRACE + ["record", "-o", str(store), "--side", "host",
                                        "--image", str(image), *extra], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    result: dict[str, str] = {}
    try:
        until_recording(host)
        yield result
    finally:
        host.send_signal(stop)
        try:
            result["stdout"], err = host.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            where = _stuck(host.pid)          # what it waits on, before it is killed
            host.send_signal(signal.SIGUSR1)  # nestrace prints its Python stacks
            time.sleep(1)
            host.kill()
            out, err = host.communicate()
            raise AssertionError(f"the host side did not stop in 120 s after {stop!r}:\n"
                                 f"{where}\nstdout: {out}\nstderr: {err}") from None
    assert host.returncode == 0, err


def _stuck(pid: int) -> str:
    """Each process of the tree under pid: its state, kernel wait channel
    and kernel stack (a test that hangs says where)."""
    lines = []
    todo = [pid]
    while todo:
        p = todo.pop()
        base = Path(f"/proc/{p}")
        try:
            stat = (base / "stat").read_text().split(") ")[-1].split()[0]
            lines.append(f"{p} {(base / 'cmdline').read_text().replace(chr(0), ' ')[:120]} "
                         f"state {stat} wchan {(base / 'wchan').read_text()}")
            lines.append((base / "stack").read_text())
            for t in (base / "task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except OSError as e:
            lines.append(f"{p}: {e}")
    return "\n".join(lines)


def kill_fio_jobs(mount: str) -> None:
    """SIGKILL the fio processes working in `mount` and wait (up to 10 s)
    until they are gone: fio's job processes run in sessions of their own,
    so killing the process group that started fio leaves them."""
    subprocess.run(["pkill", "-KILL", "-f", f"directory={mount}"], check=False)
    for _ in range(100):
        if subprocess.run(["pgrep", "-f", f"directory={mount}"], capture_output=True).returncode:
            break
        time.sleep(0.1)


def run_cli(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(NESTRACE + list(args), capture_output=True, text=True, cwd=ROOT, **kw)
    if check and r.returncode:
        raise AssertionError(f"nestrace {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


class LabHandle:
    def __init__(self, name: str, mount: str):
        self.name, self.mount = name, mount

    def fio(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["fio", "--name=t", f"--directory={self.mount}",
                               "--ioengine=psync", "--output=/dev/null", *args],
                              check=True, capture_output=True, text=True)


@pytest.fixture
def lab_factory():
    """Build labs with `make(guest_fs=..., host_fs=..., **opts)`; every lab
    is torn down afterwards, whatever happened in the test."""
    made: list[str] = []

    def make(guest_fs="ext4", host_fs="xfs", image_size="512M", **opts) -> LabHandle:
        name = f"t{uuid.uuid4().hex[:8]}"
        made.append(name)
        args = ["lab", "up", "--name", name, "--guest-fs", guest_fs, "--host-fs", host_fs,
                "--image-size", image_size]
        for k, v in opts.items():
            flag = f"--{k.replace('_', '-')}"
            args += [flag] if v is True else [flag, str(v)]
        r = run_cli(*args)
        return LabHandle(name, r.stdout.strip())

    before_loops, before_mounts, before_daemons = loop_devices(), our_mounts(), net_daemons()
    try:
        yield make
    finally:
        errors = []
        for name in made:
            r = run_cli("lab", "down", "--name", name, check=False)
            if r.returncode:
                errors.append(r.stderr)
        assert not errors, errors
        assert loop_devices() <= before_loops, "a loop device was left attached"
        assert our_mounts() <= before_mounts, "a mount was left behind"
        assert net_daemons() <= before_daemons, "a network hop's daemon was left running"


def start_job(cmd: list[str], marker: Path, what: str, wait: float = 120) -> subprocess.Popen:
    """`cmd` in its own process group (a terminal's job), returned once
    `marker` exists (its workload started)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + wait
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} never started:\n" + proc.communicate()[1])
        time.sleep(0.1)
    return proc


def job_stopped(proc: subprocess.Popen, within: float, what: str) -> tuple[str, str]:
    """The job's output once it has ended, which must be within `within`
    seconds (killed, and a failure, after 120)."""
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"{what} did not stop") from None
    assert time.monotonic() - t0 < within, err
    return out, err


@pytest.fixture
def nothing_left():
    """No lab stack, loop device or mount left after the test (labs of
    another run, or one a killed run left, are not this test's)."""
    before = (loop_devices(), our_mounts(), run_cli("lab", "list").stdout)
    yield
    assert (loop_devices(), our_mounts(), run_cli("lab", "list").stdout) == before, \
        "a lab stack was left behind"


def journal_unreadable_here(line: str) -> bool:
    """Whether `line` is record's warning that a file system's journal is
    unknown because its device cannot be opened on this machine (this
    sandbox refuses to open its root disk, /dev/vda, even to root): true
    only when opening that device does fail here."""
    m = re.match(r"nestrace: warning: \S+ on (/dev/\S+): where its journal is stays unknown", line)
    if not m:
        return False
    try:
        os.close(os.open(m.group(1), os.O_RDONLY))
    except OSError:
        return True
    return False


def lab_state(lab: LabHandle) -> dict:
    from nestrace.capture.lab import Lab
    return Lab(lab.name).state()


def sync_cmd(lab: LabHandle) -> str:
    """Shell that writes back the lab's own file systems, top down.  Not
    sync(2): beside this run, the other CI run's captures would see every
    one of their file systems commit its journal and flush its disk."""
    from nestrace.capture.lab import stack_paths
    return shlex.join(["sync", "-f", *stack_paths(lab_state(lab))])


def sync_lab(lab: LabHandle) -> None:
    from nestrace.capture.lab import sync_stack
    sync_stack(lab_state(lab))


def drop_caches(lab: LabHandle) -> None:
    """The lab's file systems written back (syncfs), every clean page,
    dentry and inode dropped: the next capture starts cold."""
    from nestrace.capture.matrix import drop_caches as drop
    drop(lab_state(lab))


def requests_without_completion(s, level: str, op: str = "read") -> int:
    """`op` requests at `level` dispatched before the capture's end whose
    completion was never recorded (see assert_losses_counted)."""
    return s.rows("SELECT count(*) AS n FROM block_requests r, capture_meta m WHERE r.level = ? "
                  "AND r.capture_id = m.capture_id AND r.op = ? AND r.c_ns IS NULL "
                  "AND r.d_ns <= m.end_ns", [level, op])[0]["n"]


# An ftrace instance that records every block completion while the tests
# run: the witness that tells a completion the kernel ran no BPF program
# for (README, "Design choices and limits") from one nestrace lost.
# (one per test run: two runs at once must not share, or remove, it)
WITNESS = Path(f"/sys/kernel/tracing/instances/nestrace_tests_{os.getpid()}")
# " comm-tid  (  tgid) [cpu] flags secs.usecs: block_rq_complete: maj,min rwbs () sector + n ..."
WITNESS_LINE = re.compile(r"^\s*(.*)-(\d+)\s+\(\s*([\d-]+)\)\s+\[(\d+)\]\s+\S+\s+(\d+)\.(\d{6}): "
                          r"block_rq_complete: (\d+),(\d+) \S+ \(\S*\) (\d+) \+ \d+")


def _witness(on: bool) -> None:
    enable = WITNESS / "events" / "block" / "block_rq_complete" / "enable"
    if on:
        for old in WITNESS.parent.glob("nestrace_tests_*"):   # of runs that were killed
            if not Path(f"/proc/{old.name.rsplit('_', 1)[1]}").exists():
                (old / "events" / "block" / "block_rq_complete" / "enable").write_text("0\n")
                old.rmdir()
        WITNESS.mkdir()
        (WITNESS / "trace_clock").write_text("mono\n")   # bpf_ktime_get_ns's clock
        (WITNESS / "options" / "record-tgid").write_text("1\n")
        (WITNESS / "buffer_size_kb").write_text("16384\n")
        enable.write_text("1\n")
    elif WITNESS.exists():
        enable.write_text("0\n")
        WITNESS.rmdir()


@pytest.fixture(scope="session")
def completion_witness():
    """The witness instance, made for the first root test and kept for the
    rest of the run (a pytest-xdist worker given none makes none); removed
    after.  Falsy without root."""
    made = []

    def make() -> bool:
        if not made:
            made.append(not _why_no_root() and WITNESS.parent.is_dir())
            if made[0]:
                _witness(True)
        return made[0]

    try:
        yield make
    finally:
        if made and made[0]:
            _witness(False)


@pytest.fixture(autouse=True)
def _witness_cleared(request, completion_witness):
    """Each root test reads only its own completions."""
    if request.node.get_closest_marker("root") and completion_witness():
        (WITNESS / "trace").write_text("")
    yield


@dataclass
class Witnessed:
    """What the witness kept since the test began (or since
    witness_from_now).  seen: (dev_t as nestrace stores it, sector) ->
    [(time ns, "comm-tid", tgid)] of each completion.  It kept every
    completion from kept_from to kept_until: when its buffer is full it
    drops the oldest (overwrite mode: a CPU's records before its oldest
    kept are gone) or the newest (after witness_from_now)."""
    seen: dict[tuple[int, int], list[tuple[int, str, int]]]
    kept_from: int
    kept_until: int
    lost: int


def witnessed_completions() -> Witnessed:
    seen: dict[tuple[int, int], list[tuple[int, str, int]]] = {}
    oldest: dict[int, int] = {}
    newest: dict[int, int] = {}
    # (errors="replace": a task's comm is bytes, not UTF-8)
    for line in (WITNESS / "trace").read_text(errors="replace").splitlines():
        m = WITNESS_LINE.match(line)
        if m:
            tgid = int(m[3]) if m[3].isdigit() else -1
            t = int(m[5]) * 10**9 + int(m[6]) * 1000
            oldest.setdefault(int(m[4]), t)
            newest[int(m[4])] = t
            seen.setdefault(((int(m[7]) << 20) | int(m[8]), int(m[9])), []).append(
                (t, f"{m[1].strip()}-{m[2]}", tgid))
    kept_from, kept_until, lost = 0, 1 << 64, 0
    for f in (WITNESS / "per_cpu").glob("cpu*/stats"):
        cpu = int(f.parent.name[3:])
        stats = dict(line.split(":", 1) for line in f.read_text().splitlines() if ":" in line)
        overrun, dropped = int(stats["overrun"]), int(stats["dropped events"])
        if overrun:
            kept_from = max(kept_from, oldest.get(cpu, 1 << 64))
        if dropped:
            kept_until = min(kept_until, newest.get(cpu, 0))
        lost += overrun + dropped
    return Witnessed(seen, kept_from, kept_until, lost)


@contextlib.contextmanager
def witness_from_now():
    """The witness keeps the completions from now on, and drops the
    newest when full (not the oldest): for a test that looks at the
    first moments of a capture, under a load that would fill it."""
    (WITNESS / "options" / "overwrite").write_text("0\n")
    (WITNESS / "trace").write_text("")
    try:
        yield
    finally:
        (WITNESS / "options" / "overwrite").write_text("1\n")


def why_no_completion(rows, end_ns: int, ends_attached_ns: int = 0) -> list[str]:
    """For each block request without a completion record (dev, sector,
    d_ns), what the witness saw: its first completion at (dev, sector)
    after the dispatch (ftrace prints microseconds, hence the slack).
    ends_attached_ns: the agent's completion program was attached from
    then (settings_json); a completion before it is the agent's loss.
    A request dispatched before the witness's oldest record kept, or
    after its newest (plus 10 ms) has no witness: another completion at
    its sector would pass for its own."""
    w = witnessed_completions()
    why = []
    for r in rows:
        after = sorted(c for c in w.seen.get((r["dev"], r["sector"]), []) if c[0] > r["d_ns"] - 1000)
        if not w.kept_from <= r["d_ns"] <= w.kept_until - 10_000_000:
            why.append(f"no witness: dispatched outside the time its records kept cover "
                       f"(it lost {w.lost})")
        elif not after:
            why.append(f"no completion in ftrace either (witness lost: {w.lost})")
        elif after[0][0] + 1000 < ends_attached_ns:
            why.append("completed before the completion program was attached: "
                       "a loss of nestrace's")
        elif after[0][0] > end_ns:
            why.append("completed after the capture's end")
        elif after[0][2] == 1:
            why.append("completed in PID 1's context")
        else:
            why.append(f"completed in {after[0][1]} (tgid {after[0][2]}): a loss of nestrace's")
    return why


def losses_in_bursts(times: list[int], gap_ns: int = 2_000_000) -> list[tuple[int, int, int]]:
    """Times (ns) grouped where they follow one another within gap_ns:
    (first, last, how many) of each group, in time order."""
    out: list[list[int]] = []
    for t in sorted(times):
        if out and t - out[-1][1] <= gap_ns:
            out[-1][1] = t
            out[-1][2] += 1
        else:
            out.append([t, t, 1])
    return [tuple(b) for b in out]


def unexplained(why: str) -> bool:
    """A why_no_completion answer that does not clear nestrace."""
    return why.endswith("nestrace's") or why.startswith("no ")


def assert_in_few_short_bursts(bad: list, n: int, total: int, capture_ns: int) -> None:
    """bad: (request, why) of the requests without a C the witness does
    not explain, of n without a C, of total requests.  They must fall in
    a few short bursts: at most one per thousand requests (two at
    least), covering at most a twentieth of the capture's capture_ns."""
    bursts = losses_in_bursts([r["d_ns"] for r, _ in bad])
    covered = sum(last - first for first, last, _ in bursts)
    assert len(bursts) <= max(2, total // 1000) and covered <= capture_ns // 20, \
        (f"{len(bad)} of {n} requests without a C unexplained (of {total}), in "
         f"{len(bursts)} bursts over {covered / 1e6:.1f} ms: {bad[:5]}")


def assert_losses_counted(s, output: str | None = None, capture_id: str | None = None) -> int:
    """Nothing lost in the ring buffer, the stream or to recursion, and
    every block request without a completion record counted in
    capture_meta (completions_missed, or requests_unfinished at the end),
    the missed ones in lost_total and in `output`'s "lost events".  On this
    machine the kernel now and then runs no BPF program for a
    block_rq_complete hit in the context of its init (PID 1) and counts no
    miss (README, "Design choices and limits"); in bursts when PID 1 is
    busy.  So for a capture of this machine's kernel the witness must show
    each request without a C completed in PID 1's context, or after the
    capture's end, but for one in a thousand requests; for another
    kernel's (a VM guest's), they must be few.
    Returns how many there were.
    capture_id: that capture of a store of several (else the only one)."""
    if capture_id is None:
        (capture_id,) = [r["capture_id"] for r in s.rows("SELECT capture_id FROM capture_meta")]
    lost = s.rows("SELECT coalesce(sum(ringbuf_drops), 0) AS drops, "
                  "coalesce(sum(seq_gaps), 0) AS gaps FROM lost_events WHERE capture_id = ?",
                  [capture_id])[0]
    assert lost == {"drops": 0, "gaps": 0}, lost
    (m,) = s.rows("SELECT lost_total, hook_misses, completions_missed AS missed, "
                  "requests_unfinished AS unfinished, start_ns, end_ns, kernel, machine, "
                  "hook_misses_json FROM capture_meta WHERE capture_id = ?", [capture_id])
    here = (m["kernel"], m["machine"]) == (os.uname().release, os.uname().nodename)
    # (a guest under TCG runs each program ~50 times slower: an interrupt's
    # hit, a virtio disk's completion, lands more often while the same
    # program runs on that CPU for a loop device's, and the kernel counts
    # it a miss; one CI run had 2.  Counted, and few, there)
    assert (m["hook_misses"] == 0 if here else m["hook_misses"] <= 5) and \
        m["lost_total"] == m["missed"] + m["hook_misses"], m
    # (a dispatch the driver gave back, requeued to be dispatched again,
    # has no C of its own: virtio-blk does so when its queue is full)
    # (--per-request: a requeue's own row; those in flight at the end, a row
    # of action unfinished, counted in requests_in_flight too)
    rows = s.rows("SELECT r.dev, r.sector, r.d_ns FROM block_requests r, capture_meta m "
                  "WHERE r.capture_id = m.capture_id AND m.capture_id = ? AND r.c_ns IS NULL "
                  "AND r.d_ns BETWEEN m.start_ns AND m.end_ns AND NOT EXISTS ("
                  "  SELECT 1 FROM (SELECT capture_id, dev, rq_id, action, ts_ns FROM block_events "
                  "    UNION ALL SELECT capture_id, dev, rq_id, action, ts_ns "
                  "    FROM block_request_records) e WHERE e.capture_id = r.capture_id "
                  "  AND e.dev = r.dev AND e.rq_id = r.rq_id AND e.action = 10 "
                  "  AND e.ts_ns BETWEEN r.d_ns AND coalesce(r.done_by_ns, m.end_ns)) "
                  "ORDER BY r.d_ns", [capture_id])
    settings = json.loads(s.rows("SELECT settings_json FROM capture_meta WHERE capture_id = ?",
                                 [capture_id])[0]["settings_json"] or "{}")
    total = s.rows("SELECT count(*) AS n FROM block_requests WHERE capture_id = ?",
                   [capture_id])[0]["n"]
    n = len(rows)
    if settings.get("block_records") == "completions":
        # (--from-completions: a request whose completion no program saw has
        # no row, only the kernel's counts: the dispatches in the capture
        # against the ends seen; a requeue's row ends its dispatch)
        assert m["missed"] == settings["requests_dispatched"] - settings["requests_ended"] \
            and m["unfinished"] == 0, (settings, m)
        # (this kernel's bursts, below, at most a twentieth of the requests)
        assert m["missed"] <= max(2, total // 20), (settings, m, total)
        if output is not None:
            assert f"lost events: {m['missed']}" in output, output
        return m["missed"]
    assert n == m["missed"] + m["unfinished"], (n, m)
    if here and WITNESS.is_dir():
        why = why_no_completion(rows, m["end_ns"])
        bad = [(r, w) for r, w in zip(rows, why) if unexplained(w)]
        # Rarely a burst is lost in another task's context too, with no
        # drop, gap or recursion miss counted (README: 4 of 8 in idle and
        # fio context in one 1 s capture of a QD16 job, 32 of 32 in
        # another; 618 in two bursts, one of every completion for 7.5 ms).
        # The programs stay attached with the same filter all along, and a
        # record lost on its way leaves a sequence gap (none, above), so a
        # nestrace bug would lose a class of completions all through the
        # capture, not all of them for a few ms: the unexplained ones must
        # fall in a few short bursts (a gap of over 2 ms between two starts
        # a new one), at most one burst per thousand requests, covering at
        # most a twentieth of the capture.
        assert_in_few_short_bursts(bad, n, total, m["end_ns"] - m["start_ns"])
    else:
        assert n <= max(2, total // 100), f"{n} of {total} block requests without a completion"
    if output is not None:
        assert f"lost events: {m['missed']}" in output, output
    return n
