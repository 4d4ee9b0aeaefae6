"""Per-level summary of one capture (what `record` prints at the end)."""
from __future__ import annotations

from pathlib import Path

from nestrace.query.session import Session

LEVELS = (("vfs", "vfs_io"), ("vdisk", "vdisk_io"), ("hostfs", "hostfs_io"), ("disk", "disk_io"))


def level_summary(store: Path, capture_id: str | None = None) -> dict:
    """ValueError for a capture the store does not hold (naming those it does)."""
    with Session(store) as s:
        caps = s.captures()
        if not caps:
            return {"capture_id": None, "levels": [], "lost": 0}
        # (the newest by start, as report and follow take it)
        cid = s.capture(capture_id)
        # the levels the capture traced (one side of a VM has two)
        traced = {r["level"] for r in s.rows(
            "SELECT DISTINCT level FROM device_map WHERE capture_id = ?", [cid])}
        levels = []
        for level, view in LEVELS:
            if traced and level not in traced:
                continue
            r = s.rows(f"""
                SELECT count(*) AS n,
                       count(*) FILTER (WHERE op = 'read') AS reads,
                       coalesce(sum(bytes) FILTER (WHERE op = 'read'), 0) AS read_bytes,
                       count(*) FILTER (WHERE op = 'write') AS writes,
                       coalesce(sum(bytes) FILTER (WHERE op = 'write'), 0) AS write_bytes,
                       count(*) FILTER (WHERE op NOT IN ('read', 'write')) AS other
                FROM {view} WHERE capture_id = ?""", [cid])[0]
            levels.append({"level": level, **r})
        meta = s.rows("SELECT lost_total, records_total, hooks_json FROM capture_meta "
                      "WHERE capture_id = ?", [cid])
        lost = meta[0]["lost_total"] if meta else 0
        return {"capture_id": cid, "levels": levels, "lost": lost,
                "records": meta[0]["records_total"] if meta else 0, "captures": len(caps)}


def _mib(b: int) -> str:
    return f"{b / (1 << 20):.1f}"


def format_summary(summary: dict) -> str:
    out = []
    if summary.get("captures", 1) > 1:     # (which one, when it could be another)
        out.append(f"capture {summary['capture_id']} (of {summary['captures']} in the store; "
                   "--capture picks one)")
    out += [f"{'level':<8}{'events':>10}{'reads':>10}{'read MiB':>10}{'writes':>10}"
           f"{'write MiB':>11}{'other':>8}"]
    for r in summary["levels"]:
        out.append(f"{r['level']:<8}{r['n']:>10}{r['reads']:>10}{_mib(r['read_bytes']):>10}"
                   f"{r['writes']:>10}{_mib(r['write_bytes']):>11}{r['other']:>8}")
    out.append(f"lost events: {summary['lost']}")
    return "\n".join(out)
