"""Generate the C header, the Python record table, the docs and the SQL
enum tables from schemas/.

Usage: python -m nestrace.schema.gen [--out DIR] [--check]

`--check` regenerates into a temporary directory and exits 1 naming every
file that differs from the committed one (this is `ci/check-generated`).
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
import tempfile
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "records.toml"

C_SIZES = {"__u64": 8, "__s64": 8, "__u32": 4, "__s32": 4, "__u16": 2,
           "__s16": 2, "__u8": 1}
NP_TYPES = {"__u64": "<u8", "__s64": "<i8", "__u32": "<u4", "__s32": "<i4",
            "__u16": "<u2", "__s16": "<i2", "__u8": "u1"}
OUTPUTS = ("tracers/nestrace_records.h", "tracers/nestrace_arrow.h", "nestrace/schema/_records.py",
           "docs/reference/records.md", "correlate/sql/hostfs/sources.sql", "correlate/sql/codes/tables.sql")


class SchemaError(ValueError):
    pass


def c_size(ctype: str) -> int:
    if ctype.startswith("char[") and ctype.endswith("]"):
        return int(ctype[5:-1])
    if ctype not in C_SIZES:
        raise SchemaError(f"{SCHEMA}: unknown C type {ctype!r}")
    return C_SIZES[ctype]


def np_type(ctype: str) -> str:
    if ctype.startswith("char["):
        return f"S{c_size(ctype)}"
    return NP_TYPES[ctype]


def load(path: Path = SCHEMA) -> dict:
    """Parse and validate the schema; return it with computed layouts."""
    spec = tomllib.loads(path.read_text())
    header = spec["header"]["fields"]
    kinds = set()
    for rec in spec["record"]:
        if rec["kind"] in kinds:
            raise SchemaError(f"{path}: kind {rec['kind']} declared twice")
        kinds.add(rec["kind"])
        offset = 0
        layout = []
        for f in header + rec["fields"]:
            name, ctype = f[0], f[1]
            size = c_size(ctype)
            align = 1 if ctype.startswith("char[") else size
            if offset % align:
                raise SchemaError(
                    f"{path}: {rec['name']}.{name} at offset {offset} is not "
                    f"{align}-aligned; reorder largest first or add _pad")
            layout.append((name, ctype, offset, size))
            offset += size
        if offset % 8:
            raise SchemaError(f"{path}: {rec['name']} is {offset} bytes, "
                              "not a multiple of 8; add explicit padding")
        rec["layout"] = layout
        rec["size"] = offset
    fields = {f"{r['name']}.{f[0]}" for r in spec["record"] + spec.get("table", [])
              for f in r["fields"]}
    for en in spec.get("enum", []):
        if en["field"] not in fields:
            raise SchemaError(f"{path}: enum {en['name']} is for unknown field {en['field']}")
        values = [v[0] for v in en["values"]]
        names = [v[1] for v in en["values"]]
        if len(set(values)) != len(values) or len(set(names)) != len(names) or min(values) < 0:
            raise SchemaError(f"{path}: enum {en['name']}: values must be distinct and >= 0, "
                              "names distinct")
        en.setdefault("columns", [])
        for v in en["values"]:
            if len(v) != 2 + len(en["columns"]) or not re.fullmatch(r"[a-z][a-z0-9_]*", v[1]):
                raise SchemaError(f"{path}: enum {en['name']}: value {v[0]}: a code, a "
                                  f"lower-case name and one item per column "
                                  f"({', '.join(c[0] for c in en['columns']) or 'none'})")
    return spec


def enum_const(en: dict, name: str) -> str:
    return f"NT_{en['name'].upper()}_{name.upper()}"


def gen_header(spec: dict) -> str:
    out = [
        "/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */",
        "/* GENERATED from schemas/records.toml by nestrace.schema.gen: do not edit. */",
        "#ifndef NESTRACE_RECORDS_H",
        "#define NESTRACE_RECORDS_H",
        "",
        f"#define NT_STREAM_MAGIC 0x{spec['stream_magic']:08x}U",
        f"#define NT_STREAM_VERSION {spec['stream_version']}",
        "",
        "/* Stream frame: a frame header, then count records of rec_size bytes",
        " * (kind 0: count bytes of UTF-8 JSON). */",
        "struct nt_frame {",
        "\t__u32 magic;",
        "\t__u16 kind;",
        "\t__u16 version;",
        "\t__u32 rec_size;",
        "\t__u32 count;",
        "};",
        "",
        "/* " + spec["header"]["doc"] + " */",
        "struct nt_header {",
    ]
    for f in spec["header"]["fields"]:
        out.append(_c_field(f))
    out += ["};", ""]
    for rec in spec["record"]:
        up = rec["name"].upper()
        out += [f"#define NT_KIND_{up} {rec['kind']}",
                f"#define NT_VERSION_{up} {rec['version']}",
                f"/* {rec['doc']} ({rec['size']} bytes) */",
                f"struct nt_{rec['name']} {{",
                "\tstruct nt_header hdr;"]
        for f in rec["fields"]:
            out.append(_c_field(f))
        out += ["};", ""]
    records = {r["name"] for r in spec["record"]}
    for en in spec.get("enum", []):
        if en["field"].split(".")[0] not in records:
            continue        # (a stored table's code: the programs never see it)
        out.append(f"/* {en['field']}: {en['doc']} */")
        out += [f"#define {enum_const(en, v[1])} {v[0]}" for v in en["values"]]
        # (the names as one list: hostfs_source's are the tracepoints a
        # guest-side agent skips, having no image to trace)
        out.append(f"#define NT_{en['name'].upper()}_NAMES \"{','.join(v[1] for v in en['values'])}\"")
        out.append("")
    out += ["#endif /* NESTRACE_RECORDS_H */", ""]
    return "\n".join(out)


def _c_bytes(name: str, data: bytes) -> list[str]:
    out = [f"static const unsigned char {name}[{len(data)}] = {{"]
    for i in range(0, len(data), 16):
        out.append("\t" + ", ".join(f"0x{b:02x}" for b in data[i:i + 16]) + ",")
    out.append("};")
    return out


def gen_arrow_header(spec: dict) -> str:
    """The agent's Arrow IPC writer tables: per record kind, the stored
    columns (offset and width in the record), the Schema message and a
    RecordBatch message template (see nestrace.schema.arrowipc)."""
    from nestrace.schema.arrowipc import batch_template, schema_message
    out = [
        "/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */",
        "/* GENERATED from schemas/records.toml by nestrace.schema.gen: do not edit. */",
        "/* Arrow IPC stream messages for the agent's --arrow-dir output.  Each",
        " * batch: the template with row count, body length, one FieldNode",
        " * {length, null_count} per column and one Buffer {offset, length} per",
        " * buffer (validity, then data; strings: validity, offsets, data) written",
        " * at the given positions, then the body. */",
        "#ifndef NESTRACE_ARROW_H",
        "#define NESTRACE_ARROW_H",
        "",
        "struct nt_arrow_col {",
        "\tunsigned short offset;\t/* in the record */",
        "\tunsigned char width;\t/* bytes */",
        "\tunsigned char is_string;\t/* char[width], NUL padded -> Utf8 */",
        "};",
        "",
        "struct nt_arrow_table {",
        "\tconst char *table;",
        "\tunsigned int rec_size, ncols, nbuffers;",
        "\tconst struct nt_arrow_col *cols;",
        "\tconst unsigned char *schema;",
        "\tunsigned int schema_len;",
        "\tconst unsigned char *batch;",
        "\tunsigned int batch_len;",
        "\tunsigned int length_pos, body_length_pos, nodes_pos, buffers_pos;",
        "};",
        "",
    ]
    entries = []
    for rec in spec["record"]:
        name = rec["name"]
        fields = spec["header"]["fields"] + rec["fields"]
        cols, meta_cols = [], []
        for f, (_, ctype, offset, size) in zip(fields, rec["layout"]):
            if f[0].startswith("_pad"):
                continue
            is_str = ctype.startswith("char[")
            cols.append(f"{{{offset}, {size}, {int(is_str)}}}")
            meta = {"doc": f[4]}
            if f[3]:
                meta["unit"] = f[3]
            meta_cols.append((f[0], f[2], meta))
        nbuf = sum(3 if c[1] == "string" else 2 for c in meta_cols)
        tpl = batch_template(len(meta_cols), nbuf)
        out.append(f"static const struct nt_arrow_col nt_arrow_cols_{name}[{len(cols)}] = {{")
        out += [f"\t{c}," for c in cols]
        out.append("};")
        out += _c_bytes(f"nt_arrow_schema_{name}", schema_message(meta_cols))
        out += _c_bytes(f"nt_arrow_batch_{name}", tpl.message)
        out.append("")
        entries.append(
            f"\t[{rec['kind']}] = {{ \"{rec['table']}\", {rec['size']}, {len(cols)}, {nbuf}, "
            f"nt_arrow_cols_{name},\n\t\tnt_arrow_schema_{name}, sizeof(nt_arrow_schema_{name}),"
            f"\n\t\tnt_arrow_batch_{name}, sizeof(nt_arrow_batch_{name}),"
            f"\n\t\t{tpl.length_pos}, {tpl.body_length_pos}, {tpl.nodes_pos}, {tpl.buffers_pos} }},")
    max_kind = max(r["kind"] for r in spec["record"]) + 1
    out += [f"#define NT_ARROW_MAX_KIND {max_kind}",
            "static const struct nt_arrow_table nt_arrow_tables[NT_ARROW_MAX_KIND] = {"]
    out += entries
    out += ["};", "", "#endif /* NESTRACE_ARROW_H */", ""]
    return "\n".join(out)


def _c_field(f: list) -> str:
    name, ctype = f[0], f[1]
    doc = f" /* {f[4]} */" if len(f) > 4 and f[4] else ""
    if ctype.startswith("char["):
        return f"\tchar {name}[{c_size(ctype)}];{doc}"
    return f"\t{ctype} {name};{doc}"


def gen_python(spec: dict) -> str:
    out = ['"""GENERATED from schemas/records.toml by nestrace.schema.gen: do not edit."""',
           "",
           f"STREAM_MAGIC = 0x{spec['stream_magic']:08x}",
           f"STREAM_VERSION = {spec['stream_version']}",
           "",
           "# name -> dict(kind, version, table, size, doc, fields=[(name, numpy type,",
           "#   arrow type, unit, doc, byte offset)]); fields include the header.",
           "RECORDS = {"]
    for rec in spec["record"]:
        out.append(f"    {rec['name']!r}: {{")
        out.append(f"        'kind': {rec['kind']}, 'version': {rec['version']}, "
                   f"'table': {rec['table']!r}, 'size': {rec['size']},")
        out.append(f"        'doc': {rec['doc']!r},")
        out.append("        'fields': [")
        fields = spec["header"]["fields"] + rec["fields"]
        for f, (_, ctype, offset, _) in zip(fields, rec["layout"]):
            out.append(f"            ({f[0]!r}, {np_type(ctype)!r}, {f[2]!r}, "
                       f"{f[3]!r}, {f[4]!r}, {offset}),")
        out.append("        ],")
        out.append("    },")
    out.append("}")
    out.append("")
    out.append("# name -> dict(doc, fields=[(name, arrow type, unit, doc)])")
    out.append("TABLES = {")
    for t in spec["table"]:
        out.append(f"    {t['name']!r}: {{'doc': {t['doc']!r}, 'fields': [")
        for f in t["fields"]:
            out.append(f"        ({f[0]!r}, {f[1]!r}, {f[2]!r}, {f[3]!r}),")
        out.append("    ]},")
    out.append("}")
    out.append("")
    out.append("# name -> dict(field, doc, columns, values=[(value, name, *one per column)])")
    out.append("ENUMS = {")
    for en in spec.get("enum", []):
        cols = tuple(c[0] for c in en["columns"])
        out.append(f"    {en['name']!r}: {{'field': {en['field']!r}, 'doc': {en['doc']!r}, "
                   f"'columns': {cols!r}, 'values': [")
        for v in en["values"]:
            items = ", ".join(repr(tuple(x) if isinstance(x, list) else x) for x in v)
            out.append(f"        ({items}),")
        out.append("    ]},")
    out.append("}")
    out.append("")
    return "\n".join(out)


def gen_sql_sources(spec: dict) -> str:
    """correlate/sql/hostfs/sources.sql: the hostfs_source enum as a view."""
    (en,) = [e for e in spec.get("enum", []) if e["name"] == "hostfs_source"]
    rows = [f"  ({v[0]}, '{v[1]}', '{fs}')" for v in en["values"] for fs in v[2]]
    return "\n".join([
        "-- Module hostfs.sources: GENERATED from schemas/records.toml by",
        "-- nestrace.schema.gen: do not edit.",
        "",
        *textwrap.wrap(en["doc"], 76, initial_indent="-- ", subsequent_indent="-- "),
        "-- One row per (hook, host file system it is the access source for);",
        "-- fs_type '*' stands for any file system without rows of its own.",
        "-- `nestrace record` attaches no access hook unused for the stack's host",
        "-- FS by the same table (nestrace.capture.agent.unused_hooks).",
        "CREATE OR REPLACE VIEW _hostfs_sources AS",
        "SELECT * FROM (VALUES",
        ",\n".join(rows),
        ") AS t(source, hook, fs_type);",
        ""])


def _sql_value(x, sqltype: str) -> str:
    if isinstance(x, list):
        return "[" + ", ".join(_sql_value(i, sqltype) for i in x) + "]"
    if isinstance(x, str):
        return "'" + x.replace("'", "''") + "'"
    return str(x)


def gen_sql_codes(spec: dict) -> str:
    """correlate/sql/codes/tables.sql: every enum as a view of its rows, a
    macro from name to code (an unknown name is an error) and one from
    code to each column's value (NULL for a code not in the table)."""
    out = ["-- Module codes.tables: GENERATED from schemas/records.toml by",
           "-- nestrace.schema.gen: do not edit.", "",
           "-- The code tables of the record fields, for the modules to name codes",
           "-- instead of writing numbers: _<enum>('name') is the code (folded to a",
           "-- constant), _<enum>_<column>(code) the column's value for a code."]
    for en in spec.get("enum", []):
        name, cols = en["name"], en["columns"]
        out += ["", *textwrap.wrap(f"{en['field']}: {en['doc']}", 76, initial_indent="-- ",
                                   subsequent_indent="-- ")]
        rows = [f"  ({v[0]}, '{v[1]}'" + "".join(", " + _sql_value(x, c[1])
                                                 for x, c in zip(v[2:], cols)) + ")"
                for v in en["values"]]
        out += [f"CREATE OR REPLACE VIEW _code_{name} AS", "SELECT * FROM (VALUES",
                ",\n".join(rows),
                f") AS t(code, name{''.join(', ' + c[0] for c in cols)});"]
        whens = " ".join(f"WHEN '{v[1]}' THEN {v[0]}" for v in en["values"])
        # (no error() for an unknown name: DuckDB then refuses an alias of
        # the expression in the same SELECT; check_code_names finds them)
        out += [f"CREATE OR REPLACE MACRO _{name}(n) AS CASE n {whens} END;"]
        hi = max(v[0] for v in en["values"])
        for i, c in enumerate([("name", "VARCHAR", ""), *cols]):
            by_code = {v[0]: (v[1] if i == 0 else v[1 + i]) for v in en["values"]}
            items = ", ".join(_sql_value(by_code[k], c[1]) if k in by_code else "NULL"
                              for k in range(hi + 1))
            out.append(f"CREATE OR REPLACE MACRO _{name}_{c[0]}(code) AS "
                       f"([{items}]::{c[1] if i else 'VARCHAR'}[])[code + 1];")
    out.append("")
    return "\n".join(out)


