-- Module netfs.io: the requests a network file system's client sends its
-- server (level netfs): sshfs's FUSE requests.
-- INCLUDE base.levels
-- INCLUDE codes.tables

-- One row per request on a traced network mount: its send and its answer
-- (netfs_events, paired by the connection's request id).  Reads and
-- writes carry the file offset and the bytes asked for: with an image on
-- the mount, the image file's offsets, as at hostfs.  The other requests
-- are the metadata and attribute traffic (lookups, attributes, opens:
-- op meta) and the syncs (fsync, flush); they carry no offset.  A
-- request sent before the capture ended whose answer came after has no
-- end (end_ns NULL); an answer whose send was before the start is left out.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        always 'netfs'
-- @column io_id UBIGINT        row id, unique in a capture (the send's cpu << 48 | seq)
-- @column dev UINTEGER         kernel dev_t of the network mount
-- @column request UBIGINT      the request's id on its connection (FUSE: unique)
-- @column nodeid UBIGINT       the file it is on (FUSE: node id)
-- @column opcode VARCHAR       the operation (FUSE: lookup, getattr, read, write, fsync, ...)
-- @column op VARCHAR           read, write, sync or meta
-- @column offset_bytes BIGINT  read and write: the file offset asked for; NULL for the others
-- @column bytes UBIGINT        read and write: the bytes asked for; the others: the request's length on the wire
-- @column reply_bytes UBIGINT  the answer's length on the wire (a read's data and its header)
-- @column start_ns UBIGINT     sent, CLOCK_MONOTONIC ns
-- @column end_ns UBIGINT       answered (NULL: not in the capture)
-- @column latency_ns BIGINT    end_ns - start_ns
-- @column error INTEGER        the answer's status (negative errno), 0 when it succeeded
-- @column cached_write BOOLEAN a write from the client's page cache (FUSE WRITE_CACHE: writeback), not the caller's own
-- @column pid UINTEGER         the process the request is for (0: the kernel's own, as writeback)
-- @column comm VARCHAR         the task that sent it
CREATE OR REPLACE VIEW netfs_io AS
WITH s AS (
  SELECT * FROM netfs_events WHERE event = 1),
e AS (
  SELECT capture_id, dev, "unique", ts_ns, bytes, error FROM netfs_events WHERE event = 2)
SELECT s.capture_id, l.machine, 'netfs' AS level, (s.cpu::UBIGINT << 48) | s.seq AS io_id,
       s.dev, s."unique" AS request, s.nodeid, _fuse_opcode_name(s.opcode) AS opcode,
       coalesce(_fuse_opcode_op(s.opcode), 'meta') AS op,
       CASE WHEN s.offset_bytes >= 0 THEN s.offset_bytes END AS offset_bytes, s.bytes,
       e.bytes AS reply_bytes, s.ts_ns AS start_ns, e.ts_ns AS end_ns,
       e.ts_ns::BIGINT - s.ts_ns::BIGINT AS latency_ns, coalesce(e.error, 0) AS error,
       s.opcode = _fuse_opcode('write') AND s.flags & 1 <> 0 AS cached_write, s.pid, s.comm
FROM s
JOIN base_levels l ON l.capture_id = s.capture_id AND l.dev = s.dev AND l.level = 'netfs'
LEFT JOIN e ON e.capture_id = s.capture_id AND e.dev = s.dev AND e."unique" = s."unique"
           AND e.ts_ns >= s.ts_ns;
