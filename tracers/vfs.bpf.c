// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* vfs: file syscalls on the traced (guest) file systems.  raw_syscalls
 * sys_enter/sys_exit; the fd is resolved in BPF to (dev, ino, f_pos,
 * f_flags) through task->files, filtered by device before anything is
 * stored, and one record is emitted at exit.
 *
 * These two programs run for every system call on the machine, so both
 * leave on the syscall number first, and the per-thread start slot is
 * reused in place (no map update or delete per I/O). */
#include "common.bpf.h"
#include "core_fixes.bpf.h"

/* Keep the record types in BTF: tests check their layout against schemas/. */
struct nt_vfs_event *unused_vfs_event __attribute__((unused));

/* Only trace this process (tgid) when non-zero. */
const volatile __u32 target_tgid = 0;
/* Only trace the tasks of one cgroup (v2) and of the cgroups below it,
 * when set: the agent puts the cgroup in target_cgroups[0]. */
const volatile bool target_cgroup = false;

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} target_cgroups SEC(".maps");

/* Is the current task one the vfs level follows (--pid, --cgroup)? */
static __always_inline bool task__followed(void)
{
	if (target_tgid && task__tgid() != target_tgid)
		return false;
	return !target_cgroup || bpf_current_task_under_cgroup(&target_cgroups, 0) == 1;
}
/* The traced file system sync(2) is recorded on (the agent's first vfs
 * device); 0: sync(2) is not recorded. */
const volatile __u32 sync_dev = 0;

/* vfs_event.syscall values are NT_VFS_SYSCALL_<NAME>, from schemas/ (what
 * each records: docs/reference/records.md).  Two more, never recorded: the AIO calls
 * whose iocbs the records are. */
enum { SC_IO_SUBMIT = 100, SC_IO_GETEVENTS };

/* iocbs per io_submit, and events per io_getevents, followed (the
 * kernel's own default limit, fs.aio-max-nr); beyond, each is counted as
 * a lost record. */
#define NT_MAX_AIO_BATCH 65536

#define NT_MAX_IOV 8

struct vfs_start {
	__u64 ts;
	__u64 ino;
	__s64 offset;
	__u64 req_bytes;
	__u32 dev;
	__u32 f_flags;
	__u16 syscall;
	__u16 iov_count;
	__s32 fd;
};

/* tid -> the syscall in flight (syscall == 0: none).  LRU, since slots
 * of threads that have exited are never deleted. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NT_MAX_TASKS);
	__type(key, __u32);
	__type(value, struct vfs_start);
} starts SEC(".maps");

/* tid -> the file copy_file_range or sendfile writes (syscall == 0:
 * none, or not a traced file); its read side is in starts. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, NT_MAX_TASKS);
	__type(key, __u32);
	__type(value, struct vfs_start);
} out_starts SEC(".maps");

/* An iocb in flight: (process, the iocb's user address) -> its start.  A
 * plain hash, not LRU: an iocb that finds it full is counted as lost,
 * where an LRU would silently evict one in flight. */
struct aio_key {
	__u32 tgid;
	__u32 _pad;
	__u64 iocb;
};

struct aio_start {
	struct vfs_start s;
	__u32 tid;	/* the submitting thread */
	__u32 tgid;
	char comm[16];	/* io_uring: a CQE may be posted from another task */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NT_MAX_AIO);
	__type(key, struct aio_key);
	__type(value, struct aio_start);
} aio_inflight SEC(".maps");

/* Elements of aio_inflight (an upper bound: an insert that replaced one is
 * counted too).  A reaped iocb's element is kept, marked done (syscall 0),
 * while the map is at most half full: programs reuse their iocbs, and the
 * next submission of the same iocb overwrites it in place, a lookup
 * instead of an insert and a delete (~350 ns of the ~2 µs the syscall
 * programs spent per AIO I/O).  Past half, reaped elements are deleted,
 * so done ones (of iocbs not reused, of processes gone) never take the
 * room of those in flight. */
__u64 aio_elems = 0;

/* A system call argument from the user registers sys_enter gets (and
 * sys_exit: the caller's registers, kept but for the return value): on
 * tp_btf the registers are a BTF pointer, read with plain loads; on
 * raw_tp, through a CO-RE probe read (a helper call each). */
