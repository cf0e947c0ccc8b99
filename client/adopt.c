/* SPDX-License-Identifier: MIT */
/* mrd_mem_adopt(): memory the program already has (heap, anonymous mmap) moved onto mrd's
 * memory at its own address, by the code libmrd-preload.so moves a verbs program's buffers
 * with (moved-range.c: writes wait in the kernel while the pages move, write-hold.c). Each
 * handle keeps its own registry of moved ranges; a buffer whose pages hold part of one
 * adopted before (a heap neighbour) becomes one more span of it. Keys are asked of mrd at the
 * range's address in mrd's window and handed back at the program's (adopt_window_delta):
 * their MRs use the program's addresses (AllocRequest.alias). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "call.h"
#include "handle.h"
#include "memory.h"
#include "moved-range.h"
#include "mrd/mrd.h"

/* ibv_access_flags: local write, remote write, remote read; remote read alone. */
#define ADOPT_ACCESS 7u
#define ADOPT_ACCESS_READ_ONLY 4u

/* A range whose span [start, end) is exactly the buffer, and that span's index. */
static struct moved_range *adopted_at(mrd_client *client, uintptr_t start, uintptr_t end,
				      int *ret_span)
{
	unsigned n;
	struct moved_range *r = moved_ranges_overlapping(&client->adopted, start, end, &n);
	int s = r ? moved_range_span_of(r, start, end) : -1;

	if (s < 0 || r->spans[s].start != start || r->spans[s].end != end)
		return NULL;
	*ret_span = s;
	return r;
}

static int adopt_locked(mrd_client *client, uintptr_t start, uintptr_t end, unsigned access,
			char *why, size_t why_size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t pstart = start & ~(page - 1), pend = (end + page - 1) & ~(page - 1);
	struct moved_range *r;
	unsigned n, slot;
	int k, s;

	r = adopted_at(client, start, end, &s);
	if (r && moved_range_intact(r, start, end)) {
		r->spans[s].users++; /* the same buffer again: nothing moves */
		return 0;
	}
	r = moved_ranges_overlapping(&client->adopted, pstart, pend, &n);
	if (r && !moved_range_intact(r, r->start, r->end)) {
		/* The program unmapped it without mrd_mem_unadopt(): what it still maps of it
		 * goes back to private memory, and mrd's memory with it. */
		__atomic_fetch_add(&client->adopt_gone, 1, __ATOMIC_RELEASE);
		moved_range_move_back(&client->adopted, client, r);
		r = moved_ranges_overlapping(&client->adopted, pstart, pend, &n);
	}
	if (n > 1) {
		snprintf(why, why_size, "its pages hold parts of %u buffers adopted before", n);
		return -EOPNOTSUPP;
	}
	if (!r) {
		k = moved_range_move(&client->adopted, client, start, end, access, &r, why,
				     why_size);
		if (k == 0)
			r->spans[0].users = 1;
		return k;
	}
	if (moved_range_span_of(r, start, end) >= 0) {
		snprintf(why, why_size, "[0x%" PRIxPTR ", 0x%" PRIxPTR ") lies inside a buffer "
			 "adopted before", start, end);
		return -EEXIST;
	}
	if (r->access != access) {
		snprintf(why, why_size, "its pages hold a buffer adopted before with other access "
			 "(MRD_MEM_READ_ONLY)");
		return -EOPNOTSUPP;
	}
	k = moved_range_add_span(&client->adopted, client, r, start, end, &slot, why, why_size);
	if (k == 0)
		r->spans[slot].users = 1;
	return k;
}

