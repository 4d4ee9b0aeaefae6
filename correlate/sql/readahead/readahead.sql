-- Module readahead.readahead: pages brought in ahead of demand, and whether
-- the level above ever read them.
-- INCLUDE vfs.io
-- INCLUDE vdisk.io
-- INCLUDE map.image
-- INCLUDE codes.tables

-- An overlay's files copied up to its upper layer: the overlay keeps the
-- lower file's inode number (its calls carry it), while the page cache is
-- the upper file's, another inode on the file system under it.  Told by
-- their extents: FIEMAP through the overlay gives the upper file's, so an
-- overlay file's snapshot rows equal those of a file of another number
-- under it in the same snapshot.  Each such file: itself and that one.
CREATE OR REPLACE VIEW _overlay_copies AS
WITH o AS (
  SELECT e.capture_id, e.phase, e.dev, e.ino, m.backing_dev, e.logical_bytes, e.physical_bytes,
         e.length_bytes
  FROM extent_maps e JOIN device_map m ON m.capture_id = e.capture_id AND m.dev = e.dev
   AND m.level = 'vfs' AND m.fs_type = 'overlay'
  WHERE e.role = 'guest_file'),
c AS (
  SELECT DISTINCT o.capture_id, o.dev, o.ino, b.ino AS real_ino
  FROM o JOIN extent_maps b ON b.capture_id = o.capture_id AND b.phase = o.phase
   AND b.dev = o.backing_dev AND b.role = 'guest_file' AND b.ino <> o.ino
   AND b.logical_bytes = o.logical_bytes AND b.physical_bytes = o.physical_bytes
   AND b.length_bytes = o.length_bytes)
SELECT * FROM c
UNION SELECT capture_id, dev, ino, ino FROM c;

-- Page-cache fills per level: `guest` = the guest FS's page cache (files on
-- the guest FS; demand = vfs reads and writes), `host` = the host page cache
-- of the image (demand = virtual-disk reads and writes, from queue to
-- completion).  Each page added is put down to one cause, first match:
-- `read` (a demand read covering it was in progress; a call on an
-- overlay's file is a demand on its layer file, and on the upper file it
-- was copied up to), `fault` (a page
-- fault on a memory-mapped file asked for it, at most 50 ms before: the
-- kernel's filemap_fault event), `readahead` (inside
-- the range of a readahead the adding task started on the file -- the
-- kernel's page_cache_ra_unbounded or page_cache_ra_order event, its
-- latest on the file, at most 50 ms before), `write` (a demand write
-- covering it was in progress: a buffered write, or the read half of a
-- partial-page one), `other` (the file system's own pages, e.g. btrfs
-- metadata).  A page is used when a demand read covers it after it was
-- added and before it was evicted (or the capture ended), or when a
-- process mapped it (a page fault, or fault-around mapping the cached
-- pages near one) in that time: a mapping is used for the whole folio it
-- touches (a large folio is mapped as one), and accesses to pages already
-- mapped make no event.  Fault-around that maps a 2 MiB folio with one
-- page-table entry leaves no event either (the kernel returns before its
-- tracepoint), so for memory-mapped files `used` is a lower bound.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        guest or host
-- @column dev UINTEGER         kernel dev_t of the file system
-- @column ino UBIGINT          file
-- @column page UBIGINT         page index (offset / 4096)
-- @column added_ns UBIGINT     when the page entered the page cache
-- @column evicted_ns UBIGINT   when it left (NULL: still cached at the end)
-- @column cause VARCHAR        read, fault, readahead, write or other (see above)
-- @column readahead BOOLEAN    cause = 'readahead': brought in ahead of demand
-- @column used BOOLEAN         read or mapped by the level above while cached
CREATE OR REPLACE VIEW readahead_pages AS
WITH lv AS (
  SELECT capture_id, dev, CASE level WHEN 'vfs' THEN 'guest' ELSE 'host' END AS level
  FROM device_map WHERE level IN ('vfs', 'hostfs')),
filled AS MATERIALIZED (   -- files with pages added: only their demand
              -- matters (an O_DIRECT run has none, and its I/O is never cut
              -- into pages); numbered: fk.  The joins below key on (fk, page),
              -- not (capture_id, dev, ino, page): with the time, a sort key
              -- within DuckDB's fastest 24 bytes
  SELECT capture_id, dev, ino, row_number() OVER (ORDER BY capture_id, dev, ino)::UINTEGER AS fk
  FROM (SELECT DISTINCT capture_id, dev, ino FROM pagecache_events WHERE event = _pagecache_event('add'))),
