"""Per-level summary of one capture (what `record` prints at the end)."""
from __future__ import annotations

import json
from pathlib import Path

from nestrace.query.session import Session

# what a chain that stops short lacks, by the level it stops at
STOPS = {"vfs": "the levels under the guest file system were not traced",
         "vdisk": "the host side was not traced (in a VM: `record --side host` on the host, "
                  "then `nestrace merge`)",
         "netfs": "the network file system's server is not this machine: its file system "
                  "and disks are not seen",
         "hostfs": "the host file system's disk was not traced"}
# the tracepoints a network hop's client requests come from, by its kind
# (stack_json net.kind): all missing, the netfs level is empty
NET_HOOKS = {"sshfs": ("fuse_request_send", "fuse_request_end"),
             "nfs": ("nfs_initiate_read", "nfs_initiate_write", "nfs_readpage_done",
                     "nfs_writeback_done")}


def untraced(stack_json: str | None, hooks_json: str | None) -> str | None:
    """Why the netfs level is empty on this kernel, if it is: none of
    the tracepoints its client's requests come from exists here."""
    try:
        net = json.loads(stack_json or "{}").get("net") or {}
        hooks = json.loads(hooks_json or "{}")
    except (ValueError, AttributeError):
        return None
    want = NET_HOOKS.get(net.get("kind", ""), ())
    if want and hooks and all(hooks.get(h, "missing") == "missing" for h in want):
        return (f"not traced: netfs (this kernel has no {', '.join(want)} tracepoints: "
                f"the {net['kind']} client's requests are not seen)")
    return None


def level_summary(store: Path, capture_id: str | None = None) -> dict:
    """Per level of a capture, in chain order (chain_levels, chain_io):
    its I/Os, reads, writes and others, and their bytes.  ValueError for a
    capture the store does not hold (naming those it does)."""
    with Session(store) as s:
        caps = s.captures()
        if not caps:
            return {"capture_id": None, "levels": [], "chain": [], "lost": 0}
        # (the newest by start, as report and follow take it)
        cid = s.capture(capture_id)
        # the levels the capture traced (one side of a VM has two), a
        # level with no I/O too
        levels = s.rows("""
            WITH l AS (SELECT DISTINCT position, level FROM chain_levels WHERE capture_id = $1),
            io AS (
              SELECT level, count(*) AS n,
                     count(*) FILTER (WHERE op = 'read') AS reads,
                     coalesce(sum(bytes) FILTER (WHERE op = 'read'), 0) AS read_bytes,
                     count(*) FILTER (WHERE op = 'write') AS writes,
                     coalesce(sum(bytes) FILTER (WHERE op = 'write'), 0) AS write_bytes,
                     count(*) FILTER (WHERE op NOT IN ('read', 'write')) AS other
              FROM chain_io WHERE capture_id = $1 GROUP BY level)
            SELECT l.level, coalesce(n, 0) AS n, coalesce(reads, 0) AS reads,
                   coalesce(read_bytes, 0)::BIGINT AS read_bytes, coalesce(writes, 0) AS writes,
                   coalesce(write_bytes, 0)::BIGINT AS write_bytes, coalesce(other, 0) AS other
            FROM l LEFT JOIN io USING (level) ORDER BY l.position""", [cid])
        meta = s.rows("SELECT lost_total, records_total, hooks_json, stack_json "
                      "FROM capture_meta WHERE capture_id = ?", [cid])
        lost = meta[0]["lost_total"] if meta else 0
        return {"capture_id": cid, "levels": levels, "chain": [r["level"] for r in levels],
                "lost": lost, "records": meta[0]["records_total"] if meta else 0,
                "captures": len(caps),
                "untraced": untraced(meta[0]["stack_json"], meta[0]["hooks_json"])
                if meta else None}


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
    chain = summary.get("chain", [])
    if chain:
        stop = f"; it stops at {chain[-1]}: {STOPS[chain[-1]]}" if chain[-1] in STOPS else ""
        out.append("chain: " + " > ".join(chain) + stop)
    if summary.get("untraced"):
        out.append(summary["untraced"])
    return "\n".join(out)
