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

enum { SC_READ = 1, SC_WRITE, SC_PREAD64, SC_PWRITE64, SC_READV, SC_WRITEV,
       SC_PREADV, SC_PWRITEV, SC_PREADV2, SC_PWRITEV2, SC_FSYNC,
       SC_FDATASYNC, SC_SYNC_FILE_RANGE };

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

/* Syscall numbers are per architecture. */
static __always_inline __u16 syscall__code(long id)
{
	switch (id) {
#if defined(__TARGET_ARCH_x86)
	case 0: return SC_READ;
	case 1: return SC_WRITE;
	case 17: return SC_PREAD64;
	case 18: return SC_PWRITE64;
	case 19: return SC_READV;
	case 20: return SC_WRITEV;
	case 74: return SC_FSYNC;
	case 75: return SC_FDATASYNC;
	case 277: return SC_SYNC_FILE_RANGE;
	case 295: return SC_PREADV;
	case 296: return SC_PWRITEV;
	case 327: return SC_PREADV2;
	case 328: return SC_PWRITEV2;
#elif defined(__TARGET_ARCH_arm64)
	case 63: return SC_READ;
	case 64: return SC_WRITE;
	case 65: return SC_READV;
	case 66: return SC_WRITEV;
	case 67: return SC_PREAD64;
	case 68: return SC_PWRITE64;
	case 69: return SC_PREADV;
	case 70: return SC_PWRITEV;
	case 82: return SC_FSYNC;
	case 83: return SC_FDATASYNC;
	case 84: return SC_SYNC_FILE_RANGE;
	case 286: return SC_PREADV2;
	case 287: return SC_PWRITEV2;
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

static __always_inline int vfs__enter(struct pt_regs *regs, long id, const bool btf)
{
	struct vfs_start s = {}, *slot;
	struct file *f;
	struct inode *inode;
	__u16 code = syscall__code(id);
	__u32 tid;

	if (!code)
		return 0;
	if (target_tgid && task__tgid() != target_tgid)
		return 0;
	s.fd = PT_REGS_PARM1_CORE_SYSCALL(regs);
	f = task__file(s.fd, btf);
	if (!f)
		return 0;
	inode = BPF_CORE_READ(f, f_inode);
	s.dev = BPF_CORE_READ(inode, i_sb, s_dev);
	if (!dev__has(s.dev, NT_ROLE_VFS)) {
		counters__filtered();
		return 0;
	}
	s.ts = bpf_ktime_get_ns();
	s.ino = BPF_CORE_READ(inode, i_ino);
	s.f_flags = BPF_CORE_READ(f, f_flags);
	s.syscall = code;
	s.iov_count = 1;
	s.offset = BPF_CORE_READ(f, f_pos);
	switch (code) {
	case SC_READ:
	case SC_WRITE:
		s.req_bytes = PT_REGS_PARM3_CORE_SYSCALL(regs);
		break;
	case SC_PREAD64:
	case SC_PWRITE64:
		s.req_bytes = PT_REGS_PARM3_CORE_SYSCALL(regs);
		s.offset = PT_REGS_PARM4_CORE_SYSCALL(regs);
		break;
	case SC_READV:
	case SC_WRITEV:
	case SC_PREADV:
	case SC_PWRITEV:
	case SC_PREADV2:
	case SC_PWRITEV2: {
		__s64 pos = PT_REGS_PARM4_CORE_SYSCALL(regs);

		s.iov_count = PT_REGS_PARM3_CORE_SYSCALL(regs);
		s.req_bytes = iov__sum((void *)PT_REGS_PARM2_CORE_SYSCALL(regs), s.iov_count);
		/* preadv2/pwritev2 with offset -1 use and move f_pos */
		if (code >= SC_PREADV && pos != -1)
			s.offset = pos;
		break;
	}
	case SC_SYNC_FILE_RANGE:
		s.offset = PT_REGS_PARM2_CORE_SYSCALL(regs);
		s.req_bytes = PT_REGS_PARM3_CORE_SYSCALL(regs);
		break;
	default:	/* fsync, fdatasync: the whole file */
		s.offset = -1;
		s.req_bytes = 0;
	}
	tid = (__u32)bpf_get_current_pid_tgid();
	slot = bpf_map_lookup_elem(&starts, &tid);
	if (slot)
		*slot = s;
	else
		bpf_map_update_elem(&starts, &tid, &s, BPF_ANY);
	return 0;
}

static __always_inline int vfs__exit(struct pt_regs *regs, long ret, const bool btf)
{
	__u64 id;
	__u32 tid;
	struct vfs_start *s;
	struct nt_vfs_event *e;
	__u64 now;

	if (!syscall__code(regs__syscall_nr(regs, btf)))
		return 0;
	id = bpf_get_current_pid_tgid();
	tid = (__u32)id;
	s = bpf_map_lookup_elem(&starts, &tid);
	if (!s || !s->syscall)
		return 0;
	now = bpf_ktime_get_ns();
	e = RESERVE_DIRECT(vfs_event, VFS_EVENT, s->ts);	/* may be preempted */
	if (e) {
		e->duration_ns = now - s->ts;
		e->ino = s->ino;
		e->offset_bytes = s->offset;
		e->req_bytes = s->req_bytes;
		e->ret = ret;
		e->dev = s->dev;
		e->pid = id >> 32;
		e->tid = tid;
		e->f_flags = s->f_flags;
		e->syscall = s->syscall;
		e->iov_count = s->iov_count;
		e->fd = s->fd;
		bpf_get_current_comm(e->comm, sizeof(e->comm));
		record__submit_direct(e);
	}
	s->syscall = 0;
	return 0;
}

NT_TWIN(sys_enter) { return vfs__enter(ARG(0, struct pt_regs *), (long)ctx[1], btf); }
NT_TWIN(sys_exit) { return vfs__exit(ARG(0, struct pt_regs *), (long)ctx[1], btf); }