adds AS (
  SELECT p.capture_id, lv.level, p.dev, p.ino, f.fk, p.pid, p.ts_ns AS added_ns, p.index AS folio,
         unnest(range(p.index::BIGINT, (p.index + p.nr_pages)::BIGINT)) AS page
  FROM pagecache_events p JOIN lv ON lv.capture_id = p.capture_id AND lv.dev = p.dev
  JOIN filled f ON f.capture_id = p.capture_id AND f.dev = p.dev AND f.ino = p.ino
  WHERE p.event = _pagecache_event('add')),
ra AS (   -- readahead that reads: unbounded and large-folio order
  SELECT f.fk, p.pid, p.ts_ns AS ra_ns, p.index AS ra_first, p.index + p.nr_pages AS ra_end
  FROM pagecache_events p JOIN filled f USING (capture_id, dev, ino)
  WHERE p.event IN (_pagecache_event('ra_unbounded'), _pagecache_event('ra_order'))),
maps AS (   -- a memory-mapped file's pages faulted in or mapped around a fault
  SELECT f.fk, p.event, p.ts_ns,
         unnest(range(p.index::BIGINT, (p.index + p.nr_pages)::BIGINT)) AS page
  FROM pagecache_events p JOIN filled f USING (capture_id, dev, ino)
  WHERE p.event IN (_pagecache_event('fault'), _pagecache_event('map_pages'))),
dels AS (
  SELECT f.fk, p.ts_ns AS evicted_ns,
         unnest(range(p.index::BIGINT, (p.index + p.nr_pages)::BIGINT)) AS page
  FROM pagecache_events p JOIN filled f USING (capture_id, dev, ino)
  WHERE p.event = _pagecache_event('delete')),
