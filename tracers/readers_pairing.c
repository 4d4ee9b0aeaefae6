// SPDX-License-Identifier: BSD-2-Clause
/* The pairings of block events, compiled into libnestrace-readers.so with
 * readers.c (nestrace.importers.compiled calls them on numpy arrays).
 *
 * - nt_blk_pair: request and bio ids for block events in time order, the
 *   way btt pairs them, by (device, sector) streams kept in a hash table:
 *   one pass, where numpy needed a sort by stream.  The rules are
 *   nestrace.importers.blkimport.block_events' docstring.  nt_pairing_*:
 *   the same a chunk of events at a time, the streams kept between.
 * - nt_requests_*: block requests of block events, a chunk at a time, as
 *   nestrace.importers.requests pairs all of them at once, keeping only
 *   the bios and requests still open.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What the pairings forget: a sector's last start, and a bio's Q, G or
 * X, when it is more than STALE_NS before the event that would use it (no
 * request open at the sector); and, for a split (X), the start at its
 * sector more than SPLIT_NS before it.  blk-mq times a request out after
 * 30 s (its default), and splits a bio as it is queued; held longer, a
 * start is one whose bio was merged, or whose sector no bio started at
 * again.  Forgetting them keeps a streamed import's memory bounded by the
 * starts of the last STALE_NS, not by all the sectors a trace touched.
 * The same rules are nestrace.importers.requests' STALE_NS and SPLIT_NS,
 * and the SQL module block.requests' _block_stale_ns() and
 * _block_split_ns(). */
#define STALE_NS 30000000000ll
#define SPLIT_NS 1000000000ll

/* nestrace's block_action codes */
enum { A_Q = 1, A_BACKMERGE, A_FRONTMERGE, A_G, A_I, A_D, A_C, A_X, A_RQ_MERGE, A_REQUEUE };

struct stream {
	uint64_t sector;
	uint32_t dev;
	uint32_t used;
	uint64_t bio;	/* the bio of the last start here (resolved), 0: none */
	uint64_t rq;	/* the request open here, 0: none */
	uint64_t ts;	/* the time of the last event here */
};

/* A stream that no event may use any more at time now: none open here,
 * the last event more than STALE_NS ago. */
static int stale(const struct stream *s, uint64_t now)
{
	return !s->rq && now > s->ts && now - s->ts > (uint64_t)STALE_NS;
}

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

/* Room for one more stream: the table at most half full.  A full table
 * is built again without the streams stale at now, twice as big only
 * when more than a quarter of it is left. */
static int room(struct streams *t, uint64_t now)
{
	struct streams next;
	uint64_t i, live = 0;

	if ((t->used + 1) * 2 <= t->mask + 1)
		return 0;
	for (i = 0; i <= t->mask; i++)
		live += t->slot[i].used && !stale(&t->slot[i], now);
	next.mask = (live + 1) * 4 > t->mask + 1 ? t->mask * 2 + 1 : t->mask;
	next.used = 0;
	next.slot = calloc(next.mask + 1, sizeof(*next.slot));
	if (!next.slot)
		return -1;
	for (i = 0; i <= t->mask; i++) {
		struct stream *s = &t->slot[i], *d;

		if (!s->used || stale(s, now))
			continue;
		d = find(&next, s->dev, s->sector, 1);
		d->bio = s->bio;
		d->rq = s->rq;
		d->ts = s->ts;
	}
	free(t->slot);
	*t = next;
	return 0;
}

/* The stream at (dev, sector) for an event at now (made when add), as a
 * new one when stale: its last start forgotten.  NULL: none, not add. */
static struct stream *at(struct streams *t, uint32_t dev, uint64_t sector, uint64_t now, int add)
{
	struct stream *s = find(t, dev, sector, add);

	if (s && stale(s, now)) {
		if (!add)
			return NULL;
		s->bio = 0;
	}
	if (s)
		s->ts = now;
	return s;
}

/* The pairing's state between the chunks of one import: the streams, the
 * per-CPU counts, the last request id and how many events came before. */
struct nt_pairing {
	struct streams t;
	uint64_t *per_cpu;
	uint64_t next_rq;
	uint64_t events;
};

void nt_pairing_free(struct nt_pairing *p)
{
	if (!p)
		return;
	free(p->t.slot);
	free(p->per_cpu);
	free(p);
}

