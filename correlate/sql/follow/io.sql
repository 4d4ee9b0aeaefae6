-- Module follow.io: one I/O followed up and down the stack through links.
-- INCLUDE links.links
-- INCLUDE chain.io
-- INCLUDE hostfs.io
-- INCLUDE depth.outstanding
-- LATE (follow_io is bound when created: after the stored links, it reads them)

-- Every level's I/Os in one shape (chain_io), and the hints, which links
-- ties the reads they ask for to (kind hint).
CREATE OR REPLACE VIEW _follow_rows AS
SELECT capture_id, level, io_id, start_ns, end_ns, latency_ns, op, dev, ino, offset_bytes, bytes,
       comm
FROM chain_io
UNION ALL
SELECT capture_id, level, io_id, ts_ns, end_ns, duration_ns::BIGINT, 'other', dev, ino,
       offset_bytes, req_bytes::BIGINT, comm
FROM vfs_hints;

-- One I/O of capture `cid` (level `lvl`, io_id `id`) and what `links` ties
-- to it: the lower requests it caused (depth 1, 2: a vfs call's
-- virtual-disk requests, their host-FS accesses and host-disk requests)
-- and the upper events that caused it (depth -1, -2), not their other
-- children.  A row per link: a request tied to it by two kinds is two
-- rows.  Use: SELECT * FROM follow_io('<capture>', 'disk', <io_id>).
-- @column capture_id VARCHAR   capture
-- @column depth INTEGER        0 the I/O itself; 1, 2 below it; -1, -2 above it
-- @column level VARCHAR        vfs, vdisk, hostfs or disk
-- @column io_id UBIGINT        the row's io_id in its level's view (vfs: vfs_io, or vfs_hints)
-- @column via_level VARCHAR    level of the neighbour toward depth 0 (NULL at 0)
-- @column via_id UBIGINT       io_id of that neighbour
-- @column kind VARCHAR         the link's kind (as in links)
-- @column link_bytes BIGINT    bytes of the lower one of the pair the link accounts for
-- @column lag_ns BIGINT        the link's lag (as in links)
-- @column start_ns UBIGINT     vfs: entry; block: first seen (Q, else G, else D); hostfs: the access
-- @column end_ns UBIGINT       vfs: exit; block: completion (or done_by_ns); hostfs: NULL
-- @column latency_ns BIGINT    end_ns - start_ns
-- @column op VARCHAR           the row's op (a vfs_hints row: other)
-- @column dev UINTEGER         kernel dev_t
-- @column ino UBIGINT          file (vfs, hostfs)
-- @column offset_bytes BIGINT  file offset (vfs, hostfs) or device offset (block levels); NULL where there is none (fsync, a flush)
-- @column bytes BIGINT         the row's whole size (vfs: bytes done; a vfs_hints row: its range, 0 to the file's end)
-- @column comm VARCHAR         task
-- @column in_flight BIGINT     I/Os of its device in flight when it arrived, itself included (as depth_arrivals.depth; NULL for hostfs, and for an I/O whose end was not seen)
CREATE OR REPLACE MACRO follow_io(cid, lvl, id) AS TABLE
WITH l AS MATERIALIZED (
  SELECT upper_level, upper_id, lower_level, lower_id, kind, bytes, lag_ns FROM links
  WHERE capture_id = cid AND upper_id IS NOT NULL),
down1 AS (
  SELECT 1 AS depth, lower_level AS level, lower_id AS io_id, upper_level AS via_level,
         upper_id AS via_id, kind, bytes AS link_bytes, lag_ns
  FROM l WHERE upper_level = lvl AND upper_id = id),
down2 AS (
  SELECT 2 AS depth, l.lower_level, l.lower_id, l.upper_level, l.upper_id, l.kind, l.bytes, l.lag_ns
  FROM l JOIN (SELECT DISTINCT level, io_id FROM down1) d
    ON l.upper_level = d.level AND l.upper_id = d.io_id),
up1 AS (
  SELECT -1 AS depth, upper_level AS level, upper_id AS io_id, lower_level AS via_level,
         lower_id AS via_id, kind, bytes AS link_bytes, lag_ns
  FROM l WHERE lower_level = lvl AND lower_id = id),
up2 AS (
  SELECT -2 AS depth, l.upper_level, l.upper_id, l.lower_level, l.lower_id, l.kind, l.bytes, l.lag_ns
  FROM l JOIN (SELECT DISTINCT level, io_id FROM up1) u
    ON l.lower_level = u.level AND l.lower_id = u.io_id),
t AS (
  SELECT 0 AS depth, lvl::VARCHAR AS level, id::UBIGINT AS io_id, NULL::VARCHAR AS via_level,
         NULL::UBIGINT AS via_id, NULL::VARCHAR AS kind, NULL::BIGINT AS link_bytes,
         NULL::BIGINT AS lag_ns
  UNION ALL SELECT * FROM down1 UNION ALL SELECT * FROM down2
  UNION ALL SELECT * FROM up1 UNION ALL SELECT * FROM up2),
me AS (   -- the tree's I/Os that have a queue (vfs, block), and what was
          -- in flight when each arrived: only their device's I/Os are read
  SELECT DISTINCT q.k, q.level, q.io_id, q.arrive_ns, q.ended FROM _depth_io q
  JOIN t ON q.capture_id = cid AND q.level = t.level AND q.io_id = t.io_id),
-- (the I/Os in flight at any of those arrivals first, by time alone: a
-- join on the device number would hash a million rows under each of a
-- few keys, 1 s at 10 M events)
near AS (
  SELECT q.k, q.io_id, q.arrive_ns, q.end_ns FROM _depth_io q
  WHERE q.arrive_ns <= (SELECT max(arrive_ns) FROM me)
    AND q.ended AND q.end_ns > (SELECT min(arrive_ns) FROM me)),
fl AS (
  SELECT me.level, me.io_id, count(*) AS in_flight
  FROM near q JOIN me ON q.k = me.k AND me.ended
   AND (q.arrive_ns < me.arrive_ns OR (q.arrive_ns = me.arrive_ns AND q.io_id <= me.io_id))
   AND q.end_ns > me.arrive_ns
  GROUP BY ALL)
-- (the tree's few rows on the right: the side a hash join builds)
SELECT cid::VARCHAR AS capture_id, t.depth, t.level, t.io_id, t.via_level, t.via_id, t.kind,
       t.link_bytes, t.lag_ns, r.start_ns, r.end_ns, r.latency_ns, r.op, r.dev, r.ino,
       r.offset_bytes::BIGINT AS offset_bytes, r.bytes, r.comm, fl.in_flight
FROM (SELECT * FROM _follow_rows WHERE capture_id = cid) r
RIGHT JOIN t ON r.level = t.level AND r.io_id = t.io_id
LEFT JOIN fl ON fl.level = t.level AND fl.io_id = t.io_id
ORDER BY t.depth, r.start_ns, t.level, t.io_id;
