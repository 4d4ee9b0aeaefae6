"""nestrace command line: a thin wrapper over the library.

Every error the user can cause ends as one line `nestrace: error: ...` and
exit code 2, with nothing left mounted or attached.
"""
from __future__ import annotations

import csv
import json
import os
import stat
import sys
from pathlib import Path

import click

from nestrace.cli.common import (
    LEVEL_NAMES,
    UserError,
    cli,
    group_option,
    memory_limit_option,
    output_file,
    report_capture,
    share_store,
    store_with_captures,
    user_errors,
)
from nestrace.errors import StoreError

# ---- record / seal ----------------------------------------------------------


def kdev_arg(spec: str, option: str = "--vdisk") -> int:
    """A device as the kernel's dev_t (major << 20 | minor): MAJ:MIN or a
    block device path."""
    if ":" in spec and not spec.startswith("/"):
        try:
            major, minor = (int(x) for x in spec.split(":"))
        except ValueError:
            raise UserError(f"{option} {spec}: not MAJ:MIN") from None
        if not (0 <= major < 1 << 12 and 0 <= minor < 1 << 20):
            raise UserError(f"{option} {spec}: no such device number (major < 4096, "
                            "minor < 1048576)")
        return (major << 20) | minor
    try:
        st = os.stat(spec)
    except OSError as e:
        raise UserError(f"{option} {spec}: {e.strerror} (give a block device, or MAJ:MIN "
                        "for a device not on this machine)") from None
    if not stat.S_ISBLK(st.st_mode):
        raise UserError(f"{option} {spec}: not a block device (give MAJ:MIN for a device not "
                        "on this machine)")
    return (os.major(st.st_rdev) << 20) | os.minor(st.st_rdev)


@cli.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Store directory (created, or an existing store).")
@click.option("--vdisk", "vdisks", multiple=True, metavar="DEV",
              help="A device at the virtual-disk level (MAJ:MIN or /dev path); the others are disk.")
