/* SPDX-License-Identifier: MIT */
#include "base/process.h"
#include "memory/mem-owner.h"

uint64_t mem_owner_start_time(struct mem_owner *o)
{
	/* Asked at a hand-over or a claim only: connecting costs no /proc read. */
	if (!o->start_time)
		o->start_time = process_start_time(o->pid);
	return o->start_time;
}
