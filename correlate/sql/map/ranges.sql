-- Module map.ranges: every I/O's byte range carried down the stack.
-- INCLUDE map.extents
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE disk.io
-- INCLUDE hostfs.io
-- INCLUDE map.image
-- INCLUDE util.blocks

-- The image extents, with their disk (a btrfs on several devices: a row
-- per copy and per stripe); logical_bytes in image bytes (a backing
-- file's at its shift: _base_image_files); disk_length_bytes: a
-- compressed extent's (map_extents), whose image bytes are each read from
-- all of [physical_bytes, physical_bytes + disk_length_bytes).
CREATE OR REPLACE VIEW _map_image_extents AS
SELECT e.capture_id, (e.logical_bytes::BIGINT + coalesce(f.shift, 0))::UBIGINT AS logical_bytes,
       e.physical_bytes, e.length_bytes, e.disk_dev, e.disk_length_bytes
FROM map_extents e LEFT JOIN _base_image_files f ON f.capture_id = e.capture_id AND f.ino = e.ino
WHERE e.role = 'image';

-- The same keyed for _overlaps by image bytes (capture; lo, hi), with
-- delta = disk minus image bytes; a compressed extent's zp and zlen: its
-- compressed data on the disk, which any part of [lo, hi) is read from
-- (_map_on_disk), else NULL.
CREATE OR REPLACE VIEW _map_image_extents_keyed AS
SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, logical_bytes::BIGINT AS lo,
       (logical_bytes + length_bytes)::BIGINT AS hi, logical_bytes, physical_bytes, disk_dev,
       physical_bytes::BIGINT - logical_bytes::BIGINT AS delta,
       CASE WHEN disk_length_bytes IS NOT NULL THEN physical_bytes::BIGINT END AS zp,
       disk_length_bytes::BIGINT AS zlen
FROM _map_image_extents;

-- Where image bytes [s, t) of an extent with delta, zp and zlen
-- (_map_image_extents_keyed) are on the disk: the start, and the length.
-- Byte for byte, s + delta and t - s; a compressed extent's bytes are all
-- of its compressed data, zp and zlen, whichever of them are asked for.
CREATE OR REPLACE MACRO _map_on_disk_off(s, delta, zp) AS
  CASE WHEN zp IS NULL THEN s + delta ELSE zp END;
CREATE OR REPLACE MACRO _map_on_disk_len(s, t, zlen) AS
  CASE WHEN zlen IS NULL THEN t - s ELSE zlen END;
CREATE OR REPLACE MACRO _map_on_disk_end(s, t, delta, zp, zlen) AS
  _map_on_disk_off(s, delta, zp) + _map_on_disk_len(s, t, zlen);

-- Bytes of files of role r ('image' or 'guest_file') that were freed
-- during the capture, as known from source src: with src 'fiemap_start',
-- bytes in the start snapshot and in no extent of map_extents (a hole
-- punched, a range zeroed by unmapping it, the file cut short); with
-- 'mapping_events', bytes allocated during the capture (mapping events)
-- and at that place in neither map_extents nor the start snapshot (a
-- file grown and cut short again, a hole filled and punched again, a
-- block a copy-on-write host placed and then moved when it was
-- rewritten: btrfs, where the place is also per disk).  lo, hi: file
-- bytes; delta: their old place minus file offset; disk_dev: the old
-- place's device.  (Where map_extents has no end snapshot of a file, it
-- is the start one, or the mapping events, and those free nothing.)
-- moved: captures (a list) where, with 'fiemap_start', the start
-- snapshot's bytes that map_extents has at another place count too: a
-- copy-on-write FS moved them (a btrfs guest's block rewritten), and they
-- were at the old place until then.  (Only there: on a FS that writes in
-- place, a file's inode number taken again by a new file would look moved.)
-- Bytes the start snapshot has shared with another file (a reflink, on
-- xfs say) count so everywhere: a rewrite of shared blocks moves them.
CREATE OR REPLACE MACRO _map_extents_freed(r, src, moved := []::VARCHAR[]) AS TABLE
WITH st AS (
  SELECT capture_id, dev, ino, logical_bytes::BIGINT AS lo,
         (logical_bytes + length_bytes)::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta, disk_dev, shared,
         CASE WHEN disk_length_bytes IS NOT NULL THEN physical_bytes::BIGINT END AS zp,
         disk_length_bytes::BIGINT AS zlen
  FROM _map_extents_all WHERE role = r AND source = src),
now AS (
  SELECT capture_id, dev, ino, logical_bytes::BIGINT AS lo, (logical_bytes + length_bytes)::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta, disk_dev
  FROM map_extents WHERE role = r
  UNION ALL
  SELECT capture_id, dev, ino, logical_bytes::BIGINT, (logical_bytes + length_bytes)::BIGINT,
         physical_bytes::BIGINT - logical_bytes::BIGINT, disk_dev
  FROM _map_extents_all WHERE role = r AND source = 'fiemap_start' AND src = 'mapping_events'),
stk AS NOT MATERIALIZED (SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, * FROM st),
nowk AS (SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, lo, hi, delta, disk_dev
         FROM now),
covered AS (  -- each start extent's parts that some extent covers now
              -- (a mapping event's: at its place)
  SELECT capture_id, dev, ino, lo, hi, delta, disk_dev, zp, zlen, greatest(lo, o.lo) AS clo,
         least(hi, o.hi) AS chi
  FROM _overlaps('stk', 'nowk')
  WHERE (src <> 'mapping_events' AND NOT list_contains(moved, capture_id) AND NOT shared)
     OR (o.delta = delta AND o.disk_dev IS NOT DISTINCT FROM disk_dev)),
gaps AS (     -- (covered to: the furthest end of the parts before; copies may overlap)
  SELECT capture_id, dev, ino, delta, disk_dev, zp, zlen, clo, hi,
         coalesce(max(chi) OVER (PARTITION BY capture_id, dev, ino, lo, hi, delta, disk_dev
                                 ORDER BY clo, chi
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), lo) AS covered_to,
         max(chi) OVER (PARTITION BY capture_id, dev, ino, lo, hi, delta, disk_dev) AS last_end
  FROM covered)
SELECT capture_id, dev, ino, covered_to AS lo, clo AS hi, delta, disk_dev, zp, zlen FROM gaps
WHERE clo > covered_to
UNION ALL
SELECT DISTINCT capture_id, dev, ino, last_end, hi, delta, disk_dev, zp, zlen FROM gaps
WHERE last_end < hi
UNION ALL
SELECT st.* EXCLUDE (shared) FROM st   -- (those no extent covers now at all)
ANTI JOIN covered c ON c.capture_id = st.capture_id AND c.dev = st.dev AND c.ino = st.ino
 AND c.lo = st.lo AND c.hi = st.hi AND c.delta IS NOT DISTINCT FROM st.delta
 AND c.disk_dev IS NOT DISTINCT FROM st.disk_dev;

-- Image bytes that moved or were freed during the capture: where the
-- start snapshot had them, for the parts where map_extents (the end
-- snapshot, as a rule) has them elsewhere or nowhere.  A copy-on-write
-- host (btrfs) writes a rewritten block to a new place; a read of the old
-- place before that (the host's read-modify-write of a partial page, say)
-- is found through these.  A hole punched in the image (the loop device's
-- discards) frees its blocks, and a host FS with online discard discards
-- them on its disk: found through these too (_map_image_freed), as are
-- image bytes allocated during the capture and freed before its end.
-- lo, hi: image bytes; delta: old disk offset minus image offset;
-- disk_dev: the old place's disk; freed: the bytes are nowhere at the end
-- (_map_image_freed), not elsewhere; placed: a freed place a copy-on-
-- write host's mapping event gave (_map_image_freed).  (A part
-- is moved when no copy of it
-- in map_extents is on the same disk with the same delta: on a mirrored
-- host each copy is cut at the same image offsets.)
CREATE OR REPLACE VIEW _map_image_moved AS
WITH st AS (   -- (in image bytes, as _map_image_extents)
  SELECT e.capture_id, e.logical_bytes::BIGINT + coalesce(f.shift, 0) AS lo,
         (e.logical_bytes + e.length_bytes)::BIGINT + coalesce(f.shift, 0) AS hi,
         e.physical_bytes::BIGINT - e.logical_bytes::BIGINT - coalesce(f.shift, 0) AS delta,
         e.disk_dev,
         CASE WHEN e.disk_length_bytes IS NOT NULL THEN e.physical_bytes::BIGINT END AS zp,
         e.disk_length_bytes::BIGINT AS zlen
  FROM _map_extents_all e LEFT JOIN _base_image_files f ON f.capture_id = e.capture_id AND f.ino = e.ino
  WHERE e.role = 'image' AND e.source = 'fiemap_start'),
now AS (
  SELECT capture_id, logical_bytes::BIGINT AS lo, (logical_bytes + length_bytes)::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta, disk_dev
  FROM _map_image_extents),
stk AS NOT MATERIALIZED (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, * FROM st),
nowk AS (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, * FROM now),
cand AS (
  SELECT DISTINCT capture_id, greatest(lo, o.lo) AS lo, least(hi, o.hi) AS hi, delta, disk_dev,
         zp, zlen
  FROM _overlaps('stk', 'nowk')
  WHERE o.delta <> delta OR o.disk_dev <> disk_dev),
reach AS (   -- per disk and place: how far the extents starting at or before lo reach
  SELECT capture_id, disk_dev, delta, lo,
         max(max(hi)) OVER (PARTITION BY capture_id, disk_dev, delta ORDER BY lo
                            ROWS UNBOUNDED PRECEDING) AS reach
  FROM now GROUP BY capture_id, disk_dev, delta, lo)
SELECT c.*, false AS freed, false AS placed FROM cand c   -- (not held by one extent now on the same disk at the same place)
ASOF LEFT JOIN reach n ON n.capture_id = c.capture_id AND n.disk_dev = c.disk_dev
 AND n.delta = c.delta AND c.lo >= n.lo
WHERE n.reach IS NULL OR n.reach < c.hi
UNION ALL
SELECT capture_id, lo, hi, delta, disk_dev, zp, zlen, true, placed FROM _map_image_freed;

-- Image bytes freed during the capture (a hole punched: the loop device's
-- discards), where they were: where the start snapshot had them, or for
-- bytes allocated during the capture and freed before its end (a guest
-- write into a hole of a sparse image, then the guest's discard of those
-- blocks), where the host FS's mapping events put them; as
-- _map_image_moved's rows.  Unlike the old place of bytes a copy-on-write
-- host moved, such a place held them until they were freed: links ties a
-- host-disk write there to the virtual-disk write in flight with it (not
-- to one that ended before: the place may hold other data once freed).
-- placed: on a copy-on-write host (btrfs), a place a mapping event gave:
-- the host wrote the bytes there during the capture (each write-back of a
-- page goes to a new place) and held them there until a rewrite moved
-- them on, and it never writes other data into a data place before that
-- frees it: links ties a host-disk write there as the write-back of the
-- image bytes too.  (On a host that writes in place, a place is freed by
-- a hole punched, at a time no event gives, and may hold other data
-- after.)
CREATE OR REPLACE VIEW _map_image_freed AS
SELECT x.capture_id, x.lo + coalesce(f.shift, 0) AS lo, x.hi + coalesce(f.shift, 0) AS hi,
       x.delta - coalesce(f.shift, 0) AS delta, x.disk_dev, x.zp, x.zlen,
       x.placed AND x.capture_id IN (SELECT capture_id FROM device_map
                                     WHERE level = 'hostfs' AND fs_type = 'btrfs') AS placed
FROM (SELECT *, false AS placed FROM _map_extents_freed('image', 'fiemap_start')
      UNION ALL SELECT *, true FROM _map_extents_freed('image', 'mapping_events')) x
LEFT JOIN _base_image_files f ON f.capture_id = x.capture_id AND f.ino = x.ino;

-- The rows of view `t` (capture_id, dev, ino and a guest-file byte range
-- [off, stop), plus any columns) carried through the guest file's extents
-- onto the virtual disk, in pieces: each row loses dev, ino, off and stop
-- and gains [vs, vt) and delta = virtual-disk minus file offset (a piece
-- of a compressed extent, a compressing btrfs guest's: [vs, vt) is all of
-- its compressed data, which any byte of it is read from).
CREATE OR REPLACE MACRO _map_into_vdisk(t) AS TABLE
WITH _iv_io AS NOT MATERIALIZED (SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, off AS lo, stop AS hi, *
                FROM query_table(t)),
_iv_e AS (
  SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, logical_bytes::BIGINT AS lo,
         (logical_bytes + length_bytes)::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta,
         CASE WHEN disk_length_bytes IS NOT NULL THEN physical_bytes::BIGINT END AS zp,
         disk_length_bytes::BIGINT AS zlen
  FROM map_extents WHERE role = 'guest_file')
SELECT * EXCLUDE (k0, k1, k2, lo, hi, o, dev, ino, off, stop), o.delta AS delta,
       _map_on_disk_off(greatest(off, o.lo), o.delta, o.zp) AS vs,
       _map_on_disk_end(greatest(off, o.lo), least(stop, o.hi), o.delta, o.zp, o.zlen) AS vt
FROM _overlaps('_iv_io', '_iv_e');

CREATE OR REPLACE VIEW _map_vfs_io AS
SELECT capture_id, io_id, dev, ino, ts_ns, end_ns, op, offset_bytes AS off,
       offset_bytes + ret_bytes AS stop
FROM vfs_io WHERE op IN ('read', 'write', 'discard') AND ret_bytes > 0 AND offset_bytes >= 0;

-- Each file syscall's pieces on the virtual disk (through the guest
-- file's extents): [vs, vt), and delta = virtual-disk minus file offset.
-- Bytes freed during the capture (a hole punched, the file cut short)
-- are carried through where the start snapshot had them, or for bytes
-- allocated during the capture, where its mapping events put them: the
-- end snapshot has none there.  So are the calls that freed them (op
-- discard), and the reads and writes of them before.  So are bytes a
-- btrfs guest moved (it writes a rewritten block to a new place): a read
-- before the rewrite read the old place.
CREATE OR REPLACE VIEW _map_vfs_freeing AS
SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, off AS lo, stop AS hi, *
FROM _map_vfs_io v
SEMI JOIN (SELECT DISTINCT k0, k1, k2 FROM _map_guest_freed) f   -- (files with bytes freed)
  ON f.k0 = v.capture_id AND f.k1 = v.dev AND f.k2 = v.ino;
CREATE OR REPLACE VIEW _map_guest_freed AS
SELECT capture_id AS k0, dev::UBIGINT AS k1, ino::UBIGINT AS k2, lo, hi, delta, zp, zlen
FROM (SELECT * FROM _map_extents_freed('guest_file', 'fiemap_start', moved := (
        SELECT coalesce(list(capture_id), []) FROM device_map WHERE level = 'vfs' AND fs_type = 'btrfs'))
      UNION ALL SELECT * FROM _map_extents_freed('guest_file', 'mapping_events'));

CREATE OR REPLACE VIEW _map_vfs_ranges AS
SELECT capture_id, io_id, ts_ns, end_ns, op, delta, vs, vt FROM _map_into_vdisk('_map_vfs_io')
UNION ALL
SELECT capture_id, io_id, ts_ns, end_ns, op, o.delta,
       _map_on_disk_off(greatest(off, o.lo), o.delta, o.zp) AS vs,
       _map_on_disk_end(greatest(off, o.lo), least(stop, o.hi), o.delta, o.zp, o.zlen) AS vt
FROM _overlaps_2('_map_vfs_freeing', '_map_guest_freed');

-- map_vfs with image_offset_bytes in image bytes (_base_image_files), as
-- the views below it read it.
CREATE OR REPLACE VIEW _map_vfs AS
WITH v AS (   -- carried into the image (pieces: qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks clusters)
  SELECT capture_id, io_id, ts_ns, end_ns, op, ps - delta AS file_offset_bytes,
         (pt - ps)::UBIGINT AS bytes, ps::UBIGINT AS vdisk_offset_bytes,
         (ps + idelta)::UBIGINT AS image_offset_bytes
  FROM _map_into_image('_map_vfs_ranges')),
-- a piece that crosses an image extent's end (a guest block smaller than
-- the host's, or an image offset not aligned to it) splits there too
vk AS (
  SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, image_offset_bytes::BIGINT AS lo,
         (image_offset_bytes + bytes)::BIGINT AS hi, *
  FROM v),
w AS (   -- (and the pieces in no extent of the image, as they are)
  SELECT * EXCLUDE (k0, k1, k2, lo, hi, o), o.logical_bytes AS il, o.physical_bytes AS ip,
         o.disk_dev, greatest(lo, o.lo) AS ps, least(hi, o.hi) AS pt, o.zp, o.zlen
  FROM _overlaps_3('vk', '_map_image_extents_keyed', keep := true))
SELECT capture_id, io_id, ts_ns, end_ns, op,
       file_offset_bytes + coalesce(ps - image_offset_bytes::BIGINT, 0) AS file_offset_bytes,
       coalesce((pt - ps)::UBIGINT, bytes) AS bytes,
       (vdisk_offset_bytes + coalesce(ps - image_offset_bytes::BIGINT, 0))::UBIGINT AS vdisk_offset_bytes,
       coalesce(ps::UBIGINT, image_offset_bytes) AS image_offset_bytes,
       _map_on_disk_off(ps, ip::BIGINT - il::BIGINT, zp)::UBIGINT AS disk_offset_bytes, disk_dev,
       CASE WHEN ps IS NOT NULL THEN _map_on_disk_len(ps, pt, zlen) END::UBIGINT AS disk_bytes
FROM w;

-- map_vdisk with image_offset_bytes in image bytes (_base_image_files), as
-- the views below it read it.
CREATE OR REPLACE VIEW _map_vdisk AS
WITH r AS (
  SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, s, t
  FROM _map_vdisk_pieces WHERE s IS NOT NULL),
rk AS NOT MATERIALIZED (SELECT capture_id AS k0, 0::UBIGINT AS k1, 0::UBIGINT AS k2, s AS lo, t AS hi, * FROM r),
p AS (
  SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, s, t,
         greatest(s, o.lo) AS ps, least(t, o.hi) AS pt, o.delta, o.disk_dev, o.zp, o.zlen
  FROM _overlaps('rk', '_map_image_extents_keyed')),
whole AS (SELECT capture_id, io_id, s FROM p WHERE ps = s AND pt = t),
holey AS (   -- pieces not inside one extent (few: the rest skip the window)
  SELECT r.* FROM r ANTI JOIN whole USING (capture_id, io_id, s)),
edges AS (   -- their mapped pieces, and an empty one at the end
  SELECT h.capture_id, h.io_id, h.start_ns, h.c_ns, h.done_by_ns, h.op, h.s, p.ps, p.pt
  FROM holey h JOIN p USING (capture_id, io_id, s)
  UNION ALL
  SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, s, t, t FROM holey),
holes AS (   -- from the end of what is mapped so far to the next piece
  SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, ps AS he,
         greatest(s, coalesce(max(pt) OVER (PARTITION BY io_id, s, capture_id ORDER BY ps, pt
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s)) AS hs
  FROM edges)
SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, ps::UBIGINT AS image_offset_bytes,
       (pt - ps)::UBIGINT AS bytes, _map_on_disk_off(ps, delta, zp)::UBIGINT AS disk_offset_bytes,
       disk_dev, _map_on_disk_len(ps, pt, zlen)::UBIGINT AS disk_bytes
FROM p
UNION ALL
SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, hs::UBIGINT, (he - hs)::UBIGINT, NULL, NULL,
       NULL
FROM holes WHERE he > hs;

-- map_disk with image_offset_bytes in image bytes (_base_image_files), as
-- the views below it read it.
CREATE OR REPLACE VIEW _map_disk AS
WITH d AS NOT MATERIALIZED (   -- (keyed for _overlaps: capture, disk; disk bytes)
  SELECT capture_id AS k0, dev::UBIGINT AS k1, 0::UBIGINT AS k2, offset_bytes::BIGINT AS lo,
         (offset_bytes + bytes)::BIGINT AS hi, capture_id, io_id, start_ns, d_ns, c_ns, op
  FROM disk_io WHERE bytes > 0),
ie AS (   -- the image's extents where they are on the disk: delta, disk minus image
          -- bytes; il, ilen: the image bytes a compressed one holds (NULL: byte for byte)
  SELECT capture_id AS k0, disk_dev::UBIGINT AS k1, 0::UBIGINT AS k2, physical_bytes::BIGINT AS lo,
         (physical_bytes + coalesce(disk_length_bytes, length_bytes))::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta,
         CASE WHEN disk_length_bytes IS NOT NULL THEN logical_bytes::BIGINT END AS il,
         CASE WHEN disk_length_bytes IS NOT NULL THEN length_bytes::BIGINT END AS ilen
  FROM _map_image_extents),
m AS (   -- and where they were before they moved
  SELECT capture_id AS k0, disk_dev::UBIGINT AS k1, 0::UBIGINT AS k2,
         _map_on_disk_off(lo, delta, zp) AS lo,
         _map_on_disk_off(lo, delta, zp) + _map_on_disk_len(lo, hi, zlen) AS hi, delta,
         CASE WHEN zp IS NOT NULL THEN lo END AS il, CASE WHEN zp IS NOT NULL THEN hi - lo END AS ilen
  FROM _map_image_moved),
p AS (SELECT * FROM _overlaps('d', 'ie') UNION ALL SELECT * FROM _overlaps_2('d', 'm'))
SELECT capture_id, io_id, start_ns, d_ns, c_ns, op,
       greatest(lo, o.lo)::UBIGINT AS disk_offset_bytes,
       (least(hi, o.hi) - greatest(lo, o.lo))::UBIGINT AS bytes,
       coalesce(o.il, greatest(lo, o.lo) - o.delta)::UBIGINT AS image_offset_bytes,
       coalesce(o.ilen, least(hi, o.hi) - greatest(lo, o.lo))::UBIGINT AS image_bytes
FROM p;

-- The rows of view `t` (capture_id, image_offset_bytes in image bytes,
-- _base_image_files) with the file named: image_offset_bytes the offset
-- in it, image_ino the file.
CREATE OR REPLACE MACRO _map_in_files(t) AS TABLE
SELECT m.* REPLACE ((m.image_offset_bytes::BIGINT - f.shift)::UBIGINT AS image_offset_bytes),
       f.ino AS image_ino
FROM query_table(t) m
LEFT JOIN _base_image_files f
  ON f.capture_id = m.capture_id AND f.shift = (m.image_offset_bytes::BIGINT >> 50) << 50;

-- Pieces of each file syscall's byte range, mapped through the guest file's
-- extents to the virtual disk and through the image's extents to the host
-- disk.  A range that spans extents (of the file or of the image) gives
-- several pieces; bytes with no known guest mapping (holes, delayed
-- allocation) give none; a piece wholly in a hole of the image has no disk
-- offset (one partly in a hole keeps only its mapped parts).
-- @column capture_id VARCHAR     capture
-- @column io_id UBIGINT          vfs_io row
-- @column ts_ns UBIGINT          syscall entry
-- @column end_ns UBIGINT         syscall exit
-- @column op VARCHAR             read, write or discard (fallocate punching a hole or zeroing a range)
-- @column file_offset_bytes BIGINT start of the piece in the file
-- @column bytes UBIGINT          piece length
-- @column vdisk_offset_bytes UBIGINT byte offset on the virtual disk
-- @column image_offset_bytes UBIGINT byte offset in that file of the image's backing chain (image_ino) (NULL: no place in it, see map_vdisk_image)
-- @column disk_offset_bytes UBIGINT byte offset on the host disk (NULL if the image range is unmapped)
-- @column disk_dev UINTEGER      kernel dev_t of that host disk (a host FS on several devices: a row per copy)
-- @column disk_bytes UBIGINT     bytes of the host disk from disk_offset_bytes the piece is read from or written to: bytes, or for a piece of a compressed image extent (a btrfs host) all of that extent's compressed data, where disk_offset_bytes then starts (NULL: no place)
-- @column image_ino UBIGINT     inode of that file: the image, or a file of its backing chain
CREATE OR REPLACE VIEW map_vfs AS SELECT * FROM _map_in_files('_map_vfs');

-- Virtual-disk requests carried to the image (through a qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks image's
-- cluster map, see map_vdisk_image) and, piece by piece through the
-- image's extents, to the host disk; the parts no extent covers (holes of
-- a sparse image) are pieces too, with no disk offset.  Parts with no
-- place in a qcow2, qcow, vmdk, vdi, vhdx, vpc, qed, parallels or luks image give no row.
-- @column capture_id VARCHAR     capture
-- @column io_id UBIGINT          vdisk_io row
-- @column start_ns UBIGINT       first seen (Q)
-- @column c_ns UBIGINT           completion
-- @column done_by_ns UBIGINT     over at the latest (vdisk_io.done_by_ns: c_ns, or when its C was lost the next use of its request id)
-- @column op VARCHAR             read, write, ...
-- @column image_offset_bytes UBIGINT start of the piece in the image file (image_ino)
-- @column bytes UBIGINT          piece length
-- @column disk_offset_bytes UBIGINT byte offset on the host disk (NULL: a hole in the image)
-- @column disk_dev UINTEGER      kernel dev_t of that host disk (a host FS on several devices: a row per copy)
-- @column disk_bytes UBIGINT     bytes of the host disk from disk_offset_bytes the piece is read from or written to: bytes, or for a piece of a compressed image extent (a btrfs host) all of that extent's compressed data, where disk_offset_bytes then starts (NULL: a hole)
-- @column image_ino UBIGINT     inode of that file: the image, or a file of its backing chain
CREATE OR REPLACE VIEW map_vdisk AS SELECT * FROM _map_in_files('_map_vdisk');

-- Host disk requests carried back into the image file (inverse of the
-- image's extent map, and of where moved image bytes were at the start:
-- _map_image_moved); requests outside the image give no row.
-- @column capture_id VARCHAR     capture
-- @column io_id UBIGINT          disk_io row
-- @column start_ns UBIGINT       first seen (Q)
-- @column d_ns UBIGINT           dispatch
-- @column c_ns UBIGINT           completion
-- @column op VARCHAR             read, write, ...
-- @column disk_offset_bytes UBIGINT start of the piece on the disk
-- @column bytes UBIGINT          piece length
-- @column image_offset_bytes UBIGINT where the piece is in the image file (image_ino); a piece of a compressed extent's data (a btrfs host): where that extent starts, every byte of it being read from all of its data
-- @column image_bytes UBIGINT   the image bytes the piece holds: bytes, or for a piece of a compressed extent's data all of that extent's
-- @column image_ino UBIGINT     inode of that file: the image, or a file of its backing chain
CREATE OR REPLACE VIEW map_disk AS SELECT * FROM _map_in_files('_map_disk');
