-- Module util.blocks: generic helpers over byte ranges (no level knowledge).

-- 4 KiB block numbers a byte range [off, off + len) touches.
CREATE OR REPLACE MACRO _blocks(off, len) AS
  range((off // 4096)::BIGINT, ((off + len + 4095) // 4096)::BIGINT);

-- Bytes of [a, a + alen) inside [b, b + blen).
CREATE OR REPLACE MACRO _overlap(a, alen, b, blen) AS
  greatest(least(a + alen, b + blen)::BIGINT - greatest(a, b)::BIGINT, 0);

-- Class of a lower-level request nobody above explains, from its flags
-- (nestrace bits: 1 SYNC 2 META 8 FUA 16 PREFLUSH 32 RAHEAD 64 BACKGROUND
-- 256 IDLE).  SYNC | META | IDLE together is how jbd2 (ext3, ext4:
-- JBD2_JOURNAL_REQ_FLAGS) and the xfs log (xlog_write_iclog) write their
-- journals; a disk without FUA loses the commit block's FUA and PREFLUSH
-- to the flush machinery before dispatch, but not these.  A discard no
-- application call explains (fstrim's ioctl, the FS's online discard) is
-- its own class.
CREATE OR REPLACE MACRO _unattributed_kind(op, flags) AS
  CASE WHEN op = 'read' AND flags & 32 <> 0 THEN 'readahead'
       WHEN op = 'read' AND flags & 2 <> 0 THEN 'metadata'
       WHEN op = 'write' AND flags & (8 | 16) <> 0 THEN 'journal'
       WHEN op = 'write' AND flags & (1 | 2 | 256) = (1 | 2 | 256) THEN 'journal'
       WHEN flags & 2 <> 0 THEN 'metadata'
       WHEN op = 'write' AND flags & 1 <> 0 THEN 'journal'
       WHEN op = 'write' THEN 'writeback'
       WHEN op = 'discard' THEN 'discard'
       ELSE 'other' END;
