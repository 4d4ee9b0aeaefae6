// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* hostfs: what the host file system does with the traced file (the disk
 * image): its read/write accesses, page cache fills and evictions,
 * readahead, dirtying and writeback, and the file-offset -> disk-address
 * mappings it looks up.  Also used for the guest FS's page cache and
 * mappings (role bits per device).  See docs/design/hostfs-hooks.md for which
 * file system yields which event. */
#include "common.bpf.h"
#include "core_fixes.bpf.h"

/* Keep the record types in BTF: tests check their layout against schemas/. */
struct nt_hostfs_event *unused_hostfs_event __attribute__((unused));
struct nt_pagecache_event *unused_pagecache_event __attribute__((unused));
struct nt_mapping_event *unused_mapping_event __attribute__((unused));

/* hostfs_event.source values are NT_HOSTFS_SOURCE_<HOOK>, from schemas/ */
/* ... and op, pagecache_event.event and mapping_event.source values
 * NT_HOSTFS_OP_*, NT_PAGECACHE_EVENT_* and NT_MAPPING_SOURCE_* */

static __always_inline int access__emit(struct inode *inode, __s64 offset,
					__u64 bytes, __u32 flags,
					__u16 source, __u16 op, const bool btf)
{
	struct nt_hostfs_event *e;
	__u32 dev;
	__u64 ino;

	if (!inode__wanted(inode, NT_ROLE_FILE, &dev, &ino, btf))
		return 0;
	e = RESERVE(hostfs_event, HOSTFS_EVENT, bpf_ktime_get_ns());
	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->ino = ino;
	e->offset_bytes = offset;
	e->bytes = bytes;
	e->isize_bytes = RD1(btf, inode, i_size);
	e->dev = dev;
	e->pid = task__tgid();
	e->iocb_flags = flags;
	e->source = source;
	e->op = op;
	task__comm(e->comm, btf);
	record__submit(e);
	return 0;
}

/* nestrace iocb_flags bit: the file's lock was held exclusively */
#define NT_IOCB_IOLOCK_EXCL 32

static __always_inline int kiocb__emit(struct kiocb *iocb, struct iov_iter *iter,
				       __u16 source, __u16 op, __u32 extra, const bool btf)
{
	struct inode *inode = RD2(btf, iocb, ki_filp, f_inode);
	int ki_flags = RD1(btf, iocb, ki_flags);

	if (op > NT_HOSTFS_OP_WRITE)	/* iomap dio: direction from the iter */
		op = iter__is_source(iter, btf) ? NT_HOSTFS_OP_WRITE : NT_HOSTFS_OP_READ;
	return access__emit(inode, RD1(btf, iocb, ki_pos),
			    RD1(btf, iter, count), iocb__nt_flags(ki_flags) | extra,
			    source, op, btf);
}

/* xfs: one event per read_iter/write_iter call, exact offset and count. */
NT_TWIN(xfs_file_buffered_read)
{ return kiocb__emit(ARG(0, struct kiocb *), ARG(1, struct iov_iter *), NT_HOSTFS_SOURCE_XFS_FILE_BUFFERED_READ, NT_HOSTFS_OP_READ, 0, btf); }
NT_TWIN(xfs_file_buffered_write)
{ return kiocb__emit(ARG(0, struct kiocb *), ARG(1, struct iov_iter *), NT_HOSTFS_SOURCE_XFS_FILE_BUFFERED_WRITE, NT_HOSTFS_OP_WRITE, 0, btf); }
NT_TWIN(xfs_file_direct_read)
{ return kiocb__emit(ARG(0, struct kiocb *), ARG(1, struct iov_iter *), NT_HOSTFS_SOURCE_XFS_FILE_DIRECT_READ, NT_HOSTFS_OP_READ, 0, btf); }
/* A direct write not aligned to the FS block is first tried under the
 * shared iolock, for overwrites only; one that needs allocation fails
 * (-EAGAIN) and is tried again under the exclusive lock: a second event
 * for the same write.  Which lock is held tells the two apart (hostfs_io
 * drops the failed try). */
