-- Module links.links: the causal join — each lower request tied to the
-- upper event(s) that caused it.  The hops and their keyed sides are in
-- links.keyed, the join of each block in links.blocks; here the blocks
-- summed per request, and the views over them.
-- INCLUDE links.blocks

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