def gen_docs(spec: dict) -> str:
    out = ["# Record reference", "",
           "GENERATED from `schemas/records.toml` by `python -m nestrace.schema.gen`.",
           "", "Every kernel record starts with the common header:", "",
           "| field | C type | Arrow | unit | doc |", "|---|---|---|---|---|"]
    for f in spec["header"]["fields"]:
        out.append(f"| `{f[0]}` | `{f[1]}` | {f[2]} | {f[3]} | {f[4]} |")
    for rec in spec["record"]:
        out += ["", f"## `{rec['table']}` — {rec['name']} (kind {rec['kind']}, "
                f"version {rec['version']}, {rec['size']} bytes)", "", rec["doc"], "",
                "| field | C type | Arrow | unit | offset | doc |",
                "|---|---|---|---|---|---|"]
        for f, (_, _, offset, _) in zip(rec["fields"], rec["layout"][len(spec["header"]["fields"]):]):
            if f[0].startswith("_pad"):
                continue
            out.append(f"| `{f[0]}` | `{f[1]}` | {f[2]} | {f[3]} | {offset} | {f[4]} |")
    for en in spec.get("enum", []):
        cols = [c[0] for c in en["columns"]]
        out += ["", f"## enum `{en['name']}` — `{en['field']}`", "", en["doc"], "",
                "| value | name | " + " | ".join(cols) + (" |" if cols else "|"),
                "|---|---|" + "---|" * len(cols)]
        for v in en["values"]:
            extra = [", ".join(x) if isinstance(x, list) else str(x) for x in v[2:]]
            out.append(f"| {v[0]} | `{v[1]}` | " + " | ".join(extra) + (" |" if extra else "|"))
        for c in en["columns"]:
            out.append(f"\n`{c[0]}`: {c[2]}")
    for t in spec["table"]:
        out += ["", f"## `{t['name']}` (store table)", "", t["doc"], "",
                "| field | Arrow | unit | doc |", "|---|---|---|---|"]
        for f in t["fields"]:
            out.append(f"| `{f[0]}` | {f[1]} | {f[2]} | {f[3]} |")
    out.append("")
    return "\n".join(out)


