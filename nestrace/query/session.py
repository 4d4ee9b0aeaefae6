"""A DuckDB session on a store: raw tables as views over the Parquet files,
plus every SQL module under correlate/sql."""
from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from nestrace.query import sqlmod
from nestrace.schema import RECORDS, TABLES, record_schema, table_schema
from nestrace.store.files import captures, check_store
from nestrace.store.manifest import store_files
from nestrace.store.seal import DAMAGE_NOTE, damage_of


def raw_tables() -> dict[str, pa.Schema]:
    """Every table a store holds (kernel records with capture_id, and the
    store-only tables) -> its current schema."""
    out = {}
    for name, spec in RECORDS.items():
        s = record_schema(name)
        out[spec["table"]] = s.append(pa.field("capture_id", pa.string()))
    for name in TABLES:
        out[name] = table_schema(name)
    return out


# what `nestrace correlate` stores, in STORE/<name>/, and the view that
# reads it: `_<name>_computed` gives the rows stored (rmw maps the writes
# through the offset maps links was computed from: in `correlate` they are
# already in memory; in `report`, reading no stored rmw, mapping them again
# was ~0.35 s of every run).  block_requests is stored without the columns
# it derives when read (_block_requests_core: the paired requests)
MATERIALIZED = {"block_requests": "_block_requests_core", "links": "links", "rmw": "rmw"}
# what links reads, lower first: computed once into tables before links,
# its plan binds to scans of them instead of expanding each view at every
# use (on an 82k-event capture, planning was ~1.5 s of links' 2.2 s)
LINKS_INPUTS = ["_base_image_files", "_map_image_cluster", "map_extents", "_map_guest_freed",
                "_map_image_freed", "_map_image_moved", "_map_vdisk_ranges", "_map_vdisk_pieces",
                "_map_vfs_ranges", "_map_vdisk", "_links_hints_keyed"]
# links and the shared intermediates it reads, lower first: what a command
# that reads links computes once (Session.cache_links)
LINKS_CACHE = ["_block_requests_core", *LINKS_INPUTS, "_map_disk", "links"]
# one I/O followed (Session.follow_io, `nestrace follow`): capture, level, io_id
FOLLOW_SQL = "SELECT * FROM follow_io(?, ?, ?)"
# store tables that gained columns after stores were first written
GROWN = ("device_map", "capture_meta", "extent_maps", "mapping_events")


def _quiet(con) -> None:
    """No progress bar on stdout: sessions are used from scripts and pipes.
    (Inside Jupyter DuckDB refuses to touch the setting without ipywidgets;
    there the default is fine.)"""
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:
        pass


def _plan(con) -> None:
    """links' ASOF joins are on blocks unnested from requests; from a few
    large requests (a fstrim's discards) the planner expects a few rows
    and plans a nested loop, quadratic in the real ones (4 discards of
    487 MiB: 27 s, against 1.6 s for the whole query with the ASOF join).

    DuckDB's projection pull-up and placement passes take time superlinear
    in the plan's size, and links' plan is large: planning `links` on an
    uncorrelated 80k-event store took 7.5 s of optimizer time (5.9 s in
    pull-up, 0.8 s in placement) of a 9.8 s query; without them 0.8 s, and
    the query 3.0 s.  They only move projections; results are the same.

    DuckDB's build-side pass swaps a join's sides when it thinks the
    written build (right) side the larger; its estimates for unnested
    blocks are far too low, so it swapped `_links_blocks`' rmw filter
    (`k IN (SELECT k FROM unread)`: upper blocks probing a set that is
    usually empty) and built a hash table of every upper block.  At 10 M
    events that failed a 256 MB limit ("failed to pin block"); with the
    pass off it fits (peak RSS 0.5 GiB), and 1 M and 10 M events take the
    same time.  Our SQL puts the smaller side on the right: it is built
    as written."""
    con.execute("SET asof_loop_join_threshold = 0")
    con.execute("SET disabled_optimizers = "
                "'projection_pullup,projection_placement,build_side_probe_side'")


