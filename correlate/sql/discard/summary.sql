-- Module discard.summary: where a guest's discards end up down the stack.
-- INCLUDE links.links

-- Per level, the requests that unmap or zero a range: discards and
-- write-zeroes at the block levels (REQ_OP_WRITE_ZEROES, op write), holes
-- punched or ranges zeroed in the image at hostfs; and how many of their
-- bytes `links` ties to a request of the level above (vdisk: to an
-- application's fallocate that punched a hole in a guest file, whose
-- blocks a guest FS with online discard discards at its commit; hostfs
-- and disk: to the virtual-disk request that punched the hole in the
-- image; a host-disk discard comes from a host FS with online discard).  Bytes a
-- guest discards that the image never held reach no lower level.
-- @column capture_id VARCHAR       capture
-- @column level VARCHAR            vdisk, hostfs or disk
-- @column requests BIGINT          discard or write-zeroes requests (hostfs: op discard accesses)
-- @column discard_bytes BIGINT     bytes of the discards (hostfs: of the holes punched and ranges zeroed)
-- @column zeroes_bytes BIGINT      bytes of the write-zeroes requests (block levels; 0 at hostfs)
-- @column tied_bytes BIGINT        bytes links ties to a request of the level above
-- @column tied_fraction DOUBLE     tied_bytes / (discard_bytes + zeroes_bytes)
-- @column lag_median_ns DOUBLE     median over the tied links of lower start - upper end (kind discard) or - upper start (kind sync)
CREATE OR REPLACE VIEW discard_summary AS
WITH r AS (
  SELECT capture_id, 'vdisk' AS level, io_id, req_op = 9 AS zeroes, bytes::BIGINT AS bytes
  FROM vdisk_io WHERE op = 'discard' OR req_op = 9
  UNION ALL
  SELECT capture_id, 'hostfs', io_id, false, bytes::BIGINT FROM hostfs_io WHERE op = 'discard'
  UNION ALL
  SELECT capture_id, 'disk', io_id, req_op = 9, bytes::BIGINT
  FROM disk_io WHERE op = 'discard' OR req_op = 9),
t AS (
  SELECT l.capture_id, l.lower_level AS level, sum(l.bytes)::BIGINT AS tied_bytes,
         median(l.lag_ns) AS lag_median_ns
  FROM links l SEMI JOIN r
    ON r.capture_id = l.capture_id AND r.level = l.lower_level AND r.io_id = l.lower_id
  WHERE l.upper_id IS NOT NULL
  GROUP BY ALL),
s AS (
  SELECT capture_id, level, count(*) AS requests,
         coalesce(sum(bytes) FILTER (WHERE NOT zeroes), 0)::BIGINT AS discard_bytes,
         coalesce(sum(bytes) FILTER (WHERE zeroes), 0)::BIGINT AS zeroes_bytes
  FROM r GROUP BY ALL)
SELECT s.capture_id, s.level, s.requests, s.discard_bytes, s.zeroes_bytes,
       coalesce(t.tied_bytes, 0) AS tied_bytes,
       coalesce(t.tied_bytes, 0) / nullif(s.discard_bytes + s.zeroes_bytes, 0) AS tied_fraction,
       t.lag_median_ns
FROM s LEFT JOIN t USING (capture_id, level);
