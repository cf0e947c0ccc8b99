/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "macro.h"
#include "provider/provider.h"
#include "registration/reg-base.h"

int reg_check_pinned(const struct reg_base *b, uint64_t more, char *why, size_t why_size)
{
	const struct config *c = b->config;
	uint64_t mine = *b->pinned_bytes, all = *b->host_pinned;

	/* In use: pinned or being pinned. */
	if (mine + more > b->quota->pinned_bytes)
		return config_quota_refusal(c, b->quota, QUOTA_PINNED_BYTES, b->name, mine, more,
					    why, why_size);
	if (all + more > c->max_pinned_bytes)
		return config_quota_refusal(c, b->quota, LIMIT_PINNED_BYTES, NULL, all, more, why,
					    why_size);
	return 0;
}

static void work_run(struct work *work)
{
	struct registrar_work *w = container_of(work, struct registrar_work, work);

	w->run(w);
}

static void work_done(struct work *work)
{
	struct registrar_work *w = container_of(work, struct registrar_work, work);
	struct reg_base *b = w->reg;

	if (w->busy)
		b->jobs--;
	w->done(w); /* frees w */
	reg_unhold(b);
}

void reg_job_init(struct reg_base *b, struct registrar_work *w,
		  void (*run)(struct registrar_work *w),
		  void (*done)(struct registrar_work *w), bool busy)
{
	w->work.run = work_run;
	w->work.done = work_done;
	w->reg = b;
	w->run = run;
	w->done = done;
	w->busy = busy;
	w->key = b->mem;
	reg_hold(b);
	if (busy)
		b->jobs++;
}

void registrar_submit(struct registrar_work *w)
{
	worker_pool_submit(*w->reg->workers, &w->work, w->key);
}

/* One MR on a worker: a mempool's, a registration that lost a race, an on-demand child. */
struct dereg_job {
	struct registrar_work base;
	struct provider_mr *pmr;
	void (*gone)(struct reg_base *b, void *arg, int result);
	void *arg;
	/* Written by the worker, read on the loop after it. */
	struct {
		int result;
	} rt;
};

static void dereg_job_run(struct registrar_work *w)
{
	struct dereg_job *j = (struct dereg_job *)w;

	j->rt.result = reg_dereg(w->reg, j->pmr);
}

static void dereg_job_done(struct registrar_work *w)
{
	struct dereg_job *j = (struct dereg_job *)w;

	if (j->gone)
		j->gone(w->reg, j->arg, j->rt.result);
	free(j);
}

int reg_dereg(struct reg_base *b, struct provider_mr *pmr)
{
	if (pmr && pmr->pd != b->pd)
		return provider_dereg(pmr); /* a client PD's (registration/bound-pd.h) */
	return frmr_pools_dereg(&b->pools, pmr);
}

int reg_dereg_on_worker(struct reg_base *b, struct provider_mr *pmr,
			void (*gone)(struct reg_base *b, void *arg, int result), void *arg)
{
	struct dereg_job *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->pmr = pmr;
	j->gone = gone;
	j->arg = arg;
	reg_start(b, &j->base, dereg_job_run, dereg_job_done, true);
	return 0;
}
