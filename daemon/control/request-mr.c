/* SPDX-License-Identifier: MIT */
/* The MR family: MrLookup (keys for addresses, registering on a miss), Dma (an RDMA WRITE or
 * READ driven by keys alone: emulated on soft, done by the device on verbs) and Prefetch
 * (advice for on-demand memory). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "macro.h"
#include "time-util.h"
#include "base/worker-pool.h"
#include "provider/provider.h"
#include "registration/reg-allocation.h"
#include "core/domain.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

/* A lookup of several addresses; it waits, whole, while a worker registers for one of them. */
struct pending_lookup {
	struct pending_request base; /* first */
	uint64_t generation; /* the domain's when the entries before next were found */
	size_t n, next;
	uint64_t *addrs;
	uint64_t *lens; /* NULL: addresses alone; else the range each entry covers whole */
	int32_t *errors; /* NULL: the first failure fails the request; else each address's */
	struct mr_entry *entries;
};

static void pending_free(struct pending_lookup *p)
{
	free(p->addrs);
	free(p->lens);
	free(p->errors);
	free(p->entries);
	free(p);
}

/* The answer for the address at p->next: its entry (0), or its failure k. False when the
 * request fails with k. */
static bool lookup_done(struct pending_lookup *p, int k, const struct mr_entry *entry)
{
	if (k < 0 && !p->errors)
		return false;
	p->entries[p->next] = k < 0 ? (struct mr_entry){ 0 } : *entry;
	if (p->errors)
		p->errors[p->next] = k < 0 ? k : 0;
	p->next++;
	return true;
}

/* Looks up from p->next on; -EINPROGRESS when it has to wait. */
static int lookup_run(struct pending_lookup *p, char *why, size_t why_size)
{
	struct domain *d = p->base.client->domain;

	while (p->next < p->n) {
		struct mr_entry e;
		int k = p->lens ?
			domain_lookup_range(d, p->base.client->bound, p->base.client->owner.mem.pid,
					    p->addrs[p->next],
					    p->lens[p->next], &e, why, why_size, &p->base.waiter) :
			domain_lookup(d, p->base.client->bound, p->base.client->owner.mem.pid,
				      p->addrs[p->next], &e, why, why_size, &p->base.waiter);
		if (k == -EINPROGRESS || !lookup_done(p, k, &e))
			return k;
	}
	return 0;
}

/* The reply body: one entry per address, in order. */
static int fill_reply(const struct pending_lookup *p, struct reply *r)
{
	Mrd__MrEntry **ptrs = fill_mr_entries(r, p->entries, p->n);
	Mrd__MrLookupResponse *body;

	if (!ptrs)
		return -ENOMEM;
	body = reply_body(r, MRD__RESPONSE__BODY_MR_LOOKUP);
	body->n_entries = p->n;
	body->entries = ptrs;
	if (p->errors) {
		body->errors = malloc(p->n * sizeof(*body->errors));
		r->owned[r->n_owned++] = body->errors;
		if (!body->errors)
			return -ENOMEM;
		memcpy(body->errors, p->errors, p->n * sizeof(*body->errors));
		body->n_errors = p->n;
	}
	return 0;
}

static void lookup_resume(struct waiter *w, int result, const struct mr_entry *entry,
			  const char *why)
{
	struct pending_lookup *p = (struct pending_lookup *)w;
	struct reply r;
	int k = result;

	if (!p->base.client) {
		pending_free(p);
		return;
	}
	reply_init(&r, p->base.id);
	if (k >= 0 || p->errors) {
		struct domain *d = p->base.client->domain;

		/* A range's wait may end with an MR covering less (another's, the policy's run):
		 * that address is looked up again, which then makes the range's own. */
		if (k < 0 || !p->lens ||
		    mr_entry_covers(entry, p->addrs[p->next], p->lens[p->next]))
			(void)lookup_done(p, k, entry);
		/* Keys died meanwhile (a Free, maybe of this client's, answered while this
		 * waited): what was found before the wait is found again, so that no key of
		 * memory whose Free was answered goes out after it. */
		if (domain_generation(d) != p->generation) {
			p->generation = domain_generation(d);
			p->next = 0;
		}
		k = lookup_run(p, r.message, sizeof(r.message));
		if (k == -EINPROGRESS)
			return; /* waits for the next one */
	} else
		reply_set_message(&r, "%s", why);
	if (k >= 0)
		k = fill_reply(p, &r);
	request_answer(&p->base, &r, k);
	pending_free(p);
}

