-- Module links.keyed: the two sides of each hop the causal join ties,
-- cut into 4 KiB blocks and keyed: the upper events (calls, virtual-disk
-- requests, and the faults, hints, readahead and stores that cause lower
-- requests with no call) and the lower requests.  links.blocks ties them.
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
