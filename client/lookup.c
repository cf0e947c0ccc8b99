/* SPDX-License-Identifier: MIT */
/* libmrd's side of the datapath: asking mrd for keys, and the two-level lookup cache (DPDK's
 * per-queue MR control): 8 recent entries with an MRU index and a round-robin victim, then a
 * sorted array, both flushed when the domain's generation moves. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "call.h"
#include "lookup.h"
#include "log.h"
#include "mr-table.h"
#include "mrd/mrd.h"

#define BOTTOM_FIRST 256
#define BOTTOM_MAX 65536

struct mrd_lookup_bottom {
	struct mr_table table;
};

MRD_EXPORT int mrd_mr_lookup(mrd_client *client, const void *addr, struct mrd_mr *ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	uint64_t address = (uintptr_t)addr;
	Mrd__Response *resp;
	int r;

	if (!client || !ret)
		return set_last_error(-EINVAL, "mrd_mr_lookup: NULL argument");
	q.addresses = &address;
	q.n_addresses = 1;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_MR_LOOKUP || resp->mr_lookup->n_entries != 1 ||
	    address < resp->mr_lookup->entries[0]->start ||
	    address >= resp->mr_lookup->entries[0]->end)
		r = set_last_error(-EBADMSG, "malformed MrLookup reply");
	else {
		const Mrd__MrEntry *e = resp->mr_lookup->entries[0];

		ret->start = (uintptr_t)e->start;
		ret->end = (uintptr_t)e->end;
		ret->lkey = e->lkey;
		ret->rkey = e->rkey;
		log_debug("lookup of 0x%" PRIx64 " asked mrd: [0x%" PRIx64 ", 0x%" PRIx64
			  ") lkey 0x%08x rkey 0x%08x", address, e->start, e->end, e->lkey, e->rkey);
	}
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

static void flush(struct mrd_lookup *l)
{
	memset(l->top, 0, sizeof(l->top));
	l->mru = l->head = 0;
	mr_table_clear(&l->bottom->table);
}

MRD_EXPORT int mrd_lookup_init(struct mrd_lookup *l, mrd_client *client)
{
	int r;

	if (!l || !client)
		return set_last_error(-EINVAL, "mrd_lookup_init: NULL argument");
	memset(l, 0, sizeof(*l));
	l->bottom = calloc(1, sizeof(*l->bottom));
	if (!l->bottom)
		return set_last_error(-ENOMEM, "out of memory");
	r = mr_table_init(&l->bottom->table, BOTTOM_FIRST, BOTTOM_MAX);
	if (r < 0) {
		free(l->bottom);
		l->bottom = NULL;
		return set_last_error(r, "out of memory");
	}
	l->client = client;
	l->generation_ptr = &client->status->generation;
	l->generation = *l->generation_ptr;
	return 0;
}

MRD_EXPORT void mrd_lookup_done(struct mrd_lookup *l)
{
	if (!l || !l->bottom)
		return;
	mr_table_done(&l->bottom->table);
	free(l->bottom);
	l->bottom = NULL;
}

static void top_insert(struct mrd_lookup *l, const struct mrd_mr *mr)
{
	l->top[l->head] = *mr;
	l->mru = l->head;
	l->head = (l->head + 1) % MRD_LOOKUP_TOP;
}

/* The top half, after the generation check: most lookups that miss the MRU end here. */
static inline bool top_find(struct mrd_lookup *l, uintptr_t a, struct mrd_mr *ret)
{
	uint64_t generation = __atomic_load_n(l->generation_ptr, __ATOMIC_ACQUIRE);

	/* Memory of the domain went away since we cached: nothing cached can be trusted. */
	if (generation != l->generation) {
		flush(l);
		l->generation = generation;
		return false;
	}
	for (unsigned i = 0; i < MRD_LOOKUP_TOP; i++)
		if (a >= l->top[i].start && a < l->top[i].end) {
			l->mru = i;
			*ret = l->top[i];
			return true;
		}
	return false;
}

/* The bottom half, which refills the top on a hit. */
static int bottom_find(struct mrd_lookup *l, uintptr_t a, struct mrd_mr *ret)
{
	const struct mr_entry *e = mr_table_lookup(&l->bottom->table, a);

	if (!e)
		return -ENOENT;
	*ret = (struct mrd_mr){ (uintptr_t)e->start, (uintptr_t)e->end, e->lkey, e->rkey };
	top_insert(l, ret);
	return 0;
}

