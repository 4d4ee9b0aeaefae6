-- Module merge.potential: seed 001's merge potential at every block level.
-- Readahead and write-back send the pages of one batch as several
-- requests when the pages are not contiguous on the disk; a request that
-- could carry discontiguous pages would send them as one (up to the
-- device's largest request).
-- INCLUDE block.requests

-- Each batch of readahead or write-back requests on a traced disk (vdisk
-- or disk): the requests of one class on one device queued one after the
-- other, each within 100 us of the one before (a readahead, or a
-- flusher's pass over a file's dirty pages, queues its requests back to
-- back: on this machine a flusher's batches came out the same at gaps of
-- 50 to 200 us, where 1 ms chained a streaming workload's separate
-- readaheads into batches of hundreds).
-- Readahead: reads the kernel marks REQ_RAHEAD.  Write-back: page-cache
-- writes, the data writes not marked O_DIRECT's IDLE, META, PRIO, FUA or
-- PREFLUSH (the flusher's, and an fsync's writing back dirty pages).  Two
-- flushers writing to one device at once make one batch.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vdisk or disk
-- @column dev UINTEGER         kernel dev_t of the disk
-- @column class VARCHAR        readahead or writeback
-- @column batch UBIGINT        the batch's number on its device and class, from 1
-- @column start_ns UBIGINT     its first request's first event (Q), CLOCK_MONOTONIC ns
-- @column span_ns UBIGINT      from its first request's queueing to its last's
-- @column requests UBIGINT     requests sent
-- @column bytes UBIGINT        their bytes
-- @column segments UBIGINT     contiguous runs of disk space they cover (sorted by offset)
-- @column max_request_bytes UBIGINT the device's largest request: its max_sectors_kb when the capture kept it, else the largest request of the capture on it
-- @column needed UBIGINT       requests it would take if a request could carry discontiguous pages: the splits within a contiguous run stay (requests - segments + 1), the splits at the gaps between runs go, and no request is larger than the device takes (at least ceil(bytes / max_request_bytes))
-- @column saved BIGINT         requests - needed: the requests such transfers would save (0: no batch was split at a gap)
CREATE OR REPLACE VIEW merge_batches AS
WITH c AS (
  SELECT capture_id, level, dev, io_id, start_ns, offset_bytes, bytes,
         CASE WHEN op = 'read' THEN 'readahead' ELSE 'writeback' END AS class
  FROM block_requests
  WHERE bytes > 0 AND offset_bytes IS NOT NULL
    AND ((op = 'read' AND req_flags & 32 <> 0)
         OR (op = 'write' AND req_flags & (2 | 4 | 8 | 16 | 256) = 0))),
g AS (
  SELECT *, CASE WHEN start_ns - lag(start_ns) OVER w <= 100000 THEN 0 ELSE 1 END AS first
  FROM c WINDOW w AS (PARTITION BY capture_id, dev, class ORDER BY start_ns, io_id)),
b AS (
  SELECT *, sum(first) OVER (PARTITION BY capture_id, dev, class ORDER BY start_ns, io_id
                             ROWS UNBOUNDED PRECEDING)::UBIGINT AS batch
  FROM g),
s AS (   -- a request that does not start where the one below it in the batch ends starts a run
  SELECT *, CASE WHEN offset_bytes = lag(offset_bytes + bytes) OVER w THEN 0 ELSE 1 END AS run
  FROM b WINDOW w AS (PARTITION BY capture_id, dev, class, batch ORDER BY offset_bytes, io_id)),
mx AS (
  SELECT r.capture_id, r.dev, coalesce(
           1024 * json_extract(any_value(m.settings_json),
                               '$.max_sectors_kb.' || any_value(r.level))::UBIGINT,
           max(r.bytes)) AS max_request_bytes
  FROM block_requests r JOIN capture_meta m USING (capture_id) GROUP BY ALL)
SELECT s.capture_id, s.level, s.dev, s.class, s.batch, min(s.start_ns) AS start_ns,
       max(s.start_ns) - min(s.start_ns) AS span_ns, count(*)::UBIGINT AS requests,
       sum(s.bytes)::UBIGINT AS bytes, sum(s.run)::UBIGINT AS segments,
       any_value(mx.max_request_bytes) AS max_request_bytes,
       greatest(count(*) - sum(s.run) + 1,
                ceil(sum(s.bytes) / any_value(mx.max_request_bytes)))::UBIGINT AS needed,
       count(*)::BIGINT - greatest(count(*) - sum(s.run) + 1,
                                   ceil(sum(s.bytes) / any_value(mx.max_request_bytes)))::BIGINT
         AS saved
FROM s JOIN mx USING (capture_id, dev)
GROUP BY s.capture_id, s.level, s.dev, s.class, s.batch;

-- Per capture, block level, device and class: the merge potential of its
-- readahead and write-back batches (merge_batches): how many requests
-- each batch sent, and how many a transfer of discontiguous pages in one
-- request would have needed.  ratio > 1: the batches were split at the
-- pages' discontiguities, and one such request would carry what took
-- several (seed 001); 1: as few requests as the device takes.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vdisk or disk
-- @column dev UINTEGER         kernel dev_t of the disk
-- @column class VARCHAR        readahead or writeback
-- @column batches UBIGINT      batches
-- @column requests UBIGINT     requests they sent
-- @column bytes UBIGINT        their bytes
-- @column requests_per_batch DOUBLE mean requests per batch
-- @column max_requests_per_batch UBIGINT the most requests in one batch
-- @column segments_per_batch DOUBLE mean contiguous runs per batch
-- @column needed UBIGINT       requests the batches would need, each one transfer of discontiguous pages (merge_batches.needed, summed)
-- @column saved BIGINT         requests - needed
-- @column ratio DOUBLE         requests / needed
CREATE OR REPLACE VIEW merge_potential AS
SELECT capture_id, level, dev, class, count(*)::UBIGINT AS batches,
       sum(requests)::UBIGINT AS requests, sum(bytes)::UBIGINT AS bytes,
       avg(requests) AS requests_per_batch, max(requests) AS max_requests_per_batch,
       avg(segments) AS segments_per_batch, sum(needed)::UBIGINT AS needed,
       sum(saved)::BIGINT AS saved, sum(requests) / sum(needed) AS ratio
FROM merge_batches GROUP BY ALL;