NT_TWIN(xfs_file_direct_write)
{
	struct kiocb *iocb = ARG(0, struct kiocb *);
	struct inode *inode = RD2(btf, iocb, ki_filp, f_inode);

	return kiocb__emit(iocb, ARG(1, struct iov_iter *), NT_HOSTFS_SOURCE_XFS_FILE_DIRECT_WRITE,
			   NT_HOSTFS_OP_WRITE, inode__write_locked(inode) ? NT_IOCB_IOLOCK_EXCL : 0, btf);
}
/* Every iomap file system's direct I/O (xfs, ext2/3/4, btrfs). */
NT_TWIN(iomap_dio_rw_begin)
{ return kiocb__emit(ARG(0, struct kiocb *), ARG(1, struct iov_iter *), NT_HOSTFS_SOURCE_IOMAP_DIO_RW_BEGIN, 0xff, 0, btf); }

/* Buffered reads of every file system: filemap_read() asks for pages. */
NT_TWIN(mm_filemap_get_pages)
{
	struct address_space *m = ARG(0, struct address_space *);
	__u64 first = ctx[1], last = ctx[2];

	return access__emit(RD1(btf, m, host), first << 12,
			    (last - first + 1) << 12, 0, NT_HOSTFS_SOURCE_MM_FILEMAP_GET_PAGES, NT_HOSTFS_OP_READ, btf);
}

/* ext2/3/4 buffered writes, one event per page-sized chunk. */
NT_TWIN(ext4_write_begin)
{ return access__emit(ARG(0, struct inode *), ctx[1], (__u32)ctx[2], 0, NT_HOSTFS_SOURCE_EXT4_WRITE_BEGIN, NT_HOSTFS_OP_WRITE, btf); }
NT_TWIN(ext4_da_write_begin)
{ return access__emit(ARG(0, struct inode *), ctx[1], (__u32)ctx[2], 0, NT_HOSTFS_SOURCE_EXT4_DA_WRITE_BEGIN, NT_HOSTFS_OP_WRITE, btf); }

/* Holes punched in the image: the loop device's discards (a guest's
 * fstrim or online discard) and write-zeroes that may unmap.  ext4 says
 * so with the range in bytes.  xfs_free_file_space has no range: the
 * unmaps it makes do, in FS blocks, the whole range again for each
 * transaction it takes (hostfs_io keeps the first); unmaps of the
 * attribute and copy-on-write forks are not the file's data, and a remap
 * (the end of a copy-on-write write of a shared block, a clone over a
 * range) puts other blocks in the range's place: no hole. */
NT_TWIN(ext4_punch_hole)
{ return access__emit(ARG(0, struct inode *), ctx[1], ctx[2], 0, NT_HOSTFS_SOURCE_EXT4_PUNCH_HOLE, NT_HOSTFS_OP_DISCARD, btf); }
/* A range zeroed in place (the loop device's write-zeroes that must not
 * unmap: fallocate ZERO_RANGE; ext4 keeps the blocks, as unwritten
 * extents).  What the level above reads there is zeroes, as from a hole. */
NT_TWIN(ext4_zero_range)
{ return access__emit(ARG(0, struct inode *), ctx[1], ctx[2], 0, NT_HOSTFS_SOURCE_EXT4_ZERO_RANGE, NT_HOSTFS_OP_DISCARD, btf); }

#define NT_XFS_BMAPI_ATTRFORK (1 << 2)
#define NT_XFS_BMAPI_REMAP (1 << 7)
#define NT_XFS_BMAPI_COWFORK (1 << 8)
NT_TWIN(xfs_bunmap)
{
	struct xfs_inode *ip = ARG(0, struct xfs_inode *);
	int flags = (int)ctx[3];
	__u8 log;

	if (flags & (NT_XFS_BMAPI_ATTRFORK | NT_XFS_BMAPI_REMAP | NT_XFS_BMAPI_COWFORK))
		return 0;
	log = RD2(btf, ip, i_mount, m_sb.sb_blocklog);
	return access__emit(&ip->i_vnode, ctx[1] << log, ctx[2] << log, 0,
			    NT_HOSTFS_SOURCE_XFS_BUNMAP, NT_HOSTFS_OP_DISCARD, btf);
}

/* 1 when the task is in a page fault it took in user mode, not in a
 * system call: a folio dirtied then was dirtied by a store through a
 * shared mapping.  The entry code writes -1 as the "system call number"
 * of an exception (ptrace's orig_rax); a kernel thread's is 0. */
static __always_inline __u64 task__in_user_fault(void)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());

#if defined(__TARGET_ARCH_x86)
	return (long)BPF_CORE_READ(regs, orig_ax) == -1;