/* How many streams p holds (the tests see that they stay bounded). */
int64_t nt_pairing_held(const struct nt_pairing *p)
{
	return (int64_t)p->t.used;
}

struct nt_pairing *nt_pairing_new(void)
{
	struct nt_pairing *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->t.mask = 65535;
	p->t.slot = calloc(p->t.mask + 1, sizeof(*p->t.slot));
	p->per_cpu = calloc(65536, sizeof(*p->per_cpu));
	if (!p->t.slot || !p->per_cpu) {
		nt_pairing_free(p);
		return NULL;
	}
	return p;
}

/* Bio ids (bio), request ids (rq) and per-CPU sequence numbers from 1
 * (seq) of the next m block events in time order, going on from the
 * events p has seen: action a (block_action codes), time ts, device dev,
 * sector sec, for a split (X) the sector it was cut at (aux), cpu.  An
 * event finds no bio at a stream stale at its time (STALE_NS).  Bio ids are
 * 2k + 1 for the k-th event (of all p has seen) when it starts a bio (a
 * Q, or the piece an X cut off), so they do not depend on how streams
 * are kept or events cut into chunks.  Returns 0; -1 when out of memory;
 * -2 for a CPU past 65535. */
int nt_pairing_step(struct nt_pairing *p, int64_t m, const uint16_t *a, const uint64_t *ts,
		    const uint32_t *dev, const uint64_t *sec, const uint64_t *aux,
		    const uint32_t *cpu, uint64_t *bio, uint64_t *rq, uint64_t *seq)
{
	struct streams *t = &p->t;
	int64_t k;

	for (k = 0; k < m; k++)
		if (cpu[k] > 65535)
			return -2;
	for (k = 0; k < m; k++) {
		uint16_t act = a[k];
		uint64_t start = 2 * (p->events + (uint64_t)k) + 1;
		struct stream *s;
		uint64_t id;

		seq[k] = ++p->per_cpu[cpu[k]];
		rq[k] = bio[k] = 0;
		if (act == A_Q || act == A_X || act == A_I || act == A_D || act == A_C ||
		    act == A_REQUEUE) {
			if (room(t, ts[k]))
				return -1;
			s = at(t, dev[k], sec[k], ts[k], 1);
		} else {
			s = at(t, dev[k], sec[k], ts[k], 0);
		}
		if (act == A_Q) {
			s->bio = start;
		} else if (act == A_X) {
			uint64_t before = s->bio;

			s->bio = start;
			if (aux[k] > sec[k]) {
				/* the bio it was cut from goes on at the remainder */
				if (room(t, ts[k]))
					return -1;
				s = at(t, dev[k], aux[k], ts[k], 1);
				s->bio = before;
				s = find(t, dev[k], sec[k], 0);
			}
		}
		id = s ? s->bio : 0;
		if (act >= A_Q && act <= A_D)
			bio[k] = id;
		else if (act == A_X)
			bio[k] = start;
		if (act == A_I || act == A_D || act == A_C || act == A_REQUEUE) {
			if (!s->rq)
				s->rq = ++p->next_rq;
			rq[k] = s->rq;
			if (act == A_C)
				s->rq = 0;
		}
	}
	p->events += (uint64_t)m;
	return 0;
}

/* The same for all of an import's events at once. */
int nt_blk_pair(int64_t m, const uint16_t *a, const uint64_t *ts, const uint32_t *dev,
		const uint64_t *sec, const uint64_t *aux, const uint32_t *cpu, uint64_t *bio,
		uint64_t *rq, uint64_t *seq)
{
	struct nt_pairing *p = nt_pairing_new();
	int r;

	if (!p)
		return -1;
	r = nt_pairing_step(p, m, a, ts, dev, sec, aux, cpu, bio, rq, seq);
	nt_pairing_free(p);
	return r;
}

/* A table of (dev, id) keys with a few numbers each: open addressing, at
 * most half full, an entry removed by shifting back the ones after it.
 * In a table that sweeps, v[1] is a time, and an entry whose v[1] is
 * older than that is left out when the table is full. */
struct entry {
	uint64_t id;
	uint32_t dev;
	uint32_t used;
	int64_t v[6];
};

struct map {
	struct entry *slot;
	uint64_t mask, used;
	int64_t sweeps;		/* 0, or how old (ns) an entry's v[1] is when gone */
};

