-- Module netfs.io: the requests a network file system's client sends its
-- server (level netfs): sshfs's FUSE requests, NFS's READ, WRITE and
-- COMMIT calls; and the NFS server's reads and writes of its files.
-- INCLUDE base.levels
-- INCLUDE codes.tables

-- The requests of protos lo..hi paired (an internal macro of the views above).
CREATE OR REPLACE MACRO _netfs_pairs(lo, hi, lvl) AS TABLE
WITH s AS (
  SELECT * FROM netfs_events WHERE event = 1 AND proto BETWEEN lo AND hi),
e AS (
  SELECT capture_id, dev, proto, "unique", opcode, ts_ns, bytes, error, flags FROM netfs_events
  WHERE event = 2 AND proto BETWEEN lo AND hi)
SELECT s.capture_id, l.machine, lvl AS level, (s.cpu::UBIGINT << 48) | s.seq AS io_id,
       s.dev, ['fuse', 'nfs', 'nfsd'][s.proto] AS proto, s."unique" AS request, s.nodeid,
       CASE s.proto WHEN 1 THEN _fuse_opcode_name(s.opcode) ELSE _nfs_proc_name(s.opcode) END
         AS opcode,
       coalesce(CASE s.proto WHEN 1 THEN _fuse_opcode_op(s.opcode) ELSE _nfs_proc_op(s.opcode) END,
                'meta') AS op,
       CASE WHEN s.offset_bytes >= 0 THEN s.offset_bytes END AS offset_bytes, s.bytes,
       e.bytes AS reply_bytes, s.ts_ns AS start_ns, e.ts_ns AS end_ns,
       e.ts_ns::BIGINT - s.ts_ns::BIGINT AS latency_ns, coalesce(e.error, 0) AS error,
       CASE s.proto WHEN 1 THEN s.opcode = _fuse_opcode('write') AND s.flags & 1 <> 0
                    WHEN 2 THEN s.opcode = _nfs_proc('write') AND s.flags & 256 <> 0
                    ELSE false END AS cached_write,
       s.proto = 2 AND s.flags & 256 <> 0 AS cached,
       CASE WHEN s.proto = 2 AND s.opcode = _nfs_proc('write')
            THEN ['unstable', 'data_sync', 'file_sync'][(s.flags & 3) + 1] END AS stable,
       CASE WHEN s.proto = 2 AND s.opcode IN (_nfs_proc('write'), _nfs_proc('commit'))
            THEN ['unstable', 'data_sync', 'file_sync'][(e.flags & 3) + 1] END AS reply_stable,
       s.pid, s.comm
FROM s
JOIN base_levels l ON l.capture_id = s.capture_id AND l.dev = s.dev AND l.level = lvl
ASOF LEFT JOIN e ON e.capture_id = s.capture_id AND e.dev = s.dev AND e.proto = s.proto
                AND e."unique" = s."unique" AND e.opcode = s.opcode AND e.ts_ns >= s.ts_ns;