#elif defined(__TARGET_ARCH_arm64)
	return (int)BPF_CORE_READ(regs, syscallno) == -1;
#else
#error "nestrace hostfs: how does this architecture mark an exception's entry registers?"
#endif
}

static __always_inline int cache__emit(struct inode *inode, __u64 index,
				       __u64 nr_pages, __u64 aux, __u16 event, const bool btf)
{
	struct nt_pagecache_event *e;
	__u32 dev;
	__u64 ino;

	if (!inode)
		return 0;
	if (!inode__wanted(inode, NT_ROLE_CACHE, &dev, &ino, btf))
		return 0;
	e = RESERVE(pagecache_event, PAGECACHE_EVENT, bpf_ktime_get_ns());
	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->ino = ino;
	e->index = index;
	e->nr_pages = nr_pages;
	/* (asked only for a file traced: a dirtied folio's aux says who dirtied it) */
	e->aux = event == NT_PAGECACHE_EVENT_DIRTY ? task__in_user_fault() : aux;
	e->dev = dev;
	e->pid = task__tgid();
	e->event = event;
	e->_pad0 = 0;
	e->_pad1 = 0;
	task__comm(e->comm, btf);
	record__submit(e);
	return 0;
}

static __always_inline int folio__emit(struct folio *folio, __u16 event, const bool btf)
{
	struct inode *inode = folio__inode(folio, btf);

	if (!inode)
		return 0;
	return cache__emit(inode, BPF_CORE_READ(folio, index),
			   folio__nr_pages(folio), 0, event, btf);
}

NT_TWIN(mm_filemap_add_to_page_cache) { return folio__emit(ARG(0, struct folio *), NT_PAGECACHE_EVENT_ADD, btf); }
NT_TWIN(mm_filemap_delete_from_page_cache) { return folio__emit(ARG(0, struct folio *), NT_PAGECACHE_EVENT_DELETE, btf); }
NT_TWIN(writeback_dirty_folio) { return folio__emit(ARG(0, struct folio *), NT_PAGECACHE_EVENT_DIRTY, btf); }

NT_TWIN(page_cache_sync_ra)
{
	struct file_ra_state *ra = ARG(2, struct file_ra_state *);

	return cache__emit(ARG(0, struct inode *), ctx[1], RD1(btf, ra, ra_pages),
			   ctx[3], NT_PAGECACHE_EVENT_SYNC_RA, btf);
}
NT_TWIN(page_cache_async_ra)
{
	struct file_ra_state *ra = ARG(2, struct file_ra_state *);

	return cache__emit(ARG(0, struct inode *), ctx[1], RD1(btf, ra, ra_pages),
			   ctx[3], NT_PAGECACHE_EVENT_ASYNC_RA, btf);
}
NT_TWIN(page_cache_ra_unbounded)
{
	return cache__emit(ARG(0, struct inode *), ctx[1], ctx[2], ctx[3], NT_PAGECACHE_EVENT_RA_UNBOUNDED, btf);
}
NT_TWIN(page_cache_ra_order)
{
	struct file_ra_state *ra = ARG(2, struct file_ra_state *);

	return cache__emit(ARG(0, struct inode *), ctx[1], RD1(btf, ra, size),
			   RD1(btf, ra, async_size), NT_PAGECACHE_EVENT_RA_ORDER, btf);
}
NT_TWIN(iomap_writeback_folio)
{
	__u64 pos = ctx[1], len = ctx[2];

	return cache__emit(ARG(0, struct inode *), pos >> 12, (len + 4095) >> 12, 0, NT_PAGECACHE_EVENT_WRITEBACK, btf);
}

/* Reads of a memory-mapped file, made without a system call: a page
 * fault that found the page unmapped (filemap_fault: it reads the page if
 * it is not cached), and fault-around, which maps the cached pages around
 * a faulting one (filemap_map_pages, pages index..last_index). */
NT_TWIN(mm_filemap_fault)
{
	struct address_space *m = ARG(0, struct address_space *);

	return cache__emit(RD1(btf, m, host), ctx[1], 1, 0, NT_PAGECACHE_EVENT_FAULT, btf);
}
NT_TWIN(mm_filemap_map_pages)
{
	struct address_space *m = ARG(0, struct address_space *);
	__u64 first = ctx[1], last = ctx[2];

	return cache__emit(RD1(btf, m, host), first, last - first + 1, 0, NT_PAGECACHE_EVENT_MAP_PAGES, btf);
}