#define SC_ARG(btf, regs, n)						\
	((btf) ? (long)PT_REGS_PARM##n##_SYSCALL(regs) : (long)PT_REGS_PARM##n##_CORE_SYSCALL(regs))

/* Syscall numbers are per architecture. */
static __always_inline __u16 syscall__code(long id)
{
	switch (id) {
#if defined(__TARGET_ARCH_x86)
	case 0: return NT_VFS_SYSCALL_READ;
	case 1: return NT_VFS_SYSCALL_WRITE;
	case 17: return NT_VFS_SYSCALL_PREAD64;
	case 18: return NT_VFS_SYSCALL_PWRITE64;
	case 19: return NT_VFS_SYSCALL_READV;
	case 20: return NT_VFS_SYSCALL_WRITEV;
	case 74: return NT_VFS_SYSCALL_FSYNC;
	case 75: return NT_VFS_SYSCALL_FDATASYNC;
	case 277: return NT_VFS_SYSCALL_SYNC_FILE_RANGE;
	case 285: return NT_VFS_SYSCALL_FALLOCATE;
	case 295: return NT_VFS_SYSCALL_PREADV;
	case 296: return NT_VFS_SYSCALL_PWRITEV;
	case 327: return NT_VFS_SYSCALL_PREADV2;
	case 328: return NT_VFS_SYSCALL_PWRITEV2;
	case 208: return SC_IO_GETEVENTS;
	case 209: return SC_IO_SUBMIT;
	case 333: return SC_IO_GETEVENTS;	/* io_pgetevents */
	case 326: return NT_VFS_SYSCALL_COPY_FILE_RANGE_IN;
	case 40: return NT_VFS_SYSCALL_SENDFILE_IN;		/* sendfile64 */
	case 77: return NT_VFS_SYSCALL_FTRUNCATE;
	case 275: return NT_VFS_SYSCALL_SPLICE_IN;
	case 221: return NT_VFS_SYSCALL_FADVISE;		/* fadvise64 */
	case 187: return NT_VFS_SYSCALL_READAHEAD;
	case 26: return NT_VFS_SYSCALL_MSYNC;
	case 306: return NT_VFS_SYSCALL_SYNCFS;
	case 162: return NT_VFS_SYSCALL_SYNC;
	case 28: return NT_VFS_SYSCALL_MADVISE;
#elif defined(__TARGET_ARCH_arm64)
	case 63: return NT_VFS_SYSCALL_READ;
	case 64: return NT_VFS_SYSCALL_WRITE;
	case 65: return NT_VFS_SYSCALL_READV;
	case 66: return NT_VFS_SYSCALL_WRITEV;
	case 67: return NT_VFS_SYSCALL_PREAD64;
	case 68: return NT_VFS_SYSCALL_PWRITE64;
	case 69: return NT_VFS_SYSCALL_PREADV;
	case 70: return NT_VFS_SYSCALL_PWRITEV;
	case 82: return NT_VFS_SYSCALL_FSYNC;
	case 83: return NT_VFS_SYSCALL_FDATASYNC;
	case 84: return NT_VFS_SYSCALL_SYNC_FILE_RANGE;
	case 47: return NT_VFS_SYSCALL_FALLOCATE;
	case 286: return NT_VFS_SYSCALL_PREADV2;
	case 287: return NT_VFS_SYSCALL_PWRITEV2;
	case 2: return SC_IO_SUBMIT;
	case 4: return SC_IO_GETEVENTS;
	case 292: return SC_IO_GETEVENTS;	/* io_pgetevents */
	case 285: return NT_VFS_SYSCALL_COPY_FILE_RANGE_IN;
	case 71: return NT_VFS_SYSCALL_SENDFILE_IN;
	case 46: return NT_VFS_SYSCALL_FTRUNCATE;
	case 76: return NT_VFS_SYSCALL_SPLICE_IN;
	case 223: return NT_VFS_SYSCALL_FADVISE;		/* fadvise64_64 */
	case 213: return NT_VFS_SYSCALL_READAHEAD;
	case 227: return NT_VFS_SYSCALL_MSYNC;
	case 267: return NT_VFS_SYSCALL_SYNCFS;
	case 81: return NT_VFS_SYSCALL_SYNC;
	case 233: return NT_VFS_SYSCALL_MADVISE;
#else
#error "nestrace vfs: add this architecture's syscall numbers"
#endif
	}
	return 0;
}

/* The open file behind fd.  On tp_btf the task is a trusted BTF pointer
 * and the walk is plain loads; only the fd array slot needs a read. */
static __always_inline struct file *task__file(int fd, const bool btf)
{
	struct task_struct *task;
	struct fdtable *fdt;
	struct file **fds;
	struct file *f = NULL;

	if (btf)
		task = bpf_get_current_task_btf();
	else
		task = (void *)bpf_get_current_task();
	fdt = RD2(btf, task, files, fdt);
	if (!fdt || fd < 0 || (unsigned int)fd >= RD1(btf, fdt, max_fds))
		return NULL;
	fds = RD1(btf, fdt, fd);
	bpf_core_read(&f, sizeof(f), &fds[fd]);
	return f;
}

/* The system call number in the registers sys_exit gets. */
static __always_inline long regs__syscall_nr(struct pt_regs *regs, const bool btf)
{
#if defined(__TARGET_ARCH_x86)
	return RD1(btf, regs, orig_ax);
#elif defined(__TARGET_ARCH_arm64)
	return RD1(btf, regs, syscallno);
#endif
}

static __always_inline __u64 iov__sum(const struct iovec *iov, __u32 cnt)
{
	__u64 sum = 0;

	for (int i = 0; i < NT_MAX_IOV; i++) {
		struct iovec v = {};

		if (i >= cnt)
			break;
		bpf_probe_read_user(&v, sizeof(v), &iov[i]);
		sum += (__u64)v.iov_len;
	}
	return sum;
}

/* Take n sequence numbers and count them as dropped: records nestrace
 * could not follow still show up as lost, never silently missing. */
static __always_inline void records__lost(__u64 n)
{
	struct nt_cpu_counters *c = counters__get();

	if (c && n) {
		__sync_fetch_and_add(&c->seq, n);
		__sync_fetch_and_add(&c->ringbuf_drops, n);
	}
}

/* bpf_rdonly_cast (Linux 6.2) turns the file pointer read out of the fd
 * table into a typed, read-only one whose fields are plain loads (faults
 * read as 0, as a failed probe read does) instead of a probe read each.
 * Weak, and used only where the agent found it in the kernel's BTF
 * (have_rdonly_cast): on an older kernel libbpf leaves the call
 * unresolved, the constant makes it dead code, and the verifier drops it
 * (Linux 5.18 and later accept an unresolved weak kfunc in dead code). */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;
const volatile bool have_rdonly_cast = false;

/* If f's file system is traced: its dev, ino, f_flags and (pos: for the
 * calls that may use it; the others give an offset) f_pos into s.  (One
 * probe read per field: reading nearby fields in pairs takes 64 bytes
 * more of the stack, past what Linux 6.1's verifier allows a program and
 * its bpf_loop callback together.) */
static __always_inline bool file__traced(struct vfs_start *s, struct file *f, const bool pos,
					 const bool btf)
{
	/* plain loads through the cast, or a probe read each (RDn) */
	const bool cast = btf && have_rdonly_cast;
	struct inode *inode;

	if (!f)
		return false;
	if (cast)
		f = bpf_rdonly_cast(f, bpf_core_type_id_kernel(struct file));
	inode = RD1(cast, f, f_inode);
	s->dev = RD2(cast, inode, i_sb, s_dev);
	if (!dev__has(s->dev, NT_ROLE_VFS)) {
		counters__filtered();
		return false;
	}
	s->ino = RD1(cast, inode, i_ino);
	s->f_flags = RD1(cast, f, f_flags);
	if (pos)
		s->offset = RD1(cast, f, f_pos);
	return true;
}

static __always_inline bool vfs__file(struct vfs_start *s, const bool pos, const bool btf)
{
	return file__traced(s, task__file(s->fd, btf), pos, btf);
}

struct mapped_ctx {
	struct vfs_start *s;
	__u64 addr;
	bool traced;
};

/* The mapping an msync's or madvise's address is in (bpf_find_vma): its
 * file, if traced, and the address as a file offset; the length kept to
 * this mapping (a range over several is recorded for its first). */
static long mapped__vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct mapped_ctx *c = data;
	__u64 start = BPF_CORE_READ(vma, vm_start), end = BPF_CORE_READ(vma, vm_end);

	if (!file__traced(c->s, BPF_CORE_READ(vma, vm_file), false, false))
		return 0;
	/* (vm_pgoff in 4 KiB pages: x86-64's, and arm64's as Debian builds it) */
	c->s->offset = (c->addr - start) + (BPF_CORE_READ(vma, vm_pgoff) << 12);
	if (c->s->req_bytes > end - c->addr)
		c->s->req_bytes = end - c->addr;
	c->traced = true;
	return 0;
}

