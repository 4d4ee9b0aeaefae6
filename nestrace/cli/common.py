"""What every nestrace command shares: the group, the one-line errors, the
options and checks used by several commands.

Every error the user can cause ends as one line `nestrace: error: ...` and
exit code 2, with nothing left mounted or attached.
"""
from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from pathlib import Path

import click

from nestrace._paths import AgentMismatch, AgentNotFound
from nestrace._version import __version__
from nestrace.capture.loops import LabError
from nestrace.errors import RecordError, StackError, StoreError, StreamError


class UserError(click.ClickException):
    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"nestrace: error: {self.message}", err=True)


def _print_version(ctx: click.Context) -> None:
    """`nestrace --version`: the package and the agent it drives (its build
    id, and where it is: the one binary to copy into a guest)."""
    from nestrace import _paths
    click.echo(f"nestrace {__version__}")
    want = _paths.expected_build_id()
    try:
        path = _paths.agent_path()
        click.echo(f"agent build {want} ({path})")
    except (AgentNotFound, AgentMismatch) as e:
        click.echo(f"agent build {want}: {e}")
    ctx.exit()


# the four levels, top down (follow, plot --level)
LEVEL_NAMES = ("vfs", "vdisk", "hostfs", "disk")


def user_errors(fn=None, *, detail: bool = False):
    """Decorator: turn the library's expected errors into one-line exit 2.
    `detail`: a DuckDB error keeps the lines of help DuckDB gives after
    its first (the caret under the query, the candidate names), indented."""
    if fn is None:
        return functools.partial(user_errors, detail=detail)

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except (LabError, StackError, StoreError, StreamError, RecordError,
                AgentNotFound, AgentMismatch) as e:
            raise UserError(str(e)) from None
        except OSError as e:    # (a file that is a directory, a FIFO, unreadable, ...)
            raise UserError(f"{e.filename}: {e.strerror}" if e.filename and e.strerror
                            else str(e)) from None
        except Exception as e:
            # (a DuckDB error comes only from a command that imported it:
            # the others do not pay its import)
            duckdb = sys.modules.get("duckdb")
            if duckdb is None or not isinstance(e, duckdb.Error):
                raise
            from nestrace.store.seal import DAMAGE_NOTE, STORE_FILE_PATTERN, damage_of
            # (DuckDB quotes a damaged file's bytes as they are)
            msg = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(e).splitlines()[0])
            # a store's damaged Parquet file: named with the byte range that
            # does not read (DuckDB names the file for some damage, never
            # the offset; for a damaged footer or page often neither)
            named = STORE_FILE_PATTERN.search(msg)
            store = Path(named.group(1)).parents[2] if named else \
                Path(kw["store"]) if kw.get("store") and Path(kw["store"]).is_dir() else None
            # (a session's query has named it already: not read again)
            noted = [n for n in getattr(e, "__notes__", []) if n.startswith(DAMAGE_NOTE)]
            damage = noted[0].removeprefix(DAMAGE_NOTE) if noted else \
                damage_of(store, e) if store else None
            if damage:
                msg = (f"{DAMAGE_NOTE}{damage} (DuckDB: {msg}); `nestrace verify "
                       f"{store}` checks every file")
            elif named:
                msg += f" (`nestrace verify {store}` checks every page)"
            elif detail:
                from nestrace.cli.shell import error_lines
                msg = error_lines(e)
            raise UserError(msg) from None
    return wrapper


def store_with_captures(store: str) -> Path:
    """A store that holds a sealed capture (what a command that shows one
    needs), else one error line: the same for every such command."""
    from nestrace.store.files import captures, check_store, live_captures, recorder_of
    p = check_store(store)
    if not captures(p):
        recording, unsealed = [], []
        for cid in live_captures(p):
            try:
                pid = recorder_of(p, cid, wait=0)
            except StoreError:          # its recorder gone, its agent still writing
                pid = 0
            (recording if pid is not None else unsealed).append(
                f"{cid} (nestrace pid {pid})" if pid else cid)
        raise UserError(f"{store}: the store holds no capture" + "".join(
            [f" (being recorded: {', '.join(recording)})" if recording else "",
             f" (unsealed: {', '.join(unsealed)}; `nestrace seal {store}`)" if unsealed else ""]))
    return p


