-- Module links.links: the causal join — each lower request tied to the
-- upper event(s) that caused it.
-- INCLUDE map.ranges
-- INCLUDE util.blocks
-- INCLUDE codes.tables

-- Hops, each in one address space, cut into 4 KiB blocks:
--   vfs -> vdisk   virtual-disk bytes (file pieces through the guest extents)
--   vdisk -> hostfs image-file bytes (loop offset, or qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks clusters applied;
--                  a backing file's bytes at its shift, _base_image_files)
--   vdisk -> disk  host-disk bytes (through the image's extents); the
--                  host FS access has no end time, so disk requests are tied
--                  to the virtual-disk request whose image range they serve.
--                  A host FS on several disks (btrfs RAID) puts each disk
--                  in its own stretch of this space: + shift (_links_disks).

-- The host disks of each capture, numbered: disk k's bytes are at
-- k << 50 (1 PiB each; blocks stay under _links_key's 2^48).
CREATE OR REPLACE VIEW _links_disks AS
SELECT capture_id, dev,
       ((row_number() OVER (PARTITION BY capture_id ORDER BY dev) - 1) << 50)::BIGINT AS shift
FROM (SELECT DISTINCT capture_id, dev FROM device_map WHERE level = 'disk');

-- Rows of view `t` (capture_id and image bytes [s, t), plus any columns)
-- carried onto the host disks through the image's extents, in pieces:
-- u_off (in links' disk space, _links_disks) and u_len.
CREATE OR REPLACE MACRO _links_onto_disks(t) AS TABLE
WITH _od_r AS NOT MATERIALIZED (
  SELECT r.capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, r.s::BIGINT AS lo,
         r.t::BIGINT AS hi, r.*
  FROM query_table(t) r)
SELECT q.* EXCLUDE (k0, k1, k2, lo, hi, o),
       _map_on_disk_off(greatest(q.lo, q.o.lo), q.o.delta, q.o.zp) + x.shift AS u_off,
       _map_on_disk_len(greatest(q.lo, q.o.lo), least(q.hi, q.o.hi), q.o.zlen) AS u_len
FROM _overlaps('_od_r', '_map_image_extents_keyed') q
JOIN _links_disks x ON x.capture_id = q.capture_id AND x.dev = q.o.disk_dev;

-- The same through where moved or freed image bytes were at the start
-- (_map_image_moved), with its freed and placed.
CREATE OR REPLACE MACRO _links_onto_moved(t) AS TABLE
WITH _om_r AS NOT MATERIALIZED (
  SELECT r.capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, r.s::BIGINT AS lo,
         r.t::BIGINT AS hi, r.*
  FROM query_table(t) r),
_om_m AS (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, lo, hi, delta, disk_dev,
                 freed, placed, zp, zlen
          FROM _map_image_moved)
SELECT q.* EXCLUDE (k0, k1, k2, lo, hi, o),
       _map_on_disk_off(greatest(q.lo, q.o.lo), q.o.delta, q.o.zp) + x.shift AS u_off,
       _map_on_disk_len(greatest(q.lo, q.o.lo), least(q.hi, q.o.hi), q.o.zlen) AS u_len,
       q.o.freed, q.o.placed
FROM _overlaps_2('_om_r', '_om_m') q   -- (_overlaps_2: the moved ranges are found with _overlaps)
JOIN _links_disks x ON x.capture_id = q.capture_id AND x.dev = q.o.disk_dev;

-- (vfs -> vdisk: the pieces on the virtual disk, cut by the guest file's
-- extents only: cut again where the image's extents end, as map_vfs
-- is, two pieces of one call could share a block, and the block would
-- be tied to one of them)
CREATE OR REPLACE VIEW _links_upper AS
WITH vp AS MATERIALIZED (   -- (planned once: each use of a view is planned anew)
  SELECT p.capture_id, p.io_id, p.start_ns, p.done_by_ns, p.op, p.req_op, p.vdisk_s, p.s, p.t,
         c.cs
  FROM _map_vdisk_pieces p LEFT JOIN _map_image_cluster c USING (capture_id)
  WHERE p.s IS NOT NULL),
-- writes into an image whose cluster map is known at start and end (cs),
-- cluster by cluster (_map_write_clusters), in image bytes [s, t): the
-- whole cluster where it was allocated during the capture, which the
-- hypervisor writes whole (the write's part, and the rest copied from a
-- backing file or zeros) or zeroes first (an fallocate of the image: op
-- discard at the host FS); else the write's part
wc AS MATERIALIZED (
  SELECT capture_id, io_id, start_ns, done_by_ns, allocated, c, cs, idelta,
         CASE WHEN allocated THEN c ELSE vs END + idelta AS s,
         CASE WHEN allocated THEN c + cs ELSE vt END + idelta AS t
  FROM _map_write_clusters('vp')),
-- where those allocated clusters were at the capture's start (a backing
-- file): the copy-on-write reads the rest of the cluster there while the
-- write is in flight (rmw; a backing file is not written, so these rows
-- claim no write).  (_overlaps_2: _links_onto_disks uses _overlaps on
-- these rows; a join on the capture alone compared each allocated
-- cluster with every cluster of the start map)
wck AS NOT MATERIALIZED (
  SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, c AS lo, c + cs AS hi,
         capture_id, io_id, start_ns, done_by_ns, idelta
  FROM wc WHERE allocated),
startk AS (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, lo, hi, delta
           FROM _map_image_start),
cow AS (
  SELECT capture_id, io_id, start_ns, done_by_ns,
         greatest(lo, o.lo) + o.delta AS s, least(hi, o.hi) + o.delta AS t
  FROM _overlaps_2('wck', 'startk') WHERE o.delta <> idelta)
SELECT 'vfs' AS upper_level, 'vdisk' AS lower_level, capture_id, io_id AS upper_id,
       ts_ns AS u_start, end_ns AS u_end, op AS u_op, vs AS u_off, vt - vs AS u_len,
       unnest(_blocks(vs, vt - vs)) AS blk
FROM _map_vfs_ranges
UNION ALL
SELECT 'vdisk', 'hostfs', capture_id, io_id, start_ns, done_by_ns, op,
       s, t - s, unnest(_blocks(s, t - s))
FROM vp WHERE NOT (op = 'write' AND cs IS NOT NULL)
UNION ALL
SELECT 'vdisk', 'hostfs', capture_id, io_id, start_ns, done_by_ns, 'write',
       s, t - s, unnest(_blocks(s, t - s))
FROM wc
UNION ALL
SELECT 'vdisk', 'hostfs', capture_id, io_id, start_ns, done_by_ns, 'discard',
       s, t - s, unnest(_blocks(s, t - s))
FROM wc WHERE allocated
UNION ALL
SELECT 'vdisk', 'hostfs', capture_id, io_id, start_ns, done_by_ns, 'write',
       s, t - s, unnest(_blocks(s, t - s))
FROM cow
UNION ALL
-- a write-zeroes request (REQ_OP_WRITE_ZEROES, op write) is also offered
-- to the host FS's discards: the loop device makes it an fallocate of the
-- image (a hole punched, or with REQ_NOUNMAP a range zeroed), where a
-- hypervisor may write the zeroes instead
SELECT 'vdisk', 'hostfs', capture_id, io_id, start_ns, done_by_ns, 'discard',
       s, t - s, unnest(_blocks(s, t - s))
FROM vp WHERE req_op = 9
UNION ALL
SELECT 'vdisk', 'disk', m.capture_id, m.io_id, m.start_ns, m.done_by_ns, m.op,
       m.disk_offset_bytes::BIGINT + x.shift, m.disk_bytes::BIGINT,
       unnest(_blocks(m.disk_offset_bytes::BIGINT + x.shift, m.disk_bytes))
FROM _map_vdisk m JOIN _links_disks x ON x.capture_id = m.capture_id AND x.dev = m.disk_dev
WHERE m.disk_offset_bytes IS NOT NULL
  AND NOT (m.op = 'write' AND m.capture_id IN (SELECT capture_id FROM _map_image_cluster))
UNION ALL
SELECT 'vdisk', 'disk', capture_id, io_id, start_ns, done_by_ns, 'write', u_off, u_len,
       unnest(_blocks(u_off, u_len))
FROM _links_onto_disks('wc')
UNION ALL
SELECT 'vdisk', 'disk', capture_id, io_id, start_ns, done_by_ns, 'write', u_off, u_len,
       unnest(_blocks(u_off, u_len))
FROM _links_onto_disks('cow');

-- The same hop vdisk -> disk through where moved or freed image bytes
-- were at the start (_map_image_moved: copy-on-write hosts, holes
-- punched; and bytes allocated and freed during the capture): used for
-- reads, for discards (a host FS with online discard discards the blocks
-- a hole punched for a virtual-disk discard or write-zeroes freed), and
-- for the writes a read-modify-write read is put down to, not for
-- write-back (a freed old place may hold other data later); for writes in
-- flight with them only through freed bytes (op write_freed: a
-- copy-on-write host writes a rewritten block elsewhere), but for places
-- a copy-on-write host's mapping event gave, where it wrote the bytes
-- during the capture: write-back there too (op write_placed: btrfs
-- writes back each page to a new place, and a later rewrite moves it on).
-- (only the captures with moved bytes are carried into the image again)
CREATE OR REPLACE VIEW _links_moved_ranges AS
WITH c AS MATERIALIZED (SELECT DISTINCT capture_id FROM _map_image_moved)
SELECT * FROM _map_vdisk_ranges WHERE capture_id IN (SELECT capture_id FROM c)
UNION ALL
SELECT * REPLACE ('discard' AS op) FROM _map_vdisk_ranges
WHERE req_op = 9 AND capture_id IN (SELECT capture_id FROM c);

CREATE OR REPLACE VIEW _links_upper_moved AS
WITH v AS NOT MATERIALIZED (
  SELECT capture_id, io_id, start_ns, done_by_ns, op, ps + idelta AS s, pt + idelta AS t
  FROM _map_into_image('_links_moved_ranges') WHERE idelta IS NOT NULL),
p AS (
  SELECT capture_id, io_id, start_ns, done_by_ns AS u_end, op, u_off, u_len, freed, placed
  FROM _links_onto_moved('v'))
-- (op write_freed: a virtual-disk write carried to where image bytes freed
-- during the capture were (_map_image_freed: the start snapshot's place,
-- or for bytes allocated during the capture, the mapping events'), tied
-- to a host-disk write only while in flight with it, never as write-back;
-- op write_placed: where a copy-on-write host's mapping event put them,
-- in flight or as write-back: it wrote the bytes there during the
-- capture, at a write-back)
SELECT 'vdisk' AS upper_level, 'disk' AS lower_level, capture_id, io_id AS upper_id,
       start_ns AS u_start, u_end,
       CASE WHEN freed AND op = 'write' THEN CASE WHEN placed THEN 'write_placed' ELSE 'write_freed' END
            ELSE op END AS u_op,
       u_off, u_len, unnest(_blocks(u_off, u_len)) AS blk
FROM p;

CREATE OR REPLACE VIEW _links_lower_io AS
SELECT 'vdisk' AS lower_level, capture_id, io_id AS lower_id, start_ns AS l_start, op AS l_op,
       req_flags AS l_flags, req_op = 9 AS l_zeroes, false AS l_page, offset_bytes::BIGINT AS l_off,
       bytes::BIGINT AS l_len
FROM vdisk_io WHERE bytes > 0
UNION ALL
-- (an access to a qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks image's own tables counts as metadata: REQ_META)
SELECT 'hostfs', h.capture_id, h.io_id, h.ts_ns, h.op,
       CASE WHEN m.io_id IS NULL THEN 0 ELSE 2 END::USMALLINT, false,
       h.source IN ('mm_filemap_get_pages', 'writeback_dirty_folio'),
       h.off, h.bytes::BIGINT
FROM _map_hostfs_io h LEFT JOIN _map_image_metadata_io m USING (capture_id, io_id)
WHERE h.bytes > 0
UNION ALL
SELECT 'disk', d.capture_id, d.io_id, d.start_ns, d.op, d.req_flags, d.req_op = 9, false,
       d.offset_bytes::BIGINT + x.shift, d.bytes::BIGINT
FROM disk_io d JOIN _links_disks x ON x.capture_id = d.capture_id AND x.dev = d.dev
WHERE d.bytes > 0;

-- The captures links can tie nothing in: no extent maps (no upper event
-- lands on a lower block without them) and no file-system level (an
-- imported blktrace file or trace.dat).  Their requests are classed by
-- op and flags alone, a row each (_links_computed), not block by block.
CREATE OR REPLACE VIEW _links_bare AS
SELECT capture_id FROM _links_captures
WHERE capture_id NOT IN (SELECT capture_id FROM extent_maps)
  AND capture_id NOT IN (SELECT capture_id FROM device_map
                         WHERE level IN ('vfs', 'hostfs', 'netfs'));

-- (their rows in links: what _links_blocks would find for them, a row a
-- request; a session whose captures are all such reads only these)
CREATE OR REPLACE VIEW _links_bare_rows AS
SELECT capture_id, CASE lower_level WHEN 'vdisk' THEN 'vfs' ELSE 'vdisk' END AS upper_level,
       lower_level, lower_id, NULL::UBIGINT AS upper_id,
       _links_rest_kind(_links_hop(lower_level), _links_op(l_op), l_flags, NULL, false, l_zeroes,
                        false, false, false, false, NULL, false, NULL) AS kind,
       l_len AS bytes, NULL::BIGINT AS lag_ns
FROM _links_lower_io WHERE capture_id IN (SELECT capture_id FROM _links_bare);

CREATE OR REPLACE VIEW _links_lower AS
SELECT *, unnest(_blocks(l_off, l_len)) AS blk FROM _links_lower_io
WHERE capture_id NOT IN (SELECT capture_id FROM _links_bare);

-- (capture, hop, op, block) as one integer: DuckDB's ASOF join is ~2.5x
-- faster on one integer key than on several columns.  Captures are
-- numbered in the store (at most 4096), hops 0 vdisk 1 hostfs 2 disk (by
-- the lower level), ops 0 read 1 write 2 discard 3 other, blocks below
-- 2^48 (1 EiB; beyond, no match).
-- err: a merged guest + host capture's clock error (nestrace merge): a
-- host-side time may be off by this much against a guest-side one, so the
-- hops down to hostfs and disk widen their time windows by it (DESIGN:
-- [start - err, end + err]).
-- end_ns: the capture's end, the end of an upper request with none
-- known (a virtual-disk request whose C was lost and whose request id
-- was not used again).
-- ck: the capture's number in the store (_base_captures), from 0.
CREATE OR REPLACE VIEW _links_captures AS
SELECT b.capture_id, (b.ck - 1)::UBIGINT AS ck,
       coalesce(m.clock_offset_err_ns, 0)::UBIGINT AS err, m.end_ns
FROM _base_captures b
JOIN (SELECT capture_id, max(clock_offset_err_ns) AS clock_offset_err_ns, max(end_ns) AS end_ns
      FROM capture_meta GROUP BY capture_id) m USING (capture_id);

CREATE OR REPLACE MACRO _links_hop(lvl) AS
  (CASE lvl WHEN 'vdisk' THEN 0 WHEN 'hostfs' THEN 1 ELSE 2 END)::UTINYINT;
CREATE OR REPLACE MACRO _links_op(op) AS
  (CASE op WHEN 'read' THEN 0 WHEN 'write' THEN 1 WHEN 'discard' THEN 2
           WHEN 'write_freed' THEN 1 WHEN 'write_placed' THEN 1 ELSE 3 END)::UTINYINT;
CREATE OR REPLACE MACRO _links_key(ck, hop, op, blk) AS
  (CASE WHEN ck < 4096 THEN ck ELSE error('links: more than 4096 captures in one store') END << 52)
  | (hop::UBIGINT << 50) | (op::UBIGINT << 48)
  | CASE WHEN blk >= 0 AND blk < (1::BIGINT << 48) THEN blk::UBIGINT END;  -- else no match

-- Both sides keyed, with small codes for the strings: the rows between
-- the two joins below are held in memory, 3 per 4 KiB block.  (uop 4: a
-- write_freed, 5: a write_placed, keyed as writes: _links_upper_moved,
-- _links_blocks)
-- (t: _links_upper or _links_upper_moved)
CREATE OR REPLACE MACRO _links_keyed(t) AS TABLE
SELECT _links_key(c.ck, _links_hop(x.lower_level), _links_op(x.u_op), x.blk) AS k,
       x.upper_id, x.u_start, coalesce(x.u_end, greatest(c.end_ns, x.u_start)) AS u_end,
       CASE x.u_op WHEN 'write_freed' THEN 4 WHEN 'write_placed' THEN 5
                   ELSE _links_op(x.u_op) END::UTINYINT AS uop,
       x.u_off, x.u_len
FROM query_table(t) x JOIN _links_captures c USING (capture_id);

CREATE OR REPLACE VIEW _links_upper_keyed AS SELECT * FROM _links_keyed('_links_upper');
CREATE OR REPLACE VIEW _links_upper_moved_keyed AS SELECT * FROM _links_keyed('_links_upper_moved');

CREATE OR REPLACE VIEW _links_lower_keyed AS
SELECT c.ck, _links_hop(x.lower_level) AS hop, _links_op(x.l_op) AS lop, x.lower_id, x.l_start,
       CASE WHEN x.lower_level = 'vdisk' THEN 0 ELSE c.err END AS l_err,
       x.l_start + CASE WHEN x.lower_level = 'vdisk' THEN 0 ELSE c.err END AS l_asof,
       x.l_flags, x.l_zeroes, x.l_page, x.l_off, x.l_len, x.blk,
       _links_key(c.ck, _links_hop(x.lower_level), _links_op(x.l_op), x.blk) AS k
FROM _links_lower x JOIN _links_captures c USING (capture_id);

-- Page faults on memory-mapped guest files (no system call), carried
-- through the guest file's extents onto virtual-disk blocks: a virtual-disk
-- read no read call explains, of a block a fault asked for at most 50 ms
-- before, is put down to the fault.
CREATE OR REPLACE VIEW _links_faults AS
SELECT capture_id, dev, ino, ts_ns, (index * 4096)::BIGINT AS off, (index * 4096 + 4096)::BIGINT AS stop
FROM pagecache_events WHERE event = _pagecache_event('fault');

-- The virtual-disk blocks of such guest-file pages (relation `t`:
-- capture_id, dev, ino, ts_ns, off, stop), keyed as links' op `op`
-- (0 read, 1 write) at hop vdisk: k, and ts_ns.  (Through the end
-- snapshot, and where bytes were freed later, the start one or the
-- mapping events, as for the calls: _map_vfs_ranges.  On a copy-on-write
-- guest FS a page is faulted in from where it was before a rewrite moved
-- it.)
CREATE OR REPLACE MACRO _links_pages_keyed(t, op) AS TABLE
WITH pk AS NOT MATERIALIZED (
  SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, off AS lo, stop AS hi, *
  FROM query_table(t)),
p AS (
  SELECT capture_id, ts_ns, vs, vt FROM _map_into_vdisk(t)
  UNION ALL
  SELECT capture_id, ts_ns, _map_on_disk_off(greatest(off, o.lo), o.delta, o.zp),
         _map_on_disk_end(greatest(off, o.lo), least(stop, o.hi), o.delta, o.zp, o.zlen)
  FROM _overlaps_2('pk', '_map_guest_freed')),
b AS (SELECT capture_id, ts_ns, unnest(_blocks(vs, vt - vs)) AS blk FROM p)
SELECT _links_key(c.ck, 0, op, b.blk) AS k, b.ts_ns
FROM b JOIN _links_captures c USING (capture_id);

CREATE OR REPLACE VIEW _links_faults_keyed AS
SELECT k, ts_ns AS f_ns FROM _links_pages_keyed('_links_faults', 0);

-- The hints that read (vfs_hints): readahead(2), posix_fadvise and
-- madvise WILLNEED, madvise POPULATE_READ, those that succeeded, carried through the guest file's extents onto
-- virtual-disk blocks (fadvise's length 0: to the file's end).  The kernel
-- queues the reads a hint asks for before the call returns: a
-- virtual-disk read no read call explains, of a block in the range of
-- the latest such call on it, queued while that call ran, is put down to
-- the call (kind hint, upper_id its vfs_hints row).
CREATE OR REPLACE VIEW _links_hints AS
SELECT capture_id, io_id, dev, ino, ts_ns, end_ns, offset_bytes AS off,
       CASE WHEN to_end THEN 1::BIGINT << 62 ELSE offset_bytes + req_bytes::BIGINT END AS stop
FROM vfs_hints
WHERE reads AND ret = 0 AND offset_bytes >= 0;

-- (through the end snapshot, and where bytes were freed later, the start
-- one, as for the calls: _map_vfs_ranges)
CREATE OR REPLACE VIEW _links_hints_keyed AS
WITH hk AS NOT MATERIALIZED (
  SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, off AS lo, stop AS hi, *
  FROM _links_hints),
p AS (
  SELECT capture_id, io_id, ts_ns, end_ns, vs, vt FROM _map_into_vdisk('_links_hints')
  UNION ALL
  SELECT capture_id, io_id, ts_ns, end_ns, _map_on_disk_off(greatest(off, o.lo), o.delta, o.zp),
         _map_on_disk_end(greatest(off, o.lo), least(stop, o.hi), o.delta, o.zp, o.zlen)
  FROM _overlaps_2('hk', '_map_guest_freed')),
b AS (SELECT capture_id, io_id, ts_ns, end_ns, unnest(_blocks(vs, vt - vs)) AS blk FROM p)
SELECT _links_key(c.ck, 0, 0, b.blk) AS k, b.ts_ns AS h_ns, b.end_ns AS h_end, b.io_id AS h_id
FROM b JOIN _links_captures c USING (capture_id);

-- The file systems' readahead (the reads readahead makes: unbounded, 5,
-- and large-folio order, 6): the guest FS's of guest files, carried
-- through their extents onto the virtual disk (as page faults are:
-- _links_pages_keyed), and the host FS's of the image, through the
-- image's extents onto the host disks (links' disk space), keyed as
-- reads at those hops.  A read no upper request explains, of a block such
-- a readahead covered at most 50 ms before, is readahead even without
-- REQ_RAHEAD: btrfs reads a compressed extent with a bio of its own,
-- which drops the flag.
CREATE OR REPLACE VIEW _links_ra AS
SELECT p.capture_id, m.level, p.dev, p.ino, p.ts_ns, (p.index * 4096)::BIGINT AS off,
       ((p.index + p.nr_pages) * 4096)::BIGINT AS stop
FROM pagecache_events p
JOIN device_map m ON m.capture_id = p.capture_id AND m.dev = p.dev
                 AND m.level IN ('vfs', 'hostfs')
WHERE p.event IN (_pagecache_event('ra_unbounded'), _pagecache_event('ra_order')) AND p.nr_pages > 0;

CREATE OR REPLACE VIEW _links_guest_ra AS
SELECT capture_id, dev, ino, ts_ns, off, stop FROM _links_ra WHERE level = 'vfs';

-- (the image's: in image bytes, _base_image_files)
CREATE OR REPLACE VIEW _links_host_ra AS
SELECT r.capture_id, r.ts_ns, r.off + f.shift AS s, r.stop + f.shift AS t
FROM _links_ra r JOIN _base_image_files f ON f.capture_id = r.capture_id AND f.ino = r.ino
WHERE r.level = 'hostfs';

-- (the image's through where its extents are at the end, and where moved
-- bytes were before, as _links_upper_moved)
CREATE OR REPLACE VIEW _links_ra_keyed AS
WITH p AS (
  SELECT capture_id, ts_ns, u_off, u_len FROM _links_onto_disks('_links_host_ra')
  UNION ALL
  SELECT capture_id, ts_ns, u_off, u_len FROM _links_onto_moved('_links_host_ra'))
SELECT _links_key(c.ck, 2, 0, b.blk) AS k, b.ts_ns AS ra_ns
FROM (SELECT capture_id, ts_ns, unnest(_blocks(u_off, u_len)) AS blk FROM p) b
JOIN _links_captures c USING (capture_id)
UNION ALL
SELECT k, ts_ns FROM _links_pages_keyed('_links_guest_ra', 0);

-- Stores through shared mappings of guest files (no system call): the
-- folios a user-mode page fault dirtied, carried onto virtual-disk blocks.
-- A virtual-disk write of a block a store dirtied after the last write
-- call on it (or with none) is put down to the store: kind store.
CREATE OR REPLACE VIEW _links_stores AS
SELECT capture_id, dev, ino, ts_ns, (index * 4096)::BIGINT AS off,
       ((index + nr_pages) * 4096)::BIGINT AS stop
FROM pagecache_events WHERE event = _pagecache_event('dirty') AND aux = 1;

CREATE OR REPLACE VIEW _links_stores_keyed AS
SELECT k, ts_ns AS s_ns FROM _links_pages_keyed('_links_stores', 1);

-- The ASOF order of upper events on a block: by start, then by end.  Two
-- pieces of a split bio start together (their Q is the bio's): the one
-- still in flight, which a lower access may be serving, is the latest, not
-- the one the join happened to meet first (it was not deterministic).
CREATE OR REPLACE MACRO _links_asof_upper(u_start, u_end) AS
  (u_start::UHUGEINT << 64) | u_end::UHUGEINT;
CREATE OR REPLACE MACRO _links_asof_lower(l_asof) AS
  (l_asof::UHUGEINT << 64) | 18446744073709551615::UHUGEINT;

-- How a lower block's request and the upper event ASOF found for it are
-- tied: sync (in flight together, the same op; a write_freed or
-- write_placed, uop 4 and 5, with a write), rmw (a read while a write was
-- in flight), writeback (a write after a write), discard; NULL: none.
CREATE OR REPLACE MACRO _links_kind0(upper_id, in_flight, lop, uop) AS
  CASE WHEN upper_id IS NULL THEN NULL
       WHEN in_flight AND lop = uop THEN 'sync'
       WHEN in_flight AND uop IN (4, 5) AND lop = 1 THEN 'sync'
       WHEN in_flight AND uop IN (1, 4, 5) AND lop = 0 THEN 'rmw'
       WHEN uop IN (1, 5) AND lop = 1 THEN 'writeback'
       WHEN uop = 2 AND lop = 2 THEN 'discard'
  END;

-- The bytes of a lower block's request the upper event explains: its
-- overlap with the event's range; the whole block for a read-modify-write
-- (it reads the whole block the write touches part of) and for a host
-- page-cache access (l_page: the page a virtual-disk request touches part
-- of is read or dirtied whole for it).
CREATE OR REPLACE MACRO _links_attributed(kind0, l_page, block_bytes, l_off, l_len, blk, u_off,
                                          u_len) AS
  CASE WHEN kind0 IS NULL THEN 0
       WHEN kind0 = 'rmw' OR l_page THEN block_bytes
       ELSE _overlap(greatest(l_off, blk * 4096),
                     least(l_off + l_len, blk * 4096 + 4096) - greatest(l_off, blk * 4096),
                     u_off, u_len) END;

-- A lower block's row (_links_blocks' m) the latest upper event explains
-- only in part, where other events may explain the rest: tied (not an
-- rmw read, which counts whole), not a page-cache access (whole too).
CREATE OR REPLACE MACRO _links_partial(kind0, l_page, attributed, block_bytes) AS
  coalesce(kind0 IN ('sync', 'writeback', 'discard') AND NOT l_page AND attributed < block_bytes,
           false);

-- The hops where a 4 KiB block is one block of one file, moved whole by
-- a page cache: the virtual disk under a guest FS of 4 KiB blocks or
-- more (a guest file's page), the host disk under a host FS of 4 KiB
-- blocks or more (an image page).  (Host-FS accesses through the page
-- cache count whole already, l_page; the others carry their own range.)
-- There the rest of a block no upper event wrote or read (the old bytes
-- of a page a partial write dirtied, the rest of a page a partial read
-- brought in, what a file system zeroes around a sub-block direct write
-- into a new block) is the latest upper event's, as the page is: the
-- partial I/O is what moved it.  (On a smaller-block FS a 4 KiB block
-- may hold another file's or the FS's own blocks: the rest is left
-- unattributed and classified.)
-- (every traced file system of the hop: a guest may have several)
CREATE OR REPLACE VIEW _links_whole_hops AS
SELECT c.ck, CASE d.level WHEN 'vfs' THEN 0 ELSE 2 END::UTINYINT AS hop
FROM _links_captures c JOIN device_map d USING (capture_id)
WHERE d.level IN ('vfs', 'hostfs')
GROUP BY ALL HAVING min(d.block_size_bytes) >= 4096;

-- Guest files' extents on the virtual disk (hop 0), and the image's on
-- the host disks at the end, where its bytes are (hop 2, in links' disk
-- space): how far those starting at or before lo reach.
CREATE OR REPLACE VIEW _links_extent_reach AS
SELECT ck, hop, lo, max(max(hi)) OVER (PARTITION BY ck, hop ORDER BY lo ROWS UNBOUNDED PRECEDING) AS reach
FROM (SELECT c.ck, 0::UTINYINT AS hop, e.physical_bytes::BIGINT AS lo,
             (e.physical_bytes + coalesce(e.disk_length_bytes, e.length_bytes))::BIGINT AS hi
      FROM map_extents e JOIN _links_captures c USING (capture_id)
      WHERE e.role = 'guest_file'
      UNION ALL
      SELECT c.ck, 2, e.physical_bytes::BIGINT + x.shift,
             e.physical_bytes::BIGINT + coalesce(e.disk_length_bytes, e.length_bytes)::BIGINT
             + x.shift
      FROM _map_image_extents e JOIN _links_captures c USING (capture_id)
      JOIN _links_disks x ON x.capture_id = e.capture_id AND x.dev = e.disk_dev)
GROUP BY ck, hop, lo;

-- The capture's own store files, where a traced disk holds them
-- (extent_maps role nestrace_store: the store on the virtual disk, hop 0,
-- or on a host disk, hop 2), the file systems' journals (fs_journal: the
-- guest's on the virtual disk, the host's on its disk), and the other
-- images on the host FS (neighbor_image: other VMs' disks): how far
-- those starting at or before lo reach.
CREATE OR REPLACE VIEW _links_placed_reach AS
SELECT ck, hop, role, lo,
       max(max(hi)) OVER (PARTITION BY ck, hop, role ORDER BY lo ROWS UNBOUNDED PRECEDING) AS reach
FROM (SELECT c.ck, CASE d.level WHEN 'vdisk' THEN 0 ELSE 2 END::UTINYINT AS hop, e.role,
             e.physical_bytes::BIGINT + coalesce(x.shift, 0) AS lo,
             (e.physical_bytes + e.length_bytes)::BIGINT + coalesce(x.shift, 0) AS hi
      FROM extent_maps e JOIN _links_captures c USING (capture_id)
      JOIN device_map d ON d.capture_id = e.capture_id AND d.dev = e.physical_dev
                       AND d.level IN ('vdisk', 'disk')
      LEFT JOIN _links_disks x ON x.capture_id = e.capture_id AND x.dev = e.physical_dev
                              AND d.level = 'disk'
      WHERE e.role IN ('nestrace_store', 'fs_journal', 'neighbor_image')
        AND (e.flags & 6) = 0)
GROUP BY ck, hop, role, lo;

-- The traced file systems' partitions on the virtual disk (hop 0: one
-- per --stack) and on the host disk (hop 2), where known.
CREATE OR REPLACE VIEW _links_fs_spans AS
SELECT c.ck, CASE p.level WHEN 'vdisk' THEN 0 ELSE 2 END::UTINYINT AS hop,
       list({'lo': p.lo, 'hi': p.hi}) AS spans
FROM _base_fs_partitions p JOIN _links_captures c USING (capture_id)
GROUP BY ALL;

-- A lower block whose last upper event (same_op's) covers only part of
-- it may hold other parts other upper events left: a write-back of a
-- page an app wrote in 512-byte records, or of a 1 KiB-block guest file
-- system whose file starts 1 KiB into a 4 KiB block, where two writes
-- share each block.  There each 512-byte sector of the lower block goes
-- to its own last upper event: an ASOF join on the block's key and the
-- sector, over the upper events of those blocks only (few rows, and none
-- where every block is covered whole).  (Sub-sector parts go with their
-- sector's last event, as the kernel writes the sector whole; a store
-- through a mapping counts for the block's last event only: stored.)
-- part: _links_blocks' part (such blocks, with their key k and last
-- event first_*), up: its upper events (_links_blocks' up); the rows are
-- the sectors whose last upper event is another, with its kind and bytes.
CREATE OR REPLACE MACRO _links_other_sectors(part, up) AS TABLE
WITH psec AS MATERIALIZED (   -- (the sectors the block's last event does not cover whole: the
                              -- others are its; ks: the block's key and the sector in one integer)
  SELECT *, (k::UHUGEINT << 3) | (sec - blk * 8)::UHUGEINT AS ks FROM (
    SELECT *, unnest(range(greatest(l_off, blk * 4096) // 512,
                           (least(l_off + l_len, blk * 4096 + 4096) + 511) // 512)) AS sec
    FROM query_table(part))
  WHERE NOT (first_off <= sec * 512 AND sec * 512 + 512 <= first_off + first_len)),
usec AS (
  SELECT * FROM (
    SELECT (k::UHUGEINT << 3) | (sec - b * 8)::UHUGEINT AS ks, upper_id, u_start, u_end, uop,
           u_off, u_len
    FROM (SELECT *, unnest(range(greatest(u_off, b * 4096) // 512,
                                 (least(u_off + u_len, b * 4096 + 4096) + 511) // 512)) AS sec
          FROM (SELECT *, (k & 281474976710655)::BIGINT AS b   -- (the block: the key's low 48 bits)
                FROM query_table(up)
                WHERE (NOT moved OR uop IN (0, 2, 4, 5))
                  AND k IN (SELECT k FROM query_table(part)))))
  WHERE ks IN (SELECT ks FROM psec))
SELECT s.ck, s.hop, s.lower_id, s.first_id, s.blk, s.l_off, s.l_len, u.upper_id,
       CASE WHEN s.l_start <= u.u_end + s.l_err AND (s.lop = u.uop OR (u.uop IN (4, 5) AND s.lop = 1))
                 THEN 'sync'
            WHEN u.uop IN (1, 5) AND s.lop = 1 THEN 'writeback'
            WHEN u.uop = 2 AND s.lop = 2 THEN 'discard' END AS kind0,
       _overlap(greatest(s.l_off, s.sec * 512),
                least(s.l_off + s.l_len, s.sec * 512 + 512) - greatest(s.l_off, s.sec * 512),
                u.u_off, u.u_len) AS attributed,
       s.l_start, u.u_start, u.u_end
FROM psec s
ASOF JOIN usec u ON u.ks = s.ks
 AND _links_asof_lower(s.l_asof) >= _links_asof_upper(u.u_start, u.u_end)
WHERE u.upper_id <> s.first_id;

-- Each lower block of `lower` (rows with their key k, and near: an upper
-- event of `up` has that key) with the latest event of `up` on it
-- (upper_id, u_*: NULL where none).  Only the near blocks go through
-- the ASOF join, which sorts all it is given: the others, often most,
-- have no cause there (with no upper level, an imported disk's requests,
-- the join sorted 2.8 M rows for nothing).
CREATE OR REPLACE MACRO _links_latest_upper(lower, up) AS TABLE
SELECT l.* EXCLUDE (k, near), u.upper_id, u.u_start, u.u_end, u.uop, u.u_off, u.u_len
FROM (SELECT * FROM query_table(lower) WHERE near) l
ASOF LEFT JOIN query_table(up) u
  ON u.k = l.k AND _links_asof_lower(l.l_asof) >= _links_asof_upper(u.u_start, u.u_end)
UNION ALL BY NAME
SELECT * EXCLUDE (k, near) FROM query_table(lower) WHERE NOT near;

-- The kind of a lower block's bytes no upper event explains (_links_blocks'
-- rest): a hint's, a fault's, readahead, a store through a
-- mapping, zeroes, nestrace's own, another VM's, another file system's
-- by its flags, a guest file's or the image's write-back (filed), the
-- journal, or by its flags.
CREATE OR REPLACE MACRO _links_rest_kind(hop, lop, flags, blk, stored, zeroes, hinted, faulted,
                                         readahead, filed, placed, journaled, spans) AS
  CASE WHEN hinted THEN 'hint'
       WHEN hop = 0 AND lop = 0 AND faulted THEN 'fault'
       WHEN hop IN (0, 2) AND lop = 0 AND flags & 2 = 0 AND readahead THEN 'readahead'
       WHEN stored THEN 'store'
       WHEN zeroes THEN 'zeroes'
       WHEN placed = 'nestrace_store' THEN 'nestrace'
       -- (another virtual disk's image on the host FS: another VM's)
       WHEN placed = 'neighbor_image' THEN 'other'
       -- (another file system's, on another partition of the virtual
       -- disk or the host disk, in none a traced file system is on: its
       -- flags alone say what it is)
       WHEN spans IS NOT NULL AND NOT list_bool_or(list_transform(
              spans, lambda x: blk * 4096 + 4096 > x.lo AND blk * 4096 < x.hi)) THEN
            CASE WHEN flags & 2 <> 0 THEN 'metadata'
                 WHEN lop = 0 AND flags & 32 <> 0 THEN 'readahead'
                 WHEN lop = 2 THEN 'discard' ELSE 'other' END
       WHEN filed THEN 'writeback'
       WHEN placed = 'fs_journal' THEN 'journal'
       -- (a host-FS write no virtual-disk request explains is no
       -- write-back: the hypervisor's own, or one from before a guest's
       -- capture began in a merged capture)
       WHEN hop = 1 AND lop = 1 AND flags = 0 THEN 'other'
       -- (outside a known journal: jbd2's checkpoint writes its metadata
       -- home with REQ_SYNC alone, as it writes the journal)
       WHEN lop = 1 AND journaled THEN
            CASE WHEN flags & 2 <> 0 THEN 'metadata' ELSE 'writeback' END
       ELSE _unattributed_kind(['read', 'write', 'discard', 'other'][lop + 1], flags) END;

-- Per lower block, the upper event that caused it: the latest upper event
-- of the same op on the same block that started before it (ASOF) — a
-- write is written back for the last write that dirtied the block, reads
-- of it in between do not count — and, for a read that no upper read was
-- waiting for, the write in flight whose partial block it reads (rmw).
-- A block the latest event explains in part: the other sectors' events
-- (_links_other_sectors); the bytes no event explains: classed
-- (_links_rest_kind).
CREATE OR REPLACE VIEW _links_blocks AS
WITH up AS MATERIALIZED (   -- (computed once for the three joins that read it)
  SELECT *, false AS moved FROM _links_upper_keyed
  UNION ALL SELECT *, true FROM _links_upper_moved_keyed),
up_same AS MATERIALIZED (
  SELECT * EXCLUDE (moved) FROM up WHERE NOT moved OR uop IN (0, 2, 4, 5)),
lower_near AS MATERIALIZED (
  SELECT *, coalesce(k IN (SELECT k FROM up_same), false) AS near FROM _links_lower_keyed),
same_op AS MATERIALIZED (SELECT * FROM _links_latest_upper('lower_near', 'up_same')),
stored AS (   -- virtual-disk writes: the last store through a mapping before them
  SELECT l.* EXCLUDE (upper_id),
         -- (a write in flight with its call stays the call's)
         CASE WHEN s.s_ns > l.u_start AND l.l_start > l.u_end + l.l_err THEN NULL
              ELSE l.upper_id END AS upper_id,
         CASE WHEN l.upper_id IS NULL
                   OR (s.s_ns > l.u_start AND l.l_start > l.u_end + l.l_err) THEN s.s_ns END AS s_ns
  FROM (SELECT * FROM same_op WHERE hop = 0 AND lop = 1) l
  ASOF LEFT JOIN _links_stores_keyed s
    ON s.k = _links_key(l.ck, 0, 1, l.blk) AND l.l_asof >= s.s_ns
  UNION ALL BY NAME
  SELECT * FROM same_op WHERE NOT (hop = 0 AND lop = 1)),
unread AS (   -- reads no upper read was in flight for, keyed to upper writes
  SELECT * EXCLUDE (upper_id, u_start, u_end, uop, u_off, u_len),
         _links_key(ck, hop, 1, blk) AS k
  FROM stored WHERE lop = 0 AND NOT coalesce(l_start <= u_end + l_err, false)),
up_w AS MATERIALIZED (   -- (the writes of those blocks only: usually few, often none)
  SELECT * EXCLUDE (moved) FROM up
  WHERE (NOT moved OR uop IN (1, 4, 5)) AND k IN (SELECT k FROM unread)),
unread_near AS MATERIALIZED (   -- (and only the reads of blocks such a write is on)
  SELECT *, coalesce(k IN (SELECT k FROM up_w), false) AS near FROM unread),
rmw AS (SELECT * FROM _links_latest_upper('unread_near', 'up_w')),
j AS (
  SELECT * FROM stored WHERE NOT (lop = 0 AND NOT coalesce(l_start <= u_end + l_err, false))
  UNION ALL BY NAME SELECT * FROM rmw),
k AS (
  SELECT *, _overlap(l_off, l_len, blk * 4096, 4096) AS block_bytes,
         _links_kind0(upper_id, l_start <= u_end + l_err, lop, uop) AS kind0
  FROM j),
m AS (
  SELECT *, _links_attributed(kind0, l_page, block_bytes, l_off, l_len, blk, u_off, u_len)
              AS attributed
  FROM k),
part AS MATERIALIZED (   -- blocks the last event explains in part
  SELECT *, upper_id AS first_id, u_off AS first_off, u_len AS first_len,
         _links_key(ck, hop, lop, blk) AS k
  FROM m WHERE _links_partial(kind0, l_page, attributed, block_bytes)),
more AS (SELECT * FROM _links_other_sectors('part', 'up')),
extra AS (
  SELECT ck, hop, lower_id, first_id, blk, l_off, l_len, sum(attributed) AS extra
  FROM more WHERE kind0 IS NOT NULL GROUP BY ALL),
part_x AS MATERIALIZED (   -- part's rows, the bytes other events got taken off; on
                           -- _links_whole_hops the rest of the block is the event's
  SELECT p.* EXCLUDE (first_id, first_off, first_len, k, attributed),
         CASE WHEN w.hop IS NOT NULL AND p.kind0 <> 'discard' THEN p.block_bytes - coalesce(x.extra, 0)
              ELSE p.attributed END AS attributed,
         CASE WHEN w.hop IS NOT NULL AND p.kind0 <> 'discard' THEN 0
              ELSE p.block_bytes - p.attributed - coalesce(x.extra, 0) END AS left_bytes
  FROM part p
  LEFT JOIN extra x ON x.ck = p.ck AND x.hop = p.hop AND x.lower_id = p.lower_id
   AND x.first_id = p.upper_id AND x.blk = p.blk AND x.l_off = p.l_off AND x.l_len = p.l_len
  LEFT JOIN (SELECT DISTINCT ck, hop FROM _links_whole_hops) w ON w.ck = p.ck AND w.hop = p.hop),
rest AS MATERIALIZED (   -- the lower blocks' bytes no upper event explains
  SELECT *, block_bytes - attributed AS left_bytes FROM m
  WHERE block_bytes > attributed AND NOT _links_partial(kind0, l_page, attributed, block_bytes)
  UNION ALL BY NAME
  SELECT * FROM part_x WHERE left_bytes > 0),
filed AS (    -- virtual-disk blocks written with no cause found in a guest
              -- file's extent (an ASOF join on their reach), host-disk ones
              -- in the image's: write-back, whatever the flags say (fsync
              -- writes data with REQ_SYNC); not a REQ_META write, which no
              -- data write is (ext2's indirect block, freed with its file,
              -- a later file's data, was metadata then)
  SELECT DISTINCT r.ck, r.hop, r.blk
  FROM rest r
  ASOF JOIN _links_extent_reach e ON e.ck = r.ck AND e.hop = r.hop AND r.blk * 4096 >= e.lo
  WHERE r.hop IN (0, 2) AND r.lop = 1 AND r.s_ns IS NULL AND r.l_flags & 2 = 0
    AND r.blk * 4096 < e.reach),
placed AS (   -- blocks written with no cause found into _links_placed_reach: the
              -- agent's batches, the journal's writes, another VM's
  SELECT r.ck, r.hop, r.blk, min(e.role) AS role
  FROM (SELECT DISTINCT ck, hop, blk FROM rest WHERE hop IN (0, 2) AND lop = 1 AND s_ns IS NULL) r
  CROSS JOIN (VALUES ('nestrace_store'), ('fs_journal'), ('neighbor_image')) p(role)
  ASOF JOIN _links_placed_reach e ON e.ck = r.ck AND e.hop = r.hop AND e.role = p.role
                                 AND r.blk * 4096 >= e.lo
  WHERE r.blk * 4096 < e.reach
  GROUP BY r.ck, r.hop, r.blk),
tied AS (     -- the bytes an upper event explains: the latest one's, the other sectors'
  SELECT ck, hop, lower_id, upper_id, kind0, attributed, l_start, u_start, u_end FROM m
  WHERE kind0 IS NOT NULL AND attributed > 0
    AND NOT _links_partial(kind0, l_page, attributed, block_bytes)
  UNION ALL
  SELECT ck, hop, lower_id, upper_id, kind0, attributed, l_start, u_start, u_end FROM part_x
  WHERE attributed > 0
  UNION ALL
  SELECT ck, hop, lower_id, upper_id, kind0, attributed, l_start, u_start, u_end FROM more
  WHERE kind0 IS NOT NULL AND attributed > 0),
hk AS MATERIALIZED (SELECT * FROM _links_hints_keyed),
fk AS MATERIALIZED (SELECT * FROM _links_faults_keyed),
ak AS MATERIALIZED (SELECT * FROM _links_ra_keyed),
rest_near AS MATERIALIZED (   -- (as same_op: the ASOF joins below get only the
                              -- blocks a hint, a fault or a readahead is on)
  SELECT *, coalesce(k IN (SELECT k FROM hk UNION ALL SELECT k FROM fk
                            UNION ALL SELECT k FROM ak), false) AS near
  FROM (SELECT *, _links_key(ck, hop, lop, blk) AS k FROM rest)),
rest_hinted AS (
  SELECT r.* EXCLUDE (near), h.h_id, h.h_end, h.h_ns, f.f_ns, a.ra_ns
  FROM (SELECT * FROM rest_near WHERE near) r
  -- (the hints' keys are virtual-disk reads': no other row matches)
  ASOF LEFT JOIN hk h ON h.k = r.k AND r.l_start >= h.h_ns
  ASOF LEFT JOIN fk f ON f.k = r.k AND r.l_start >= f.f_ns
  -- (the readahead's keys are virtual- and host-disk reads': no other row matches)
  ASOF LEFT JOIN ak a ON a.k = r.k AND r.l_start >= a.ra_ns
  UNION ALL BY NAME
  SELECT * EXCLUDE (near) FROM rest_near WHERE NOT near)
SELECT ck, hop, lower_id, upper_id, kind0 AS kind, attributed AS bytes,
       CASE WHEN kind0 IN ('writeback', 'discard') THEN l_start::BIGINT - u_end::BIGINT
            ELSE l_start::BIGINT - u_start::BIGINT END AS lag_ns
FROM tied
UNION ALL
SELECT r.ck, r.hop, r.lower_id, CASE WHEN r.l_start <= r.h_end THEN r.h_id END,
       _links_rest_kind(r.hop, r.lop, r.l_flags, r.blk, r.s_ns IS NOT NULL, r.l_zeroes,
                        r.l_start <= r.h_end, r.l_start - r.f_ns <= 50000000,
                        r.l_start - r.ra_ns <= 50000000, d.blk IS NOT NULL, o.role,
                        j.hop IS NOT NULL, g.spans),
       r.left_bytes,
       r.l_start::BIGINT - CASE WHEN r.l_start <= r.h_end THEN r.h_ns ELSE r.s_ns END::BIGINT
FROM rest_hinted r
LEFT JOIN filed d ON d.ck = r.ck AND d.hop = r.hop AND d.blk = r.blk AND r.lop = 1
                 AND r.l_flags & 2 = 0
LEFT JOIN placed o ON o.ck = r.ck AND o.hop = r.hop AND o.blk = r.blk AND r.lop = 1
-- (the hops whose disk's journal is known: there a write outside it is
-- no journal write, whatever its flags)
LEFT JOIN (SELECT DISTINCT ck, hop FROM _links_placed_reach WHERE role = 'fs_journal') j
       ON j.ck = r.ck AND j.hop = r.hop
LEFT JOIN _links_fs_spans g ON g.ck = r.ck AND g.hop = r.hop;

-- Links as computed (`links` reads the rows `nestrace correlate` stored,
-- where it has been run).
-- (blocks summed per request on the integer keys, named after: grouping
-- on the capture's and levels' names took twice as long)
CREATE OR REPLACE VIEW _links_computed AS
SELECT c.capture_id, CASE o.hop WHEN 0 THEN 'vfs' ELSE 'vdisk' END AS upper_level,
       ['vdisk', 'hostfs', 'disk'][o.hop + 1] AS lower_level, o.lower_id, o.upper_id, o.kind,
       o.bytes, o.lag_ns
FROM (SELECT ck, hop, lower_id, upper_id, kind, sum(bytes)::BIGINT AS bytes, min(lag_ns) AS lag_ns
      FROM _links_blocks GROUP BY ck, hop, lower_id, upper_id, kind) o
JOIN _links_captures c USING (ck)
UNION ALL
SELECT * FROM _links_bare_rows;

-- Each lower-level request tied to each upper-level event that caused part
-- of it (kind sync, writeback, rmw or discard; kind hint: a virtual-disk
-- read a readahead(2), posix_fadvise or madvise WILLNEED, or madvise
-- POPULATE_READ call asked for, queued while it ran, tied to its
-- vfs_hints row), plus the unattributed rest of it,
-- classified (upper_id NULL; kind zeroes: a write-zeroes request
-- (REQ_OP_WRITE_ZEROES: fallocate of a block device, a file system
-- zeroing blocks, mkfs); kind fault: a virtual-disk read of a block
-- a page fault on a memory-mapped file asked for; kind store: a
-- virtual-disk write of a block last dirtied by a store through a shared
-- mapping, no write call; kind writeback: other virtual-disk writes of
-- a guest file's blocks (not REQ_META ones: a block freed and given to a
-- file during the capture was metadata before), and host-disk writes of
-- blocks the image holds at the end (its pages written back, dirtied
-- before the capture, say);
-- kind nestrace: writes into the capture's own store files, where the
-- store was on a traced disk (the virtual disk, or a host disk);
-- kind journal: writes into a file system's journal, where the capture
-- found it (extent_maps role fs_journal: an ext3 or ext4 journal inode,
-- an xfs internal log), and on such a disk the other writes are
-- metadata (REQ_META) or writeback (jbd2's checkpoint of journaled
-- blocks to their home is REQ_SYNC alone, as its journal writes are);
-- kind readahead: a virtual- or host-disk read of a block the guest FS's
-- readahead of a guest file, or the host FS's of the image, covered at
-- most 50 ms before (btrfs reads compressed extents without REQ_RAHEAD);
-- a virtual-disk request outside the traced guest file system's partition
-- (device_map: another file system's, or the partition table), and a
-- host-disk one outside the host file system's (on one disk), is
-- metadata, readahead or discard by its flags, else other; so is a
-- host-disk write into another virtual disk's image on the host FS
-- (extent_maps role neighbor_image: another VM's) other;
-- else readahead,
-- journal, metadata, writeback, discard or other: by the request's op
-- and flags (there a REQ_SYNC write counts as journal), and for host-FS accesses to a qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks image's own tables,
-- metadata; another host-FS write is other, not writeback).  bytes are exact overlaps of the mapped ranges,
-- but for an rmw read and a host-FS access through the page cache in whole
-- pages (filemap page lookups, btrfs's dirtied folios): there the 4 KiB
-- page a request touches part of counts whole for it.  A lower block
-- several upper events wrote parts of (512-byte records, a 1 KiB-block
-- guest FS) is split among them by 512-byte sector: each sector goes to
-- the latest upper event on it; where a 4 KiB block is one page of one
-- file (the virtual disk under a guest FS of 4 KiB blocks or more, the
-- host disk under such a host FS), the rest of it no upper event covered
-- goes to the latest event (the page moved whole for it).  A
-- virtual-disk request whose C was lost ends, for its hops, at its
-- done_by_ns (the next use of its request id), else at the capture's end.
-- @column capture_id VARCHAR   capture
-- @column upper_level VARCHAR  vfs or vdisk
-- @column lower_level VARCHAR  vdisk, hostfs or disk
-- @column lower_id UBIGINT     io_id of the lower request (vdisk_io, hostfs_io or disk_io)
-- @column upper_id UBIGINT     io_id of the upper event (vfs_io, for kind hint vfs_hints, or vdisk_io); NULL when unattributed
-- @column kind VARCHAR         sync (in flight together), writeback (after a write that dirtied the range), rmw (a read caused by a partial write), discard (a discard after the upper discard of the range ended: a file system's online discard, at its commit, of the blocks a hole punched for it freed: an fallocate's in a guest file, a virtual-disk discard's in the image), hint (a virtual-disk read a readahead, a WILLNEED or a POPULATE_READ call asked for), or for the unattributed: zeroes (a write-zeroes request), fault, store (write-back of a store through a mapping), nestrace (nestrace's own writes to its store, when the store was on a traced disk), journal (a write into the file system's journal: by its place where the capture found the journal, else by its flags), readahead, metadata, writeback, discard, other
-- @column bytes BIGINT         bytes of the lower request this row accounts for
-- @column lag_ns BIGINT        writeback and discard: lower start - upper end; otherwise lower start - upper start; store: lower start - the store's page fault; NULL for the other unattributed
CREATE OR REPLACE VIEW links AS SELECT * FROM _links_computed;

-- Share of each level's bytes explained, per hop and kind.
-- @column capture_id VARCHAR   capture
-- @column upper_level VARCHAR  vfs or vdisk
-- @column lower_level VARCHAR  vdisk, hostfs or disk
-- @column kind VARCHAR         as in links
-- @column attributed BOOLEAN   an upper event was found
-- @column requests BIGINT      lower requests with bytes of this kind
-- @column bytes BIGINT         bytes of this kind
-- @column fraction DOUBLE      bytes / all bytes of the lower level in this hop
CREATE OR REPLACE VIEW links_summary AS
SELECT capture_id, upper_level, lower_level, kind, upper_id IS NOT NULL AS attributed,
       count(DISTINCT lower_id) AS requests, sum(bytes)::BIGINT AS bytes,
       sum(bytes) / sum(sum(bytes)) OVER (PARTITION BY capture_id, upper_level, lower_level)
         AS fraction
FROM links GROUP BY capture_id, upper_level, lower_level, kind, upper_id IS NOT NULL;

-- Bytes of the virtual and host disks traced back to application file
-- syscalls: vdisk directly, disk through the vdisk request it served
-- (its bytes counted in proportion to that request's own attribution).
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        vdisk or disk
-- @column bytes BIGINT         all bytes of the level's requests (reads and writes)
-- @column app_bytes DOUBLE     bytes attributed to a vfs event
-- @column fraction DOUBLE      app_bytes / bytes
CREATE OR REPLACE VIEW links_to_vfs AS
WITH l AS MATERIALIZED (   -- (links planned and computed once, not three times)
  SELECT capture_id, lower_level, lower_id, upper_id, bytes FROM links
  WHERE lower_level IN ('vdisk', 'disk')),
vd AS (
  SELECT capture_id, lower_id AS vdisk_id,
         sum(bytes) FILTER (WHERE upper_id IS NOT NULL) / sum(bytes) AS frac
  FROM l WHERE lower_level = 'vdisk' GROUP BY ALL),
d AS (
  SELECT l.capture_id, sum(l.bytes) AS bytes,
         sum(CASE WHEN l.upper_id IS NULL THEN 0 ELSE l.bytes * coalesce(vd.frac, 0) END) AS app
  FROM l LEFT JOIN vd ON vd.capture_id = l.capture_id AND vd.vdisk_id = l.upper_id
  WHERE l.lower_level = 'disk' GROUP BY ALL),
v AS (
  SELECT capture_id, sum(bytes) AS bytes,
         sum(bytes) FILTER (WHERE upper_id IS NOT NULL) AS app
  FROM l WHERE lower_level = 'vdisk' GROUP BY ALL)
SELECT capture_id, 'vdisk' AS level, bytes::BIGINT AS bytes, coalesce(app, 0)::DOUBLE AS app_bytes,
       coalesce(app, 0) / bytes AS fraction FROM v
UNION ALL
SELECT capture_id, 'disk', bytes::BIGINT, app::DOUBLE, app / bytes FROM d;