/* Mappings already reported: direct I/O looks the same mapping up on
 * every request; report each (inode, offset, address, length, type) once. */
struct map_key {
	__u64 ino;
	__u64 file_off;
	__u64 disk;
	__u64 len;
	__u32 dev;
	__u32 type;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct map_key);
	__type(value, __u8);
} seen_maps SEC(".maps");

/* zlen: a compressed extent's (btrfs): the bytes at disk that hold all
 * of its len bytes, compressed; 0 for a byte-for-byte mapping */
static __always_inline int map__emit_z(struct inode *inode, __u64 file_off,
				       __u64 disk, __u64 len, __u32 zlen, __u16 type,
				       __u16 source, __u32 flags, const bool btf)
{
	struct nt_mapping_event *e;
	struct map_key k = {};
	__u8 one = 1;
	__u32 dev;
	__u64 ino;

	if (!inode__wanted(inode, NT_ROLE_MAP, &dev, &ino, btf))
		return 0;
	k.ino = ino;
	k.file_off = file_off;
	k.disk = disk;
	k.len = len;
	k.dev = dev;
	k.type = type;
	if (bpf_map_lookup_elem(&seen_maps, &k))
		return 0;
	bpf_map_update_elem(&seen_maps, &k, &one, BPF_ANY);
	e = RESERVE(mapping_event, MAPPING_EVENT, bpf_ktime_get_ns());
	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->ino = ino;
	e->file_offset_bytes = file_off;
	e->disk_bytes = disk;
	e->length_bytes = len;
	e->dev = dev;
	e->map_type = type;
	e->source = source;
	e->flags = flags;
	e->disk_length_bytes = zlen;
	record__submit(e);
	return 0;
}

static __always_inline int map__emit(struct inode *inode, __u64 file_off,
				     __u64 disk, __u64 len, __u16 type,
				     __u16 source, __u32 flags, const bool btf)
{
	return map__emit_z(inode, file_off, disk, len, 0, type, source, flags, btf);
}

/* Mapped extents that existed before are in the FIEMAP snapshots; report
 * only what the capture changes: new allocations (IOMAP_F_NEW, bit 0 in
 * every kernel), unwritten extents and delayed allocations. */
#define NT_IOMAP_MAPPED 2
#define NT_IOMAP_F_NEW 1
static __always_inline int iomap__emit(struct inode *inode, struct iomap *m, __u16 source,
				       const bool btf)
{
	if (RD1(btf, m, type) == NT_IOMAP_MAPPED && !(RD1(btf, m, flags) & NT_IOMAP_F_NEW))
		return 0;
	return map__emit(inode, RD1(btf, m, offset), RD1(btf, m, addr), RD1(btf, m, length),
			 RD1(btf, m, type), source, RD1(btf, m, flags), btf);
}

NT_TWIN(iomap_iter_dstmap) { return iomap__emit(ARG(0, struct inode *), ARG(1, struct iomap *), NT_MAPPING_SOURCE_ITER_DSTMAP, btf); }
NT_TWIN(iomap_iter_srcmap) { return iomap__emit(ARG(0, struct inode *), ARG(1, struct iomap *), NT_MAPPING_SOURCE_ITER_SRCMAP, btf); }

/* btrfs places every write it makes of file data (write-back, and direct
 * writes: copy-on-write, a new place each time) in an ordered extent: the
 * file range and where it goes, in btrfs logical bytes (record maps them
 * through the chunk tree to the devices, as the FIEMAP snapshots).  A
 * compressed one is no byte-for-byte mapping: its compressed length goes
 * with it (disk_length_bytes), the whole of which any byte of it is in. */
NT_TWIN(btrfs_ordered_extent_add)
{
	struct btrfs_inode *bi = ARG(0, struct btrfs_inode *);
	struct btrfs_ordered_extent *o = ARG(1, struct btrfs_ordered_extent *);
	__u32 zlen = RD1(btf, o, compress_type) ? (__u32)RD1(btf, o, disk_num_bytes) : 0;

	return map__emit_z(btf ? &bi->vfs_inode : __builtin_preserve_access_index(&bi->vfs_inode),
			   RD1(btf, o, file_offset), RD1(btf, o, disk_bytenr), RD1(btf, o, num_bytes),
			   zlen, NT_IOMAP_MAPPED, NT_MAPPING_SOURCE_BTRFS_ORDERED_EXTENT, (__u32)RD1(btf, o, flags), btf);
}