-- One row per request on a traced network mount: its send and its answer
-- (netfs_events, paired by the request's id: the first answer after the
-- send with its id; an NFS client's ids are kernel addresses, used again
-- by later calls).  Reads and
-- writes carry the file offset and the bytes asked for: with an image on
-- the mount, the image file's offsets, as at hostfs.  The other requests
-- are the metadata and attribute traffic (lookups, attributes, opens:
-- op meta) and the syncs (fsync, flush; NFS COMMIT, which has a range);
-- FUSE's carry no offset.  NFS: the client's READ, WRITE and COMMIT
-- calls, and its metadata calls (GETATTR, SETATTR, LOOKUP, ACCESS,
-- CREATE, REMOVE, NFSv4's OPEN by name: the client's own call, which
-- sends the RPC; paired by task and call).  A
-- request sent before the capture ended whose answer came after has no
-- end (end_ns NULL); an answer whose send was before the start is left out.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        always 'netfs'
-- @column io_id UBIGINT        row id, unique in a capture (the send's cpu << 48 | seq)
-- @column dev UINTEGER         kernel dev_t of the network mount
-- @column proto VARCHAR        fuse or nfs
-- @column request UBIGINT      the request's id (FUSE: unique on its connection; NFS: the call's kernel address, a metadata call's task)
-- @column nodeid UBIGINT       the file it is on (FUSE: node id; NFS: its inode number on the mount)
-- @column opcode VARCHAR       the operation (FUSE: lookup, getattr, read, write, fsync, ...; NFS: read, write, commit, getattr, setattr, lookup, access, create, remove, open)
-- @column op VARCHAR           read, write, sync or meta
-- @column offset_bytes BIGINT  read and write: the file offset asked for; NULL for the others
-- @column bytes UBIGINT        read and write: the bytes asked for; the others: the request's length on the wire
-- @column reply_bytes UBIGINT  FUSE: the answer's length on the wire (a read's data and its header); NFS: the bytes read or written
-- @column start_ns UBIGINT     sent, CLOCK_MONOTONIC ns
-- @column end_ns UBIGINT       answered (NULL: not in the capture)
-- @column latency_ns BIGINT    end_ns - start_ns
-- @column error INTEGER        the answer's status (negative errno), 0 when it succeeded
-- @column cached_write BOOLEAN a write from the client's page cache (FUSE WRITE_CACHE; NFS: not O_DIRECT): writeback, not the caller's own
-- @column stable VARCHAR       NFS WRITE: the stable how asked (unstable, data_sync, file_sync); NULL otherwise
-- @column reply_stable VARCHAR NFS WRITE and COMMIT: how the server says it stored the bytes; NULL otherwise
-- @column pid UINTEGER         the process the request is for (0: the kernel's own, as writeback)
-- @column comm VARCHAR         the task that sent it
CREATE OR REPLACE VIEW netfs_io AS
SELECT * EXCLUDE (cached) FROM _netfs_pairs(1, 2, 'netfs');

-- Each NFS server's (nfsd's) read or write of a file traced at hostfs
-- (the image it exports, or on a gateway the export's files): the
-- server's file operations, between the client's call (netfs_io) and its
-- file system's work (hostfs_io).  Same columns as netfs_io; level
-- 'hostfs', dev the server's file system's, request the call's xid,
-- nodeid the file's inode number, reply_bytes the bytes done.
-- @column capture_id VARCHAR   capture
-- @column machine VARCHAR      machine that recorded it
-- @column level VARCHAR        always 'hostfs'
-- @column io_id UBIGINT        row id, unique in a capture
-- @column dev UINTEGER         kernel dev_t of the server's file system
-- @column proto VARCHAR        always 'nfsd'
-- @column request UBIGINT      the call's xid
-- @column nodeid UBIGINT       the file's inode number
-- @column opcode VARCHAR       read or write
-- @column op VARCHAR           read or write
-- @column offset_bytes BIGINT  the file offset
-- @column bytes UBIGINT        the bytes asked for
-- @column reply_bytes UBIGINT  the bytes read or written
-- @column start_ns UBIGINT     nfsd began, CLOCK_MONOTONIC ns
-- @column end_ns UBIGINT       the file system had done it (NULL: not in the capture)
-- @column latency_ns BIGINT    end_ns - start_ns
-- @column error INTEGER        always 0 (nfsd's errors have tracepoints of their own, not traced)
-- @column cached_write BOOLEAN always false
-- @column stable VARCHAR       always NULL
-- @column reply_stable VARCHAR always NULL
-- @column pid UINTEGER         always 0
-- @column comm VARCHAR         the nfsd thread
CREATE OR REPLACE VIEW netfs_server_io AS
SELECT * EXCLUDE (cached) FROM _netfs_pairs(3, 3, 'hostfs');
