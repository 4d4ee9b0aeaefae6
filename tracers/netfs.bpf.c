// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* netfs: the requests a network file system's client sends to its server
 * (level netfs), on the traced network mounts.  FUSE (sshfs): one record
 * when a request is sent (fuse_request_send: opcode, node, and for reads
 * and writes the offset and size from the request's first argument) and
 * one when its answer comes (fuse_request_end); the netfs_io view pairs
 * them by (dev, unique). */
#include "common.bpf.h"
#include "core_fixes.bpf.h"

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
