"""The interactive shell of `nestrace sql STORE`, and the printing of
query results it shares with a one-shot `nestrace sql STORE QUERY`."""
from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import click


def format_table(cols: list[str], rows: list[tuple]) -> str:
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for r in cells:
        out.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(r, widths)))
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _numeric(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


SHELL_HELP = """\
.tables             the views and tables of the store
.schema NAME        NAME's columns: type and what each means
.mode table|csv|json   how results are printed (default table)
.timer on|off       print each query's time
.help               this
.quit, .exit        leave (so does Ctrl-D)
Anything else is SQL, run when a line ends with ;"""


def _column_docs(s, name: str) -> dict[str, str]:
    """What each column of a view or table means, as its module or
    schemas/ documents it."""
    from nestrace.schema import RECORDS, TABLES, kernel_tables
    for m in s.modules.values():
        for v in m.views:
            if v.name == name:
                docs = _column_docs(s, v.inherits) if v.inherits else {}
                return docs | {c.name: c.doc for c in v.columns}
    rec = kernel_tables().get(name)
    fields = RECORDS[rec]["fields"] if rec else TABLES.get(name, {}).get("fields", [])
    return {"capture_id": "capture"} | {f[0]: f[4 if rec else 3] for f in fields}


def _shell_command(s, line: str, opts: dict) -> bool:
    """Run one dot-command; False to leave the shell."""
    cmd, _, arg = line.strip().partition(" ")
    arg = arg.strip().rstrip(";")
    if cmd in (".quit", ".exit", ".q"):
        return False
    if cmd == ".help":
        click.echo(SHELL_HELP)
    elif cmd in (".tables", ".views"):
        names = [r[0] for r in s.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_name NOT LIKE '\\_%' ESCAPE '\\' "
            "ORDER BY 1").fetchall()]
        click.echo("\n".join(names))
    elif cmd in (".schema", ".describe"):
        if not arg:
            click.echo("error: .schema NAME (see .tables)", err=True)
            return True
        try:
            cols = s.execute(f"DESCRIBE {duckdb_ident(arg)}").fetchall()
        except Exception as e:
            click.echo(f"error: {str(e).splitlines()[0]}", err=True)
            return True
        docs = _column_docs(s, arg)
        click.echo(format_table(["column", "type", "meaning"],
                                [(c[0], c[1], docs.get(c[0], "")) for c in cols]))
    elif cmd == ".mode":
        if arg in ("table", "csv", "json"):
            opts["mode"] = arg
        else:
            click.echo("error: .mode table, csv or json", err=True)
    elif cmd == ".timer":
        if arg in ("on", "off"):
            opts["timer"] = arg == "on"
        else:
            click.echo("error: .timer on or off", err=True)
    else:
        click.echo(f"error: {line.strip()}: not a command here (.help lists them)", err=True)
    return True


def duckdb_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def print_rows(cur, mode: str) -> None:
    """A cursor's rows as a table, CSV or JSON (one array of objects)."""
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()
    if mode == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        w.writerows(rows)
    elif mode == "json":
        click.echo(json.dumps([dict(zip(cols, r)) for r in rows], default=str, indent=1))
    else:
        click.echo(format_table(cols, rows))


def error_lines(e: Exception) -> str:
    """A DuckDB error as DuckDB's own shell shows it: its first line, then
    its help (the LINE 1 and caret, "Candidate bindings") indented."""
    first, *rest = str(e).splitlines() or [type(e).__name__]
    return "\n".join([first, *(f"  {line}" for line in rest if line.strip())])


def run(s) -> int:
    """Read SQL and dot-commands from stdin until .quit or end of input;
    the number of statements that failed.  On a terminal it prompts and
    keeps a history; piped, it reads the lines as they come, as DuckDB's
    shell does (no prompts in the output)."""
    tty = sys.stdin.isatty()
    if tty:     # line editing, and history kept in ~/.nestrace_history
        try:
            import readline
            history = Path.home() / ".nestrace_history"
            try:
                readline.read_history_file(history)
            except OSError:
                pass
            import atexit
            atexit.register(lambda: _save_history(readline, history))
        except ImportError:
            pass
        click.echo(f"nestrace sql on {s.store}: views {', '.join(s.views())}; end with ; and "
                   "quit with Ctrl-D (.help: the shell's commands)", err=True)
    buf: list[str] = []
    opts = {"mode": "table", "timer": False}
    failed = 0
    while True:
        try:
            if tty:
                line = input("nestrace> " if not buf else "      ...> ")
            else:
                line = sys.stdin.readline()
                if not line:
                    raise EOFError
                line = line.rstrip("\n")
        except EOFError:
            if tty:
                click.echo("", err=True)
            return failed
        except KeyboardInterrupt:       # Ctrl-C drops the statement being typed
            click.echo("", err=True)
            buf = []
            continue
        if not buf and line.lstrip().startswith("."):
            if not _shell_command(s, line, opts):
                return failed
            continue
        buf.append(line)
        if line.rstrip().endswith(";"):
            q = "\n".join(buf)
            buf = []
            t = time.monotonic()
            try:
                cur = s.execute(q)
                if cur.description:
                    with s._damage_noted():     # (rows can be read only here)
                        print_rows(cur, opts["mode"])
            except KeyboardInterrupt:
                s.con.interrupt()
                click.echo("error: interrupted", err=True)
                failed += 1
            except Exception as e:  # the shell keeps going on a bad query
                click.echo(f"error: {error_lines(e)}", err=True)
                for note in getattr(e, "__notes__", []):   # a damaged file, named
                    click.echo(f"  {note}", err=True)
                failed += 1
            if opts["timer"]:
                click.echo(f"time: {time.monotonic() - t:.3f} s", err=True)


def _save_history(readline, path: Path) -> None:
    try:
        readline.set_history_length(1000)
        readline.write_history_file(path)
    except OSError:
        pass