# Arrow type -> DuckDB type, for the types schemas/ declares
_SQL_TYPES = {pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER", pa.uint64(): "UBIGINT",
              pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.string(): "VARCHAR",
              pa.bool_(): "BOOLEAN"}


def _empty_view(name: str, schema: pa.Schema) -> str:
    """A view with no rows and the schema's columns, in SQL: registering an
    empty Arrow table instead makes DuckDB import pandas, ~0.4 s of every
    command's start-up."""
    cols = ", ".join(f'NULL::{_SQL_TYPES[f.type]} AS "{f.name}"' for f in schema)
    return f"CREATE OR REPLACE VIEW {name} AS SELECT {cols} WHERE false"


def _names_reading(mods: dict[str, sqlmod.Module], module: str) -> set[str]:
    """The objects that read module's objects, directly or through others,
    and module's own: found by name in each object's statement, among the
    modules that include module (directly or not).  (compare_captures'
    module includes links, for amplification_per_io, but compare_captures
    itself does not read it: computing links for it cost 25 s on a study's
    16 captures.)"""
    reads = {module}
    grew = True
    while grew:
        more = {n for n, m in mods.items() if reads.intersection(m.includes)} - reads
        reads |= more
        grew = bool(more)
    bodies = {o: b for n in reads & mods.keys() for o, b in sqlmod.bodies(mods[n].text).items()}
    found = {name for _, name in mods[module].objects} if module in mods else set()
    grew = True
    while grew:
        more = {o for o, body in bodies.items() if o not in found and _names_any(body, found)}
        found |= more
        grew = bool(more)
    return found


def _names_any(sql: str, names: set[str]) -> bool:
    """Whether SQL names any of these (as a word; a string or comment that
    does counts too, which costs only time)."""
    return bool(names) and re.search(
        r"\b(" + "|".join(re.escape(n) for n in sorted(names)) + r")\b", sql, re.I) is not None


def _sql_list(files: list[Path]) -> str:
    """Files as a DuckDB list of strings."""
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


def arrow_of(rel) -> pa.Table:
    """A DuckDB relation's rows as an Arrow table (DuckDB 2 calls it
    to_arrow_table; older versions arrow())."""
    fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
    return fetch()

