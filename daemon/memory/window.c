/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "macro.h"
#include "memory/window.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

int window_reserve(struct window *w, uint64_t base, uint64_t size, uint64_t slot_size)
{
	void *p;

	*w = (struct window){};
	if (slot_size == 0 || size < slot_size || size % slot_size || base % slot_size)
		return -EINVAL;
	/* NOREPLACE: never clobber something else; older kernels take it as a hint, so the
	 * address is checked too. */
	p = mmap((void *)(uintptr_t)base, size, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		return errno == EEXIST ? -EADDRINUSE : negative_errno();
	if (p != (void *)(uintptr_t)base) {
		munmap(p, size);
		return -EADDRINUSE;
	}
	w->used = calloc(size / slot_size, sizeof(bool));
	if (!w->used) {
		munmap(p, size);
		return -ENOMEM;
	}
	w->base = p;
	w->size = size;
	w->slot_size = slot_size;
	w->n_slots = (uint32_t)(size / slot_size);
	return 0;
}

void window_release(struct window *w)
{
	if (w->base)
		munmap(w->base, w->size);
	free(w->used);
	*w = (struct window){};
}

int window_take(struct window *w, uint32_t n, uint32_t *ret_first)
{
	uint32_t run = 0;

	for (uint32_t i = 0; i < w->n_slots; i++) {
		run = w->used[i] ? 0 : run + 1;
		if (run == n) {
			uint32_t first = i + 1 - n;

			for (uint32_t j = first; j <= i; j++)
				w->used[j] = true;
			*ret_first = first;
			return 0;
		}
	}
	return -ENOSPC;
}

int window_take_at(struct window *w, uint32_t first, uint32_t n)
{
	if (n == 0 || first >= w->n_slots || n > w->n_slots - first)
		return -EINVAL;
	for (uint32_t j = first; j < first + n; j++)
		if (w->used[j])
			return -EEXIST;
	for (uint32_t j = first; j < first + n; j++)
		w->used[j] = true;
	return 0;
}

void window_give_back(struct window *w, uint32_t first, uint32_t n)
{
	/* Replace whatever was mapped there with the reservation again. */
	(void)mmap(window_slot(w, first), (uint64_t)n * w->slot_size, PROT_NONE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	for (uint32_t j = first; j < first + n; j++)
		w->used[j] = false;
}