/* The madvise advice about a file's I/O: MADV_NORMAL, RANDOM, SEQUENTIAL,
 * WILLNEED, REMOVE, COLD, PAGEOUT, POPULATE_READ, POPULATE_WRITE.  The
 * rest (DONTNEED, FREE, HUGEPAGE, ...) manage memory, and allocators
 * call them all the time on anonymous memory: not even looked up. */
static __always_inline bool madvice__file(long advice)
{
	switch (advice) {
	case 0: case 1: case 2: case 3: case 9: case 20: case 21: case 22: case 23:
		return true;
	}
	return false;
}

/* An msync or madvise (addr, len, flags or advice) of a mapped file on a
 * traced file system, in the current task's address space (anonymous
 * memory has no file: not recorded). */
static __always_inline bool mapped__range(struct vfs_start *s, __u64 addr, __u64 len, __u16 arg)
{
	struct mapped_ctx c = { .s = s, .addr = addr };
	long err;

	s->fd = -1;
	s->req_bytes = len;
	s->iov_count = arg;
	err = bpf_find_vma(bpf_get_current_task_btf(), c.addr, mapped__vma, &c, 0);
	if (err == -16)		/* -EBUSY: the address space was locked: unknown, so lost */
		records__lost(1);
	return c.traced;
}

/* msync(addr, len, flags) or madvise(addr, len, advice) */
static __always_inline bool mapped__file(struct vfs_start *s, struct pt_regs *regs, const bool btf)
{
	return mapped__range(s, SC_ARG(btf, regs, 1), SC_ARG(btf, regs, 2), SC_ARG(btf, regs, 3));
}

enum { ASYNC_RW, ASYNC_RWV, ASYNC_SYNC };

/* An AIO or io_uring request's range into s: an offset (-1: the file
 * position, already in s) and a length, or for the vectored kinds an
 * iovec array (addr, count); none for a sync. */
static __always_inline void async__range(struct vfs_start *s, int kind, __s64 off,
					 __u64 addr, __u64 len)
{
	s->iov_count = 1;
	if (kind == ASYNC_SYNC) {
		s->offset = -1;
		s->req_bytes = 0;
		return;
	}
	if (off != -1)
		s->offset = off;
	if (kind == ASYNC_RWV) {
		s->iov_count = len;
		s->req_bytes = iov__sum((void *)addr, len);
	} else {
		s->req_bytes = len;
	}
}

struct aio_submit_ctx {
	struct iocb **iocbpp;
	__u64 ts;
	__u64 id;
};

/* The i-th iocb of an io_submit: note its start if its file is traced. */
static __always_inline long aio__submit_one(__u64 i, struct aio_submit_ctx *c, const bool btf)
{
	struct aio_start a = {}, *slot;
	struct aio_key k = {};
	struct iocb *up = NULL;
	struct iocb cb;

	if (bpf_probe_read_user(&up, sizeof(up), &c->iocbpp[i]) ||
	    bpf_probe_read_user(&cb, sizeof(cb), up))
		return 0;	/* io_submit fails on it too */
	switch (cb.aio_lio_opcode) {
	case 0: a.s.syscall = NT_VFS_SYSCALL_AIO_PREAD; break;	/* IOCB_CMD_PREAD */
	case 1: a.s.syscall = NT_VFS_SYSCALL_AIO_PWRITE; break;
	case 2: a.s.syscall = NT_VFS_SYSCALL_AIO_FSYNC; break;
	case 3: a.s.syscall = NT_VFS_SYSCALL_AIO_FDSYNC; break;
	case 7: a.s.syscall = NT_VFS_SYSCALL_AIO_PREADV; break;
	case 8: a.s.syscall = NT_VFS_SYSCALL_AIO_PWRITEV; break;
	default: return 0;				/* poll, noop */
	}
	a.s.fd = cb.aio_fildes;
	a.s.offset = -1;	/* an iocb has its offset (-1 kept as given: EINVAL) */
	if (!vfs__file(&a.s, false, btf))
		return 0;
	a.s.ts = c->ts;
	async__range(&a.s, a.s.syscall >= NT_VFS_SYSCALL_AIO_PREADV ? ASYNC_RWV :
			   a.s.syscall >= NT_VFS_SYSCALL_AIO_FSYNC ? ASYNC_SYNC : ASYNC_RW,
		     cb.aio_offset, cb.aio_buf, cb.aio_nbytes);
	a.tid = (__u32)c->id;
	k.tgid = c->id >> 32;
	k.iocb = (__u64)up;
	slot = bpf_map_lookup_elem(&aio_inflight, &k);
	if (slot)
		*slot = a;	/* this iocb's element, done (or never reaped) */
	else if (bpf_map_update_elem(&aio_inflight, &k, &a, BPF_ANY))
		records__lost(1);
	else
		__sync_fetch_and_add(&aio_elems, 1);
	return 0;
}

