"""One workload on every stack of a guest FS x host FS matrix.

`nestrace lab run` builds each lab stack in turn, records the workload on
it into one store (a capture per stack), tears the stack down, and prints
the captures side by side (the `compare_captures` view): the experiment of
the nested-file-systems study, with every level traced.
"""
from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from nestrace.capture.lab import FILESYSTEMS, Lab, LabConfig, LabError, sync_stack

if TYPE_CHECKING:
    from nestrace.capture.record import Capture


@dataclass
class Cell:
    """One stack of the matrix and what became of it."""
    config: LabConfig
    capture_id: str | None = None
    command_rc: int | None = None
    lost: int = 0
    error: str | None = None

    @property
    def label(self) -> str:
        c = self.config
        on = (f"{c.net} gateway to {c.host_fs}" if c.gateway else
              f"{c.guest_fs} on {c.net + ' to ' if c.net else ''}{c.host_fs}")
        return (f"{on} (guest-dio {'on' if c.guest_dio else 'off'}, "
                f"host-dio {'on' if c.host_dio else 'off'})")

    @property
    def failed(self) -> bool:
        return self.error is not None or bool(self.command_rc)


def parse_list(value: str, choices: tuple[str, ...], option: str) -> list[str]:
    """'ext4,xfs' -> ['ext4', 'xfs']; 'all' -> every choice."""
    items = list(choices) if value.strip() == "all" else [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in choices]
    if bad or not items:
        raise LabError(f"{option} {value!r}: choose from {', '.join(choices)} (comma-separated, or all)")
    return list(dict.fromkeys(items))


def cells(guest_fs: list[str], host_fs: list[str], guest_dio: list[bool], host_dio: list[bool],
          base: LabConfig, repeat: int = 1) -> list[Cell]:
    """Every combination, `repeat` rounds of it (round after round, so a
    machine's drift falls on every stack alike)."""
    combos = list(itertools.product(guest_fs, host_fs, guest_dio, host_dio))
    return [Cell(replace(base, guest_fs=g, host_fs=h, guest_dio=gd, host_dio=hd))
            for _ in range(repeat) for g, h, gd, hd in combos]


def workload_env(cfg: LabConfig, mount: str) -> dict[str, str]:
    """What the workload is told about its stack (besides its cwd, the guest mount)."""
    return os.environ | {"NESTRACE_GUEST": mount, "NESTRACE_GUEST_FS": cfg.guest_fs,
                         "NESTRACE_HOST_FS": cfg.host_fs,
                         "NESTRACE_GUEST_DIO": "on" if cfg.guest_dio else "off",
                         "NESTRACE_HOST_DIO": "on" if cfg.host_dio else "off"}


def run_cell(store: str | os.PathLike, cell: Cell, command: list[str], *, lab_name: str,
             prepare: str | None = None, log=lambda msg: print(msg, file=sys.stderr),
             stopped=lambda: False, env: dict[str, str] | None = None, **record_opts) -> Cell:
    """Build the cell's stack, run `prepare` on it untraced, drop the
    caches, record `command` (cwd: the guest mount; `{guest}` in an
    argument of `command`, or in `prepare`, is replaced by it, shell-quoted
    in `prepare`), tear the stack down, also on failure.  When `stopped()`
    turns true (Ctrl-C) before the capture starts, the cell is not recorded.
    `env`: more variables for `prepare` and `command`."""
    from nestrace.capture.record import RecordError, record
    from nestrace.capture.stack import StackError, discover
    from nestrace.capture.workload import run_workload
    lab = Lab(lab_name)
    try:
        st = lab.up(cell.config)
    except LabError as e:
        cell.error = str(e)
        return cell
    try:
        mount = st["guest_mount"]
        env = workload_env(cell.config, mount) | (env or {})
        if prepare and not stopped():
            rc = run_workload(["sh", "-c", prepare.replace("{guest}", shlex.quote(mount))],
                               cwd=mount, env=env)
            if rc:
                cell.error = f"--prepare exited with code {rc}"
                return cell
        if stopped():
            cell.error = "interrupted"
            return cell
        drop_caches(st)
        cmd = [a.replace("{guest}", mount) for a in command]
        try:
            # (and again once record has read the stack's facts: reading
            # each guest file's extents brings its inode into the cache,
            # which a workload that stat()s them would then not read)
            cap = record(store, discover(mount), command=cmd, cwd=mount, env=env, log=log,
                         before_tracing=lambda: drop_caches(st), **record_opts)
        except (RecordError, StackError) as e:
            cell.error = str(e)
            return cell
        cell.capture_id, cell.command_rc = cap.capture_id, cap.command_rc
        cell.lost = cap.seal.lost_total if cap.seal else 0
        return cell
    finally:
        lab.down()


