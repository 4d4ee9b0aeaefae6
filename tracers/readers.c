// SPDX-License-Identifier: BSD-2-Clause
/* The importers' inner loops, compiled: libnestrace-readers.so.
 *
 * nestrace.importers.fast loads it with ctypes and hands it numpy arrays;
 * nothing here allocates what the caller reads back.  Two loops:
 *
 * - nt_blk_index: the records of a blktrace file (struct blk_io_trace,
 *   48 bytes, then pdu_len bytes of payload): their offsets and their
 *   headers' fields, a column each.  It reads only undamaged files: at the first
 *   record that is not plainly whole it returns where, and the Python
 *   walk (nestrace.importers.blktrace) decides what the damage is.
 * - nt_blk_pair: request and bio ids for block events in time order, the
 *   way btt pairs them, by (device, sector) streams kept in a hash table:
 *   one pass, where numpy needed a sort by stream.  The rules are
 *   nestrace.importers.blkimport.block_events' docstring.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* what nestrace.importers.fast checks before it calls anything */
#define NT_READERS_ABI 1

int nt_readers_abi(void)
{
	return NT_READERS_ABI;
}

#define BLK_HEADER 48
#define BLK_MAGIC_VERSION 0x65617407u
/* the longest payload a kernel writes: a cgroup id, then a message */
#define BLK_MAX_PDU (8 + 128)

static int has_magic(const uint8_t *p, const uint8_t *end)
{
	static const uint32_t want = BLK_MAGIC_VERSION;

	for (; p + 4 <= end; p++)
		if (!memcmp(p, &want, 4))
			return 1;
	return 0;
}

/* The columns nt_blk_index fills, one array each (n = cap rows). */
struct blk_columns {
	int64_t *offset;
	uint32_t *sequence;
	uint64_t *time;
	uint64_t *sector;
	uint32_t *bytes;
	uint32_t *action;
	uint32_t *pid;
	uint32_t *device;
	uint32_t *cpu;
	uint16_t *error;
	uint16_t *pdu_len;
};

/* The records of buf[0..len), at most cap of them, into the columns c:
 * where each starts and its header's fields.  Returns how many, or
 * -(off + 1) for the first record at off that is not plainly whole: bad
 * magic or version, a payload too long or cut short, a record's first
 * bytes inside a payload, or more than cap records. */
int64_t nt_blk_index(const uint8_t *buf, int64_t len, int64_t cap, const struct blk_columns *c)
{
	int64_t off = 0, n = 0;

	while (off < len) {
		const uint8_t *r = buf + off;
		uint32_t magic;
		uint16_t pdu;
		int64_t next;

		if (len - off < BLK_HEADER || n >= cap)
			return -(off + 1);
		memcpy(&magic, r, 4);
		memcpy(&pdu, r + 46, 2);
		next = off + BLK_HEADER + pdu;
		if (magic != BLK_MAGIC_VERSION || pdu > BLK_MAX_PDU || next > len)
			return -(off + 1);
		/* (one starting in the payload, or going on past it) */
		if (pdu && has_magic(r + BLK_HEADER, buf + (next + 3 < len ? next + 3 : len)))
			return -(off + 1);
		c->offset[n] = off;
		memcpy(&c->sequence[n], r + 4, 4);
		memcpy(&c->time[n], r + 8, 8);
		memcpy(&c->sector[n], r + 16, 8);
		memcpy(&c->bytes[n], r + 24, 4);
		memcpy(&c->action[n], r + 28, 4);
		memcpy(&c->pid[n], r + 32, 4);
		memcpy(&c->device[n], r + 36, 4);
		memcpy(&c->cpu[n], r + 40, 4);
		memcpy(&c->error[n], r + 44, 2);
		c->pdu_len[n] = pdu;
		n++;
		off = next;
	}
	return n;
}

/* nestrace's block_action codes */
enum { A_Q = 1, A_BACKMERGE, A_FRONTMERGE, A_G, A_I, A_D, A_C, A_X, A_RQ_MERGE, A_REQUEUE };