/* ext2/3/4 buffered I/O and writeback map blocks here (ret = blocks):
 * ext4_ext_map_blocks for a file with extents (ext4), ext4_ind_map_blocks
 * for one with indirect blocks (an ext2 or ext3, which the ext4 driver
 * serves) — one event class, one body. */
static __always_inline int ext4_map__emit(unsigned long long *ctx, __u16 source, const bool btf)
{
	struct inode *inode = ARG(0, struct inode *);
	struct ext4_map_blocks *map = ARG(2, struct ext4_map_blocks *);
	int ret = (int)ctx[3];
	__u32 mflags, bits, unwritten;
	__u64 pblk;

	/* only new allocations (EXT4_MAP_NEW = 1 << BH_New) and unwritten
	 * extents: older mappings are in the FIEMAP snapshots.  This fires
	 * on every ext4 block mapping on the machine: decide on the flags
	 * before reading anything else. */
	if (ret <= 0)
		return 0;
	mflags = RD1(btf, map, m_flags);
	if (!(mflags & ((1U << bpf_core_enum_value(enum bh_state_bits, BH_New)) |
			(1U << bpf_core_enum_value(enum bh_state_bits, BH_Unwritten)))))
		return 0;
	bits = RD1(btf, inode, i_blkbits);
	pblk = RD1(btf, map, m_pblk);
	/* EXT4_MAP_UNWRITTEN is 1 << BH_Unwritten */
	unwritten = mflags & (1U << bpf_core_enum_value(enum bh_state_bits, BH_Unwritten));
	return map__emit(inode, (__u64)RD1(btf, map, m_lblk) << bits, pblk << bits,
			 (__u64)ret << bits, unwritten ? 3 : 2, source, mflags, btf);
}

NT_TWIN(ext4_ext_map_blocks_exit) { return ext4_map__emit(ctx, NT_MAPPING_SOURCE_EXT4_MAP_BLOCKS, btf); }
NT_TWIN(ext4_ind_map_blocks_exit) { return ext4_map__emit(ctx, NT_MAPPING_SOURCE_EXT4_IND_MAP_BLOCKS, btf); }

/* xfs reflinks (FICLONE, FICLONERANGE, dedupe: coreutils' cp clones by
 * default) give a file another's blocks with no I/O and no allocation,
 * so no hook above sees the clone's place.  Until the clone's blocks are
 * rewritten (copy-on-write: a new place, in the end snapshot) a read of
 * them reads the source's place.  The kernel traces each extent remapped
 * as a pair on one task: first the source's extent (its inode, its
 * offsets and blocks), then the destination's range it goes to (the
 * destination's inode and offsets, with the blocks it had before).  The
 * first is kept per task; the second makes the mapping event. */
struct xfs_remap_src {
	__u64 startblock;
	__u32 state;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct xfs_remap_src);
} xfs_remap_srcs SEC(".maps");

NT_TWIN(xfs_reflink_remap_extent_src)
{
	struct xfs_bmbt_irec *irec = ARG(1, struct xfs_bmbt_irec *);
	struct xfs_remap_src v = {};
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	v.startblock = RD1(btf, irec, br_startblock);
	v.state = RD1(btf, irec, br_state);
	bpf_map_update_elem(&xfs_remap_srcs, &tid, &v, BPF_ANY);
	return 0;
}

/* startblock values that are no place: a hole, a delayed allocation */
#define NT_XFS_HOLESTARTBLOCK ((__u64)-2)
#define NT_XFS_DELAYSTARTBLOCK ((__u64)-1)
#define NT_XFS_DIFLAG_REALTIME 1

/* A mapping event for the file range of irec at FS block fsb (state:
 * irec's br_state, of the extent the blocks come from).  An FS block
 * number is (AG number << agblklog | block in the AG); the AGs lie one
 * after another, agblocks each. */