def generate(root: Path) -> list[Path]:
    spec = load()
    texts = dict(zip(OUTPUTS, (gen_header(spec), gen_arrow_header(spec), gen_python(spec),
                               gen_docs(spec), gen_sql_sources(spec), gen_sql_codes(spec))))
    written = []
    for rel, text in texts.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        written.append(p)
    return written


def check_code_names(spec: dict, sql_dir: Path) -> list[str]:
    """Every _<enum>('name') in the SQL modules names a value of the enum."""
    enums = {en["name"]: {v[1] for v in en["values"]} for en in spec.get("enum", [])}
    bad = []
    for p in sorted(sql_dir.rglob("*.sql")):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for enum, name in re.findall(r"\b_([a-z_]+)\('([a-z0-9_]+)'\)", line):
                if enum in enums and name not in enums[enum]:
                    bad.append(f"{p}:{i}: {enum} has no value named {name!r}")
    return bad


def check() -> list[str]:
    """Return a unified diff per generated file that drifted from schemas/."""
    drift = []
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        for rel in OUTPUTS:
            want = (Path(tmp) / rel).read_text().splitlines(keepends=True)
            have_p = ROOT / rel
            have = have_p.read_text().splitlines(keepends=True) if have_p.exists() else []
            if want != have:
                drift.append("".join(difflib.unified_diff(
                    have, want, f"{rel} (committed)", f"{rel} (from schemas/)")))
    return drift


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nestrace.schema.gen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if generated files drifted")
    args = ap.parse_args(argv)
    if args.check:
        drift = check()
        drift += [line + "\n" for line in check_code_names(load(), ROOT / "correlate" / "sql")]
        for d in drift:
            sys.stdout.write(d)
        if drift:
            print(f"check-generated: {len(drift)} file(s) drifted from schemas/records.toml; "
                  "run: python -m nestrace.schema.gen", file=sys.stderr)
            return 1
        print("check-generated: generated files match schemas/records.toml")
        return 0
    for p in generate(ROOT):
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