struct stream {
	uint64_t sector;
	uint32_t dev;
	uint32_t used;
	uint64_t bio;	/* the bio of the last start here (resolved), 0: none */
	uint64_t rq;	/* the request open here, 0: none */
};

struct streams {
	struct stream *slot;
	uint64_t mask, used;
};

static uint64_t mix(uint32_t dev, uint64_t sector)
{
	uint64_t h = (sector ^ ((uint64_t)dev << 40) ^ dev) * 0x9E3779B97F4A7C15ull;

	return h ^ (h >> 29);
}

static struct stream *find(struct streams *t, uint32_t dev, uint64_t sector, int add)
{
	uint64_t i = mix(dev, sector) & t->mask;

	for (;; i = (i + 1) & t->mask) {
		struct stream *s = &t->slot[i];

		if (!s->used) {
			if (!add)
				return NULL;
			s->used = 1;
			s->dev = dev;
			s->sector = sector;
			t->used++;
			return s;
		}
		if (s->dev == dev && s->sector == sector)
			return s;
	}
}

/* Room for one more stream: the table at most half full. */
static int room(struct streams *t)
{
	struct streams bigger;
	uint64_t i;

	if ((t->used + 1) * 2 <= t->mask + 1)
		return 0;
	bigger.mask = t->mask * 2 + 1;
	bigger.used = 0;
	bigger.slot = calloc(bigger.mask + 1, sizeof(*bigger.slot));
	if (!bigger.slot)
		return -1;
	for (i = 0; i <= t->mask; i++) {
		struct stream *s = &t->slot[i], *d;

		if (!s->used)
			continue;
		d = find(&bigger, s->dev, s->sector, 1);
		d->bio = s->bio;
		d->rq = s->rq;
	}
	free(t->slot);
	*t = bigger;
	return 0;
}

/* Bio ids (bio), request ids (rq) and per-CPU sequence numbers from 1
 * (seq) of m block events in time order: action a (block_action codes),
 * device dev, sector sec, for a split (X) the sector it was cut at (aux),
 * cpu.  Bio ids are 2k + 1 for the k-th event when it starts a bio (a Q,
 * or the piece an X cut off), so they do not depend on how streams are
 * kept.  Returns 0; -1 when out of memory; -2 for a CPU past 65535. */
int nt_blk_pair(int64_t m, const uint16_t *a, const uint32_t *dev, const uint64_t *sec,
		const uint64_t *aux, const uint32_t *cpu, uint64_t *bio, uint64_t *rq,
		uint64_t *seq)
{
	struct streams t = { .mask = 65535 };
	uint64_t *per_cpu, next_rq = 0;
	int64_t k;

	for (k = 0; k < m; k++)
		if (cpu[k] > 65535)
			return -2;
	t.slot = calloc(t.mask + 1, sizeof(*t.slot));
	per_cpu = calloc(65536, sizeof(*per_cpu));
	if (!t.slot || !per_cpu)
		goto oom;
	for (k = 0; k < m; k++) {
		uint16_t act = a[k];
		struct stream *s;
		uint64_t id;

		seq[k] = ++per_cpu[cpu[k]];
		rq[k] = bio[k] = 0;
		if (act == A_Q || act == A_X || act == A_I || act == A_D || act == A_C ||
		    act == A_REQUEUE) {
			if (room(&t))
				goto oom;
			s = find(&t, dev[k], sec[k], 1);
		} else {
			s = find(&t, dev[k], sec[k], 0);
		}
		if (act == A_Q) {
			s->bio = 2 * (uint64_t)k + 1;
		} else if (act == A_X) {
			uint64_t before = s->bio;

			s->bio = 2 * (uint64_t)k + 1;
			if (aux[k] > sec[k]) {
				/* the bio it was cut from goes on at the remainder */
				if (room(&t))
					goto oom;
				s = find(&t, dev[k], aux[k], 1);
				s->bio = before;
				s = find(&t, dev[k], sec[k], 0);
			}
		}
		id = s ? s->bio : 0;
		if (act >= A_Q && act <= A_D)
			bio[k] = id;
		else if (act == A_X)
			bio[k] = 2 * (uint64_t)k + 1;
		if (act == A_I || act == A_D || act == A_C || act == A_REQUEUE) {
			if (!s->rq)
				s->rq = ++next_rq;
			rq[k] = s->rq;
			if (act == A_C)
				s->rq = 0;
		}
	}
	free(t.slot);
	free(per_cpu);
	return 0;
oom:
	free(t.slot);
	free(per_cpu);
	return -1;
}

