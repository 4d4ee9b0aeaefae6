-- Module block.requests: block events paired into requests.
-- INCLUDE base.levels
-- INCLUDE codes.tables

-- How long a bio's Q, G or X is its D's (ns): a D takes none longer
-- before it.  blk-mq times a request out after 30 s (its default); held
-- longer, it is a bio that was merged, or an address used again.  And
-- how long a start at a sector is an X's there: the kernel splits a bio
-- as it is queued.  (The importers pair the same way,
-- nestrace.importers.requests' STALE_NS and SPLIT_NS, and forget what is
-- older: their memory stays bounded.)
CREATE OR REPLACE MACRO _block_stale_ns() AS 30000000000::UBIGINT;
CREATE OR REPLACE MACRO _block_split_ns() AS 1000000000::UBIGINT;

-- The bio queue (Q) time of each split-off piece (X): a piece is never
-- queued itself; it inherits the Q of the bio it was cut from.  The kernel
-- cuts a big bio from its front, one piece after another, so a piece's
-- sector is where its parent Q started (first cut) or where the previous
-- cut's remainder started (aux_sector of the X before): each X is matched
-- to the latest Q or X at that (dev, sector), no more than
-- _block_split_ns() before it, and the chain followed to its Q.
CREATE OR REPLACE VIEW _block_split_q AS
WITH RECURSIVE x AS (
  SELECT capture_id, dev, bio_id, ts_ns, sector, aux_sector, (cpu::UBIGINT << 48) | seq AS x_id
  FROM block_events WHERE action = _block_action('x')),
start AS (   -- where a piece may begin: a Q's sector (only the Qs at a
             -- sector some piece begins at), or a remainder's
  SELECT q.capture_id, q.dev, q.ts_ns, q.sector AS key, _block_action('q') AS kind, q.ts_ns AS q_ns,
         NULL::UBIGINT AS x_id
  FROM block_events q SEMI JOIN x ON x.capture_id = q.capture_id AND x.dev = q.dev
                                 AND x.sector = q.sector
  WHERE q.action = _block_action('q')
  UNION ALL
  SELECT capture_id, dev, ts_ns, aux_sector, _block_action('x'), NULL, x_id FROM x
  WHERE aux_sector > sector),
pred AS (
  SELECT x.capture_id, x.dev, x.bio_id, x.ts_ns, x.x_id, s.kind, s.q_ns, s.x_id AS pred_id
  FROM x ASOF JOIN start s ON s.capture_id = x.capture_id AND s.dev = x.dev
                          AND s.key = x.sector AND x.ts_ns >= s.ts_ns
  WHERE x.ts_ns <= s.ts_ns + _block_split_ns()),
root(capture_id, dev, bio_id, ts_ns, x_id, q_ns) AS (
  SELECT capture_id, dev, bio_id, ts_ns, x_id, q_ns FROM pred WHERE kind = _block_action('q')
  UNION ALL
  SELECT p.capture_id, p.dev, p.bio_id, p.ts_ns, p.x_id, r.q_ns
  FROM pred p JOIN root r ON p.kind = _block_action('x') AND p.capture_id = r.capture_id AND p.pred_id = r.x_id)
SELECT capture_id, dev, bio_id, ts_ns, q_ns FROM root;

-- Computed requests, the columns `correlate` stores (_block_requests_core
-- may read stored ones instead): block_requests derives the rest (start,
-- phases, bytes, rwbs) when read; op stays (a filter on it reads fewer rows).  (Storing the derived columns too
-- took 0.85 s to write at 10 M events against 0.52 s without them.)
-- (The windows here key each device by its small number dk, not by its
-- capture's name and dev, and break ties in time by CPU alone: a sort
-- key of 24 bytes or less is DuckDB's fastest, and with the name in it the
-- two windows took twice as long.  An event's seq would only order two
-- events of one bio or request on one CPU in the same nanosecond: on a
-- clock of nanoseconds, two program runs apart, they never are.)
CREATE OR REPLACE VIEW _block_requests_computed AS
WITH by_bio AS (   -- Q, X, G, D of each bio address, in time order; D's own
                   -- columns ride along to the request window (one window
                   -- feeding the other: no join of two 2 M-row halves at
                   -- 10 M events, 5.5 -> 4.5 s)
  SELECT e.capture_id, e.dev, d.dk, e.rq_id, e.bio_id, e.ts_ns, e.sector, e.nr_sectors, e.req_op,
         e.req_flags, e.pid, e.comm, e.action, e.cpu, e.seq,
         lag(e.action) OVER w AS a1, lag(e.ts_ns) OVER w AS t1,
         lag(e.action, 2) OVER w AS a2, lag(e.ts_ns, 2) OVER w AS t2
  FROM block_events e JOIN _base_block_devs d USING (capture_id, dev)
  WHERE e.action IN (_block_action('q'), _block_action('g'), _block_action('d'),
                     _block_action('x'))
  WINDOW w AS (PARTITION BY e.bio_id, d.dk ORDER BY e.ts_ns, e.cpu::USMALLINT)),
