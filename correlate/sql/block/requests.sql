-- Module block.requests: block events paired into requests.
-- INCLUDE base.levels

CREATE OR REPLACE VIEW _block_d AS
SELECT capture_id, dev, rq_id, bio_id, ts_ns, sector, nr_sectors, req_op, req_flags, pid, comm,
       (cpu::UBIGINT << 48) | seq AS io_id
FROM block_events WHERE action = 6;

-- One row per dispatched (issued) block request on a traced disk, with its
-- lifecycle timestamps and btt phases.  Q and G are found through the
-- request's first bio, I and C through the request id; a phase whose
-- events were not seen (no I/O scheduler insert, say) is NULL.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        vdisk or disk
-- @column dev UINTEGER         kernel dev_t of the disk
-- @column io_id UBIGINT        row id, unique in a capture (cpu << 48 | seq of the D event)
-- @column rq_id UBIGINT        request id (kernel address, reused over time)
-- @column ts_ns UBIGINT        dispatch (D) time, CLOCK_MONOTONIC ns
-- @column start_ns UBIGINT     first time the request was seen: Q, else G, else D
-- @column q_ns UBIGINT         bio queue (Q) time of the first bio
-- @column g_ns UBIGINT         get-request (G) time
-- @column i_ns UBIGINT         insert (I) time
-- @column d_ns UBIGINT         dispatch (D) time
-- @column c_ns UBIGINT         completion (C) time
-- @column q2g_ns BIGINT        G - Q
-- @column g2i_ns BIGINT        I - G
-- @column i2d_ns BIGINT        D - I
-- @column d2c_ns BIGINT        C - D: device service time
-- @column q2c_ns BIGINT        C - Q: total time in the block layer and device
-- @column sector UBIGINT       start sector at dispatch
-- @column nr_sectors UINTEGER  size in 512-byte sectors at dispatch
-- @column offset_bytes UBIGINT sector * 512 (NULL for requests without a position, e.g. flushes)
-- @column bytes UBIGINT        nr_sectors * 512
-- @column op VARCHAR           read, write, flush, discard or other
-- @column rwbs VARCHAR         blktrace-style flags (R/W/D/F, then F=FUA A=readahead S=sync M=meta)
-- @column req_op USMALLINT     kernel REQ_OP
-- @column req_flags USMALLINT  nestrace flag bits (see docs/records.md)
-- @column error INTEGER        completion status (0 ok)
-- @column pid UINTEGER         process current at dispatch
-- @column comm VARCHAR         task current at dispatch
CREATE OR REPLACE VIEW block_requests AS
WITH c AS (SELECT capture_id, dev, rq_id, ts_ns AS c_ns, error FROM block_events WHERE action = 7),
     i AS (SELECT capture_id, dev, rq_id, ts_ns AS i_ns FROM block_events WHERE action = 5),
     g AS (SELECT capture_id, dev, bio_id, ts_ns AS g_ns FROM block_events WHERE action = 4),
     q AS (SELECT capture_id, dev, bio_id, ts_ns AS q_ns FROM block_events WHERE action = 1),
     joined AS (
       SELECT d.*, q.q_ns, g.g_ns, i.i_ns, c.c_ns, c.error
       FROM _block_d d
       ASOF LEFT JOIN c ON d.capture_id = c.capture_id AND d.dev = c.dev
                       AND d.rq_id = c.rq_id AND c.c_ns >= d.ts_ns
       ASOF LEFT JOIN i ON d.capture_id = i.capture_id AND d.dev = i.dev
                       AND d.rq_id = i.rq_id AND d.ts_ns >= i.i_ns
       ASOF LEFT JOIN g ON d.capture_id = g.capture_id AND d.dev = g.dev
                       AND d.bio_id = g.bio_id AND d.ts_ns >= g.g_ns
       ASOF LEFT JOIN q ON d.capture_id = q.capture_id AND d.dev = q.dev
                       AND d.bio_id = q.bio_id AND d.ts_ns >= q.q_ns)
SELECT j.capture_id, l.machine, l.level, j.dev, j.io_id, j.rq_id, j.ts_ns,
       coalesce(j.q_ns, j.g_ns, j.ts_ns) AS start_ns, j.q_ns, j.g_ns,
       -- an insert older than this request's bio belongs to an earlier use of the address
       CASE WHEN j.i_ns >= coalesce(j.g_ns, j.q_ns, 0) THEN j.i_ns END AS i_ns,
       j.ts_ns AS d_ns, j.c_ns,
       j.g_ns::BIGINT - j.q_ns::BIGINT AS q2g_ns,
       (CASE WHEN j.i_ns >= coalesce(j.g_ns, j.q_ns, 0) THEN j.i_ns END)::BIGINT - j.g_ns::BIGINT AS g2i_ns,
       j.ts_ns::BIGINT - (CASE WHEN j.i_ns >= coalesce(j.g_ns, j.q_ns, 0) THEN j.i_ns END)::BIGINT AS i2d_ns,
       j.c_ns::BIGINT - j.ts_ns::BIGINT AS d2c_ns,
       j.c_ns::BIGINT - j.q_ns::BIGINT AS q2c_ns,
       j.sector, j.nr_sectors,
       -- flushes carry sector (sector_t)-1: no position
       CASE WHEN j.sector < (1::UBIGINT << 54) THEN j.sector * 512 END AS offset_bytes,
       j.nr_sectors::UBIGINT * 512 AS bytes,
       _req_op_name(j.req_op) AS op, _rwbs(j.req_op, j.req_flags) AS rwbs,
       j.req_op, j.req_flags, coalesce(j.error, 0) AS error, j.pid, j.comm
FROM joined j
JOIN base_levels l ON l.capture_id = j.capture_id AND l.dev = j.dev
                  AND l.level IN ('vdisk', 'disk');
