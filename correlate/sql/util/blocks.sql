-- Module util.blocks: generic helpers over byte ranges (no level knowledge).

-- 4 KiB block numbers a byte range [off, off + len) touches.
CREATE OR REPLACE MACRO _blocks(off, len) AS
  range((off // 4096)::BIGINT, ((off + len + 4095) // 4096)::BIGINT);

-- Spans of 2^20 ns (~1 ms) a time window [s, e] touches: an equality key
-- that pairs a window with the instants inside it (an instant t is in span
-- t >> 20), so that a join on it compares only rows close in time.
CREATE OR REPLACE MACRO _ns_spans(s, e) AS
  range((s >> 20)::BIGINT, ((e >> 20) + 1)::BIGINT);

-- Bytes of [a, a + alen) inside [b, b + blen).
CREATE OR REPLACE MACRO _overlap(a, alen, b, blen) AS
  greatest(least(a + alen, b + blen)::BIGINT - greatest(a, b)::BIGINT, 0);

-- Class of a lower-level request nobody above explains, from its flags
-- (nestrace bits: 1 SYNC 2 META 8 FUA 16 PREFLUSH 32 RAHEAD 64 BACKGROUND
-- 256 IDLE).  SYNC | META | IDLE together is how jbd2 (ext3, ext4:
-- JBD2_JOURNAL_REQ_FLAGS) and the xfs log (xlog_write_iclog) write their
-- journals; a disk without FUA loses the commit block's FUA and PREFLUSH
-- to the flush machinery before dispatch, but not these.  A discard no
-- application call explains (fstrim's ioctl, the FS's online discard) is
-- its own class.
CREATE OR REPLACE MACRO _unattributed_kind(op, flags) AS
  CASE WHEN op = 'read' AND flags & 32 <> 0 THEN 'readahead'
       WHEN op = 'read' AND flags & 2 <> 0 THEN 'metadata'
       WHEN op = 'write' AND flags & (8 | 16) <> 0 THEN 'journal'
       WHEN op = 'write' AND flags & (1 | 2 | 256) = (1 | 2 | 256) THEN 'journal'
       WHEN flags & 2 <> 0 THEN 'metadata'
       WHEN op = 'write' AND flags & 1 <> 0 THEN 'journal'
       WHEN op = 'write' THEN 'writeback'
       WHEN op = 'discard' THEN 'discard'
       ELSE 'other' END;

-- The pairs of rows of relations `a` and `b` (each with key columns k0,
-- k1, k2 and a range [lo, hi), plus any columns) whose keys are equal and
-- whose ranges overlap: every column of a, and b's row as the struct o
-- (keep: also a's rows that overlap none, with o NULL, as a LEFT JOIN).
-- A join on the keys that compares the ranges would compare each row of a
-- with every row of b under its key (I/Os against the extents of a
-- fragmented file: quadratic).  Here b is sorted by lo; an ASOF join finds
-- the last row of b starting before a's end, another the first whose
-- running maximum end (b's ranges may overlap: copies, snapshots) is past
-- a's start; only the rows between them are compared.  Under a key with
-- few rows of b (32 or fewer: a file in a few extents) a plain join is
-- cheaper (the ASOF joins sort all of a), and is used.  (a and b must not
-- be named like the CTEs here: _ov_*.)  A use whose a or b is made with
-- another use takes the next copy: _overlaps_2, then _overlaps_3.
-- COPIES _overlaps: _overlaps_2 _overlaps_3
CREATE OR REPLACE MACRO _overlaps(a, b, keep := false) AS TABLE
WITH _ov_bi AS (SELECT *, row_number() OVER (ORDER BY k0, k1, k2, lo, hi) AS _i FROM query_table(b)),
_ov_bn AS (SELECT *, count(*) OVER (PARTITION BY k0, k1, k2) > 32 AS _big FROM _ov_bi WHERE hi > lo),
_ov_bx AS (SELECT * EXCLUDE (_big),
                  max(hi) OVER (PARTITION BY k0, k1, k2 ORDER BY _i ROWS UNBOUNDED PRECEDING) AS _reach
           FROM _ov_bn WHERE _big),
_ov_big AS (SELECT DISTINCT k0, k1, k2 FROM _ov_bx),
_ov_last AS (SELECT k0, k1, k2, lo, max(_i) AS _last FROM _ov_bx GROUP BY ALL),
_ov_first AS (SELECT k0, k1, k2, _reach, min(_i) AS _first FROM _ov_bx GROUP BY ALL),
_ov_c AS (   -- (an empty side of a join: DuckDB does not compute the other)
  SELECT x.*, l._last, f._first
  FROM (SELECT * FROM query_table(a) SEMI JOIN _ov_big USING (k0, k1, k2)) x
  ASOF LEFT JOIN _ov_last l ON l.k0 = x.k0 AND l.k1 = x.k1 AND l.k2 = x.k2 AND x.hi > l.lo
  ASOF LEFT JOIN _ov_first f ON f.k0 = x.k0 AND f.k1 = x.k1 AND f.k2 = x.k2 AND x.lo < f._reach),
_ov_p AS (SELECT * EXCLUDE (_last, _first), unnest(range(_first, _last + 1)) AS _i
          FROM _ov_c WHERE _first <= _last)
SELECT p.* EXCLUDE (_i), o
FROM _ov_p p JOIN _ov_bx o ON o._i = p._i
WHERE o.lo < p.hi AND p.lo < o.hi
UNION ALL   -- (keep: those with none; the row `_first` overlaps whenever _first <= _last)
SELECT * EXCLUDE (_last, _first), NULL AS o FROM _ov_c
WHERE keep AND (_first IS NULL OR _last IS NULL OR _first > _last)
UNION ALL   -- few rows of b under a key: each compared, as a plain join does
SELECT x.*, o
FROM query_table(a) x
LEFT JOIN (SELECT * EXCLUDE (_big), NULL::BIGINT AS _reach FROM _ov_bn WHERE NOT _big) o
  ON o.k0 = x.k0 AND o.k1 = x.k1 AND o.k2 = x.k2 AND o.lo < x.hi AND x.lo < o.hi
WHERE o._i IS NOT NULL
   OR (keep AND NOT EXISTS (SELECT 1 FROM _ov_big g WHERE g.k0 = x.k0 AND g.k1 = x.k1 AND g.k2 = x.k2));