int request_mr_lookup_check(const Mrd__Request *req, struct reply *r)
{
	const Mrd__MrLookupRequest *q = req->mr_lookup;

	if (q->n_addresses == 0 || q->n_addresses > MRD_LOOKUP_BATCH_MAX) {
		reply_set_message(r, "MrLookup takes 1 to %u addresses, got %zu",
				  MRD_LOOKUP_BATCH_MAX, q->n_addresses);
		return -EINVAL;
	}
	if (q->n_lengths != 0 && q->n_lengths != q->n_addresses) {
		reply_set_message(r, "MrLookup takes no lengths or one per address, got %zu for "
				  "%zu", q->n_lengths, q->n_addresses);
		return -EINVAL;
	}
	for (size_t i = 0; i < q->n_lengths; i++)
		if (q->lengths[i] == 0 || q->addresses[i] + q->lengths[i] < q->addresses[i]) {
			reply_set_message(r, "MrLookup: length %" PRIu64 " at 0x%" PRIx64 " is "
					  "empty or wraps", q->lengths[i], q->addresses[i]);
			return -EINVAL;
		}
	return 0;
}

int request_mr_lookup(struct client *c, struct domain *d, const Mrd__Request *req,
		      struct wire_packet *pkt, struct reply *r)
{
	const Mrd__MrLookupRequest *q = req->mr_lookup;
	struct pending_lookup *p;
	int k;

	c->keys_out = true; /* keys go out from here: too late for BindPd */
	if (c->bound_lost) {
		reply_set_message(r, "this connection's own PD was let go for a re-exec of mrd that "
				  "did not happen: connect again");
		return -ESTALE;
	}
	p = request_pending_new(sizeof(*p), req->id, lookup_resume);
	if (!p)
		return -ENOMEM;
	p->base.client = c; /* lookup_run reads the domain through it before any wait */
	p->n = q->n_addresses;
	p->addrs = malloc(p->n * sizeof(*p->addrs));
	p->entries = calloc(p->n, sizeof(*p->entries));
	p->lens = q->n_lengths ? malloc(p->n * sizeof(*p->lens)) : NULL;
	p->errors = q->each_error ? calloc(p->n, sizeof(*p->errors)) : NULL;
	if (!p->addrs || !p->entries || (q->n_lengths && !p->lens) || (q->each_error && !p->errors)) {
		pending_free(p);
		return -ENOMEM;
	}
	memcpy(p->addrs, q->addresses, p->n * sizeof(*p->addrs));
	if (p->lens)
		memcpy(p->lens, q->lengths, p->n * sizeof(*p->lens));
	p->generation = domain_generation(d);
	k = lookup_run(p, r->message, sizeof(r->message));
	if (k == -EINPROGRESS) {
		/* Its answer comes from lookup_resume; its next requests wait behind it. */
		request_wait(c, &p->base);
		return k;
	}
	if (k >= 0)
		k = fill_reply(p, r);
	pending_free(p);
	return k;
}

/* A Dma waits for the device's completion (verbs), or is a copy of up to MRD_DMA_MAX bytes
 * (soft): either way on the Dma thread, not the loop, one transfer at a time, a domain's in
 * the order asked, domains in turns. A domain has at most DMA_QUEUED_MAX there, so one user
 * cannot hold up the others' for long; a request that waited DMA_WAIT_USEC is answered
 * without being done, before libmrd (30 s) stops waiting for it: a transfer never happens
 * after its client was told it failed. */
#define DMA_QUEUED_MAX 4
#define DMA_WAIT_USEC (20 * USEC_PER_SEC)

struct dma_job {
	struct pending_request base; /* first */
	struct work work;
	struct domain *domain; /* held while the job lives */
	Mrd__DmaRequest q;
	uint64_t deadline;     /* CLOCK_MONOTONIC usec: not begun by then, not done */
	int result;
};

