"""SQL modules: discovery, dependency order, and their documentation.

A module is a file: correlate/sql/block/requests.sql is module
`block.requests`.  A module names what it needs with `-- INCLUDE a.b`
lines, and only creates views, tables and macros.  Public names start with
the module's package (`block_requests`); internal ones with `_`.

Each public view has a comment block right above its CREATE: a
description, then one `-- @column NAME TYPE description` line per column
(`-- @column * as other_view` takes the other view's columns).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from nestrace._paths import SQL_DIR

_CREATE = re.compile(r"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+)?(VIEW|TABLE|MACRO)\s+(\w+)",
                     re.I | re.M)
# `CREATE VIEW v AS`: DuckDB binds a view when it is created, which means
# binding every view below it again (and reading Parquet footers); it binds
# it again on every query anyway.  Deferred, opening a session is cheap.
_VIEW_AS = re.compile(r"^(CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+)?VIEW\s+\w+)\s+AS\b", re.I | re.M)
_FORBIDDEN = re.compile(r"^\s*(DROP|DELETE|UPDATE|INSERT|ATTACH|COPY|INSTALL|LOAD)\b", re.I | re.M)


@dataclass
class Column:
    name: str
    type: str
    doc: str


@dataclass
class ViewDoc:
    name: str
    module: str
    doc: str
    columns: list[Column] = field(default_factory=list)
    inherits: str | None = None


@dataclass
class Module:
    name: str
    path: Path
    text: str
    includes: list[str]
    views: list[ViewDoc]
    objects: list[tuple[str, str]]   # (kind, name)
    late: bool = False       # `-- LATE`: created on first use, after the views `correlate` stored


class ModuleError(ValueError):
    pass


def _parse(path: Path, name: str) -> Module:
    text = path.read_text()
    m = _FORBIDDEN.search(text)
    if m:
        line = text[:m.start()].count("\n") + 1
        raise ModuleError(f"{path}:{line}: modules only create views, tables and macros "
                          f"({m.group(1)} found)")
    includes = re.findall(r"^--\s*INCLUDE\s+([\w.]+)", text, re.M)
    lines = text.splitlines()
    views, objects = [], []
    package = name.split(".")[0]
    for m in _CREATE.finditer(text):
        kind, obj = m.group(1).upper(), m.group(2)
        objects.append((kind, obj))
        line_no = text[:m.start()].count("\n")
        if obj.startswith("_"):
            continue
        if obj != package and not obj.startswith(package + "_"):
            raise ModuleError(f"{path}:{line_no + 1}: public name {obj!r} must start "
                              f"with the package name {package!r}_ (or _ if internal)")
        if kind != "VIEW":
            continue
        # the contiguous comment block above the CREATE
        block = []
        i = line_no - 1
        while i >= 0 and lines[i].startswith("--"):
            block.insert(0, lines[i][2:].strip())
            i -= 1
        vd = ViewDoc(obj, name, "")
        desc = []
        for b in block:
            if b.startswith("@column"):
                parts = b.split(None, 3)
                if len(parts) >= 4 and parts[1] == "*" and parts[2] == "as":
                    vd.inherits = parts[3].strip()
                elif len(parts) >= 4:
                    vd.columns.append(Column(parts[1], parts[2], parts[3]))
                else:
                    raise ModuleError(f"{path}: view {obj}: bad @column line {b!r}")
            else:
                desc.append(b)
        vd.doc = " ".join(desc).strip()
        views.append(vd)
    late = re.search(r"^--\s*LATE\b", text, re.M) is not None
    return Module(name, path, text, includes, views, objects, late)


# `-- COPIES m: m_2 m_3`: macro m is created under these names too.  DuckDB
# refuses to expand a table macro while it is expanding it (it takes that
# for recursion), even where one use only reads a view that uses it: a
# macro that views nest (one use's argument a view made with another use)
# needs a copy per level of nesting.
_COPIES = re.compile(r"^--\s*COPIES\s+(\w+):\s*([\w ]+)$", re.M)


def _with_copies(sql: str) -> str:
    for m in _COPIES.finditer(sql):
        name = m.group(1)
        start = re.search(rf"^CREATE\s+OR\s+REPLACE\s+MACRO\s+{name}\(", sql, re.M)
        if not start:
            raise ModuleError(f"-- COPIES {name}: no CREATE OR REPLACE MACRO {name}( here")
        end = sql.index(";\n", start.start()) + 2
        body = sql[start.start():end]
        sql += "".join("\n" + body.replace(f"MACRO {name}(", f"MACRO {copy}(", 1)
                       for copy in m.group(2).split())
    return sql


def bodies(text: str) -> dict[str, str]:
    """Each object a module's text creates: its statement without
    comments (a macro's copies too, under their names)."""
    code = re.sub(r"--[^\n]*", "", text)
    starts = list(_CREATE.finditer(code))
    out = {}
    for i, m in enumerate(starts):
        out[m.group(2)] = code[m.end():starts[i + 1].start() if i + 1 < len(starts) else None]
    for m in _COPIES.finditer(text):
        for copy in m.group(2).split():
            out[copy] = out.get(m.group(1), "")
    return out


def deferred(sql: str) -> str:
    """The statements with every CREATE VIEW bound on first use, not now
    (DuckDB >= 2.0: `WITH (DEFER_BINDING)`), and the copies of macros that
    `-- COPIES` asks for.  A broken view then fails when queried; the
    tests query every public view."""
    return _VIEW_AS.sub(r"\1 WITH (DEFER_BINDING) AS", _with_copies(sql))


def discover(sql_dir: Path = SQL_DIR) -> dict[str, Module]:
    mods = {}
    for p in sorted(sql_dir.rglob("*.sql")):
        name = ".".join(p.relative_to(sql_dir).with_suffix("").parts)
        mods[name] = _parse(p, name)
    return mods


def load_order(mods: dict[str, Module]) -> list[Module]:
    """Every module after the ones it includes; `-- LATE` modules last.

    DuckDB binds a table macro when it is created, planning every view its
    body reads.  A module of such macros marks itself `-- LATE`: a session
    creates it only when a query first names one of its objects, and after
    pointing `links` at what `correlate` stored.  So follow_io, which reads
    links, binds against the stored links (~0.02 s) instead of planning
    links from the raw tables (~0.5 s, on a store not yet correlated), and
    a command that draws no seek CDF never binds those macros (~40 ms).
    No module may include a LATE one."""
    for m in mods.values():
        for dep in m.includes:
            if dep in mods and mods[dep].late and not m.late:
                raise ModuleError(f"module {m.name} includes {dep}, which loads late (-- LATE)")
    order, seen, stack = [], set(), set()

    def visit(n: str, via: str) -> None:
        if n in seen:
            return
        if n not in mods:
            raise ModuleError(f"module {via} includes unknown module {n}")
        if n in stack:
            raise ModuleError(f"include cycle through {n}")
        stack.add(n)
        for dep in mods[n].includes:
            visit(dep, n)
        stack.discard(n)
        seen.add(n)
        order.append(mods[n])

    for n in sorted(mods):
        visit(n, n)
    return [m for m in order if not m.late] + [m for m in order if m.late]


def public_views(mods: dict[str, Module]) -> dict[str, ViewDoc]:
    return {v.name: v for m in mods.values() for v in m.views}


def resolved_columns(views: dict[str, ViewDoc], name: str) -> list[Column]:
    v = views[name]
    if v.inherits:
        return resolved_columns(views, v.inherits) + v.columns
    return v.columns


def check_docs(con, mods: dict[str, Module]) -> list[str]:
    """Compare every public view's documented columns with what DuckDB says
    the view has.  Returns problems (empty when all is documented)."""
    problems = []
    views = public_views(mods)
    for name, v in sorted(views.items()):
        if not v.doc:
            problems.append(f"{v.module}: view {name} has no description")
        actual = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
        documented = [c.name for c in resolved_columns(views, name)]
        for c in actual:
            if c not in documented:
                problems.append(f"{v.module}: view {name}: column {c} is not documented")
        for c in documented:
            if c not in actual:
                problems.append(f"{v.module}: view {name}: documented column {c} does not exist")
    return problems


def reference_markdown(mods: dict[str, Module]) -> str:
    views = public_views(mods)
    out = ["# SQL view reference", "",
           "GENERATED from the comment blocks in `correlate/sql/` by "
           "`python -m nestrace.query.viewdocs`; `ci/check-generated` fails on drift.", ""]
    for name in sorted(views):
        v = views[name]
        out += [f"## `{name}` (module `{v.module}`)", "", v.doc, "",
                "| column | type | description |", "|---|---|---|"]
        for c in resolved_columns(views, name):
            out.append(f"| `{c.name}` | {c.type} | {c.doc} |")
        out.append("")
    return "\n".join(out)