ev AS (   -- each D with its first bio's Q, X, G (Q G D, Q D, X G D, X D), none
          -- more than _block_stale_ns() before it; I and C
  SELECT capture_id, dev, dk, rq_id, bio_id, ts_ns, sector, nr_sectors, req_op, req_flags, pid, comm,
         action, cpu, seq, NULL::INTEGER AS error,
         CASE WHEN a1 = _block_action('q') AND f1 THEN t1
              WHEN a1 = _block_action('g') AND a2 = _block_action('q') AND f2 THEN t2 END AS bq_ns,
         CASE WHEN a1 = _block_action('x') AND f1 THEN t1
              WHEN a1 = _block_action('g') AND a2 = _block_action('x') AND f2 THEN t2 END AS x_ns,
         CASE WHEN a1 = _block_action('g') AND f1 THEN t1 END AS g_ns
  FROM (SELECT *, ts_ns <= t1 + _block_stale_ns() AS f1, ts_ns <= t2 + _block_stale_ns() AS f2
        FROM by_bio WHERE action = _block_action('d'))
  UNION ALL
  SELECT e.capture_id, e.dev, d.dk, e.rq_id, e.bio_id, e.ts_ns, NULL, NULL, NULL, NULL, NULL, NULL,
         e.action, e.cpu, e.seq, e.error, NULL, NULL, NULL
  FROM block_events e JOIN _base_block_devs d USING (capture_id, dev)
  WHERE e.action IN (_block_action('i'), _block_action('c'))),
by_rq AS (   -- I, D, C of each request address, in time order
  SELECT *, lag(action) OVER w AS prev_action, lag(ts_ns) OVER w AS prev_ns,
         lead(action) OVER w AS next_action, lead(ts_ns) OVER w AS next_ns,
         lead(error) OVER w AS next_error
  FROM ev
  WINDOW w AS (PARTITION BY rq_id, dk ORDER BY ts_ns, cpu::USMALLINT)),
joined AS (   -- each D with the insert right before it, the completion right after it
  SELECT r.capture_id, r.dev, r.dk, r.rq_id, r.bio_id, r.ts_ns, r.sector, r.nr_sectors, r.req_op,
         r.req_flags, r.pid, r.comm, (r.cpu::UBIGINT << 48) | r.seq AS io_id,
         CASE WHEN r.prev_action = _block_action('i') THEN r.prev_ns END AS i_ns,
         CASE WHEN r.next_action = _block_action('c') THEN r.next_ns END AS c_ns,
         r.next_ns AS done_by_ns,
         CASE WHEN r.next_action = _block_action('c') THEN r.next_error END AS error,
         coalesce(r.bq_ns, sq.q_ns) AS q_ns, r.g_ns
  FROM by_rq r
  LEFT JOIN _block_split_q sq ON sq.capture_id = r.capture_id AND sq.dev = r.dev
                              AND sq.bio_id = r.bio_id AND sq.ts_ns = r.x_ns
  WHERE r.action = _block_action('d'))
SELECT j.capture_id, l.machine, l.level, j.dev, j.io_id, j.rq_id, j.ts_ns, j.q_ns, j.g_ns, j.i_ns,
       j.c_ns, j.done_by_ns, j.sector, j.nr_sectors, _req_op_name(j.req_op) AS op, j.req_op,
       j.req_flags, coalesce(j.error, 0) AS error, j.pid, j.comm