static int dma_result(struct domain *d, const Mrd__DmaRequest *q, int k, struct reply *r)
{
	const struct provider *provider = domain_provider(d);

	if (k == -EOPNOTSUPP && provider->caps.no_dma)
		reply_set_message(r, "%s does no DMA through keys: %s", provider->caps.device,
				  provider->caps.no_dma);
	else if (k == -EOPNOTSUPP)
		reply_set_message(r, "the %s provider does no DMA", provider_name(provider));
	else if (k == -ENOKEY)
		reply_set_message(r, "a key is not valid: never handed out, or its memory was freed");
	else if (k == -EACCES)
		reply_set_message(r, "the keys do not grant this access");
	else if (k == -EFAULT)
		reply_set_message(r, "the range lies outside a key's registration");
	else if (k == -ENXIO) {
		reply_set_message(r, "the pages at [0x%" PRIx64 ", +%" PRIu64 ") or [0x%" PRIx64
				  ", +%" PRIu64 ") are gone: a hole in their memfd (punched?) that the "
				  "kernel could not fill (no free huge page)", q->laddr, q->length,
				  q->raddr, q->length);
		k = -EFAULT;
	} else if (k == -EKEYREJECTED)
		reply_set_message(r, "the device refused a key: not valid, not granting this access, "
				     "or the range outside its registration");
	else if (k == -ETIMEDOUT)
		reply_set_message(r, "the device did not complete the transfer in time");
	else if (k == -ENETDOWN)
		reply_set_message(r, "no port of the device is active");
	else if (k == -EADDRNOTAVAIL)
		reply_set_message(r, "the device's port has no address (GID) to loop back through");
	else if (k == -EAGAIN)
		reply_set_message(r, "not done: it waited %u s behind other mrd_dma() calls",
				  (unsigned)(DMA_WAIT_USEC / USEC_PER_SEC));
	else if (k == -ECANCELED)
		reply_set_message(r, "not done: mrd is stopping");
	if (k < 0)
		return k;
	(void)reply_body(r, MRD__RESPONSE__BODY_DMA);
	return 0;
}

static void dma_job_run(struct work *w)
{
	struct dma_job *j = container_of(w, struct dma_job, work);

	if (__atomic_load_n(&j->domain->core->stopping, __ATOMIC_ACQUIRE))
		j->result = -ECANCELED;
	else if (now_usec(CLOCK_MONOTONIC) > j->deadline)
		j->result = -EAGAIN;
	else
		j->result = domain_dma(j->domain, (enum provider_dma_op)j->q.op, j->q.lkey,
				       j->q.laddr, j->q.rkey, j->q.raddr, j->q.length);
}

static void dma_job_done(struct work *w)
{
	struct dma_job *j = container_of(w, struct dma_job, work);
	struct reply r;

	if (j->base.client) {
		reply_init(&r, j->base.id);
		request_answer(&j->base, &r, dma_result(j->domain, &j->q, j->result, &r));
	}
	registrar_dma_end(&j->domain->reg);
	domain_unref(j->domain);
	free(j);
}

int request_dma_check(const Mrd__Request *req, struct reply *r)
{
	const Mrd__DmaRequest *q = req->dma;

	if (q->op > PROVIDER_DMA_READ || q->length == 0 || q->length > MRD_DMA_MAX) {
		reply_set_message(r, "Dma: op must be 0 (write) or 1 (read), length 1 to %u",
				  MRD_DMA_MAX);
		return -EINVAL;
	}
	return 0;
}

int request_dma(struct client *c, struct domain *d, const Mrd__Request *req,
		struct wire_packet *pkt, struct reply *r)
{
	const Mrd__DmaRequest *q = req->dma;
	struct dma_job *j;
	int k;