static long aio_submit_btf(__u64 i, void *c) { return aio__submit_one(i, c, true); }
static long aio_submit_raw(__u64 i, void *c) { return aio__submit_one(i, c, false); }

/* io_submit(ctx, nr, iocbpp): note each traced iocb's start (bpf_loop:
 * one verified body for any batch size). */
static __always_inline void aio__submit(struct pt_regs *regs, const bool btf)
{
	long nr = SC_ARG(btf, regs, 2);
	struct aio_submit_ctx c = {
		.iocbpp = (void *)SC_ARG(btf, regs, 3),
		.ts = bpf_ktime_get_ns(),
		.id = bpf_get_current_pid_tgid(),
	};

	if (nr <= 0)
		return;
	if (nr > NT_MAX_AIO_BATCH) {
		records__lost(nr - NT_MAX_AIO_BATCH);
		nr = NT_MAX_AIO_BATCH;
	}
	bpf_loop(nr, btf ? aio_submit_btf : aio_submit_raw, &c, 0);
}

/* One record.  comm NULL: the current task's (it is the caller's own). */
static __always_inline void vfs__emit(const struct vfs_start *s, __u64 now, __s64 ret, __u32 tid,
				      __u32 tgid, const char *comm, const bool btf)
{
	struct nt_vfs_event *e = RESERVE_DIRECT(vfs_event, VFS_EVENT, s->ts);	/* may be preempted */

	if (!e)
		return;
	e->duration_ns = now - s->ts;
	e->ino = s->ino;
	e->offset_bytes = s->offset;
	e->req_bytes = s->req_bytes;
	e->ret = ret;
	e->dev = s->dev;
	e->pid = tgid;
	e->tid = tid;
	e->f_flags = s->f_flags;
	e->syscall = s->syscall;
	e->iov_count = s->iov_count;
	e->fd = s->fd;
	if (comm)
		__builtin_memcpy(e->comm, comm, sizeof(e->comm));
	else
		task__comm(e->comm, btf);
	record__submit_direct(e);
}

struct aio_reap_ctx {
	struct io_event *events;
	__u64 now;
	__u32 tgid;
};

/* The i-th reaped event: a record, if nestrace saw its iocb submitted. */
static __always_inline long aio__reap_one(__u64 i, void *ctx, const bool btf)
{
	struct aio_reap_ctx *c = ctx;
	struct aio_key k = { .tgid = c->tgid };
	struct io_event ev;
	struct aio_start *a;

	if (bpf_probe_read_user(&ev, sizeof(ev), &c->events[i]))
		return 0;
	k.iocb = ev.obj;
	a = bpf_map_lookup_elem(&aio_inflight, &k);
	if (!a || !a->s.syscall)
		return 0;	/* not a traced file, submitted before the capture, or done */
	vfs__emit(&a->s, c->now, ev.res, a->tid, c->tgid, NULL, btf);
	if (aio_elems <= NT_MAX_AIO / 2)
		a->s.syscall = 0;	/* done: kept for the iocb's next submission */
	else if (!bpf_map_delete_elem(&aio_inflight, &k))
		__sync_fetch_and_sub(&aio_elems, 1);
	return 0;
}

static long aio_reap_btf(__u64 i, void *c) { return aio__reap_one(i, c, true); }
static long aio_reap_raw(__u64 i, void *c) { return aio__reap_one(i, c, false); }

/* io_getevents returned n events at the user address events. */
static __always_inline void aio__reap(struct io_event *events, long n, __u64 now, const bool btf)
{
	struct aio_reap_ctx c = { .events = events, .now = now, .tgid = task__tgid() };

	if (n <= 0)
		return;
	if (n > NT_MAX_AIO_BATCH) {
		records__lost(n - NT_MAX_AIO_BATCH);
		n = NT_MAX_AIO_BATCH;
	}
	bpf_loop(n, btf ? aio_reap_btf : aio_reap_raw, &c, 0);
}

/* The calls that read one file and write another (copy__enter). */
static __always_inline bool code__copies(__u16 code)
{
	return code == NT_VFS_SYSCALL_COPY_FILE_RANGE_IN || code == NT_VFS_SYSCALL_SENDFILE_IN || code == NT_VFS_SYSCALL_SPLICE_IN;
}

/* copy_file_range(fd_in, off_in *, fd_out, off_out *, len, flags),
 * splice (the same arguments; one side a pipe) and
 * sendfile(fd_out, fd_in, offset *, count) read one file and write
 * another: each side on a traced file system is a start of its own (the
 * read side in starts, dev 0 if it is not traced; the write side in
 * out_starts), its offset through the pointer the call was given, else
 * the file position. */
