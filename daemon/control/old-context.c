/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "base/process.h"
#include "control/old-context.h"

/* Keeps the holders of h[0 .. n) whose process still runs, in place: how many. */
static size_t keep_running(struct context_holder *h, size_t n)
{
	size_t kept = 0;

	for (size_t i = 0; i < n; i++)
		if (!process_gone(h[i].pid, h[i].uid, h[i].start_time))
			h[kept++] = h[i];
	return kept;
}

int old_context_add(struct old_contexts *list, const char *domain, const char *device,
		    uint64_t pinned_bytes, uint32_t mrs, uint64_t handed_over_usec,
		    const struct context_holder *holders, size_t n)
{
	struct old_context *o;

	if (!domain || !device || strlen(domain) >= sizeof(o->domain) ||
	    strlen(device) >= sizeof(o->device))
		return -EINVAL;
	if (n == 0)
		return 0;
	o = calloc(1, sizeof(*o));
	if (!o || !(o->holders = calloc(n, sizeof(*o->holders)))) {
		free(o);
		return -ENOMEM;
	}
	memcpy(o->holders, holders, n * sizeof(*holders));
	o->n_holders = keep_running(o->holders, n);
	if (o->n_holders == 0) {
		free(o->holders);
		free(o);
		return 0;
	}
	strcpy(o->domain, domain);
	strcpy(o->device, device);
	o->pinned_bytes = pinned_bytes;
	o->mrs = mrs;
	o->handed_over_usec = handed_over_usec;
	LIST_INSERT_HEAD(list, o, link);
	return 0;
}

static void old_context_free(struct old_context *o)
{
	LIST_REMOVE(o, link);
	free(o->holders);
	free(o);
}

size_t old_contexts_prune(struct old_contexts *list)
{
	struct old_context *o, *next;
	size_t left = 0;

	for (o = LIST_FIRST(list); o; o = next) {
		next = LIST_NEXT(o, link);
		o->n_holders = keep_running(o->holders, o->n_holders);
		if (o->n_holders > 0) {
			left++;
			continue;
		}
		log_info("domain %s: no process that imported the previous mrd's context on %s runs "
			 "any more: its MRs and pins are gone once their descriptors closed",
			 o->domain, o->device);
		old_context_free(o);
	}
	return left;
}

void old_contexts_free(struct old_contexts *list)
{
	while (!LIST_EMPTY(list))
		old_context_free(LIST_FIRST(list));
}