FROM joined j JOIN _base_block_devs l USING (dk)
UNION ALL   -- a capture recorded --per-request: its requests as the kernel kept them
            -- (unfinished: still dispatched at the capture's end, no end seen)
SELECT r.capture_id, l.machine, l.level, r.dev, (r.cpu::UBIGINT << 48) | r.seq, r.rq_id, r.d_ns,
       nullif(r.q_ns, 0), nullif(r.g_ns, 0), nullif(r.i_ns, 0),
       CASE WHEN r.action = _block_action('c') THEN r.ts_ns END,
       CASE WHEN r.action <> _block_action('unfinished') THEN r.ts_ns END, r.sector, r.nr_sectors,
       _req_op_name(r.req_op), r.req_op, r.req_flags, r.error, r.pid, r.comm
FROM block_request_records r JOIN _base_block_devs l USING (capture_id, dev)
WHERE r.action IN (_block_action('c'), _block_action('requeue'), _block_action('d'),
                   _block_action('unfinished'));

-- The paired requests: computed, or read from what `correlate` stored.
CREATE OR REPLACE VIEW _block_requests_core AS SELECT * FROM _block_requests_computed;

-- One row per dispatched (issued) block request on a traced disk, with its
-- lifecycle timestamps and btt phases.  Q and G are found through the
-- request's first bio (the Q, G just before D on that bio address, no
-- more than 30 s before it, _block_stale_ns(); a bio split off a bigger
-- one has the Q of the bio it was cut from), I and
-- C through the request id (the I just before D, the C just after it: a
-- requeued request's first dispatch has no C); a phase whose events were
-- not seen (no I/O scheduler insert, say) is NULL.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        vdisk or disk
-- @column dev UINTEGER         kernel dev_t of the disk
-- @column io_id UBIGINT        row id, unique in a capture (cpu << 48 | seq of the D event; of the block_request record, --per-request)
-- @column rq_id UBIGINT        request id (kernel address, reused over time)
-- @column ts_ns UBIGINT        dispatch (D) time, CLOCK_MONOTONIC ns
-- @column start_ns UBIGINT     first time the request was seen: Q, else G, else D
-- @column q_ns UBIGINT         bio queue (Q) time of the first bio (of the bio it was split from, for a split-off piece)
-- @column g_ns UBIGINT         get-request (G) time
-- @column i_ns UBIGINT         insert (I) time
-- @column d_ns UBIGINT         dispatch (D) time
-- @column c_ns UBIGINT         completion (C) time
-- @column done_by_ns UBIGINT   when the request was over at the latest: c_ns, or with no C recorded (lost, see capture_meta.completions_missed) the next insert or dispatch of its request id (the kernel frees a request at completion; a requeue ends a dispatch too); NULL when neither was seen
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
-- @column req_flags USMALLINT  nestrace flag bits (see docs/reference/records.md)
-- @column error INTEGER        completion status (0 ok)
-- @column pid UINTEGER         process current at dispatch
-- @column comm VARCHAR         task current at dispatch
CREATE OR REPLACE VIEW block_requests AS
SELECT capture_id, machine, level, dev, io_id, rq_id, ts_ns,
       coalesce(q_ns, g_ns, ts_ns) AS start_ns, q_ns, g_ns, i_ns, ts_ns AS d_ns, c_ns, done_by_ns,
       g_ns::BIGINT - q_ns::BIGINT AS q2g_ns,
       i_ns::BIGINT - g_ns::BIGINT AS g2i_ns,
       ts_ns::BIGINT - i_ns::BIGINT AS i2d_ns,
       c_ns::BIGINT - ts_ns::BIGINT AS d2c_ns,
       c_ns::BIGINT - q_ns::BIGINT AS q2c_ns,
       sector, nr_sectors,
       -- flushes carry sector (sector_t)-1: no position
       CASE WHEN sector < (1::UBIGINT << 54) THEN sector * 512 END AS offset_bytes,
       nr_sectors::UBIGINT * 512 AS bytes,
       op, _rwbs(req_op, req_flags) AS rwbs,
       req_op, req_flags, error, pid, comm
FROM _block_requests_core;