static __always_inline int copy__enter(struct pt_regs *regs, __u16 code, const bool btf)
{
	struct vfs_start in = {}, out = {}, *slot;
	__s64 *off_in, *off_out = NULL;
	bool in_traced, out_traced;
	__u64 len;
	__u32 tid;

	if (code == NT_VFS_SYSCALL_COPY_FILE_RANGE_IN || code == NT_VFS_SYSCALL_SPLICE_IN) {
		in.fd = SC_ARG(btf, regs, 1);
		off_in = (void *)SC_ARG(btf, regs, 2);
		out.fd = SC_ARG(btf, regs, 3);
		off_out = (void *)SC_ARG(btf, regs, 4);
		len = SC_ARG(btf, regs, 5);
	} else {
		out.fd = SC_ARG(btf, regs, 1);
		in.fd = SC_ARG(btf, regs, 2);
		off_in = (void *)SC_ARG(btf, regs, 3);
		len = SC_ARG(btf, regs, 4);
	}
	in_traced = vfs__file(&in, true, btf);
	out_traced = vfs__file(&out, true, btf);
	if (!in_traced && !out_traced)
		return 0;
	in.ts = out.ts = bpf_ktime_get_ns();
	in.iov_count = out.iov_count = 1;
	in.req_bytes = out.req_bytes = len;
	if (in_traced && off_in)
		bpf_probe_read_user(&in.offset, sizeof(in.offset), off_in);
	else if (!in_traced)
		in.dev = 0;
	if (out_traced && off_out)
		bpf_probe_read_user(&out.offset, sizeof(out.offset), off_out);
	in.syscall = code;		/* what the exit matches, traced or not */
	out.syscall = out_traced ? code + 1 : 0;
	tid = (__u32)bpf_get_current_pid_tgid();
	slot = bpf_map_lookup_elem(&starts, &tid);
	if (slot)
		*slot = in;
	else
		bpf_map_update_elem(&starts, &tid, &in, BPF_ANY);
	slot = bpf_map_lookup_elem(&out_starts, &tid);
	if (slot)
		*slot = out;
	else if (out_traced)
		bpf_map_update_elem(&out_starts, &tid, &out, BPF_ANY);
	return 0;
}

/* Its exit: a record per traced side, both with the call's return. */
static __always_inline void copy__exit(struct vfs_start *s, __u64 now, long ret, __u32 tid,
				       const bool btf)
{
	struct vfs_start *o = bpf_map_lookup_elem(&out_starts, &tid);

	if (s->dev)
		vfs__emit(s, now, ret, tid, task__tgid(), NULL, btf);
	if (o && o->syscall == s->syscall + 1) {
		vfs__emit(o, now, ret, tid, task__tgid(), NULL, btf);
		o->syscall = 0;
	}
}

/* A call's range from its arguments: offset, bytes asked, iovecs (or
 * fallocate's mode, fadvise's advice). */
static __always_inline void vfs__args(struct vfs_start *s, __u16 code, struct pt_regs *regs,
				      const bool btf)
{
	switch (code) {
	case NT_VFS_SYSCALL_READ:
	case NT_VFS_SYSCALL_WRITE:
		s->req_bytes = SC_ARG(btf, regs, 3);
		break;
	case NT_VFS_SYSCALL_PREAD64:
	case NT_VFS_SYSCALL_PWRITE64:
		s->req_bytes = SC_ARG(btf, regs, 3);
		s->offset = SC_ARG(btf, regs, 4);
		break;
	case NT_VFS_SYSCALL_READV:
	case NT_VFS_SYSCALL_WRITEV:
	case NT_VFS_SYSCALL_PREADV:
	case NT_VFS_SYSCALL_PWRITEV:
	case NT_VFS_SYSCALL_PREADV2:
	case NT_VFS_SYSCALL_PWRITEV2: {
		__s64 pos = SC_ARG(btf, regs, 4);

		s->iov_count = SC_ARG(btf, regs, 3);
		s->req_bytes = iov__sum((void *)SC_ARG(btf, regs, 2), s->iov_count);
		/* preadv2/pwritev2 with offset -1 use and move f_pos */
		if (code >= NT_VFS_SYSCALL_PREADV && pos != -1)
			s->offset = pos;
		break;
	}
	case NT_VFS_SYSCALL_SYNC_FILE_RANGE:
		s->offset = SC_ARG(btf, regs, 2);
		s->req_bytes = SC_ARG(btf, regs, 3);
		break;
	case NT_VFS_SYSCALL_FALLOCATE:	/* fd, mode, offset, len */
		s->iov_count = SC_ARG(btf, regs, 2);
		s->offset = SC_ARG(btf, regs, 3);
		s->req_bytes = SC_ARG(btf, regs, 4);
		break;
	case NT_VFS_SYSCALL_FADVISE:	/* fd, offset, len, advice */
		s->iov_count = SC_ARG(btf, regs, 4);
		/* fall through */
	case NT_VFS_SYSCALL_READAHEAD:	/* fd, offset, count */
		s->offset = SC_ARG(btf, regs, 2);
		s->req_bytes = SC_ARG(btf, regs, 3);
		break;
	case NT_VFS_SYSCALL_FTRUNCATE: {	/* fd, length */
		struct file *f = task__file(s->fd, btf);

		s->offset = SC_ARG(btf, regs, 2);
		s->req_bytes = f ? BPF_CORE_READ(f, f_inode, i_size) : 0;
		break;
	}
	case NT_VFS_SYSCALL_MSYNC:
	case NT_VFS_SYSCALL_MADVISE:
		break;
	default:	/* fsync, fdatasync: the whole file */
		s->offset = -1;
		s->req_bytes = 0;
	}
}