@click.option("--capture-id", default=None, help="Default: blktrace-<first file name>.")
@click.option("--machine", default="", help="Machine the trace was recorded on.")
@group_option
@user_errors
def import_cmd(files, output, vdisks, capture_id, machine) -> None:
    """Import block traces as a capture of block events: blktrace binary
    files (blktrace's DEV.blktrace.N, or the ftrace blk tracer's trace_pipe
    in bin mode), or one trace-cmd trace.dat (versions 6 and 7) with the
    block tracepoints in it.  block_requests, phases, seeks, sizes and the
    report work on it.  Or one directory the agent wrote alone in a guest
    (`nestrace-agent --guest MOUNT --guest-capture DIR -- CMD`): a guest
    capture like `record --side guest` makes, for `merge`."""
    from nestrace.importers.blkimport import import_files
    from nestrace.importers.datimport import import_file
    from nestrace.importers.guestdir import (
        GuestDirError,
        import_guest_dir,
        is_guest_dir,
    )
    from nestrace.importers.tracecmd import TraceCmdError, is_dat
    if any(is_guest_dir(f) for f in files):
        if len(files) > 1:
            raise UserError(f"{next(f for f in files if is_guest_dir(f))} is a guest capture "
                            "directory: import it on its own")
        if vdisks or machine:
            raise UserError("--vdisk and --machine are for block traces: a guest capture "
                            "directory names its disk and machine itself")
        share_store(output)
        try:
            r = import_guest_dir(files[0], output, capture_id)
        except GuestDirError as e:
            raise UserError(str(e)) from None
        for p in r.problems:
            click.secho(f"nestrace: warning: {p}", err=True, fg="red", bold=True)
        report_capture(Path(output), r.capture_id, r.seal)
        return
    for f in files:
        if not Path(f).exists():
            raise UserError(f"{f}: no such file")
        if not Path(f).is_file():
            raise UserError(f"{f}: not a regular file, nor a guest capture directory "
                            "(no guest.json)")
    share_store(output)
    levels = {kdev_arg(v): "vdisk" for v in vdisks}
    dat = [f for f in files if is_dat(f)]
    if dat and len(files) > 1:
        raise UserError(f"{dat[0]} is a trace-cmd file: import it on its own")
    source = "tracecmd" if dat else "blktrace"
    cid = capture_id or f"{source}-" + Path(files[0]).name.split(".")[0]
    try:
        r = import_file(dat[0], output, levels, cid, machine) if dat else \
            import_files(list(files), output, levels, cid, machine)
    except TraceCmdError as e:
        raise UserError(str(e)) from None
    for p in r["problems"]:
        click.secho(f"nestrace: warning: {p}", err=True, fg="red", bold=True)
    if r.get("read", "streamed") != "streamed":     # (blktrace files held whole: said why)
        click.echo(f"note: read whole, not streamed ({r['read'].removeprefix('whole: ')}): "
                   "its memory grows with the files", err=True)
    skipped = ", ".join(f"{n} {a}" for a, n in sorted(r["not_imported"].items()))
    click.echo(f"capture {cid}: {r['block_events']} block events of {r['records']} records "
               f"({', '.join(f'{d}={lv}' for d, lv in r['devices'].items())})"
               + (f"; not request events, left out: {skipped}" if skipped else ""))
    if dat:
        if r["lost"]:
            click.secho(f"nestrace: warning: the kernel lost {r['lost']} events while tracing "
                        "(ring buffer overruns and drops, per CPU in lost_events)",
                        err=True, fg="red", bold=True)
    elif r["lost"] and r["sequence_numbers"]:
        click.secho(f"nestrace: warning: {r['lost']} records missing by blktrace's sequence numbers",
                    err=True, fg="red", bold=True)
    elif r["lost"]:
        click.secho(f"nestrace: warning: at least {r['lost']} records lost, as said above "
                    "(in lost_total); without sequence numbers (the ftrace blk tracer writes "
                    "none) no other loss can be counted", err=True, fg="red", bold=True)
    elif not r["sequence_numbers"]:
        click.echo("note: the records carry no sequence numbers (the ftrace blk tracer's do not): "
                   "losses cannot be counted", err=True)