	k = domain_dma_check(d, c->owner.mem.pid, q->lkey, r->message, sizeof(r->message));
	if (k < 0)
		return k;
	if (domain_dma_jobs(d) >= DMA_QUEUED_MAX) {
		reply_set_message(r, "%u mrd_dma() calls of domain %s wait already: ask again when one "
				     "is answered", DMA_QUEUED_MAX, d->name);
		return -EBUSY;
	}
	if (!c->manager->core.dma_worker) {
		k = worker_pool_new(c->manager->core.base, 1, &c->manager->core.dma_worker);
		if (k < 0)
			return k;
	}
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->deadline = now_usec(CLOCK_MONOTONIC) + DMA_WAIT_USEC;
	registrar_dma_start(&d->reg);
	j->work.run = dma_job_run;
	j->work.done = dma_job_done;
	j->domain = domain_ref(d);
	j->q = *q;
	j->base.id = req->id;
	request_wait(c, &j->base);
	worker_pool_submit(c->manager->core.dma_worker, &j->work, &d->mem);
	return -EINPROGRESS;
}

/* A Prefetch with flush: answered when the work is done. */
static void prefetch_resume(struct waiter *w, int result, const struct mr_entry *entry,
			    const char *why)
{
	struct pending_request *p = (struct pending_request *)w;
	struct reply r;

	if (p->client) {
		reply_init(&r, p->id);
		if (result < 0)
			reply_set_message(&r, "%s", why);
		(void)reply_body(&r, MRD__RESPONSE__BODY_PREFETCH);
		request_answer(p, &r, result);
	}
	free(p);
}

int request_prefetch_check(const Mrd__Request *req, struct reply *r)
{
	const Mrd__PrefetchRequest *q = req->prefetch;

	if (q->advice > MRD__PREFETCH_ADVICE__PREFETCH_NO_FAULT || q->length == 0 ||
	    q->address + q->length < q->address) {
		reply_set_message(r, "Prefetch: advice 0, 1 or 2 over a non-empty range");
		return -EINVAL;
	}
	return 0;
}

int request_prefetch(struct client *c, struct domain *d, const Mrd__Request *req,
		     struct wire_packet *pkt, struct reply *r)
{
	const Mrd__PrefetchRequest *q = req->prefetch;
	struct pending_request *p = NULL;
	struct allocation *a;
	int k;

	/* Addresses of the caller's domain only, never keys: it names memory, not MRs. */
	a = domain_allocation_containing(d, q->address);
	if (!a || q->address + q->length > allocation_address(a) + a->length) {
		reply_set_message(r, "[0x%" PRIx64 ", +0x%" PRIx64 ") is not inside one allocation "
				  "of domain %s", q->address, q->length, d->name);
		return -EFAULT;
	}
	if (a->alias) {
		reply_set_message(r, "0x%" PRIx64 " is a program's buffer (libmrd-preload.so): "
				  "the domain's PD does not register it", q->address);
		return -EACCES;
	}
	if (!a->odp) {
		const struct provider_caps *caps = &domain_provider(d)->caps;
		char gap[160];

		/* Asked for, perhaps, but pinned: the device's paging does not cover it. */
		if (*provider_odp_gap(caps, registration_access(a->read_only, caps), gap,
				      sizeof(gap)))
			reply_set_message(r, "0x%" PRIx64 " is not on-demand memory: it is pinned, "
					  "as %s", q->address, gap);
		else
			reply_set_message(r, "0x%" PRIx64 " is not on-demand memory (allocate it "
					  "with the ODP flag, or set [cache] policy = odp)", q->address);
		return -EINVAL;
	}
	if (q->advice == MRD__PREFETCH_ADVICE__PREFETCH_WRITE && a->read_only) {
		reply_set_message(r, "prefetch for writing, but 0x%" PRIx64 " is read-only memory",
				  q->address);
		return -EINVAL;
	}
	if (q->flush) {
		p = request_pending_new(sizeof(*p), req->id, prefetch_resume);
		if (!p)
			return -ENOMEM;
	}
	k = odp_prefetch(&d->reg.odp, &c->owner, reg_allocation_of(a), q->address, q->length,
			 (enum odp_advice)q->advice, p ? &p->waiter : NULL, r->message,
			 sizeof(r->message));
	if (k == -EINPROGRESS) {
		request_wait(c, p);
		return k;
	}
	free(p);
	if (k < 0)
		return k;
	(void)reply_body(r, MRD__RESPONSE__BODY_PREFETCH);
	return 0;
}
