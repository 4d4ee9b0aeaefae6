// SPDX-License-Identifier: BSD-2-Clause
/* The importers' inner loops, compiled: libnestrace-readers.so.
 *
 * nestrace.importers.compiled loads it with ctypes and hands it numpy
 * arrays; what the caller reads back is in arrays it gave.
 *
 * - nt_blk_index: the records of a blktrace file (struct blk_io_trace,
 *   48 bytes, then pdu_len bytes of payload): their offsets and their
 *   headers' fields, a column each.  It reads only undamaged files: at the
 *   first record that is not plainly whole it returns where, and the
 *   Python walk (nestrace.importers.blktrace) decides what the damage is.
 *   nt_blk_window: the same for a window of a file read a window at a
 *   time (a record the window cuts off is the next one's).
 * - nt_ftrace_page: the event records of a trace.dat's ring-buffer page.
 * - the pairings of block events into bios and requests: readers_pairing.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* what nestrace.importers.compiled checks before it calls anything */
#define NT_READERS_ABI 3

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
 * where each starts and its header's fields.  Stops at the first record
 * that is not plainly whole (bad magic or version, a payload too long or
 * cut short, a record's first bytes inside a payload), or at the cap:
 * *stop = where, and returns how many.  Where the data goes on past len
 * (!at_end), a record whose bytes or payload check run past len is not
 * damage but the next window's: *stop is its offset, *cut = 1. */
static int64_t blk_walk(const uint8_t *buf, int64_t len, int at_end, int64_t cap,
			const struct blk_columns *c, int64_t *stop, int *cut)
{
	int64_t off = 0, n = 0;

	*cut = 0;
	while (off < len) {
		const uint8_t *r = buf + off;
		uint32_t magic;
		uint16_t pdu;
		int64_t next;

		if (n >= cap)
			break;
		if (len - off < BLK_HEADER) {
			*cut = !at_end;
			break;
		}
		memcpy(&magic, r, 4);
		memcpy(&pdu, r + 46, 2);
		next = off + BLK_HEADER + pdu;
		if (magic != BLK_MAGIC_VERSION || pdu > BLK_MAX_PDU)
			break;
		if (next > len || (!at_end && pdu && next + 3 > len)) {
			*cut = !at_end;
			break;
		}
		/* (one starting in the payload, or going on past it) */
		if (pdu && has_magic(r + BLK_HEADER, buf + (next + 3 < len ? next + 3 : len)))
			break;
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
	*stop = off;
	return n;
}

/* The records of a whole file's bytes buf[0..len), at most cap, into the
 * columns c.  Returns how many, or -(off + 1) for the first record at off
 * that is not plainly whole, or more than cap records. */
int64_t nt_blk_index(const uint8_t *buf, int64_t len, int64_t cap, const struct blk_columns *c)
{
	int64_t stop;
	int cut;
	int64_t n = blk_walk(buf, len, 1, cap, c, &stop, &cut);

	return stop < len ? -(stop + 1) : n;
}

/* The records of one window of a file, buf[0..len) (at_end: the file's
 * last): as nt_blk_index, but a record the window cuts off ends the walk
 * cleanly.  Returns how many, with *next where the next window starts;
 * or -(off + 1) for damage at off. */
int64_t nt_blk_window(const uint8_t *buf, int64_t len, int at_end, int64_t cap,
		      const struct blk_columns *c, int64_t *next)
{
	int64_t stop;
	int cut;
	int64_t n = blk_walk(buf, len, at_end, cap, c, &stop, &cut);

	*next = stop;
	if (stop < len && !cut && n < cap)
		return -(stop + 1);
	return n;
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