int lookup_cached(struct mrd_lookup *l, uintptr_t a, struct mrd_mr *ret)
{
	return top_find(l, a, ret) ? 0 : bottom_find(l, a, ret);
}

void lookup_insert(struct mrd_lookup *l, const struct mrd_mr *mr, bool top)
{
	struct mr_entry fresh = { mr->start, mr->end, mr->lkey, mr->rkey };
	int r = mr_table_insert(&l->bottom->table, &fresh);

	if (r == -ENOSPC) {
		/* Full at its ceiling: a cache may forget everything and start over. */
		mr_table_clear(&l->bottom->table);
		(void)mr_table_insert(&l->bottom->table, &fresh);
	}
	if (top)
		top_insert(l, mr);
}

/* Nothing cached holds addr: mrd answers, and both halves keep it. */
static int ask(struct mrd_lookup *l, const void *addr, struct mrd_mr *ret)
{
	int r;

	l->n_asked++;
	r = mrd_mr_lookup(l->client, addr, ret);
	if (r >= 0)
		lookup_insert(l, ret, true);
	return r;
}

MRD_EXPORT int mrd_lookup_mr(struct mrd_lookup *l, const void *addr, struct mrd_mr *ret)
{
	return lookup_cached(l, (uintptr_t)addr, ret) == 0 ? 0 : ask(l, addr, ret);
}

MRD_EXPORT uint32_t mrd_lookup_lkey_slow(struct mrd_lookup *l, const void *addr)
{
	struct mrd_mr mr;

	/* The top half inline, with no call: most lookups that miss the MRU end there. */
	if (top_find(l, (uintptr_t)addr, &mr) || bottom_find(l, (uintptr_t)addr, &mr) == 0 ||
	    ask(l, addr, &mr) == 0)
		return mr.lkey;
	return MRD_KEY_INVALID;
}

/* mrd queues at most 4 Dma requests per domain and refuses more with -EBUSY, not done. A
 * handle has one request in flight, so those are other handles' (threads, processes of the
 * same user), and the caller could only ask again: libmrd does, backing off from 1 ms to
 * 16 ms (short, or callers that never stop asking take every slot first), until it has waited
 * DMA_BUSY_WAIT_USEC in all. */
#define DMA_BUSY_WAIT_USEC (10 * 1000000u)

MRD_EXPORT int mrd_dma(mrd_client *client, int op, uint32_t lkey, const void *laddr,
		       uint32_t rkey, const void *raddr, size_t length)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DmaRequest q = MRD__DMA_REQUEST__INIT;
	unsigned waited = 0, backoff = 1000;
	Mrd__Response *resp;
	int r;

	if (!client || (op != MRD_DMA_WRITE && op != MRD_DMA_READ))
		return set_last_error(-EINVAL, "mrd_dma: bad argument");
	q.op = (uint32_t)op;
	q.lkey = lkey;
	q.laddr = (uintptr_t)laddr;
	q.rkey = rkey;
	q.raddr = (uintptr_t)raddr;
	q.length = length;
	req.body_case = MRD__REQUEST__BODY_DMA;
	req.dma = &q;
	while ((r = client_call(client, &req, &resp, NULL)) == -EBUSY &&
	       waited < DMA_BUSY_WAIT_USEC) {
		usleep(backoff);
		waited += backoff;
		backoff = backoff < 16000 ? backoff * 2 : backoff;
	}
	if (r == -EBUSY)
		return set_last_error(r, "mrd_dma: 4 Dma requests of the domain (other handles') "
				      "kept waiting for %u s: not done", DMA_BUSY_WAIT_USEC / 1000000);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_DMA)
		r = set_last_error(-EBADMSG, "malformed Dma reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_prefetch(mrd_client *client, const void *addr, size_t length, int advice,
			    unsigned flags)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__PrefetchRequest q = MRD__PREFETCH_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	if (!client || advice < MRD_PREFETCH || advice > MRD_PREFETCH_NO_FAULT ||
	    (flags & ~MRD_PREFETCH_FLUSH))
		return set_last_error(-EINVAL, "mrd_prefetch: bad argument");
	q.address = (uintptr_t)addr;
	q.length = length;
	q.advice = (uint32_t)advice;
	q.flush = flags & MRD_PREFETCH_FLUSH;
	req.body_case = MRD__REQUEST__BODY_PREFETCH;
	req.prefetch = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_PREFETCH)
		r = set_last_error(-EBADMSG, "malformed Prefetch reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}