static int map_init(struct map *t, int64_t sweeps)
{
	/* (small: the bios and requests open at once are few, and a few
	 * entries spread over a big table miss the cache at every event) */
	t->sweeps = sweeps;
	t->mask = 255;
	t->used = 0;
	t->slot = calloc(t->mask + 1, sizeof(*t->slot));
	return t->slot ? 0 : -1;
}

static struct entry *map_find(struct map *t, uint32_t dev, uint64_t id)
{
	uint64_t i = mix(dev, id) & t->mask;

	for (;; i = (i + 1) & t->mask) {
		struct entry *e = &t->slot[i];

		if (!e->used || (e->dev == dev && e->id == id))
			return e;
	}
}

static int gone(const struct map *t, const struct entry *e, int64_t now)
{
	return t->sweeps && now - e->v[1] > t->sweeps;
}

/* (dev, id)'s entry, made with every number NONE when new; NULL when out
 * of memory.  now: the event's time.  A full table is built again without
 * the entries gone at now, twice as big only when more than a quarter of
 * it is left.  Pointers into t last until the next map_get or map_del. */
static struct entry *map_get(struct map *t, uint32_t dev, uint64_t id, int64_t now)
{
	struct entry *e;
	int k;

	if ((t->used + 1) * 2 > t->mask + 1) {
		struct map next = { .sweeps = t->sweeps };
		uint64_t i, live = 0;

		for (i = 0; i <= t->mask; i++)
			live += t->slot[i].used && !gone(t, &t->slot[i], now);
		next.mask = (live + 1) * 4 > t->mask + 1 ? t->mask * 2 + 1 : t->mask;
		next.slot = calloc(next.mask + 1, sizeof(*next.slot));
		if (!next.slot)
			return NULL;
		for (i = 0; i <= t->mask; i++)
			if (t->slot[i].used && !gone(t, &t->slot[i], now))
				*map_find(&next, t->slot[i].dev, t->slot[i].id) = t->slot[i];
		next.used = live;
		free(t->slot);
		*t = next;
	}
	e = map_find(t, dev, id);
	if (!e->used) {
		e->used = 1;
		e->dev = dev;
		e->id = id;
		for (k = 0; k < 6; k++)
			e->v[k] = -1;
		t->used++;
	}
	return e;
}

static void map_del(struct map *t, struct entry *e)
{
	uint64_t i = (uint64_t)(e - t->slot), j = i;

	for (;;) {
		uint64_t home;

		j = (j + 1) & t->mask;
		if (!t->slot[j].used)
			break;
		home = mix(t->slot[j].dev, t->slot[j].id) & t->mask;
		/* (one that may not move back past its home stays) */
		if (i <= j ? (home > i && home <= j) : (home > i || home <= j))
			continue;
		t->slot[i] = t->slot[j];
		i = j;
	}
	t->slot[i].used = 0;
	t->used--;
}

#define NONE (-1)

/* The request pairing's state between chunks: by (dev, bio) the last two
 * of a bio's Q, G and X since its last D (action, time, for an X the Q
 * time of the bio it cut from); by (dev, rq) a request's last event and
 * its D still waiting for the event after it; by (dev, sector) the Q
 * time of the last bio to start there (a Q, or a split's remainder) and
 * when it started.  A D takes no Q, G or X more than STALE_NS before it,
 * an X no start more than SPLIT_NS before it: the bios and starts tables
 * sweep what is older. */
struct nt_requests {
	struct map bios, rqs, starts;
	int64_t made;		/* requests (Ds) so far */
};

/* How many entries r holds, in its three tables (the tests see that
 * they stay bounded). */
int64_t nt_requests_held(const struct nt_requests *r)
{
	return (int64_t)(r->bios.used + r->rqs.used + r->starts.used);
}

void nt_requests_free(struct nt_requests *r)
{
	if (!r)
		return;
	free(r->bios.slot);
	free(r->rqs.slot);
	free(r->starts.slot);
	free(r);
}

struct nt_requests *nt_requests_new(void)
{
	struct nt_requests *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	if (map_init(&r->bios, STALE_NS) || map_init(&r->rqs, 0) ||
	    map_init(&r->starts, SPLIT_NS)) {
		nt_requests_free(r);
		return NULL;
	}
	return r;
}

/* The phases of one request, where nt_requests_step writes them: a
 * column each, one row per D. */