static __always_inline int xfs_map__emit(struct xfs_inode *ip, struct xfs_bmbt_irec *irec,
					 __u64 fsb, __u32 state, __u16 source, const bool btf)
{
	__u64 agno, agbno, agblocks;
	__u8 blocklog, agblklog;

	if (fsb == NT_XFS_HOLESTARTBLOCK || fsb == NT_XFS_DELAYSTARTBLOCK ||
	    (RD1(btf, ip, i_diflags) & NT_XFS_DIFLAG_REALTIME))
		return 0;
	blocklog = RD2(btf, ip, i_mount, m_sb.sb_blocklog);
	agblklog = RD2(btf, ip, i_mount, m_sb.sb_agblklog);
	agblocks = RD2(btf, ip, i_mount, m_sb.sb_agblocks);
	agno = fsb >> (agblklog & 63);
	agbno = fsb & ((1ULL << (agblklog & 63)) - 1);
	return map__emit(&ip->i_vnode, (__u64)RD1(btf, irec, br_startoff) << (blocklog & 63),
			 (agno * agblocks + agbno) << (blocklog & 63),
			 (__u64)RD1(btf, irec, br_blockcount) << (blocklog & 63),
			 state == XFS_EXT_UNWRITTEN ? 3 : 2, source, 0, btf);
}

NT_TWIN(xfs_reflink_remap_extent_dest)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct xfs_remap_src *src = bpf_map_lookup_elem(&xfs_remap_srcs, &tid);

	if (!src)
		return 0;
	return xfs_map__emit(ARG(0, struct xfs_inode *), ARG(1, struct xfs_bmbt_irec *),
			     src->startblock, src->state, NT_MAPPING_SOURCE_XFS_REFLINK_REMAP, btf);
}

/* A write to a shared block (copy-on-write) goes to new blocks, which
 * replace the old ones in the file when it ends: first the new extent is
 * traced (remap_from), then the one it replaces (remap_to).  The end
 * snapshot has the new place, but not for a file deleted by then. */
NT_TWIN(xfs_reflink_cow_remap_from)
{
	struct xfs_bmbt_irec *irec = ARG(1, struct xfs_bmbt_irec *);

	return xfs_map__emit(ARG(0, struct xfs_inode *), irec, RD1(btf, irec, br_startblock),
			     RD1(btf, irec, br_state), NT_MAPPING_SOURCE_XFS_COW_REMAP, btf);
}

/* btrfs has no reflink tracepoint, but a clone drops the clone's cached
 * extent maps, and btrfs_get_extent, which every read and direct write
 * goes through, says where each extent is when it returns one (from its
 * cache or from the tree): a clone's range read before it is rewritten
 * is found at its source's place through this.  In btrfs logical bytes,
 * like the ordered extents (record maps both through the chunk tree).
 * Only the extent_map of Linux 6.11 on (disk_bytenr and offset; before,
 * block_start): on an older kernel, nothing.  Holes and inline extents
 * have no place: left out; a compressed one is where its compressed data
 * starts, with that data's length (disk_length_bytes). */
#define NT_EXTENT_MAP_LAST_BYTE ((__u64)-4)
#define NT_EM_COMPRESSED (EXTENT_FLAG_COMPRESS_ZLIB | EXTENT_FLAG_COMPRESS_LZO | EXTENT_FLAG_COMPRESS_ZSTD)
NT_TWIN(btrfs_get_extent)
{
	const struct btrfs_inode *bi = ARG(1, const struct btrfs_inode *);
	const struct extent_map *em = ARG(2, const struct extent_map *);
	__u64 disk;
	__u32 flags;

	if (!em || !bpf_core_field_exists(em->disk_bytenr))
		return 0;
	disk = RD1(btf, em, disk_bytenr);
	flags = RD1(btf, em, flags);
	if (disk >= NT_EXTENT_MAP_LAST_BYTE)
		return 0;
	if (flags & NT_EM_COMPRESSED)
		return map__emit_z(btf ? (struct inode *)&bi->vfs_inode
				       : (struct inode *)__builtin_preserve_access_index(&bi->vfs_inode),
				   RD1(btf, em, start), disk, RD1(btf, em, len),
				   (__u32)RD1(btf, em, disk_num_bytes), NT_IOMAP_MAPPED,
				   NT_MAPPING_SOURCE_BTRFS_GET_EXTENT, flags, btf);
	return map__emit(btf ? (struct inode *)&bi->vfs_inode
			     : (struct inode *)__builtin_preserve_access_index(&bi->vfs_inode),
			 RD1(btf, em, start), disk + RD1(btf, em, offset), RD1(btf, em, len),
			 (flags & EXTENT_FLAG_PREALLOC) ? 3 : NT_IOMAP_MAPPED, NT_MAPPING_SOURCE_BTRFS_GET_EXTENT,
			 flags, btf);
}
