"""Build large captures with real structure by replicating a real one.

Each copy of the source capture is shifted in time past the previous one
(and its per-CPU sequence numbers past the previous copy's), so the result
is one long capture that the correlator treats like a real trace: same
devices, same extent maps, same request mix, `copies` times as long.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nestrace.schema import kernel_tables
from nestrace.store.files import (
    PARQUET_OPTIONS,
    check_store,
    column_options,
    init_store,
    with_crc_marker,
    write_parquet_file,
)
from nestrace.store.manifest import clean_unpublished, publish

STORE_TABLES = ("device_map", "extent_maps", "capture_meta", "lost_events", "agent_stats")


def _read(store: Path, table: str, capture_id: str) -> pa.Table:
    return pq.read_table(store / table / f"capture={capture_id}" / "data.parquet")


def replicate(src: str | Path, dst: str | Path, copies: int, capture_id: str | None = None,
              new_id: str = "synthetic") -> int:
    """Write a capture `new_id` into store `dst` made of `copies` time-shifted
    copies of `capture_id` (default: the only capture) of store `src`.
    Returns the number of kernel records written."""
    src_p = check_store(src)
    caps = sorted(p.name.split("=", 1)[1] for p in (src_p / "capture_meta").iterdir())
    cid = capture_id or caps[-1]
    dst_p = init_store(dst)
    clean_unpublished(dst_p, new_id)
    meta = _read(src_p, "capture_meta", cid).to_pylist()[0]
    ev = {t: _read(src_p, t, cid) for t in kernel_tables() if t != "agent_stats"}
    t0 = min(pc.min(t["ts_ns"]).as_py() for t in ev.values() if t.num_rows)
    t1 = max(pc.max(t["ts_ns"]).as_py() for t in ev.values() if t.num_rows)
    span = (t1 - t0) + 1_000_000
    max_seq = max(pc.max(t["seq"]).as_py() or 0 for t in ev.values() if t.num_rows)
    total = 0
    for table, t in ev.items():
        out_dir = dst_p / table / f"capture={new_id}"
        out_dir.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(out_dir / "data.parquet", with_crc_marker(t.schema),
                              **column_options(t.schema),
                              **PARQUET_OPTIONS) as w:
            for k in range(copies):
                if not t.num_rows:
                    break
                c = t.set_column(t.schema.get_field_index("ts_ns"), "ts_ns",
                                 pc.add(t["ts_ns"], pa.scalar(k * span, pa.uint64())))
                c = c.set_column(c.schema.get_field_index("seq"), "seq",
                                 pc.add(c["seq"], pa.scalar(k * max_seq, pa.uint64())))
                c = c.set_column(c.schema.get_field_index("capture_id"), "capture_id",
                                 pa.repeat(pa.scalar(new_id), c.num_rows))
                w.write_table(c)
                total += c.num_rows
            if not t.num_rows:
                w.write_table(t)
    for table in STORE_TABLES:
        t = _read(src_p, table, cid)
        t = t.set_column(t.schema.get_field_index("capture_id"), "capture_id",
                         pa.repeat(pa.scalar(new_id), t.num_rows))
        if table == "capture_meta":
            t = pa.Table.from_pylist([meta | {"capture_id": new_id, "records_total": total,
                                              "end_ns": meta["start_ns"] + copies * span}],
                                     schema=t.schema)
        out_dir = dst_p / table / f"capture={new_id}"
        out_dir.mkdir(parents=True, exist_ok=True)
        write_parquet_file(t, out_dir / "data.parquet")
    publish(dst_p, new_id)
    return total
