-- Module links.blocks: each lower 4 KiB block tied to the upper event
-- that caused it (ASOF on the keyed sides of links.keyed), or classified
-- when none did: _links_blocks, which links sums per request.
-- INCLUDE links.keyed

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
