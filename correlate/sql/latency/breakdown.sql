-- Module latency.breakdown: where an application I/O's time goes.
-- INCLUDE links.links
-- INCLUDE size.histogram

-- Each application read/write split into the time spent at each level,
-- through the requests it caused synchronously (links of kind sync):
--   guest_queue   virtual-disk Q -> D
--   host_queue    host-disk Q -> D
--   device        host-disk D -> C
--   host_fs       virtual-disk D -> C minus host-disk Q -> C (the host FS,
--                 host page cache and loop/hypervisor path)
--   guest_service the syscall's time outside its virtual-disk requests
--                 (guest FS, guest page cache, syscall entry and exit)
-- The five add up to total_ns.  An I/O served from the guest page cache
-- is all guest_service.  With several requests per level, the span from
-- the first queue to the last completion is used.  A call with a request
-- whose dispatch or completion was not seen (a lost event:
-- capture_meta.completions_missed, requests_unfinished) has no parts:
-- ended is false and the five are NULL.
-- @column capture_id VARCHAR    capture
-- @column io_id UBIGINT         vfs_io row
-- @column op VARCHAR            read or write
-- @column class VARCHAR         request class: op and vscsiStats size bin, e.g. "read 4K"
-- @column bin_max_bytes BIGINT  the size bin's upper bound (NULL for >512K)
-- @column total_ns BIGINT       syscall duration
-- @column ended BOOLEAN         every request it caused was seen dispatched and completed (else the parts are NULL)
-- @column guest_service_ns BIGINT time outside the virtual-disk requests
-- @column guest_queue_ns BIGINT virtual-disk queue time (Q -> D)
-- @column host_fs_ns BIGINT     virtual-disk service time not spent in the host disk
-- @column host_queue_ns BIGINT  host-disk queue time (Q -> D)
-- @column device_ns BIGINT      host-disk service time (D -> C)
CREATE OR REPLACE VIEW latency_breakdown AS
WITH l AS MATERIALIZED (   -- (links planned and computed once, not twice; a link
                           -- is one row per lower, upper and kind: no DISTINCT;
                           -- joined on the capture's number, not its name: on
                           -- a 10 M-event store 0.69 -> 0.56 s for the summary)
  SELECT c.ck, x.lower_level, x.upper_id, x.lower_id
  FROM links x JOIN _base_captures c USING (capture_id)
  WHERE x.lower_level IN ('vdisk', 'disk') AND x.kind = 'sync' AND x.upper_id IS NOT NULL),
v AS (
  SELECT ck, upper_id AS vfs_id, lower_id AS vdisk_id FROM l
  WHERE lower_level = 'vdisk'),
vq AS (
  SELECT v.ck, v.vfs_id, min(r.start_ns) AS q, min(r.d_ns) AS d, max(r.c_ns) AS c,
         bool_and(r.d_ns IS NOT NULL AND r.c_ns IS NOT NULL) AS ended
  FROM v JOIN (SELECT c.ck, r.* FROM vdisk_io r JOIN _base_captures c USING (capture_id)) r
    ON r.ck = v.ck AND r.io_id = v.vdisk_id
  GROUP BY ALL),
dl AS (   -- (a disk request twice under one call, through two of its
          -- virtual-disk requests, changes no min or max below)
  SELECT l.ck, v.vfs_id, l.lower_id AS disk_id FROM l
  JOIN v ON v.ck = l.ck AND v.vdisk_id = l.upper_id
  WHERE l.lower_level = 'disk'),
dq AS (
  SELECT dl.ck, dl.vfs_id, min(r.start_ns) AS q, min(r.d_ns) AS d, max(r.c_ns) AS c,
         bool_and(r.d_ns IS NOT NULL AND r.c_ns IS NOT NULL) AS ended
  FROM dl JOIN (SELECT c.ck, r.* FROM disk_io r JOIN _base_captures c USING (capture_id)) r
    ON r.ck = dl.ck AND r.io_id = dl.disk_id
  GROUP BY ALL),
parts AS (
  SELECT f.capture_id, f.io_id, f.op, f.ret_bytes, f.duration_ns::BIGINT AS total_ns,
         coalesce(vq.ended, true) AND coalesce(dq.ended, true) AS ended,
         coalesce(vq.d::BIGINT - vq.q::BIGINT, 0) AS guest_queue_ns,
         coalesce(vq.c::BIGINT - vq.q::BIGINT, 0) AS vdisk_ns,
         coalesce(vq.c::BIGINT - vq.d::BIGINT, 0) AS vdisk_service_ns,
         coalesce(dq.d::BIGINT - dq.q::BIGINT, 0) AS host_queue_ns,
         coalesce(dq.c::BIGINT - dq.d::BIGINT, 0) AS device_ns,
         coalesce(dq.c::BIGINT - dq.q::BIGINT, 0) AS disk_ns
  FROM (SELECT c.ck, f.* FROM vfs_io f JOIN _base_captures c USING (capture_id)) f
  LEFT JOIN vq ON vq.ck = f.ck AND vq.vfs_id = f.io_id
  LEFT JOIN dq ON dq.ck = f.ck AND dq.vfs_id = f.io_id
  WHERE f.op IN ('read', 'write') AND f.ret_bytes > 0)
SELECT capture_id, io_id, op, op || ' ' || _size_label(ret_bytes) AS class,
       _size_bin(ret_bytes)::BIGINT AS bin_max_bytes, total_ns, ended,
       CASE WHEN ended THEN total_ns - vdisk_ns END AS guest_service_ns,
       CASE WHEN ended THEN guest_queue_ns END AS guest_queue_ns,
       CASE WHEN ended THEN vdisk_service_ns - disk_ns END AS host_fs_ns,
       CASE WHEN ended THEN host_queue_ns END AS host_queue_ns,
       CASE WHEN ended THEN device_ns END AS device_ns
FROM parts;

-- Mean of each part per request class (the stacked bars), over the calls
-- whose requests were all seen to end; the others are counted apart.
-- @column capture_id VARCHAR    capture
-- @column op VARCHAR            read or write
-- @column class VARCHAR         request class
-- @column bin_max_bytes BIGINT  the size bin's upper bound (NULL for >512K)
-- @column n BIGINT              application I/Os in the class with every request seen to end
-- @column n_unended BIGINT      those left out: a request they caused was not seen dispatched or completed
-- @column total_ns DOUBLE       mean syscall duration (of the n)
-- @column guest_service_ns DOUBLE mean guest service time
-- @column guest_queue_ns DOUBLE mean virtual-disk queue time
-- @column host_fs_ns DOUBLE     mean host FS time
-- @column host_queue_ns DOUBLE  mean host-disk queue time
-- @column device_ns DOUBLE      mean device time
CREATE OR REPLACE VIEW latency_breakdown_summary AS
SELECT capture_id, op, class, bin_max_bytes, count(*) FILTER (WHERE ended) AS n,
       count(*) FILTER (WHERE NOT ended) AS n_unended,
       (avg(total_ns) FILTER (WHERE ended))::DOUBLE AS total_ns,
       avg(guest_service_ns)::DOUBLE AS guest_service_ns, avg(guest_queue_ns)::DOUBLE AS guest_queue_ns,
       avg(host_fs_ns)::DOUBLE AS host_fs_ns, avg(host_queue_ns)::DOUBLE AS host_queue_ns,
       avg(device_ns)::DOUBLE AS device_ns
FROM latency_breakdown GROUP BY ALL;
