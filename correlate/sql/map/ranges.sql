-- Module map.ranges: every I/O's byte range carried down the stack.
-- INCLUDE map.extents
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE disk.io
-- INCLUDE hostfs.io
-- INCLUDE map.image

-- The image extents, with their disk (a btrfs on several devices: a row
-- per copy and per stripe); logical_bytes in image bytes (a backing
-- file's at its shift: _base_image_files).
CREATE OR REPLACE VIEW _map_image_extents AS
SELECT e.capture_id, (e.logical_bytes::BIGINT + coalesce(f.shift, 0))::UBIGINT AS logical_bytes,
       e.physical_bytes, e.length_bytes, e.disk_dev
FROM map_extents e LEFT JOIN _base_image_files f ON f.capture_id = e.capture_id AND f.ino = e.ino
WHERE e.role = 'image';

-- Bytes of files of role r ('image' or 'guest_file') that were freed
-- during the capture: in the start snapshot, in no extent of map_extents
-- (a hole punched, a range zeroed by unmapping it).  lo, hi: file bytes;
-- delta: their old place minus file offset; disk_dev: the old place's
-- device.  (Where map_extents has no end snapshot of a file, it is the
-- start one, and nothing is freed.)
CREATE OR REPLACE MACRO _map_extents_freed(r) AS TABLE
WITH st AS (
  SELECT capture_id, dev, ino, logical_bytes::BIGINT AS lo,
         (logical_bytes + length_bytes)::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta, disk_dev
  FROM _map_extents_all WHERE role = r AND source = 'fiemap_start'),
now AS (
  SELECT capture_id, dev, ino, logical_bytes::BIGINT AS lo, (logical_bytes + length_bytes)::BIGINT AS hi
  FROM map_extents WHERE role = r),
covered AS (  -- each start extent's parts that some extent covers now
  SELECT st.*, greatest(st.lo, now.lo) AS clo, least(st.hi, now.hi) AS chi
  FROM st JOIN now ON now.capture_id = st.capture_id AND now.dev = st.dev AND now.ino = st.ino
   AND now.lo < st.hi AND st.lo < now.hi),
gaps AS (     -- (covered to: the furthest end of the parts before; copies may overlap)
  SELECT capture_id, dev, ino, delta, disk_dev, clo, hi,
         coalesce(max(chi) OVER (PARTITION BY capture_id, dev, ino, lo, hi, delta, disk_dev
                                 ORDER BY clo, chi
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), lo) AS covered_to,
         max(chi) OVER (PARTITION BY capture_id, dev, ino, lo, hi, delta, disk_dev) AS last_end
  FROM covered)
SELECT capture_id, dev, ino, covered_to AS lo, clo AS hi, delta, disk_dev FROM gaps
WHERE clo > covered_to
UNION ALL
SELECT DISTINCT capture_id, dev, ino, last_end, hi, delta, disk_dev FROM gaps WHERE last_end < hi
UNION ALL
SELECT st.* FROM st
ANTI JOIN now ON now.capture_id = st.capture_id AND now.dev = st.dev AND now.ino = st.ino
 AND now.lo < st.hi AND st.lo < now.hi;

-- Image bytes that moved or were freed during the capture: where the
-- start snapshot had them, for the parts where map_extents (the end
-- snapshot, as a rule) has them elsewhere or nowhere.  A copy-on-write
-- host (btrfs) writes a rewritten block to a new place; a read of the old
-- place before that (the host's read-modify-write of a partial page, say)
-- is found through these.  A hole punched in the image (the loop device's
-- discards) frees its blocks, and a host FS with online discard discards
-- them on its disk: found through these too.
-- lo, hi: image bytes; delta: old disk offset minus image offset;
-- disk_dev: the old place's disk.  (A part is moved when no copy of it
-- in map_extents is on the same disk with the same delta: on a mirrored
-- host each copy is cut at the same image offsets.)
CREATE OR REPLACE VIEW _map_image_moved AS
WITH st AS (   -- (in image bytes, as _map_image_extents)
  SELECT e.capture_id, e.logical_bytes::BIGINT + coalesce(f.shift, 0) AS lo,
         (e.logical_bytes + e.length_bytes)::BIGINT + coalesce(f.shift, 0) AS hi,
         e.physical_bytes::BIGINT - e.logical_bytes::BIGINT - coalesce(f.shift, 0) AS delta,
         e.disk_dev
  FROM _map_extents_all e LEFT JOIN _base_image_files f ON f.capture_id = e.capture_id AND f.ino = e.ino
  WHERE e.role = 'image' AND e.source = 'fiemap_start'),
now AS (
  SELECT capture_id, logical_bytes::BIGINT AS lo, (logical_bytes + length_bytes)::BIGINT AS hi,
         physical_bytes::BIGINT - logical_bytes::BIGINT AS delta, disk_dev
  FROM _map_image_extents),
cand AS (
  SELECT DISTINCT st.capture_id, greatest(st.lo, now.lo) AS lo, least(st.hi, now.hi) AS hi,
         st.delta, st.disk_dev
  FROM st JOIN now ON now.capture_id = st.capture_id AND now.lo < st.hi AND st.lo < now.hi
  WHERE now.delta <> st.delta OR now.disk_dev <> st.disk_dev)
SELECT c.* FROM cand c
ANTI JOIN now n ON n.capture_id = c.capture_id AND n.disk_dev = c.disk_dev AND n.delta = c.delta
               AND n.lo <= c.lo AND c.hi <= n.hi
UNION ALL
SELECT x.capture_id, x.lo + coalesce(f.shift, 0), x.hi + coalesce(f.shift, 0),
       x.delta - coalesce(f.shift, 0), x.disk_dev
FROM _map_extents_freed('image') x
LEFT JOIN _base_image_files f ON f.capture_id = x.capture_id AND f.ino = x.ino;

-- The rows of view `t` (capture_id, dev, ino and a guest-file byte range
-- [off, stop), plus any columns) carried through the guest file's extents
-- onto the virtual disk, in pieces: each row loses dev, ino, off and stop
-- and gains [vs, vt) and delta = virtual-disk minus file offset.
CREATE OR REPLACE MACRO _map_into_vdisk(t) AS TABLE
SELECT io.* EXCLUDE (dev, ino, off, stop),
       e.physical_bytes::BIGINT - e.logical_bytes::BIGINT AS delta,
       greatest(io.off, e.logical_bytes::BIGINT) + delta AS vs,
       least(io.stop, (e.logical_bytes + e.length_bytes)::BIGINT) + delta AS vt
FROM query_table(t) io JOIN map_extents e
  ON e.capture_id = io.capture_id AND e.dev = io.dev AND e.ino = io.ino
 AND e.role = 'guest_file'
 AND e.logical_bytes::BIGINT < io.stop AND io.off < (e.logical_bytes + e.length_bytes)::BIGINT;

CREATE OR REPLACE VIEW _map_vfs_io AS
SELECT capture_id, io_id, dev, ino, ts_ns, end_ns, op, offset_bytes AS off,
       offset_bytes + ret_bytes AS stop
FROM vfs_io WHERE op IN ('read', 'write', 'discard') AND ret_bytes > 0 AND offset_bytes >= 0;

-- Each file syscall's pieces on the virtual disk (through the guest
-- file's extents): [vs, vt), and delta = virtual-disk minus file offset.
-- A hole punched (fallocate, op discard) is carried through where the
-- start snapshot had the bytes it freed: the end snapshot has none there.
CREATE OR REPLACE VIEW _map_vfs_ranges AS
SELECT capture_id, io_id, ts_ns, end_ns, op, delta, vs, vt FROM _map_into_vdisk('_map_vfs_io')
UNION ALL
SELECT io.capture_id, io.io_id, io.ts_ns, io.end_ns, io.op, f.delta,
       greatest(io.off, f.lo) + f.delta AS vs, least(io.stop, f.hi) + f.delta AS vt
FROM _map_vfs_io io JOIN _map_extents_freed('guest_file') f
  ON f.capture_id = io.capture_id AND f.dev = io.dev AND f.ino = io.ino
 AND f.lo < io.stop AND io.off < f.hi
WHERE io.op = 'discard';

-- map_vfs with image_offset_bytes in image bytes (_base_image_files), as
-- the views below it read it.
CREATE OR REPLACE VIEW _map_vfs AS
WITH v AS (   -- carried into the image (pieces: qcow2, vmdk, vdi, vhdx or vpc clusters)
  SELECT capture_id, io_id, ts_ns, end_ns, op, ps - delta AS file_offset_bytes,
         (pt - ps)::UBIGINT AS bytes, ps::UBIGINT AS vdisk_offset_bytes,
         (ps + idelta)::UBIGINT AS image_offset_bytes
  FROM _map_into_image('_map_vfs_ranges')),
-- a piece that crosses an image extent's end (a guest block smaller than
-- the host's, or an image offset not aligned to it) splits there too
w AS (
  SELECT v.*, ie.logical_bytes AS il, ie.physical_bytes AS ip, ie.disk_dev,
         greatest(v.image_offset_bytes::BIGINT, ie.logical_bytes::BIGINT) AS ps,
         least((v.image_offset_bytes + v.bytes)::BIGINT,
               (ie.logical_bytes + ie.length_bytes)::BIGINT) AS pt
  FROM v LEFT JOIN _map_image_extents ie
    ON ie.capture_id = v.capture_id
   AND ie.logical_bytes < v.image_offset_bytes + v.bytes
   AND v.image_offset_bytes < ie.logical_bytes + ie.length_bytes)
SELECT capture_id, io_id, ts_ns, end_ns, op,
       file_offset_bytes + coalesce(ps - image_offset_bytes::BIGINT, 0) AS file_offset_bytes,
       coalesce((pt - ps)::UBIGINT, bytes) AS bytes,
       (vdisk_offset_bytes + coalesce(ps - image_offset_bytes::BIGINT, 0))::UBIGINT AS vdisk_offset_bytes,
       coalesce(ps::UBIGINT, image_offset_bytes) AS image_offset_bytes,
       (ip + (ps - il))::UBIGINT AS disk_offset_bytes, disk_dev
FROM w;

-- map_vdisk with image_offset_bytes in image bytes (_base_image_files), as
-- the views below it read it.
CREATE OR REPLACE VIEW _map_vdisk AS
WITH r AS (
  SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, s, t
  FROM _map_vdisk_pieces WHERE s IS NOT NULL),
p AS (
  SELECT r.capture_id, r.io_id, r.start_ns, r.c_ns, r.done_by_ns, r.op, r.s, r.t,
         greatest(r.s, ie.logical_bytes::BIGINT) AS ps,
         least(r.t, (ie.logical_bytes + ie.length_bytes)::BIGINT) AS pt,
         ie.physical_bytes::BIGINT - ie.logical_bytes::BIGINT AS delta, ie.disk_dev
  FROM r JOIN _map_image_extents ie
    ON ie.capture_id = r.capture_id AND ie.logical_bytes::BIGINT < r.t
   AND r.s < (ie.logical_bytes + ie.length_bytes)::BIGINT),
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
       (pt - ps)::UBIGINT AS bytes, (ps + delta)::UBIGINT AS disk_offset_bytes, disk_dev
FROM p
UNION ALL
SELECT capture_id, io_id, start_ns, c_ns, done_by_ns, op, hs::UBIGINT, (he - hs)::UBIGINT, NULL, NULL
FROM holes WHERE he > hs;

-- map_disk with image_offset_bytes in image bytes (_base_image_files), as
-- the views below it read it.
CREATE OR REPLACE VIEW _map_disk AS
SELECT d.capture_id, d.io_id, d.start_ns, d.d_ns, d.c_ns, d.op,
       greatest(d.offset_bytes, ie.physical_bytes) AS disk_offset_bytes,
       (least(d.offset_bytes + d.bytes, ie.physical_bytes + ie.length_bytes)
        - greatest(d.offset_bytes, ie.physical_bytes)) AS bytes,
       greatest(d.offset_bytes, ie.physical_bytes) - ie.physical_bytes + ie.logical_bytes
         AS image_offset_bytes
FROM disk_io d JOIN _map_image_extents ie
  ON ie.capture_id = d.capture_id AND ie.disk_dev = d.dev
 AND ie.physical_bytes < d.offset_bytes + d.bytes
 AND d.offset_bytes < ie.physical_bytes + ie.length_bytes
WHERE d.bytes > 0
UNION ALL
SELECT d.capture_id, d.io_id, d.start_ns, d.d_ns, d.c_ns, d.op,
       greatest(d.offset_bytes::BIGINT, m.lo + m.delta)::UBIGINT,
       (least((d.offset_bytes + d.bytes)::BIGINT, m.hi + m.delta)
        - greatest(d.offset_bytes::BIGINT, m.lo + m.delta))::UBIGINT,
       (greatest(d.offset_bytes::BIGINT, m.lo + m.delta) - m.delta)::UBIGINT
FROM disk_io d JOIN _map_image_moved m
  ON m.capture_id = d.capture_id AND m.disk_dev = d.dev AND m.lo + m.delta < (d.offset_bytes + d.bytes)::BIGINT
 AND d.offset_bytes::BIGINT < m.hi + m.delta
WHERE d.bytes > 0;

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
-- @column image_ino UBIGINT     inode of that file: the image, or a file of its backing chain
CREATE OR REPLACE VIEW map_vfs AS SELECT * FROM _map_in_files('_map_vfs');

-- Virtual-disk requests carried to the image (through a qcow2, vmdk, vdi, vhdx or vpc image's
-- cluster map, see map_vdisk_image) and, piece by piece through the
-- image's extents, to the host disk; the parts no extent covers (holes of
-- a sparse image) are pieces too, with no disk offset.  Parts with no
-- place in a qcow2, vmdk, vdi, vhdx or vpc image give no row.
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
-- @column image_offset_bytes UBIGINT where the piece is in the image file (image_ino)
-- @column image_ino UBIGINT     inode of that file: the image, or a file of its backing chain
CREATE OR REPLACE VIEW map_disk AS SELECT * FROM _map_in_files('_map_disk');
