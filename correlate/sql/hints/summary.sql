-- Module hints.summary: the hints an application gave about its I/O, and
-- the reads they asked for.
-- INCLUDE links.links

-- Per capture, system call and advice: the hint calls (vfs_hints), the
-- bytes their ranges covered, and the virtual-disk reads links puts down
-- to them (kind hint: a readahead(2), a WILLNEED or a madvise
-- POPULATE_READ queues its reads before it returns).  The other advice
-- (random, sequential, dontneed, ...) reads nothing itself; it changes
-- the guest's readahead and page cache, and never reaches the host,
-- which has its own.
-- @column capture_id VARCHAR   capture
-- @column syscall VARCHAR      fadvise64, uring_fadvise, readahead, madvise or uring_madvise
-- @column advice VARCHAR       the advice, as in vfs_hints; NULL for readahead
-- @column reads BOOLEAN        the calls read their range in (vfs_hints.reads)
-- @column calls BIGINT         calls
-- @column failed BIGINT        of them, calls that returned an error
-- @column range_bytes BIGINT   bytes of their ranges (a length 0, to the file's end, counts 0)
-- @column to_end_calls BIGINT  calls whose range ran to the file's end (fadvise64, uring_fadvise with length 0)
-- @column tied_requests BIGINT virtual-disk requests with bytes put down to them
-- @column tied_bytes BIGINT    virtual-disk bytes put down to them (links' kind hint)
CREATE OR REPLACE VIEW hints_summary AS
WITH h AS MATERIALIZED (SELECT * FROM vfs_hints),
t AS (   -- (links only where there are hints that read: none, usually)
  SELECT capture_id, upper_id AS io_id, count(DISTINCT lower_id) AS reqs, sum(bytes) AS bytes
  FROM links
  WHERE kind = 'hint' AND lower_level = 'vdisk'
    AND capture_id IN (SELECT capture_id FROM _links_hints)
  GROUP BY ALL)
SELECT h.capture_id, h.syscall, h.advice, h.reads, count(*) AS calls,
       count(*) FILTER (WHERE h.ret < 0) AS failed,
       coalesce(sum(h.req_bytes), 0)::BIGINT AS range_bytes,
       count(*) FILTER (WHERE h.to_end) AS to_end_calls,
       coalesce(sum(t.reqs), 0)::BIGINT AS tied_requests,
       coalesce(sum(t.bytes), 0)::BIGINT AS tied_bytes
FROM h LEFT JOIN t ON t.capture_id = h.capture_id AND t.io_id = h.io_id
GROUP BY ALL;
