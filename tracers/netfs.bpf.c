// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* netfs: the requests a network file system's client sends to its server
 * (level netfs), on the traced network mounts.  FUSE (sshfs): one record
 * when a request is sent (fuse_request_send: opcode, node, and for reads
 * and writes the offset and size from the request's first argument) and
 * one when its answer comes (fuse_request_end); the netfs_io view pairs
 * them by (dev, unique). */
#include "common.bpf.h"
#include "core_fixes.bpf.h"
#include <bpf/bpf_endian.h>

/* Keep the record type in BTF: tests check its layout against schemas/. */
struct nt_netfs_event *unused_netfs_event __attribute__((unused));

#define NT_NETFS_SEND 1
#define NT_NETFS_END 2
#define NT_NETFS_PROTO_FUSE 1

static __always_inline struct nt_netfs_event *fuse__reserve(struct fuse_req *req, __u32 *dev)
{
	*dev = BPF_CORE_READ(req, fm, sb, s_dev);
	if (!dev__has(*dev, NT_ROLE_NET)) {
		counters__filtered();
		return NULL;
	}
	return RESERVE(netfs_event, NETFS_EVENT, bpf_ktime_get_ns());
}

/* A read's or write's first argument: fuse_read_in or fuse_write_in, the
 * same in their first fields (fh, offset, size, flags). */
static __always_inline void fuse__rw(struct nt_netfs_event *e, struct fuse_req *req)
{
	struct fuse_write_in in = {};
	const void *arg = BPF_CORE_READ(req, args, in_args[0].value);

	if (arg && !bpf_probe_read_kernel(&in, sizeof(in), arg)) {
		e->offset_bytes = in.offset;
		e->bytes = in.size;
		e->flags = e->opcode == NT_FUSE_OPCODE_WRITE ? in.write_flags : 0;
	}
}

/* A request sent (its operation, node, and a read's or write's offset and
 * size; the process it is for and the task that sent it), or its answer
 * (its length and status). */
static __always_inline int fuse__emit(struct fuse_req *req, __u16 event, const bool btf)
{
	struct nt_netfs_event *e;
	__u32 dev;

	e = fuse__reserve(req, &dev);
	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->unique = BPF_CORE_READ(req, in.h.unique);
	e->opcode = BPF_CORE_READ(req, in.h.opcode);
	e->offset_bytes = -1;
	e->flags = 0;
	e->dev = dev;
	e->event = event;
	e->proto = NT_NETFS_PROTO_FUSE;
	e->_pad0 = 0;
	if (event == NT_NETFS_SEND) {
		e->nodeid = BPF_CORE_READ(req, in.h.nodeid);
		e->bytes = BPF_CORE_READ(req, in.h.len);
		if (e->opcode == NT_FUSE_OPCODE_READ || e->opcode == NT_FUSE_OPCODE_WRITE)
			fuse__rw(e, req);
		e->pid = BPF_CORE_READ(req, in.h.pid);
		e->error = 0;
		task__comm(e->comm, btf);
	} else {
		e->nodeid = 0;
		e->bytes = BPF_CORE_READ(req, out.h.len);
		e->pid = 0;
		e->error = BPF_CORE_READ(req, out.h.error);
		__builtin_memset(e->comm, 0, sizeof(e->comm));
	}
	record__submit(e);
	return 0;
}

NT_TWIN(fuse_request_send) { return fuse__emit(ARG(0, struct fuse_req *), NT_NETFS_SEND, btf); }
NT_TWIN(fuse_request_end) { return fuse__emit(ARG(0, struct fuse_req *), NT_NETFS_END, btf); }

/* NFS: the client's READ, WRITE and COMMIT calls (nfs_initiate_* when
 * one is sent, nfs_readpage_done, nfs_writeback_done and nfs_commit_done
 * when its reply is handled), and the server's file operations on the
 * exported file (nfsd_read_splice or _vector and nfsd_read_io_done,
 * nfsd_write_opened and nfsd_write_io_done).  NFS is a
 * module, and a kernel without it (this project's build machine) has none
 * of its types: these are the fields read, CO-RE-relocated against the
 * nfs and nfsd modules' BTF where they are loaded.  The programs of a
 * tracepoint the kernel lacks are not loaded, nor relocated. */
/* (an enum field must be an enum locally too: CO-RE does not match an int
 * to an enum) */
enum nfs3_stable_how___nt { NFS_UNSTABLE___nt = 0 };

struct rpc_task___nt {
	int tk_status;
} __attribute__((preserve_access_index));

struct nfs_writeverf___nt {
	enum nfs3_stable_how___nt committed;
} __attribute__((preserve_access_index));

struct nfs_pgio_args___nt {
	__u64 offset;
	__u32 count;
	enum nfs3_stable_how___nt stable;	/* (in an anonymous union) */
} __attribute__((preserve_access_index));

struct nfs_pgio_res___nt {
	__u64 count;
	struct nfs_writeverf___nt *verf;	/* in an anonymous union */
} __attribute__((preserve_access_index));

struct nfs_pgio_header___nt {
	struct inode *inode;
	void *dreq;		/* the O_DIRECT request it is for; NULL: the page cache's */
	struct nfs_pgio_args___nt args;
	struct nfs_pgio_res___nt res;
} __attribute__((preserve_access_index));

struct nfs_commitargs___nt {
	__u64 offset;
	__u32 count;
} __attribute__((preserve_access_index));

struct nfs_commitres___nt {
	struct nfs_writeverf___nt *verf;
} __attribute__((preserve_access_index));

struct nfs_commit_data___nt {
	struct inode *inode;
	struct nfs_commitargs___nt args;
	struct nfs_commitres___nt res;
} __attribute__((preserve_access_index));

struct svc_rqst___nt {
	__be32 rq_xid;
} __attribute__((preserve_access_index));

struct svc_fh___nt {
	struct dentry *fh_dentry;
} __attribute__((preserve_access_index));

#define NT_NETFS_PROTO_NFS 2
#define NT_NETFS_PROTO_NFSD 3
#define NT_NFS_CACHED 0x100

/* An NFS record's fields but the offset and bytes (-1, 0) and the pid (0);
 * a send's comm. */
static __always_inline void nfs__fill(struct nt_netfs_event *e, __u64 unique, __u64 nodeid,
				      __u32 dev, __u16 event, __u16 proto, __u16 proc)
{
	e->unique = unique;
	e->nodeid = nodeid;
	e->offset_bytes = -1;
	e->bytes = 0;
	e->dev = dev;
	e->pid = 0;
	e->error = 0;
	e->flags = 0;
	e->event = event;
	e->proto = proto;
	e->opcode = proc;
	e->_pad0 = 0;
	if (event == NT_NETFS_SEND)
		bpf_get_current_comm(e->comm, sizeof(e->comm));
	else
		__builtin_memset(e->comm, 0, sizeof(e->comm));
}

/* A client call's record: on the traced NFS mounts only.  `unique` is the
 * call's header (the pgio header or the commit data), which its send and
 * its reply share. */
static __always_inline struct nt_netfs_event *nfs__reserve(struct inode *inode, const void *id,
							    __u16 event, __u16 proc)
{
	struct nt_netfs_event *e;
	__u32 dev = BPF_CORE_READ(inode, i_sb, s_dev);

	if (!dev__has(dev, NT_ROLE_NET)) {
		counters__filtered();
		return NULL;
	}
	e = RESERVE(netfs_event, NETFS_EVENT, bpf_ktime_get_ns());
	if (!e)
		return NULL;
	nfs__fill(e, (__u64)id, BPF_CORE_READ(inode, i_ino), dev, event, NT_NETFS_PROTO_NFS, proc);
	if (event == NT_NETFS_SEND)
		e->pid = task__tgid();
	return e;
}

/* READ or WRITE sent: the offset and count asked for; a write's stable
 * flag (0 UNSTABLE, 1 DATA_SYNC, 2 FILE_SYNC); NT_NFS_CACHED when it is
 * the page cache's (no O_DIRECT request). */
static __always_inline int nfs__pgio_send(struct nfs_pgio_header___nt *h, __u16 proc)
{
	struct nt_netfs_event *e = nfs__reserve(BPF_CORE_READ(h, inode), h, NT_NETFS_SEND, proc);

	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->offset_bytes = BPF_CORE_READ(h, args.offset);
	e->bytes = BPF_CORE_READ(h, args.count);
	if (proc == NT_NFS_PROC_WRITE)
		e->flags = BPF_CORE_READ(h, args.stable);
	if (!BPF_CORE_READ(h, dreq))
		e->flags |= NT_NFS_CACHED;
	record__submit(e);
	return 0;
}

/* READ or WRITE answered: the bytes the server read or wrote, the status,
 * and a write's stable how (how the server says it committed it). */
static __always_inline int nfs__pgio_done(struct rpc_task___nt *t, struct nfs_pgio_header___nt *h,
					  __u16 proc)
{
	struct nt_netfs_event *e = nfs__reserve(BPF_CORE_READ(h, inode), h, NT_NETFS_END, proc);

	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->bytes = BPF_CORE_READ(h, res.count);
	e->error = BPF_CORE_READ(t, tk_status);
	if (e->error > 0)	/* (a read's or write's task status is its count) */
		e->error = 0;
	if (proc == NT_NFS_PROC_WRITE)
		e->flags = BPF_CORE_READ(h, res.verf, committed);
	record__submit(e);
	return 0;
}

static __always_inline int nfs__commit(struct rpc_task___nt *t, struct nfs_commit_data___nt *d,
				       __u16 event)
{
	struct nt_netfs_event *e = nfs__reserve(BPF_CORE_READ(d, inode), d, event,
						NT_NFS_PROC_COMMIT);

	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	if (event == NT_NETFS_SEND) {
		e->offset_bytes = BPF_CORE_READ(d, args.offset);
		e->bytes = BPF_CORE_READ(d, args.count);	/* 0: to the file's end */
	} else {
		e->error = BPF_CORE_READ(t, tk_status);
		e->flags = BPF_CORE_READ(d, res.verf, committed);
	}
	record__submit(e);
	return 0;
}

NT_TWIN(nfs_initiate_read)
{
	return nfs__pgio_send(ARG(0, struct nfs_pgio_header___nt *), NT_NFS_PROC_READ);
}
NT_TWIN(nfs_initiate_write)
{
	return nfs__pgio_send(ARG(0, struct nfs_pgio_header___nt *), NT_NFS_PROC_WRITE);
}
NT_TWIN(nfs_readpage_done)
{
	return nfs__pgio_done(ARG(0, struct rpc_task___nt *),
			      ARG(1, struct nfs_pgio_header___nt *), NT_NFS_PROC_READ);
}
NT_TWIN(nfs_writeback_done)
{
	return nfs__pgio_done(ARG(0, struct rpc_task___nt *),
			      ARG(1, struct nfs_pgio_header___nt *), NT_NFS_PROC_WRITE);
}
NT_TWIN(nfs_initiate_commit)
{
	return nfs__commit(NULL, ARG(0, struct nfs_commit_data___nt *), NT_NETFS_SEND);
}
NT_TWIN(nfs_commit_done)
{
	return nfs__commit(ARG(0, struct rpc_task___nt *), ARG(1, struct nfs_commit_data___nt *),
			   NT_NETFS_END);
}

/* The client's metadata calls (GETATTR, SETATTR, LOOKUP, ACCESS, CREATE,
 * REMOVE, and NFSv4's OPEN by name, which creates a file too): the NFS
 * client's own call, which sends the RPC (NFSv4's
 * compound too), from its enter and exit tracepoints; on the directory
 * for lookup, create and remove.  `unique` is the task: an exit pairs
 * with its task's latest enter of the same call. */
static __always_inline int nfs__meta(struct inode *inode, __u16 event, __u16 proc, int error)
{
	struct nt_netfs_event *e = nfs__reserve(inode, (void *)bpf_get_current_pid_tgid(),
						event, proc);

	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	e->error = error;
	record__submit(e);
	return 0;
}

#define NFS_META(call, proc, err_arg)						\
	NT_TWIN(nfs_##call##_enter)						\
	{ return nfs__meta(ARG(0, struct inode *), NT_NETFS_SEND, proc, 0); }	\
	NT_TWIN(nfs_##call##_exit)						\
	{ return nfs__meta(ARG(0, struct inode *), NT_NETFS_END, proc,		\
			   (int)ARG(err_arg, long)); }
NFS_META(getattr, NT_NFS_PROC_GETATTR, 1)
NFS_META(setattr, NT_NFS_PROC_SETATTR, 1)
NFS_META(lookup, NT_NFS_PROC_LOOKUP, 3)
NFS_META(access, NT_NFS_PROC_ACCESS, 3)
NFS_META(create, NT_NFS_PROC_CREATE, 3)
NFS_META(remove, NT_NFS_PROC_REMOVE, 2)
NFS_META(atomic_open, NT_NFS_PROC_OPEN, 3)	/* (NFSv4: OPEN, creating the file too) */

/* nfsd's read or write of a file (its start, and its end once the file
 * system has done it), on the files traced at hostfs: the server's file
 * operations on the export.  `unique` is the call's xid. */
static __always_inline int nfsd__io(struct svc_rqst___nt *rq, struct svc_fh___nt *fh,
				    __u64 offset, __u32 len, __u16 event, __u16 proc)
{
	struct inode *inode = BPF_CORE_READ(fh, fh_dentry, d_inode);
	struct nt_netfs_event *e;
	__u32 dev;
	__u64 ino;

	if (!inode__wanted(inode, NT_ROLE_FILE, &dev, &ino, false))
		return 0;
	e = RESERVE(netfs_event, NETFS_EVENT, bpf_ktime_get_ns());
	if (!e)
		return 0;
	FLOOR_SUBMIT(e);
	nfs__fill(e, bpf_ntohl(BPF_CORE_READ(rq, rq_xid)), ino, dev, event, NT_NETFS_PROTO_NFSD, proc);
	e->offset_bytes = offset;
	e->bytes = len;
	record__submit(e);
	return 0;
}

#define NFSD_TWIN(tp, event, proc)						\
	NT_TWIN(tp)								\
	{									\
		return nfsd__io(ARG(0, struct svc_rqst___nt *),			\
				ARG(1, struct svc_fh___nt *), ARG(2, __u64),	\
				ARG(3, __u32), event, proc);			\
	}
/* (the starts are once nfsd has the file open: its *_start tracepoints
 * come before the file handle is verified, with no dentry yet) */
NFSD_TWIN(nfsd_read_splice, NT_NETFS_SEND, NT_NFS_PROC_READ)
NFSD_TWIN(nfsd_read_vector, NT_NETFS_SEND, NT_NFS_PROC_READ)
NFSD_TWIN(nfsd_read_io_done, NT_NETFS_END, NT_NFS_PROC_READ)
NFSD_TWIN(nfsd_write_opened, NT_NETFS_SEND, NT_NFS_PROC_WRITE)
NFSD_TWIN(nfsd_write_io_done, NT_NETFS_END, NT_NFS_PROC_WRITE)