@cli.command("merge")
@click.argument("guest_store", type=click.Path())
@click.argument("host_store", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Store directory for the merged capture (created, or an existing store).")
@click.option("--guest-capture", default=None, help="Capture id in GUEST_STORE (if it has several).")
@click.option("--host-capture", default=None, help="Capture id in HOST_STORE (if it has several).")
@click.option("--image-offset", type=int, default=0, show_default=True,
              help="Byte offset of the virtual disk's first sector in the image file (raw: 0).")
@click.option("--offset-ns", type=int, default=None,
              help="Host clock minus guest clock, if known; default: estimated from the I/Os.")
@group_option
@user_errors
def merge_cmd(guest_store, host_store, output, guest_capture, host_capture, image_offset,
              offset_ns) -> None:
    """Merge a guest capture (record --side guest) and a host capture
    (record --side host) of one VM into one four-level capture, with the
    host's times moved onto the guest's clock by an estimated offset."""
    share_store(output)
    from nestrace.importers.merge import MergeError, merge
    try:
        r = merge(guest_store, host_store, output, guest_capture=guest_capture,
                  host_capture=host_capture, image_offset=image_offset, offset_ns=offset_ns)
    except MergeError as e:
        raise UserError(str(e)) from None
    if r.offset:
        click.echo(f"clock: {r.offset.describe()}")
    else:
        click.echo(f"clock: host clock - guest clock = {r.offset_ns} ns (given)")
    for old, new in r.remapped.items():
        click.echo(f"host device {old >> 20}:{old & 0xFFFFF} is {new >> 20}:{new & 0xFFFFF} in the "
                   "merged capture (the guest has a device of that number)")
    if r.before_guest:
        n = ", ".join(f"{v} {k}" for k, v in sorted(r.before_guest.items()))
        click.echo(f"left out host events from before the guest's clock started (before the VM "
                   f"booted; the host store keeps them): {n}")
    click.echo(f"capture {r.capture_id}: {r.records} records -> {output}")


@cli.command("export")
@click.argument("store", type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(), help="FILE.json")
@click.option("--capture", default=None, help="Capture id (default: the latest).")
@click.option("--window", default=None, metavar="FROM:TO",
              help="Only I/Os in this span, seconds from the capture's start (e.g. 2:2.5).")
@user_errors
def export_cmd(store, output, capture, window) -> None:
    """A Chrome/Perfetto JSON timeline: a process per level, a slice per I/O,
    a flow arrow per cross-level link (open in ui.perfetto.dev)."""
    from nestrace.report.export import ExportError, export
    output_file(output)
    span = None
    if window:
        try:
            a, b = (float(x) for x in window.split(":"))
        except ValueError:
            raise UserError(f"--window {window!r}: not FROM:TO in seconds") from None
        if b <= a:
            raise UserError(f"--window {window!r}: TO must be after FROM")
        span = (a, b)
    store_with_captures(store)
    try:
        info = export(store, output, capture, span)
    except ExportError as e:
        raise UserError(f"{store}: {e}") from None
    click.echo(f"{output}: {info['slices']} I/Os, {info['flows']} links, {info['counters']} "
               f"in-flight counter values (capture {info['capture_id']})")


@cli.command("verify")
@click.argument("store", type=click.Path())
@user_errors
def verify_cmd(store) -> None:
    """Read back every Parquet file of STORE, checking page checksums: a
    damaged file is named with the byte range, row group and column."""
    from nestrace.store.manifest import audit
    from nestrace.store.seal import verify
    files, unsealed = verify(store)
    bad = [f for f in files if f.problem]
    for f in bad:
        click.secho(f"damaged: {f.problem}", fg="red", bold=True)
    sums = audit(Path(store))
    for _, line in sums:
        click.secho(f"damaged: {line}", fg="red", bold=True)
    crc = sum(1 for f in files if f.checksummed and not f.problem)
    plain = [f for f in files if not f.checksummed and not f.problem]
    click.echo(f"{len(files)} files, {sum(f.rows for f in files)} rows: {crc} with page checksums "
               f"verified, {len(plain)} read back without checksums"
               + (f" (written by DuckDB or an older nestrace: {', '.join(sorted({f.path.parent.parent.name for f in plain}))})"
                  if plain else ""))
    for cid in unsealed:
        click.echo(f"capture {cid} is not sealed: nestrace seal {store}")
    if bad or sums:
        n = len({f.path for f in bad} | {f for f, _ in sums})
        raise UserError(f"{store}: {n} damaged file{'s' if n > 1 else ''}")


@cli.command("seal")
@click.argument("store", type=click.Path())
@user_errors
def seal_cmd(store) -> None:
    """Seal captures left unsealed by a crash into Parquet."""
    from nestrace.store.files import check_store, live_captures, recorder_of
    from nestrace.store.seal import seal
    p = check_store(store)
    pending = live_captures(p)
    if not pending:
        click.echo(f"{p}: nothing to seal")
    for cid in pending:
        pid = recorder_of(p, cid)
        if pid is not None:
            click.echo(f"capture {cid} is being recorded (nestrace pid {pid}): left to it")
            continue
        r = seal(p, cid)
        report_capture(p, cid, r)


# ---- query ------------------------------------------------------------------

@cli.command("sql")
@click.argument("store", type=click.Path())
@click.argument("query", required=False)
@click.option("--csv", "as_csv", is_flag=True, help="CSV output.")
@click.option("--json", "as_json", is_flag=True, help="JSON output (one array of objects).")
@user_errors(detail=True)
def sql_cmd(store, query, as_csv, as_json) -> None:
    """Run QUERY on STORE, or open an interactive DuckDB shell on it."""
    from nestrace.cli import shell
    from nestrace.query.session import Session
    if as_csv and as_json:
        raise UserError("--csv and --json: give one")
    s = Session(store)
    if not query:
        if shell.run(s) and not sys.stdin.isatty():
            sys.exit(1)     # (piped: a statement failed, as DuckDB's shell says)
        return
    cur = s.execute(query)
    if cur.description is not None:
        shell.print_rows(cur, "json" if as_json else "csv" if as_csv else "table")


@cli.command("report")
@click.argument("store", type=click.Path())
@click.option("--capture", default=None, help="Capture id (default: the newest).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (keys: docs/reference/report.md).")
@memory_limit_option
@user_errors
def report_cmd(store, capture, as_json, memory_limit) -> None:
    """Per-level and cross-level report: sizes, seeks, phases, amplification,
    attribution, read-modify-write, readahead, sync, lost events."""
    from nestrace.query.session import Session
    from nestrace.report.document import build
    from nestrace.report.terminal import render
    # (the report uses no late module: on a store not yet correlated,
    # binding follow_io would plan links once more for nothing)
    with Session(store_with_captures(store), memory_limit=memory_limit, late_modules=False) as s:
        try:
            rep = build(s, capture)
        except ValueError as e:
            raise UserError(f"{store}: {e}") from None
        # (the text names the others a store holds, as summary does)
        held = len(s.captures())
    if as_json:
        click.echo(json.dumps(rep, indent=1, default=str))
    else:
        render(rep, captures=held)


@cli.command("follow")
@click.argument("store", type=click.Path())
@click.argument("level", type=click.Choice(LEVEL_NAMES))
@click.argument("io_id", type=int, required=False)
@click.option("--capture", default=None, help="Capture id (default: the newest).")
@click.option("--json", "as_json", is_flag=True, help="The follow_io rows as JSON.")
@user_errors
def follow_cmd(store, level, io_id, capture, as_json) -> None:
    """One I/O followed down and up the stack: the requests it caused at
    each lower level and the events above that caused it (the follow_io
    macro over links), with their times.  IO_ID is the io_id column of the
    level's view; without it, the level's slowest read or write."""
    from nestrace.query.session import Session
    from nestrace.report.follow import breakdown, follow, render
    with Session(store_with_captures(store)) as s:
        try:
            cid, what, rows = follow(s, level, io_id, capture)
        except ValueError as e:
            raise UserError(f"{store}: {e}") from None
        split = None if as_json else breakdown(s, cid, rows)
    if as_json:
        click.echo(json.dumps(rows.to_pylist(), indent=1, default=str))
    else:
        render(cid, what, rows, split)


@cli.command("compare")
@click.argument("store", type=click.Path())
@click.option("--capture", "capture_ids", multiple=True, help="Only these captures (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="The compare_captures rows as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="The compare_captures rows as CSV.")
@click.option("--by-stack", is_flag=True, help="One row per stack over its rounds (lab run "
              "--repeat): medians and the throughput's spread (the compare_stacks view).")
@user_errors
def compare_cmd(store, capture_ids, as_json, as_csv, by_stack) -> None:
    """A store's captures side by side: stack, workload, throughput,
    latency, amplification to the host disk, sequentiality (the
    compare_captures view; `nestrace lab run` makes such stores)."""
    from nestrace.capture import matrix
    from nestrace.query.session import Session
    if by_stack and capture_ids:
        raise UserError("--by-stack takes every capture of the store: no --capture")
    if as_csv and as_json:
        raise UserError("--csv and --json: give one")
    with Session(store_with_captures(store)) as s:
        rows = s.compare_stacks() if by_stack else matrix.compare(s, list(capture_ids) or None)
    missing = sorted(set(capture_ids) - set(rows.column("capture_id").to_pylist())) \
        if capture_ids else []
    if missing:
        raise UserError(f"{store}: no capture {', '.join(missing)}")
    if as_json:
        click.echo(json.dumps(rows.to_pylist(), default=str, indent=1))
    elif as_csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(rows.column_names)
        w.writerows(tuple(" ".join(v) if isinstance(v, list) else v for v in r.values())
                    for r in rows.to_pylist())
    elif by_stack:
        matrix.render_stacks(rows)
    else:
        matrix.render(rows)


@cli.command("correlate")
@click.argument("store", type=click.Path())
@memory_limit_option
@user_errors
def correlate_cmd(store, memory_limit) -> None:
    """Materialize the cross-level links (and block_requests, rmw) into the store (idempotent)."""
    from nestrace.report.document import correlate

    def progress(view: str, rows: int, seconds: float) -> None:
        click.echo(f"nestrace: {view}: {rows:,} rows stored in {seconds:.1f} s", err=True)
    # (on a terminal: at 10 M events the three take ~10 s)
    for cid, n in correlate(store, memory_limit, progress if sys.stderr.isatty() else None).items():
        click.echo(f"capture {cid}: {n} links")


@cli.command("plot")
@click.argument("stores", nargs=-1, required=True, type=click.Path(), metavar="STORE...")
@click.option("--kind", default="seek-cdf", show_default=True,
              help="seek-cdf, latency, phases, amplification, sizes, offsets, throughput, depth or compare.")
@click.option("--level", default="disk", show_default=True,
              type=click.Choice(LEVEL_NAMES), help="Level for seek-cdf.")
@click.option("--distance", default="auto", show_default=True,
              type=click.Choice(["auto", "normalized", "absolute"]),
              help="seek-cdf: |d| / the device's (or file's) size, |d| in bytes, or auto: "
                   "normalized where every size is known.")
@click.option("--log-x/--linear-x", default=None,
              help="seek-cdf with absolute distances: a log axis (the default) or not.")
@click.option("--capture", "capture_id", default=None,
              help="Only this capture (default: every capture of the store, side by side).")
@click.option("-o", "--output", required=True, type=click.Path(),
              help="FILE.html (plotly.js written once beside it, as plotly.min.js) or FILE.png")
@user_errors
def plot_cmd(stores, kind, level, distance, log_x, capture_id, output) -> None:
    """Draw one figure to HTML (offline) or PNG: of one store, or for
    seek-cdf the curves of several stores overlaid, each named by its
    stack (and its store or capture where two stacks are alike)."""
    _allow_pandas()
    from nestrace.query.session import Session
    from nestrace.report import plots
    if kind not in plots.KINDS:
        raise UserError(f"unknown --kind {kind!r} (choose from {', '.join(plots.KINDS)})")
    if len(stores) > 1 and kind != "seek-cdf":
        raise UserError(f"--kind {kind} draws one store; seek-cdf overlays several")
    output_file(output, (".html", ".png"))
    sessions = [Session(store_with_captures(st)) for st in stores]
    if capture_id is not None:
        if kind == "compare":
            raise UserError("--capture: the compare figure puts every capture side by side")
        if not any(capture_id in s.captures() for s in sessions):
            raise UserError(f"{', '.join(stores)}: no capture {capture_id!r} "
                            f"(have: {', '.join(c for s in sessions for c in s.captures())})")
    s = sessions[0]
    try:
        fig = plots.seek_cdf(sessions, level=level, capture_id=capture_id, distance=distance,
                             log_x=log_x) if kind == "seek-cdf" else \
            plots.compare_bars(s) if kind == "compare" else \
            plots.KINDS[kind](s, capture_id=capture_id)
    except ValueError as e:
        raise UserError(f"{', '.join(stores)}: {e}") from None
    if output.endswith(".html"):
        fig.write_html(output, include_plotlyjs="directory")
    else:   # .png
        try:
            fig.write_image(output, width=1200, height=700)
        except Exception as e:  # kaleido missing, or no Chromium to drive
            raise UserError(f"{output}: PNG export needs kaleido and a Chromium it can start "
                            f"(apt-get install chromium): {str(e).splitlines()[0]}") from None
    click.echo(output)


@cli.command("html")
@click.argument("stores", nargs=-1, required=True, type=click.Path())
@click.option("-o", "--output", required=True, type=click.Path(), help="report.html")
@user_errors
def html_cmd(stores, output) -> None:
    """One self-contained HTML page (no network needed): the report's
    tables and every figure for each STORE, seek CDFs overlaid."""
    _allow_pandas()
    from nestrace.query.session import Session
    from nestrace.report import plots
    output_file(output)
    plots.html_report([Session(store_with_captures(s)) for s in stores], output)
    click.echo(output)


@cli.command("summary")
@click.argument("store", type=click.Path())
@click.option("--capture", default=None, help="Capture id (default: the newest).")
@user_errors
def summary_cmd(store, capture) -> None:
    """Per-level summary of a capture: requests, bytes, lost events."""
    from nestrace.report.summary import format_summary, level_summary
    p = store_with_captures(store)
    try:
        click.echo(format_summary(level_summary(p, capture)))
    except StoreError:
        raise
    except ValueError as e:
        raise UserError(f"{store}: {e}") from None


class _NoPandas:
    """An import finder that says pandas is not installed.  pyarrow (26)
    imports pandas, if it can, at the first array it builds (to tell a
    pandas Series from a list): ~0.4 s of every command's start-up that
    builds one (record, import, merge, ...), and no command but plot and
    html has any use for pandas.  Only the command line installs it; a
    program or notebook that imports nestrace gets pandas as usual."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (nestrace's command line "
                                      "does without it)", name=name)
        return None


def _allow_pandas() -> None:
    """For the commands that draw with plotly, which may use pandas."""
    sys.meta_path[:] = [f for f in sys.meta_path if f is not _NoPandas]


def _keep_freed_memory() -> None:
    """Let glibc's malloc keep what numpy frees for the next array instead
    of handing each big array back to the kernel (every new one was then
    page-faulted in afresh: a 3 M-record blktrace import spent 1.4 of its
    3.7 s in the kernel, 0.5 with this).  Arrays under 32 MiB come from
    the heap, which is not trimmed under 1 GiB.  Nothing where the C
    library is not glibc.

    And no transparent huge pages for numpy's arrays (numpy asks for them
    with madvise): where the kernel compacts memory to make one at the
    fault (defrag "madvise", Debian's default), they cost more than they
    save.  The same import spent 1.0 to 1.3 s in the kernel with them,
    0.3 to 0.5 s without."""
    import ctypes
    import ctypes.util
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")    # (read when numpy is imported)
    np = sys.modules.get("numpy")
    if np is not None:     # (imported already: told directly)
        core = getattr(np, "_core", None) or np.core
        core.multiarray._set_madvise_hugepage(os.environ["NUMPY_MADVISE_HUGEPAGE"] != "0")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        if hasattr(libc, "mallopt"):
            libc.mallopt(-3, 32 << 20)     # M_MMAP_THRESHOLD (its most)
            libc.mallopt(-1, 1 << 30)      # M_TRIM_THRESHOLD
    except OSError:
        pass


def main() -> None:
    import faulthandler
    import signal
    _keep_freed_memory()
    if "pandas" not in sys.modules:
        sys.meta_path.insert(0, _NoPandas)
    # `kill -USR1 PID` prints every thread's Python stack to stderr (a
    # recording that will not stop says where it waits)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        cli.main(prog_name="nestrace", standalone_mode=False)
        sys.exit(0)
    except click.UsageError as e:    # (a bad option or value: one line, as every error)
        where = e.ctx.command_path if e.ctx else "nestrace"
        click.echo(f"nestrace: error: {e.format_message()} (`{where} --help`)", err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("nestrace: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:      # (a bug: one line, not a traceback, unless asked)
        if os.environ.get("NESTRACE_DEBUG"):
            raise
        first = (str(e).splitlines() or [""])[0]
        click.echo(f"nestrace: error: internal error: {type(e).__name__}: {first} (a bug in "
                   "nestrace: NESTRACE_DEBUG=1 shows where; please report it with its input)",
                   err=True)
        sys.exit(70)


if __name__ == "__main__":
    main()