/* ftrace's ring-buffer event header: type_len (5 bits), time_delta (27) */
#define RB_PADDING 29
#define RB_TIME_EXTEND 30
#define RB_TIME_STAMP 31
#define RB_TS_SHIFT 27

enum { PAGE_DONE, PAGE_HEADER_CUT, PAGE_RECORD_PAST, PAGE_TIME_DAMAGED, PAGE_NO_ROOM };

static uint32_t u32_at(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

/* The event records of one ring-buffer page of a trace.dat's CPU data,
 * from byte p to end (data holds len bytes), the page's time ts: each
 * record's header offset into hdrs and its time into tss (at most cap).
 * Returns how many; status[0] says why the walk stopped (PAGE_*),
 * status[1] at which byte, status[2] a record's length (PAGE_RECORD_PAST)
 * or event id (PAGE_TIME_DAMAGED), status[3] that record's time.  The
 * rules are nestrace.importers.tracecmd's: padding with a length is a
 * discarded event whose delta stands; a time past 2^63 is damage in a
 * block event (kinds[id] != 0), kept (at most 2^64 - 1) in another. */
int64_t nt_ftrace_page(const uint8_t *data, int64_t len, int64_t p, int64_t end, uint64_t ts0,
		       const uint8_t *kinds, int64_t *hdrs, uint64_t *tss, int64_t cap,
		       int64_t *status)
{
	unsigned __int128 ts = ts0;
	const unsigned __int128 max_time = (unsigned __int128)1 << 63;
	int64_t n = 0;

	status[0] = PAGE_DONE;
	while (p < end) {
		uint32_t h, tl, delta;
		int64_t length, ev;

		if (p + 4 > end) {
			status[0] = PAGE_HEADER_CUT;
			break;
		}
		h = u32_at(data + p);
		tl = h & 0x1F;
		delta = h >> 5;
		/* (a word after the header: not past the data) */
		if ((tl == 0 || tl >= RB_PADDING) && p + 8 > len) {
			status[0] = PAGE_HEADER_CUT;
			break;
		}
		if (tl == RB_PADDING) {
			if (!delta)
				break;
			ts += delta;
			p += 4 + (int64_t)u32_at(data + p + 4);
			continue;
		}
		if (tl == RB_TIME_EXTEND) {
			ts += ((unsigned __int128)u32_at(data + p + 4) << RB_TS_SHIFT) + delta;
			p += 8;
			continue;
		}
		if (tl == RB_TIME_STAMP) {
			unsigned __int128 abs_ts =
				((unsigned __int128)u32_at(data + p + 4) << RB_TS_SHIFT) | delta;

			ts = (ts & ~(((unsigned __int128)1 << 59) - 1)) | abs_ts;
			p += 8;
			continue;
		}
		ts += delta;
		if (tl == 0) {
			length = (int64_t)u32_at(data + p + 4) - 4;
			ev = p + 8;
		} else {
			length = tl * 4;
			ev = p + 4;
		}
		if (length < 8 || ev + length > end) {
			status[0] = PAGE_RECORD_PAST;
			status[2] = length;
			break;
		}
		if (n >= cap) {
			status[0] = PAGE_NO_ROOM;
			break;
		}
		if (ts >= max_time) {
			uint16_t id = data[ev] | data[ev + 1] << 8;

			if (kinds[id]) {
				status[0] = PAGE_TIME_DAMAGED;
				status[2] = id;
				status[3] = ts > UINT64_MAX ? (int64_t)UINT64_MAX : (int64_t)ts;
				break;
			}
		}
		tss[n] = ts > UINT64_MAX ? UINT64_MAX : (uint64_t)ts;
		hdrs[n++] = p;
		p = ev + ((length + 3) & ~3);
	}
	status[1] = p;
	return n;
}