/* The file a call is on (its fd's; a mapping's for msync and madvise;
 * the traced file system for sync), into s; false when it is not
 * traced. */
static __always_inline bool vfs__target(struct vfs_start *s, __u16 code, struct pt_regs *regs,
					const bool btf)
{
	if (code == NT_VFS_SYSCALL_MSYNC || code == NT_VFS_SYSCALL_MADVISE) {
		if (code == NT_VFS_SYSCALL_MADVISE && !madvice__file(SC_ARG(btf, regs, 3)))
			return false;
		if (!mapped__file(s, regs, btf))
			return false;
	} else if (code == NT_VFS_SYSCALL_SYNC) {
		if (!sync_dev)
			return false;
		s->dev = sync_dev;
		s->fd = -1;
	} else {
		s->fd = SC_ARG(btf, regs, 1);
		if (!vfs__file(s, code != NT_VFS_SYSCALL_PREAD64 && code != NT_VFS_SYSCALL_PWRITE64, btf))
			return false;
	}
	return true;
}

static __always_inline int vfs__enter(struct pt_regs *regs, long id, const bool btf)
{
	struct vfs_start s = {}, *slot;
	__u16 code = syscall__code(id);
	__u32 tid;

	/* io_submit: all done here; io_getevents: all at exit */
	if (!code || code == SC_IO_GETEVENTS)
		return 0;
	if (floor_records)	/* a header at exit (vfs__exit) */
		return 0;
	if (!task__followed())
		return 0;
	if (code == SC_IO_SUBMIT) {
		aio__submit(regs, btf);
		return 0;
	}
	if (code__copies(code))
		return copy__enter(regs, code, btf);
	if (!vfs__target(&s, code, regs, btf))
		return 0;
	s.ts = bpf_ktime_get_ns();
	s.syscall = code;
	if (code != NT_VFS_SYSCALL_MSYNC && code != NT_VFS_SYSCALL_MADVISE)
		s.iov_count = 1;
	vfs__args(&s, code, regs, btf);
	tid = (__u32)bpf_get_current_pid_tgid();
	slot = bpf_map_lookup_elem(&starts, &tid);
	if (slot)
		*slot = s;
	else
		bpf_map_update_elem(&starts, &tid, &s, BPF_ANY);
	return 0;
}

/* --floor-records: a header for a call on a traced file, its file
 * resolved and filtered as at entry (no start kept, no field); for an
 * io_getevents that reaped any, one header for the call (a capture writes
 * one per iocb reaped); none for the rarer calls (copies, msync, madvise,
 * sync). */
static __always_inline int vfs__floor(struct pt_regs *regs, __u16 code, long ret, const bool btf)
{
	struct vfs_start s = {};
	struct nt_vfs_event *e;

	if (!task__followed())
		return 0;
	if (code == SC_IO_GETEVENTS) {
		if (ret <= 0)
			return 0;
	} else {
		if (code__copies(code) || code == NT_VFS_SYSCALL_MSYNC || code == NT_VFS_SYSCALL_MADVISE || code == NT_VFS_SYSCALL_SYNC)
			return 0;
		s.fd = SC_ARG(btf, regs, 1);
		if (!vfs__file(&s, false, btf))
			return 0;
	}
	e = RESERVE_DIRECT(vfs_event, VFS_EVENT, bpf_ktime_get_ns());
	if (e)
		record__submit_direct(e);
	return 0;
}

static __always_inline int vfs__exit(struct pt_regs *regs, long ret, const bool btf)
{
	__u16 code = syscall__code(regs__syscall_nr(regs, btf));
	__u32 tid;
	struct vfs_start *s;
	__u64 now;

	if (!code || code == SC_IO_SUBMIT)	/* io_submit: all done at entry */
		return 0;
	if (floor_records)
		return vfs__floor(regs, code, ret, btf);
	/* io_getevents(ctx, min_nr, nr, events, ...): the events are where
	 * its fourth argument points, still in the registers at exit, and
	 * each one's start is its iocb's: no start of the call is kept (a
	 * start-map update and lookup less per call) */
	if (code == SC_IO_GETEVENTS) {
		if (task__followed())
			aio__reap((void *)SC_ARG(btf, regs, 4), ret, bpf_ktime_get_ns(), btf);
		return 0;
	}
	tid = (__u32)bpf_get_current_pid_tgid();
	s = bpf_map_lookup_elem(&starts, &tid);
	if (!s || !s->syscall)
		return 0;
	if (s->syscall != code) {	/* a start whose exit was never seen */
		s->syscall = 0;
		return 0;
	}
	now = bpf_ktime_get_ns();
	if (code__copies(s->syscall))
		copy__exit(s, now, ret, tid, btf);
	else
		vfs__emit(s, now, ret, tid, task__tgid(), NULL, btf);
	s->syscall = 0;
	return 0;
}