class Session:
    """Query a nestrace store with DuckDB SQL.

    >>> s = nestrace.open("demo.store")
    >>> s.query("SELECT level, count(*) FROM disk_io GROUP BY ALL")   # pyarrow.Table
    """

    def __init__(self, store: str | os.PathLike | None, *, memory_limit: str | None = None,
                 late_modules: bool = True, read_anyway: bool | None = None,
                 captures: list[str] | None = None):
        self.store = check_store(store) if store is not None else None
        # (only these captures of the store: a study's report goes through
        # its captures a few at a time)
        self._only = None if captures is None else frozenset(captures)
        self._cached: set[str] = set()     # views cache() made tables of
        self.con = duckdb.connect()
        _quiet(self.con)
        _plan(self.con)
        # every view over the store re-binds read_parquet(); without the
        # cache each binding reads every file's footer again
        self.con.execute("SET parquet_metadata_cache = true")
        if memory_limit:
            self.con.execute(f"SET memory_limit = '{memory_limit}'")
        # the published captures' files, checked against their manifests
        # (read_anyway: a file its manifest does not describe is a warning,
        # not an error; default: $NESTRACE_READ_ANYWAY, `nestrace --read-anyway`)
        self._read_anyway = read_anyway
        self._files = store_files(self.store, read_anyway, frozenset(MATERIALIZED)) \
            if self.store else {}
        for table, schema in raw_tables().items():
            files = self._table_files(table)
            if files:
                src = f"read_parquet({_sql_list(files)}, hive_partitioning = false, " \
                      "union_by_name = true)"
                if table in GROWN:
                    # a store written before a column was added: NULL there
                    self.con.execute(_empty_view(f"_{table}_now", schema))
                    src = f"(SELECT * FROM _{table}_now UNION ALL BY NAME SELECT * FROM {src})"
                self.con.execute(sqlmod.deferred(f"CREATE VIEW {table} AS SELECT * FROM {src}"))
            else:
                self.con.execute(_empty_view(table, schema))
        self.modules = sqlmod.discover()
        order = sqlmod.load_order(self.modules)
        for m in order:
            if not m.late:
                self.con.execute(sqlmod.deferred(m.text))
        self._use_stored_views()
        # (see sqlmod.load_order; `correlate` and `report` need none of
        # them).  Created on first use: binding follow_io on a store not
        # yet correlated plans links from the raw tables, ~0.5 s of every
        # `nestrace sql` that never calls it.
        self._late = [m for m in order if m.late and late_modules]
        # a query naming links or a view built on it computes links once
        # first (cache_links), unless `correlate` stored it
        self._links_names = _names_reading(self.modules, "links.links")
        self._auto_links = "links" not in self.stored_views

    def _use_stored_views(self, refresh: bool = False) -> None:
        """Read what `nestrace correlate` stored (block_requests, links, rmw) from
        the store; compute it for captures it has not been run on."""
        self.stored_views = set()
        if not self.store:
            return
        if refresh and self._files is not None:   # (what `correlate` has stored since)
            self._files = store_files(self.store, self._read_anyway, frozenset(MATERIALIZED))
        caps = set(captures(self.store))
        if self._only is not None:
            caps &= self._only
        for view in MATERIALIZED:
            files = self._table_files(view)
            if not files:
                continue
            target = MATERIALIZED[view]
            want = (self.con.sql(f"SELECT * FROM _{view}_computed").columns
                    if target.startswith("_") else self._documented_columns(view))
            stale, damaged = [], []
            for f in files:
                try:
                    if pq.read_schema(f).names != want:
                        stale.append(f)
                except (pa.ArrowException, OSError) as e:
                    damaged.append(f)
                    print(f"nestrace: warning: {f}: unreadable ({str(e).splitlines()[0]}): computing "
                          f"{view} for that capture; run `nestrace correlate` again to store "
                          "it anew", file=sys.stderr)
            if stale:   # written by an older nestrace: computed again until re-run
                print(f"nestrace: warning: {view} stored by an older version in {len(stale)} "
                      f"capture(s) of {self.store} (e.g. {stale[0]}): computing it; "
                      "run `nestrace correlate` again to store it anew", file=sys.stderr)
            if stale or damaged:
                files = [f for f in files if f not in stale and f not in damaged]
                if not files:
                    continue
            stored = {f.parent.name.split("=", 1)[1] for f in files}
            self.con.execute(sqlmod.deferred(
                f"CREATE OR REPLACE VIEW _{view}_stored AS SELECT * FROM "
                f"read_parquet({_sql_list(files)}, hive_partitioning = false)"))
            missing = sorted(caps - stored)
            if not missing:         # the common case: never plan the computation
                self.stored_views.add(view)
                self.con.execute(sqlmod.deferred(
                    f"CREATE OR REPLACE VIEW {target} AS SELECT * FROM _{view}_stored"))
                continue
            ids = ", ".join("'" + c.replace("'", "''") + "'" for c in missing)
            self.con.execute(sqlmod.deferred(
                f"CREATE OR REPLACE VIEW {target} AS SELECT * FROM _{view}_stored "
                f"UNION ALL BY NAME SELECT * FROM _{view}_computed "
                f"WHERE capture_id IN ({ids})"))

    def _table_files(self, table: str) -> list[Path]:
        """A table's files: the published captures' (a store written
        before manifests: every capture's there)."""
        if not self.store:
            return []
        if self._files is None:
            files = self.store.glob(f"{table}/capture=*/data.parquet")
        else:
            files = self._files.get(table, [])
        if self._only is not None:
            files = [f for f in files if f.parent.name.split("=", 1)[1] in self._only]
        return sorted(files)

    def _documented_columns(self, view: str) -> list[str]:
        """The public view's columns, as its module documents them."""
        for m in self.modules.values():
            for v in m.views:
                if v.name == view:
                    return [c.name for c in v.columns]
        raise KeyError(view)

    @classmethod
    def from_tables(cls, tables: dict[str, pa.Table], *, cache_links: bool = True) -> "Session":
        """A session on hand-built tables (diff tests, synthetic data).  Like
        a session on a store not yet correlated, a query that reads links
        computes links (and what it reads) once first: that is the path
        users' queries take, and planning the plain view chain took ~3 s
        even on three rows.  cache_links=False queries the plain views."""
        s = cls.__new__(cls)
        s.store = None
        s._only = None
        s._cached = set()
        s.con = duckdb.connect()
        _quiet(s.con)
        _plan(s.con)
        s.stored_views = set()
        s._tables = {}   # kept alive: DuckDB scans them in place
        for table, schema in raw_tables().items():
            t = tables.get(table)
            if t is None:
                t = schema.empty_table()
            elif isinstance(t, list):
                t = pa.Table.from_pylist(t, schema=schema)
            s._tables[table] = t
            s.con.register(table, t)
        s.modules = sqlmod.discover()
        order = sqlmod.load_order(s.modules)
        for m in order:
            if not m.late:
                s.con.execute(sqlmod.deferred(m.text))
        s._late = [m for m in order if m.late]     # (created on first use, as in __init__)
        s._links_names = _names_reading(s.modules, "links.links")
        s._auto_links = cache_links
        return s

    def _prepare(self, sql: str) -> None:
        """Before SQL runs: compute links once if it reads links and links
        is not stored; create each late module (sqlmod.load_order) the
        first time SQL names one of its objects."""
        if self._auto_links and _names_any(sql, self._links_names):
            self.cache_links()
        late = {m.name: m for m in self._late}
        hit = {n for n, m in late.items() if _names_any(sql, {o for _, o in m.objects})}
        todo = list(hit)
        while todo:     # (and the late modules those include)
            for dep in late[todo.pop()].includes:
                if dep in late and dep not in hit:
                    hit.add(dep)
                    todo.append(dep)
        if hit:
            for m in self._late:
                if m.name in hit:
                    self.con.execute(sqlmod.deferred(m.text))
            self._late = [m for m in self._late if m.name not in hit]

    def execute(self, sql: str, params: list | None = None) -> duckdb.DuckDBPyConnection:
        """Run SQL and return DuckDB's cursor (`.description`, `.fetchall()`)."""
        self._prepare(sql)
        with self._damage_noted():
            return self.con.execute(sql, params or [])

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """Run SQL and return the result as an Arrow table."""
        self._prepare(sql)
        with self._damage_noted():
            rel = self.con.sql(sql, params=params or None)
            if rel is None:                 # a statement with no result
                return pa.table({})
            return arrow_of(rel)

    @contextlib.contextmanager
    def _damage_noted(self):
        """A DuckDB error from a damaged file of the store gets a note (shown
        with its traceback) naming the file and the byte range that does
        not read; the error itself is DuckDB's, as it was."""
        try:
            yield
        except duckdb.Error as e:
            damage = damage_of(self.store, e) if self.store is not None else None
            if damage:
                e.add_note(f"{DAMAGE_NOTE}{damage}")
            raise

    def df(self, sql: str, params: list | None = None):
        """Run SQL and return a pandas DataFrame."""
        cur = self.execute(sql, params)
        with self._damage_noted():
            return cur.df()

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        cur = self.execute(sql, params)
        cols = [d[0] for d in cur.description]
        with self._damage_noted():
            return [dict(zip(cols, r)) for r in cur.fetchall()]

    def views_to_cache(self, views: list[str]) -> list[str]:
        """Of these shared intermediates (lower first, links last), those
        worth computing once into memory: not the ones read from the store
        (a stored view is read back from Parquet faster than it is copied
        into a table), and none of those under links when links is stored
        (then each is read once at most)."""
        stored = {MATERIALIZED[v] for v in self.stored_views}
        if "links" in stored:
            return [v for v in views if v == "_block_requests_core" and v not in stored]
        return [v for v in views if v not in stored]

    def cache_links(self) -> None:
        """Compute links once for this session (and what it reads), unless
        `correlate` stored it: a query reading links, or a view built on
        it, would otherwise plan and run the whole view at each use, some
        views several times in one query (on the demo's store, 16k I/Os not
        yet correlated: `follow` 10.3 s, the latency plot 5.4 s).  Queries
        through this session that name any of them call it first."""
        self._auto_links = False
        views = self.views_to_cache(LINKS_CACHE)
        if "links" in views and not self.con.execute(
                "SELECT count(*) FROM _links_captures "
                "WHERE capture_id NOT IN (SELECT capture_id FROM _links_bare)").fetchone()[0]:
            # (no capture links can tie anything in, as an imported blktrace
            # file: its rows alone, without planning the block-by-block
            # join, which took 0.6 s of a 1.1 s links on such a store)
            self._cache_from("links", "_links_bare_rows")
            views = [v for v in views if v != "links"]
        self.cache(views)

    def cache(self, views: list[str]) -> None:
        """Compute these views once for this session: each becomes a table,
        and the view reads it, so every view built on it reuses the rows.
        Give them in dependency order (lower first); one cached already is
        left as it is."""
        for v in views:
            if v not in self._cached:   # (report.build runs once per capture in `html`)
                self._cache_from(v, v)

    def _cache_from(self, v: str, source: str) -> None:
        """View `v` becomes the rows of view `source`, computed now."""
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE _cache_{v} AS SELECT * FROM {source}")
        self.con.execute(f"CREATE OR REPLACE VIEW {v} AS SELECT * FROM temp._cache_{v}")
        self._cached.add(v)

    # ---- metrics: each returns an Arrow table, optionally for one capture ----
    def _view(self, name: str, capture_id: str | None) -> pa.Table:
        if capture_id is None:
            return self.query(f"SELECT * FROM {name}")
        # (ValueError naming the store's captures, not an empty table, for a typo)
        return self.query(f"SELECT * FROM {name} WHERE capture_id = ?", [self.capture(capture_id)])

    def links(self, capture_id: str | None = None) -> pa.Table:
        """Each lower request tied to the upper event(s) that caused it."""
        return self._view("links", capture_id)

    def amplification(self, capture_id: str | None = None) -> pa.Table:
        """Bytes per level and op, with ratios to the level above and the app."""
        return self._view("amplification", capture_id)

    def phases(self, capture_id: str | None = None) -> pa.Table:
        """btt phases (Q2G, G2I, I2D, D2C, Q2C, Q2M) per device."""
        return self._view("phases_stats", capture_id)

    def seek_distances(self, capture_id: str | None = None) -> pa.Table:
        """Seek distance of every I/O after the first of its stream."""
        return self._view("seek_distances", capture_id)

    def seek_summary(self, capture_id: str | None = None) -> pa.Table:
        return self._view("seek_summary", capture_id)

    def size_histogram(self, capture_id: str | None = None) -> pa.Table:
        """I/O sizes per level in vscsiStats bins."""
        return self._view("size_histogram", capture_id)

    def merge_ratio(self, capture_id: str | None = None) -> pa.Table:
        return self._view("size_merge_ratio", capture_id)

    def readahead(self, capture_id: str | None = None) -> pa.Table:
        """Readahead bytes per level, used and unused."""
        return self._view("readahead_summary", capture_id)

    def rmw(self, capture_id: str | None = None) -> pa.Table:
        """Read-modify-write per hop."""
        return self._view("rmw_summary", capture_id)

    def sync_transform(self, capture_id: str | None = None) -> pa.Table:
        return self._view("sync_transform", capture_id)

    def discard_summary(self, capture_id: str | None = None) -> pa.Table:
        return self._view("discard_summary", capture_id)

    def files(self, capture_id: str | None = None) -> pa.Table:
        """The application's files, one row each (view vfs_files)."""
        return self._view("vfs_files", capture_id)

    def processes(self, capture_id: str | None = None) -> pa.Table:
        """The processes that made the application's calls (view vfs_processes)."""
        return self._view("vfs_processes", capture_id)

    def hints(self, capture_id: str | None = None) -> pa.Table:
        """The application's readahead(2), posix_fadvise and madvise calls, per call
        and advice, with the virtual-disk bytes tied to them."""
        return self._view("hints_summary", capture_id)

    def depth(self, capture_id: str | None = None) -> pa.Table:
        """Queue depth per level and device: I/Os in flight at each arrival
        (mean, median, p99, max), aqu-sz and %util."""
        return self._view("depth_summary", capture_id)

    def depth_histogram(self, capture_id: str | None = None) -> pa.Table:
        """vscsiStats' outstanding-I/O, interarrival and latency histograms."""
        return self._view("depth_histogram", capture_id)

    def compare_captures(self, capture_id: str | None = None) -> pa.Table:
        """One row per capture (in capture order): its stack and the numbers
        that tell stacks apart."""
        if capture_id is None:
            return self.query("SELECT * FROM compare_captures ORDER BY capture_id")
        return self._view("compare_captures", capture_id)

    def compare_stacks(self) -> pa.Table:
        """One row per stack of repeated captures (lab run --repeat): the
        rounds' medians and the throughput's spread."""
        return self.query("SELECT * FROM compare_stacks ORDER BY capture_ids[1]")

    def views(self) -> list[str]:
        """Public views, by name."""
        return sorted(sqlmod.public_views(self.modules))

    def captures(self) -> list[str]:
        return captures(self.store) if self.store else []

    def capture(self, capture_id: str | None = None) -> str:
        """`capture_id` if the store holds it, or by default its newest
        capture (the last to start); ValueError naming what it holds otherwise."""
        caps = [r["capture_id"] for r in self.rows(
            "SELECT capture_id FROM capture_meta GROUP BY 1 ORDER BY min(start_ns), capture_id")]
        if not caps:
            raise ValueError("the store holds no capture")
        cid = capture_id or caps[-1]
        if cid not in caps:
            raise ValueError(f"no capture {cid!r} in the store (have: {', '.join(caps)})")
        return cid

    def follow_io(self, level: str, io_id: int, capture_id: str | None = None) -> pa.Table:
        """One I/O and what links ties to it above and below (the
        follow_io macro)."""
        from nestrace.query.pick import pick
        cid = self.capture(capture_id)
        pick(self, cid, level, io_id)   # (ValueError for an I/O the capture lacks, not NULLs)
        return self.query(FOLLOW_SQL, [cid, level, io_id])

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open(store: str | os.PathLike, **kw) -> Session:  # noqa: A001 - public API name
    """Open a store for querying: `nestrace.open("demo.store").query(...)`."""
    return Session(store, **kw)


def stores_from_env(var: str = "NESTRACE_STORES", default: str = "demo.store") -> list[str]:
    """The stores a notebook reads: those named in $var (comma separated),
    else `default` (ci/demo's store) in the working directory or one above
    it, as a notebook run from notebooks/ finds it.  FileNotFoundError
    saying what to run or set when there is none."""
    named = os.environ.get(var)
    if named:
        return [p for p in named.split(",") if p]
    for d in (Path.cwd(), Path.cwd().parent):
        if (d / default).is_dir():
            return [str(d / default)]
    raise FileNotFoundError(f"no store: set {var} to one (comma separated for several), or "
                            f"run ci/demo, which leaves {default} in the repository")