def run_matrix(store: str | os.PathLike, todo: list[Cell], command: list[str], *,
               prepare: str | None = None, log=lambda msg: print(msg, file=sys.stderr),
               **record_opts) -> list[Cell]:
    """Run `command` on every cell's stack, one after another, into `store`.
    A cell that fails (its stack cannot be built, `prepare` or the capture
    fails, the workload exits non-zero) is reported and the run goes on;
    Ctrl-C or SIGTERM stops it after tearing the current stack down.
    The handler only notes the signal: an exception raised at any point
    (inside losetup's wait, say, between its attaching a device and the
    lab's noting it) could leave a device or a lock behind.  The signal
    still reaches what runs: the terminal's Ctrl-C stops the workload
    and the agent, and record passes SIGTERM on to the workload."""
    from nestrace.capture.workload import handling
    name = f"run-{os.getpid()}"
    if Lab(name).state().get("made"):
        raise LabError(f"lab {name!r} is up: nestrace lab down --name {name}")
    interrupted: list[int] = []

    def on_interrupt(signum, frame):
        interrupted.append(signum)

    done: list[Cell] = []
    with handling(signal.SIGINT, on_interrupt), handling(signal.SIGTERM, on_interrupt):
        for i, cell in enumerate(todo, 1):
            log(f"nestrace: [{i}/{len(todo)}] {cell.label}")
            run_cell(store, cell, command, lab_name=name, prepare=prepare, log=log,
                     stopped=lambda: bool(interrupted), **record_opts)
            done.append(cell)
            if cell.error:
                log(f"nestrace: [{i}/{len(todo)}] failed: {cell.error}")
            elif cell.command_rc:
                log(f"nestrace: [{i}/{len(todo)}] the workload exited with code {cell.command_rc}")
            if interrupted:
                log(f"nestrace: interrupted: {len(todo) - i} of {len(todo)} stacks not run")
                break
    return done


# ---- one fio job on a lab stack, and a cold start ---------------------------

def drop_caches(st: dict) -> None:
    """Write back the lab stack `st` (lab state) and drop the clean page
    cache, dentries and inodes, so a recording starts cold.  Only the
    stack's own file systems are synced (syncfs, see sync_stack): the drop
    is machine-wide, but writes nothing."""
    sync_stack(st)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def record_lab(store: str | os.PathLike, fio_args: list[str], *, guest_fs: str = "ext4",
               host_fs: str = "xfs", layout_mib: int = 64, name: str = "notebook",
               **lab_opts) -> Capture:
    """Build a lab stack, lay out a file, record one fio job on it, tear the
    stack down (also on failure).  For notebooks and quick experiments."""
    from nestrace.capture.record import record
    lab = Lab(name)
    if lab.state().get("made"):
        lab.down()
    cfg = LabConfig(guest_fs=guest_fs, host_fs=host_fs, name=name, **lab_opts)
    st = lab.up(cfg)
    try:
        mp = st["guest_mount"]
        job = ["fio", "--name=nb", f"--directory={mp}", "--ioengine=psync", "--output=/dev/null",
               f"--size={layout_mib}M"]
        subprocess.run(job + ["--rw=write", "--bs=1M", "--direct=1"], check=True)
        drop_caches(st)
        from nestrace.capture.stack import discover
        return record(store, discover(mp), command=job + list(fio_args))
    finally:
        lab.down()


# ---- the side-by-side table -------------------------------------------------

def compare(session, capture_ids: list[str] | None = None) -> pa.Table:
    """compare_captures rows, in capture order (all, or those given)."""
    if capture_ids is None:
        return session.compare_captures()
    if not capture_ids:
        return session.query("SELECT * FROM compare_captures LIMIT 0")
    return session.query("SELECT * FROM compare_captures WHERE list_contains(?, capture_id) "
                         "ORDER BY capture_id", [capture_ids])


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1000:.1f}"


def _onoff(v) -> str:
    return "-" if v is None else ("on" if v else "off")