/* io_uring requests in flight: struct io_kiocb address -> start. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, NT_MAX_AIO);
	__type(key, __u64);
	__type(value, struct aio_start);
} uring_inflight SEC(".maps");

/* ... and the written side of a splice in flight (its read side, or a
 * placeholder for it, in uring_inflight). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct aio_start);
} uring_splice_out SEC(".maps");

/* IORING_OP_* (uapi numbers) nestrace follows */
static __always_inline __u16 uring__code(__u8 opcode)
{
	switch (opcode) {
	case 1: return NT_VFS_SYSCALL_URING_READV;		/* IORING_OP_READV */
	case 2: return NT_VFS_SYSCALL_URING_WRITEV;		/* IORING_OP_WRITEV */
	case 3: return NT_VFS_SYSCALL_URING_FSYNC;		/* IORING_OP_FSYNC */
	case 4: return NT_VFS_SYSCALL_URING_READ;		/* IORING_OP_READ_FIXED */
	case 5: return NT_VFS_SYSCALL_URING_WRITE;		/* IORING_OP_WRITE_FIXED */
	case 8: return NT_VFS_SYSCALL_URING_SYNC_FILE_RANGE;	/* IORING_OP_SYNC_FILE_RANGE */
	case 17: return NT_VFS_SYSCALL_URING_FALLOCATE;	/* IORING_OP_FALLOCATE */
	case 22: return NT_VFS_SYSCALL_URING_READ;		/* IORING_OP_READ */
	case 23: return NT_VFS_SYSCALL_URING_WRITE;		/* IORING_OP_WRITE */
	case 24: return NT_VFS_SYSCALL_URING_FADVISE;	/* IORING_OP_FADVISE */
	case 25: return NT_VFS_SYSCALL_URING_MADVISE;	/* IORING_OP_MADVISE */
	case 30: return NT_VFS_SYSCALL_URING_SPLICE_IN;	/* IORING_OP_SPLICE */
	case 55: return NT_VFS_SYSCALL_URING_FTRUNCATE;	/* IORING_OP_FTRUNCATE */
	}
	return 0;
}

/* The registered file at index idx of the request's ring (IOSQE_FIXED_FILE;
 * fio's registerfiles, and always with sqthread_poll).  The ring's file
 * table as of Linux 6.13; on other layouts none (the request is not
 * followed). */
static __always_inline struct file *uring__fixed_file(struct io_kiocb *req, int idx)
{
	struct io_ring_ctx *ctx = BPF_CORE_READ(req, ctx);
	struct io_rsrc_node **nodes, *node = NULL;
	unsigned long ptr;

	if (!bpf_core_field_exists(struct io_rsrc_node, file_ptr) ||
	    !bpf_core_field_exists(ctx->file_table.data.nodes))
		return NULL;
	if (idx < 0 || (unsigned int)idx >= BPF_CORE_READ(ctx, file_table.data.nr))
		return NULL;
	nodes = BPF_CORE_READ(ctx, file_table.data.nodes);
	bpf_core_read(&node, sizeof(node), &nodes[idx]);
	if (!node)
		return NULL;
	ptr = BPF_CORE_READ(node, file_ptr);
	return (struct file *)(ptr & ~3UL);	/* FFS_NOWAIT, FFS_ISREG bits */
}

/* A request's start under key in map: its submitter and the time. */
static __always_inline void uring__start(void *map, __u64 key, struct aio_start *a, __u64 ts)
{
	__u64 id = bpf_get_current_pid_tgid();

	a->s.ts = ts;
	a->tid = (__u32)id;
	a->tgid = id >> 32;
	bpf_get_current_comm(a->comm, sizeof(a->comm));
	if (bpf_map_update_elem(map, &key, a, BPF_ANY))
		records__lost(1);
}

/* The file of fd in a request: a registered file (fixed), else the
 * submitter's. */
static __always_inline struct file *uring__file(struct io_kiocb *req, int fd, bool fixed,
						const bool btf)
{
	return fixed ? uring__fixed_file(req, fd) : task__file(fd, btf);
}

/* IORING_OP_SPLICE: as splice(2), a start per side on a traced file
 * system.  The file written is the request's own (io_splice's file_out
 * is the request's file), the file read splice_fd_in (registered with
 * SPLICE_F_FD_IN_FIXED); an offset -1 is the file position.  The read
 * side's start goes in uring_inflight, with dev 0 if that side is not
 * traced, the written side's in uring_splice_out. */
static __always_inline int uring__splice(struct io_kiocb *req, const bool btf)
{
	struct io_splice *sp = (void *)req;
	struct aio_start in = {}, out = {};
	__u64 key = (__u64)req, ts;
	bool in_traced, out_traced;
	__u32 flags;
	__s64 off;

	if (!bpf_core_type_exists(struct io_splice))
		return 0;
	flags = BPF_CORE_READ(sp, flags);
	in.s.fd = BPF_CORE_READ(sp, splice_fd_in);
	out.s.fd = RD1(btf, req, cqe.fd);
	in_traced = file__traced(&in.s, uring__file(req, in.s.fd, flags & (1U << 31), btf), true, btf);
	out_traced = file__traced(&out.s, uring__file(req, out.s.fd, RD1(btf, req, flags) & 1, btf), true, btf);
	if (!in_traced && !out_traced)
		return 0;
	ts = bpf_ktime_get_ns();
	in.s.iov_count = out.s.iov_count = 1;
	in.s.req_bytes = out.s.req_bytes = BPF_CORE_READ(sp, len);
	in.s.syscall = NT_VFS_SYSCALL_URING_SPLICE_IN;
	out.s.syscall = NT_VFS_SYSCALL_URING_SPLICE_OUT;
	off = BPF_CORE_READ(sp, off_in);
	if (!in_traced)
		in.s.dev = 0;
	else if (off != -1)
		in.s.offset = off;
	off = BPF_CORE_READ(sp, off_out);
	if (off != -1)
		out.s.offset = off;
	uring__start(&uring_inflight, key, &in, ts);
	if (out_traced)
		uring__start(&uring_splice_out, key, &out, ts);
	return 0;
}

/* IORING_OP_MADVISE: as madvise(2), no fd: the mapping at its address, in
 * the submitter's address space (an SQPOLL thread shares it) */