struct nt_phases {
	int64_t *row, *q, *g, *i, *c, *done;
	int32_t *error;
};

static void finish(struct nt_phases *out, int64_t at, int64_t act, int64_t t, int32_t err)
{
	out->done[at] = t;
	out->c[at] = act == A_C ? t : NONE;
	out->error[at] = act == A_C ? err : 0;
}

/* The requests of the next m block events, in time then CPU order, going
 * on from the events r has seen, as nestrace.importers.requests pairs
 * them (the SQL module block.requests' rules): a row of out per D, in
 * order (row: the D's event, k), with its bio's Q, G (by bio: the events
 * before it since the bio's last D; for a split piece, the Q of the bio
 * it was cut from), the I before it and the event after it (by request;
 * c and error only when that is a C).  A D whose next event comes in a
 * later chunk is finished then: into fix (row: the request's number
 * among all, from 0) when it is of an earlier chunk.  Returns how many
 * Ds; *fixes how many rows of fix; -1 when out of memory. */
int64_t nt_requests_step(struct nt_requests *r, int64_t m, const uint16_t *a,
			 const uint64_t *ts, const uint32_t *dev, const uint64_t *bio,
			 const uint64_t *rq, const uint64_t *sec, const uint64_t *aux,
			 const int32_t *error, struct nt_phases *out, struct nt_phases *fix,
			 int64_t *fixes)
{
	int64_t k, n = 0, base = r->made;

	*fixes = 0;
	for (k = 0; k < m; k++) {
		int64_t act = a[k], t = (int64_t)ts[k], xq = NONE;
		struct entry *e;

		if (act == A_Q) {
			if (!(e = map_get(&r->starts, dev[k], sec[k], t)))
				return -1;
			e->v[0] = e->v[1] = t;
		} else if (act == A_X) {
			/* the piece's Q: the last start at its sector; the
			 * remainder starts at aux with the same */
			e = map_find(&r->starts, dev[k], sec[k]);
			xq = e->used && t - e->v[1] <= SPLIT_NS ? e->v[0] : NONE;
			if (aux[k] > sec[k]) {
				if (!(e = map_get(&r->starts, dev[k], aux[k], t)))
					return -1;
				e->v[0] = xq;
				e->v[1] = t;
			}
		}
		if (act == A_Q || act == A_G || act == A_D || act == A_X) {
			if (!(e = map_get(&r->bios, dev[k], bio[k], t)))
				return -1;
			if (act == A_D) {
				int64_t a1 = e->v[0], t1 = e->v[1], a2 = e->v[3], t2 = e->v[4];
				int64_t q = NONE, x = NONE, g;

				if (t - t1 > STALE_NS)
					a1 = NONE;
				if (t - t2 > STALE_NS)
					a2 = NONE;
				g = a1 == A_G ? t1 : NONE;

				if (a1 == A_Q)
					q = t1;
				else if (a1 == A_G && a2 == A_Q)
					q = t2;
				if (a1 == A_X)
					x = e->v[2];
				else if (a1 == A_G && a2 == A_X)
					x = e->v[5];
				out->row[n] = k;
				out->q[n] = q != NONE ? q : x;
				out->g[n] = g;
				/* (what came before this D is no one's after it) */
				map_del(&r->bios, e);
			} else {
				e->v[3] = e->v[0];
				e->v[4] = e->v[1];
				e->v[5] = e->v[2];
				e->v[0] = act;
				e->v[1] = t;
				e->v[2] = xq;
			}
		}
		if (act == A_D || act == A_I || act == A_C) {
			if (!(e = map_get(&r->rqs, dev[k], rq[k], t)))
				return -1;
			if (e->v[2] != NONE) {
				int64_t at = e->v[2];

				if (at >= base) {
					finish(out, at - base, act, t, error[k]);
				} else {
					fix->row[*fixes] = at;
					finish(fix, (*fixes)++, act, t, error[k]);
				}
				e->v[2] = NONE;
			}
			if (act == A_D) {
				out->i[n] = e->v[0] == A_I ? e->v[1] : NONE;
				out->c[n] = out->done[n] = NONE;
				out->error[n] = 0;
				e->v[2] = base + n++;
			}
			e->v[0] = act;
			e->v[1] = t;
			/* (a request's id is not given again after its C) */
			if (act == A_C)
				map_del(&r->rqs, e);
		}
	}
	r->made += n;
	return n;
}