def output_file(output: str, suffixes: tuple[str, ...] = ()) -> Path:
    """The file a command writes, refused before any work when it cannot be
    one (export wrote 190 MB to /tmp.tmp for `-o /tmp`, then a traceback)."""
    p = Path(output)
    if p.is_dir():
        raise UserError(f"{output}: is a directory (give the file to write)")
    if not p.parent.is_dir():
        raise UserError(f"{output}: no such directory {p.parent}")
    if suffixes and p.suffix not in suffixes:
        raise UserError(f"{output}: write {' or '.join(suffixes)}")
    return p


def needs_root(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        if os.geteuid() != 0:
            raise UserError("this command needs root (BPF, loop devices, mounts)")
        return fn(*a, **kw)
    return wrapper


def needs_btf(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        btf = os.environ.get("NESTRACE_BTF", "/sys/kernel/btf/vmlinux")
        if not Path(btf).exists():
            raise UserError(f"{btf}: no kernel BTF; nestrace's CO-RE tracers need a kernel "
                            "built with CONFIG_DEBUG_INFO_BTF=y")
        return fn(*a, **kw)
    return wrapper


def lab_name_option(fn):
    return click.option("--name", default="default", show_default=True,
                        help="Lab name (several labs can be up at once).")(fn)


# The commands defined outside main, by module: imported when one is named
# or the commands are listed (--help), so that the others (`report`,
# `sql`, `correlate`...) never import the capture and lab modules these
# need: 0.09 s of every such command.
ELSEWHERE = {"lab": "nestrace.cli.lab", "record": "nestrace.cli.record",
             "study": "nestrace.cli.study"}


class _Group(click.Group):
    """The `nestrace` group: ELSEWHERE's commands registered on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *ELSEWHERE})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in ELSEWHERE:
            importlib.import_module(ELSEWHERE[name])    # (its decorators register it)
        return self.commands.get(name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=lambda ctx, _p, v: _print_version(ctx) if v else None,
              help="The package's version and its agent's build, then exit.")
@click.option("--read-anyway", is_flag=True,
              help="Read a store whose files are not those its manifests name (changed, "
                   "damaged, missing): each named as a warning, not an error.")
def cli(read_anyway) -> None:
    """nestrace: multi-level I/O tracing for nested storage stacks."""
    from nestrace.store.modes import private_files
    private_files()
    if read_anyway:
        os.environ["NESTRACE_READ_ANYWAY"] = "1"     # (store.manifest.READ_ANYWAY_ENV)


def _keep_group(ctx, _param, value):
    ctx.meta["nestrace.group"] = value


def group_option(f):
    """--group NAME, for the commands that write a store."""
    return click.option(
        "--group", metavar="NAME", default=None, expose_value=False, callback=_keep_group,
        help="Share the store with this group: readable by it (directories setgid, so what "
             "is added later is too).  Default: readable by its owner only.")(f)


def group_given() -> str | None:
    return click.get_current_context().meta.get("nestrace.group")


def share_store(store) -> None:
    """Give the store to --group's group, if given (made first if new)."""
    from nestrace.store.files import init_store, share_with_group
    from nestrace.store.modes import group_id
    group = group_given()
    if group:
        group_id(group)     # (an unknown one: no store made)
        share_with_group(init_store(store), group)


# ---- options shared by record and lab run ------------------------------------

# (a BPF ring buffer's size is a u32 of bytes, and a power of two: 4 GiB
# failed to load, "Invalid argument")
RINGBUF_KB_MAX = 1 << 21


def _ringbuf_kb(ctx, param, v):
    """(the agent's rule, said before it starts; 0 was taken for the default)"""
    if v is not None and (v < 4 or v & (v - 1)):
        raise click.BadParameter(f"{v}: not a power of two >= 4")
    if v is not None and v > RINGBUF_KB_MAX:
        raise click.BadParameter(f"{v}: more than {RINGBUF_KB_MAX} (2 GiB, the largest BPF ring "
                                 "buffer the kernel makes)")
    return v


def capture_options(f):
    """The options of a capture, shared by record and lab run."""
    for opt in reversed((
        click.option("--ringbuf-kb", type=int, default=None, callback=_ringbuf_kb,
                     help="BPF ring buffer size in KiB, a power of two >= 4 (default 16384)."),
        click.option("--flush-ms", type=click.IntRange(1, 60000), default=None,
                     help="How often staged records reach the store, at most (default 200)."),
        click.option("--mode", type=click.Choice(["auto", "tp_btf", "raw_tp"]), default="auto",
                     show_default=True, help="Tracepoint program type (auto probes)."),
        click.option("--all-hooks", is_flag=True,
                     help="Also attach the host-FS access hooks hostfs_io ignores for this "
                          "host FS (for comparing hooks; costs CPU per I/O)."),
        click.option("--per-request", is_flag=True,
                     help="Record each block request once, at its end, with its phase times "
                          "kept in the kernel (and each bio merged into one), instead of a "
                          "record per block tracepoint hit: fewer records per I/O "
                          "(docs/guide/per-request.md)."),
        click.option("--from-completions", is_flag=True,
                     help="As --per-request, but each request's record is written from its "
                          "completion alone, its times read from the kernel's struct request: "
                          "no program on a request's way down, the cheapest block capture; no "
                          "insert time, submitter or merged bio's own row "
                          "(docs/guide/per-request.md)."),
        click.option("--agent-cpus", default="auto", show_default=True,
                     help="CPUs the agent runs on: a list (0,2-3), 'all', or 'auto': those "
                          "that take no block-device interrupts, if some CPUs do and others "
                          "not."))):
        f = opt(f)
    return f


def report_capture(store: Path, capture_id: str, result, stream_problems=()) -> None:
    from nestrace.report.summary import format_summary, level_summary
    for p in list(stream_problems) + list(result.problems):   # (what was kept is stored)
        click.echo(f"nestrace: warning: {p}", err=True)
    click.echo(f"capture {capture_id}: {result.records} records -> {store}")
    summary = level_summary(store, capture_id)
    summary.pop("captures", None)   # (the line above names it)
    click.echo(format_summary(summary))
    missed = result.completions_unseen
    if result.lost_total > missed:
        click.secho(f"nestrace: WARNING: {result.lost_total} EVENTS LOST in capture {capture_id} "
                    "(see the lost_events table and capture_meta.hook_misses); raise --ringbuf-kb "
                    "or narrow the filters "
                    "(Linux AIO: iocbs beyond 65536 per io_submit or io_getevents count here too)",
                    err=True, fg="red", bold=True)
    if missed:
        click.secho(f"nestrace: WARNING: {missed} block request completions in capture {capture_id} "
                    "happened without a record: the kernel ran no program for them and counted "
                    "no miss (capture_meta.completions_missed; they are in the lost total)",
                    err=True, fg="red", bold=True)


_SIZE = re.compile(r"(\d+(\.\d+)?)\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)?", re.IGNORECASE)


def _memory_limit(_ctx, _param, v: str | None) -> str | None:
    """(checked here: DuckDB would take '-4GB' for no limit at all)"""
    if v is not None and not _SIZE.fullmatch(v.strip()):
        raise click.BadParameter(f"{v!r}: a size such as 4GB or 512MiB")
    return v


def memory_limit_option(f):
    """--memory-limit for the commands that run the correlator."""
    return click.option("--memory-limit", default=None, callback=_memory_limit, metavar="SIZE",
                        help="DuckDB memory limit, e.g. 4GB.")(f)