static __always_inline int uring__madvise(struct io_kiocb *req)
{
	struct io_madvise *ma = (void *)req;
	struct aio_start a = {};
	__u32 advice;

	if (!bpf_core_type_exists(struct io_madvise))
		return 0;
	advice = BPF_CORE_READ(ma, advice);
	if (!madvice__file(advice) ||
	    !mapped__range(&a.s, BPF_CORE_READ(ma, addr), BPF_CORE_READ(ma, len), advice))
		return 0;
	a.s.syscall = NT_VFS_SYSCALL_URING_MADVISE;
	uring__start(&uring_inflight, (__u64)req, &a, bpf_ktime_get_ns());
	return 0;
}

/* A request is submitted: its SQE has been read and prepared (file
 * offset and length in the request's io_rw), its file not yet looked up,
 * so the fd is resolved here, in the submitter (or the SQPOLL thread,
 * which shares its files), or in the ring's registered files. */
static __always_inline int uring__submit(struct io_kiocb *req, const bool btf)
{
	struct io_rw *rw = (void *)req;		/* io_kiocb_to_cmd(): the command data comes first */
	struct aio_start a = {};
	__u64 key = (__u64)req;
	struct file *f;

	a.s.syscall = uring__code(RD1(btf, req, opcode));
	if (!a.s.syscall)
		return 0;
	if (!task__followed())
		return 0;
	if (a.s.syscall == NT_VFS_SYSCALL_URING_MADVISE)
		return uring__madvise(req);
	if (a.s.syscall == NT_VFS_SYSCALL_URING_SPLICE_IN)
		return uring__splice(req, btf);
	a.s.fd = RD1(btf, req, cqe.fd);
	/* REQ_F_FIXED_FILE = IOSQE_FIXED_FILE */
	f = uring__file(req, a.s.fd, RD1(btf, req, flags) & 1, btf);
	if (!file__traced(&a.s, f, true, btf))
		return 0;
	a.s.ts = bpf_ktime_get_ns();
	a.s.iov_count = 1;
	if (a.s.syscall == NT_VFS_SYSCALL_URING_FADVISE) {
		struct io_fadvise *fa = (void *)req;

		if (!bpf_core_type_exists(struct io_fadvise))
			return 0;
		a.s.offset = BPF_CORE_READ(fa, offset);
		a.s.req_bytes = BPF_CORE_READ(fa, len);
		a.s.iov_count = BPF_CORE_READ(fa, advice);
	} else if (a.s.syscall == NT_VFS_SYSCALL_URING_FTRUNCATE) {
		/* the new size; the size before in req_bytes, as ftruncate(2) */
		struct io_ftrunc *ft = (void *)req;

		if (!bpf_core_type_exists(struct io_ftrunc))
			return 0;
		a.s.offset = BPF_CORE_READ(ft, len);
		a.s.req_bytes = BPF_CORE_READ(f, f_inode, i_size);
	} else if ((a.s.syscall == NT_VFS_SYSCALL_URING_SYNC_FILE_RANGE || a.s.syscall == NT_VFS_SYSCALL_URING_FALLOCATE) &&
		   bpf_core_type_exists(struct io_sync)) {
		/* a range in the request's io_sync; fallocate's mode with it */
		struct io_sync *sync = (void *)req;

		a.s.offset = BPF_CORE_READ(sync, off);
		a.s.req_bytes = BPF_CORE_READ(sync, len);
		a.s.iov_count = a.s.syscall == NT_VFS_SYSCALL_URING_FALLOCATE ? BPF_CORE_READ(sync, mode) : 1;
	} else {
		async__range(&a.s, a.s.syscall == NT_VFS_SYSCALL_URING_FSYNC ? ASYNC_SYNC :
				   a.s.syscall >= NT_VFS_SYSCALL_URING_READV ? ASYNC_RWV : ASYNC_RW,
			     BPF_CORE_READ(rw, kiocb.ki_pos), BPF_CORE_READ(rw, addr),
			     BPF_CORE_READ(rw, len));
	}
	uring__start(&uring_inflight, key, &a, a.s.ts);
	return 0;
}

/* Its CQE is posted (wherever that runs): the record (a splice: one per
 * traced side). */
static __always_inline int uring__complete(void *req, struct io_uring_cqe *cqe, const bool btf)
{
	__u64 key = (__u64)req, now;
	struct aio_start *a = bpf_map_lookup_elem(&uring_inflight, &key);
	__s32 res;

	if (!a)
		return 0;
	now = bpf_ktime_get_ns();
	res = RD1(btf, cqe, res);
	if (a->s.syscall != NT_VFS_SYSCALL_URING_SPLICE_IN || a->s.dev)
		vfs__emit(&a->s, now, res, a->tid, a->tgid, a->comm, btf);
	if (a->s.syscall == NT_VFS_SYSCALL_URING_SPLICE_IN) {
		struct aio_start *o = bpf_map_lookup_elem(&uring_splice_out, &key);

		if (o) {
			vfs__emit(&o->s, now, res, o->tid, o->tgid, o->comm, btf);
			bpf_map_delete_elem(&uring_splice_out, &key);
		}
	}
	bpf_map_delete_elem(&uring_inflight, &key);
	return 0;
}

/* (--floor-records: io_uring's hooks return at once; bench/overhead's fio
 * uses psync and libaio) */
NT_TWIN(io_uring_submit_req)
{
	return floor_records ? 0 : uring__submit(ARG(0, struct io_kiocb *), btf);
}
NT_TWIN(io_uring_complete)
{
	return floor_records ? 0 : uring__complete(ARG(1, void *), ARG(2, struct io_uring_cqe *), btf);
}

NT_TWIN(sys_enter) { return vfs__enter(ARG(0, struct pt_regs *), (long)ctx[1], btf); }
NT_TWIN(sys_exit) { return vfs__exit(ARG(0, struct pt_regs *), (long)ctx[1], btf); }