demand AS (   -- (the bytes a call moved, not those it asked for: coreutils' cp
              -- asks copy_file_range for 2^63 bytes)
  SELECT f.fk, v.op, v.ts_ns AS d_start, v.end_ns AS d_end,
         unnest(range((v.offset_bytes // 4096)::BIGINT,
                      ((v.offset_bytes + v.bytes + 4095) // 4096)::BIGINT)) AS page
  FROM vfs_io v
  -- (a call on an overlay's file: the page cache is its layer's file's,
  -- on the file system under it, by the same inode number; a file copied
  -- up: the lower's and the upper's)
  LEFT JOIN device_map o ON o.capture_id = v.capture_id AND o.dev = v.dev AND o.level = 'vfs'
                        AND o.fs_type = 'overlay'
  LEFT JOIN _overlay_copies c ON c.capture_id = v.capture_id AND c.dev = v.dev AND c.ino = v.ino
  JOIN filled f ON f.capture_id = v.capture_id AND f.dev = coalesce(o.backing_dev, v.dev)
               AND f.ino = coalesce(c.real_ino, v.ino)
  WHERE v.op IN ('read', 'write') AND v.offset_bytes >= 0 AND v.bytes > 0
  UNION ALL   -- image pages are demanded by virtual-disk I/O, for as long as it lasts
  -- (in the file of the image's backing chain the piece is in)
  SELECT f.fk, v.op, v.start_ns, coalesce(v.done_by_ns, v.start_ns),
         unnest(range(((v.s - i.shift) // 4096)::BIGINT, ((v.t - i.shift + 4095) // 4096)::BIGINT))
  FROM _map_vdisk_pieces v JOIN device_map m ON m.capture_id = v.capture_id AND m.level = 'vdisk'
  JOIN _base_image_files i ON i.capture_id = v.capture_id AND i.shift = (v.s >> 50) << 50
  JOIN filled f ON f.capture_id = m.capture_id AND f.dev = m.backing_dev AND f.ino = i.ino
  WHERE v.op IN ('read', 'write') AND v.s IS NOT NULL),
reads AS (SELECT * EXCLUDE (op) FROM demand WHERE op = 'read'),
writes AS (SELECT * EXCLUDE (op) FROM demand WHERE op = 'write'),
a1 AS (  -- the eviction that ended this stay
  SELECT a.*, d.evicted_ns FROM adds a
  ASOF LEFT JOIN dels d ON d.fk = a.fk AND d.page = a.page AND d.evicted_ns >= a.added_ns),
a2 AS (  -- the latest demand read of the page that started before the add
  SELECT a1.*, m.d_end FROM a1
  ASOF LEFT JOIN reads m ON m.fk = a1.fk AND m.page = a1.page AND a1.added_ns >= m.d_start),
a3 AS (  -- the first demand read of the page after the add
  SELECT a2.*, n.d_start AS next_read FROM a2
  ASOF LEFT JOIN (SELECT fk, page, d_start FROM reads) n
    ON n.fk = a2.fk AND n.page = a2.page AND n.d_start >= a2.added_ns),
a4 AS (  -- the latest readahead the adding task started on the file
  SELECT a3.*, r.ra_ns, r.ra_first, r.ra_end FROM a3
  ASOF LEFT JOIN ra r ON r.fk = a3.fk AND r.pid = a3.pid AND a3.added_ns >= r.ra_ns),
a5 AS (  -- the latest demand write of the page that started before the add
  SELECT a4.*, w.d_end AS w_end FROM a4
  ASOF LEFT JOIN writes w ON w.fk = a4.fk AND w.page = a4.page AND a4.added_ns >= w.d_start),
a6 AS (  -- the latest fault on the page at or before the add
  SELECT a5.*, f.ts_ns AS fault_ns FROM a5
  ASOF LEFT JOIN (SELECT * FROM maps WHERE event = _pagecache_event('fault')) f
    ON f.fk = a5.fk AND f.page = a5.page AND a5.added_ns >= f.ts_ns),
a7 AS (  -- the first mapping of the page after the add
  SELECT a6.*, n.ts_ns AS next_map FROM a6
  ASOF LEFT JOIN maps n ON n.fk = a6.fk AND n.page = a6.page AND n.ts_ns >= a6.added_ns),
c AS MATERIALIZED (
  SELECT *, coalesce(added_ns <= d_end, false) AS in_read,
         coalesce(added_ns - fault_ns <= 50000000, false) AS in_fault,
         CASE WHEN coalesce(added_ns <= d_end, false) THEN 'read'
              WHEN coalesce(added_ns - fault_ns <= 50000000, false) THEN 'fault'
              WHEN page >= ra_first AND page < ra_end AND added_ns - ra_ns <= 50000000 THEN 'readahead'
              WHEN coalesce(added_ns <= w_end, false) THEN 'write'
              ELSE 'other' END AS cause
  FROM a7),
mapped AS (   -- folios mapped while cached: the whole folio counts (one
              -- large folio, one mapping)
  SELECT DISTINCT fk, added_ns, folio FROM c WHERE next_map <= coalesce(evicted_ns, next_map))
SELECT c.capture_id, c.level, c.dev, c.ino, c.page::UBIGINT AS page, c.added_ns, c.evicted_ns,
       c.cause, c.cause = 'readahead' AS readahead,
       coalesce(c.next_read IS NOT NULL AND c.next_read <= coalesce(c.evicted_ns, c.next_read),
                false)
         OR c.in_read OR c.in_fault OR m.fk IS NOT NULL AS used
FROM c LEFT JOIN mapped m USING (fk, added_ns, folio);

-- Readahead per level: bytes brought in ahead of demand, used and unused,
-- and what brought in the rest.
-- @column capture_id VARCHAR   capture
-- @column level VARCHAR        guest or host
-- @column filled_bytes BIGINT  all bytes added to the page cache
-- @column readahead_bytes BIGINT bytes added ahead of demand (cause readahead)
-- @column used_bytes BIGINT    readahead bytes later read by the level above
-- @column unused_bytes BIGINT  readahead bytes never read before eviction or capture end
-- @column unused_fraction DOUBLE unused / readahead
-- @column read_filled_bytes BIGINT bytes added for a demand read in progress
-- @column write_filled_bytes BIGINT bytes added for a demand write in progress
-- @column other_filled_bytes BIGINT bytes added for neither (file-system metadata, ...)
-- @column fault_filled_bytes BIGINT bytes added for a page fault on a memory-mapped file
CREATE OR REPLACE VIEW readahead_summary AS
SELECT capture_id, level, count(*) * 4096 AS filled_bytes,
       count(*) FILTER (WHERE readahead) * 4096 AS readahead_bytes,
       count(*) FILTER (WHERE readahead AND used) * 4096 AS used_bytes,
       count(*) FILTER (WHERE readahead AND NOT used) * 4096 AS unused_bytes,
       count(*) FILTER (WHERE readahead AND NOT used) / nullif(count(*) FILTER (WHERE readahead), 0)
         AS unused_fraction,
       count(*) FILTER (WHERE cause = 'read') * 4096 AS read_filled_bytes,
       count(*) FILTER (WHERE cause = 'write') * 4096 AS write_filled_bytes,
       count(*) FILTER (WHERE cause = 'other') * 4096 AS other_filled_bytes,
       count(*) FILTER (WHERE cause = 'fault') * 4096 AS fault_filled_bytes
FROM readahead_pages GROUP BY ALL;