MRD_EXPORT int mrd_mem_adopt(mrd_client *client, void *addr, size_t len, unsigned flags)
{
	uintptr_t start = (uintptr_t)addr, end = start + len;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t pstart = start & ~(page - 1);
	char why[256] = "";
	int k;

	if (!client || !addr || !len)
		return set_last_error(-EINVAL, "mrd_mem_adopt: %s", !client ? "NULL handle" :
				      !addr ? "NULL address" : "length 0");
	if (flags & ~MRD_MEM_READ_ONLY)
		return set_last_error(-EINVAL, "mrd_mem_adopt: unknown flags 0x%x (only "
				      "MRD_MEM_READ_ONLY)", flags & ~MRD_MEM_READ_ONLY);
	if (end < start || end > UINTPTR_MAX - page)
		return set_last_error(-EINVAL, "mrd_mem_adopt: %zu bytes at %p pass the end of the "
				      "address space", len, addr);
	k = mrd_client_check(client);
	if (k < 0)
		return k;
	/* Unmapped pages: madvise() answers ENOMEM for any hole, with no side effect. */
	if (madvise((void *)pstart, end - pstart, MADV_NORMAL) < 0 && errno == ENOMEM)
		return set_last_error(-EFAULT, "mrd_mem_adopt: [%p, +%zu) is not all mapped in this "
				      "process", addr, len);
	if (memory_in_window(pstart, end))
		return set_last_error(-EEXIST, "mrd_mem_adopt: [%p, +%zu) is mrd's memory already "
				      "(mrd_mem_alloc, mrd_mem_map, mrd_extmem_attach): ask "
				      "mrd_keys_query() for its keys", addr, len);
	pthread_mutex_lock(&client->adopt_lock);
	k = adopt_locked(client, start, end,
			 flags & MRD_MEM_READ_ONLY ? ADOPT_ACCESS_READ_ONLY : ADOPT_ACCESS, why,
			 sizeof(why));
	pthread_mutex_unlock(&client->adopt_lock);
	if (k < 0)
		return set_last_error(k, "mrd_mem_adopt: [%p, +%zu): %s", addr, len, why);
	return 0;
}

MRD_EXPORT int mrd_mem_unadopt(mrd_client *client, void *addr)
{
	uintptr_t start = (uintptr_t)addr;
	struct moved_range *r;
	char why[256] = "";
	unsigned n, others = 0;
	int k = 0, s = -1;

	if (!client || !addr)
		return set_last_error(-EINVAL, "mrd_mem_unadopt: NULL %s",
				      client ? "address" : "handle");
	pthread_mutex_lock(&client->adopt_lock);
	r = moved_ranges_overlapping(&client->adopted, start, start + 1, &n);
	for (unsigned i = 0; r && i < r->n_spans; i++)
		if (r->spans[i].start == start && r->spans[i].users > 0 && !r->spans[i].dead)
			s = (int)i;
	if (s < 0) {
		pthread_mutex_unlock(&client->adopt_lock);
		return set_last_error(-ENOENT, "mrd_mem_unadopt: %p is not the start of a buffer "
				      "this handle adopted", addr);
	}
	if (--r->spans[s].users > 0) {
		pthread_mutex_unlock(&client->adopt_lock);
		return 0;
	}
	for (unsigned i = 0; i < r->n_spans; i++)
		others += (int)i != s && r->spans[i].users > 0;
	/* Counted before mrd frees anything: a cache that sees the generation move forgets. */
	__atomic_fetch_add(&client->adopt_gone, 1, __ATOMIC_RELEASE);
	if (others)
		k = moved_range_drop_span(client, r, (unsigned)s, why, sizeof(why));
	else
		moved_range_move_back(&client->adopted, client, r);
	pthread_mutex_unlock(&client->adopt_lock);
	if (k < 0)
		return set_last_error(k, "mrd_mem_unadopt: %s", why);
	return 0;
}

uintptr_t adopt_window_delta(mrd_client *client, uintptr_t addr)
{
	uintptr_t delta = 0;
	struct moved_range *r;
	unsigned n;

	/* Most lookups are of mrd's own memory: two loads, no lock. */
	if (addr < __atomic_load_n(&client->adopted.lo, __ATOMIC_ACQUIRE) ||
	    addr >= __atomic_load_n(&client->adopted.hi, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&client->adopt_lock);
	r = moved_ranges_overlapping(&client->adopted, addr, addr + 1, &n);
	if (r)
		delta = r->window - r->start;
	pthread_mutex_unlock(&client->adopt_lock);
	return delta;
}

void adopt_leave(mrd_client *client)
{
	pthread_mutex_lock(&client->adopt_lock);
	if (client->adopted.n)
		__atomic_fetch_add(&client->adopt_gone, 1, __ATOMIC_RELEASE);
	while (client->adopted.n > 0)
		moved_range_move_back(&client->adopted, client, client->adopted.v[0]);
	free(client->adopted.v);
	client->adopted = (struct moved_ranges){ 0 };
	pthread_mutex_unlock(&client->adopt_lock);
}

void adopt_fork_lock(mrd_client *client, bool lock)
{
	if (lock)
		pthread_mutex_lock(&client->adopt_lock);
	else
		pthread_mutex_unlock(&client->adopt_lock);
}

void adopt_fork_child(mrd_client *client)
{
	/* The child's pages become its own copy; the parent's stay mrd's. */
	moved_ranges_fork_copy(&client->adopted);
	moved_ranges_fork_forget(&client->adopted);
}