COLUMNS = (  # header, what (rendered under the table)
    ("capture", "capture id"),
    ("stack", "guest FS / host FS"),
    ("dio", "O_DIRECT of the virtual disk / of the host disk"),
    ("exit", "the workload's exit status"),
    ("MiB/s", "application MiB per second of its reads and writes (first entered to last done)"),
    ("p50 us", "median application read/write latency"),
    ("p99 us", "its 99th percentile"),
    ("R x", "host-disk bytes read per application byte read"),
    ("W x", "host-disk bytes written per application byte written"),
    ("vd seq", "share of sequential virtual-disk requests"),
    ("d seq", "share of sequential host-disk requests"),
    ("Q2C us", "median host-disk Q2C"),
    ("vd QD", "virtual-disk requests in flight on average (iostat aqu-sz)"),
    ("d QD", "host-disk requests in flight on average"),
    ("lost", "events lost"),
)


def _print_table(title: str, columns, cells, console=None, left: int = 2) -> None:
    """A rich table of `cells` (rows of strings) under `columns` (header,
    what), the first `left` left-aligned, and what each column after them
    means under it."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    con = console or Console()
    if console is None and not con.is_terminal:
        con = Console(width=200)     # a pipe or a file: no 80-column squeeze
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, (col, _) in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right", overflow="fold")
    for row in cells:
        t.add_row(*row)
    con.print(t)
    con.print("; ".join(f"{c}: {what}" for c, what in columns[left:]), style="dim")


def _stack(r: dict) -> list[str]:
    """guest FS / host FS and the two dio modes; "-" for a capture of
    neither (an imported block trace)."""
    if not (r["guest_fs"] or r["host_fs"]):
        return ["-", "-"]
    return [f"{r['guest_fs'] or '-'}/{r['host_fs'] or '-'}",
            f"{_onoff(r['guest_dio'])}/{_onoff(r['host_dio'])}"]


def render(rows: pa.Table, console=None) -> None:
    _print_table("Captures side by side (compare_captures)", COLUMNS, [
        [r["capture_id"]] + _stack(r) + [_num(r["command_exit"], "d"), _num(r["app_mib_per_s"], ".1f"),
                     _us(r["app_median_ns"]), _us(r["app_p99_ns"]),
                     _num(r["disk_read_x_app"], ".2f"), _num(r["disk_write_x_app"], ".2f"),
                     _num(r["vdisk_sequential"], ".2f"), _num(r["disk_sequential"], ".2f"),
                     _us(r["disk_q2c_median_ns"]), _num(r["vdisk_in_flight"], ".1f"),
                     _num(r["disk_in_flight"], ".1f"), _num(r["lost_total"], "d")]
        for r in rows.to_pylist()], console, left=3)


STACK_COLUMNS = (  # header, what (rendered under the table)
    ("stack", "guest FS / host FS"),
    ("dio", "O_DIRECT of the virtual disk / of the host disk"),
    ("rounds", "rounds whose workload exited 0 (+ failed ones, left out of every number)"),
    ("MiB/s", "median application MiB/s over the rounds"),
    ("min-max", "the lowest and highest round"),
    ("p50 us", "median over the rounds of the median application latency"),
    ("p99 us", "the same of its 99th percentile"),
    ("R x", "median host-disk bytes read per application byte read"),
    ("W x", "median host-disk bytes written per application byte written"),
    ("d seq", "median share of sequential host-disk requests"),
    ("lost", "events lost over the stack's rounds"),
)


def render_stacks(rows: pa.Table, console=None) -> None:
    """compare_stacks as a table: each stack's rounds in one row."""
    _print_table("Stacks over their rounds (compare_stacks)", STACK_COLUMNS, [
        _stack(r) + [str(r["rounds"]) + (f" (+{r['failed_rounds']} failed)"
                                         if r["failed_rounds"] else ""),
                     _num(r["app_mib_per_s"], ".1f"),
                     f"{_num(r['app_mib_per_s_min'], '.1f')}-{_num(r['app_mib_per_s_max'], '.1f')}",
                     _us(r["app_median_ns"]), _us(r["app_p99_ns"]),
                     _num(r["disk_read_x_app"], ".2f"), _num(r["disk_write_x_app"], ".2f"),
                     _num(r["disk_sequential"], ".2f"), _num(r["lost_total"], "d")]
        for r in rows.to_pylist()], console)


__all__ = ["Cell", "FILESYSTEMS", "cells", "compare", "parse_list", "render", "render_stacks",
           "run_cell", "run_matrix"]
