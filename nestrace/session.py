"""A DuckDB session on a store: raw tables as views over the Parquet files,
plus every SQL module under correlate/sql."""
from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa

from . import sqlmod
from .schema import RECORDS, TABLES, record_schema, table_schema
from .store import check_store, captures


def _raw_tables() -> dict[str, pa.Schema]:
    out = {}
    for name, spec in RECORDS.items():
        s = record_schema(name)
        out[spec["table"]] = s.append(pa.field("capture_id", pa.string()))
    for name in TABLES:
        out[name] = table_schema(name)
    return out


class Session:
    """Query a nestrace store with DuckDB SQL.

    >>> s = nestrace.open("demo.store")
    >>> s.query("SELECT level, count(*) FROM disk_io GROUP BY ALL")   # pyarrow.Table
    """

    def __init__(self, store: str | os.PathLike | None, *, memory_limit: str | None = None):
        self.store = check_store(store) if store is not None else None
        self.con = duckdb.connect()
        if memory_limit:
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        self._empties: dict[str, pa.Table] = {}
        for table, schema in _raw_tables().items():
            files = sorted(self.store.glob(f"{table}/capture=*/*.parquet")) if self.store else []
            if files:
                glob = str(self.store / table / "capture=*" / "*.parquet").replace("'", "''")
                self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM "
                                 f"read_parquet('{glob}', hive_partitioning = false, union_by_name = true)")
            else:
                self._empties[table] = schema.empty_table()
                self.con.register(table, self._empties[table])
        self.modules = sqlmod.discover()
        for m in sqlmod.load_order(self.modules):
            self.con.execute(m.text)

    @classmethod
    def from_tables(cls, tables: dict[str, pa.Table]) -> "Session":
        """A session on hand-built tables (diff tests, synthetic data)."""
        s = cls.__new__(cls)
        s.store = None
        s.con = duckdb.connect()
        s._empties = {}
        for table, schema in _raw_tables().items():
            t = tables.get(table)
            if t is None:
                t = schema.empty_table()
            elif isinstance(t, list):
                t = pa.Table.from_pylist(t, schema=schema)
            s._empties[table] = t
            s.con.register(table, t)
        s.modules = sqlmod.discover()
        for m in sqlmod.load_order(s.modules):
            s.con.execute(m.text)
        return s

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """Run SQL and return the result as an Arrow table."""
        return self.con.execute(sql, params or []).fetch_arrow_table()

    def df(self, sql: str, params: list | None = None):
        """Run SQL and return a pandas DataFrame."""
        return self.con.execute(sql, params or []).df()

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        cur = self.con.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def views(self) -> list[str]:
        """Public views, by name."""
        return sorted(sqlmod.public_views(self.modules))

    def captures(self) -> list[str]:
        return captures(self.store) if self.store else []

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open(store: str | os.PathLike, **kw) -> Session:  # noqa: A001 - public API name
    """Open a store for querying: `nestrace.open("demo.store").query(...)`."""
    return Session(store, **kw)
