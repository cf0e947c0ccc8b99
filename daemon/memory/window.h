/* SPDX-License-Identifier: MIT */
/* The address window: one PROT_NONE reservation at the same address in mrd and every client,
 * carved into equal slots; an arena occupies one or more consecutive slots. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct window {
	uint8_t *base;
	uint64_t size;
	uint64_t slot_size;
	uint32_t n_slots;
	bool *used;
	uint64_t arena_serial; /* last serial given to an arena */
	/* Another mrd takes the arenas over (control/handover.c): pages freed from here on keep
	 * their content. */
	bool keep_content;
};

/* Reserves [base, base + size). -EADDRINUSE when any of it is mapped already. */
int window_reserve(struct window *w, uint64_t base, uint64_t size, uint64_t slot_size);
void window_release(struct window *w);

/* First fit for n consecutive free slots; -ENOSPC when the window is full. */
int window_take(struct window *w, uint32_t n, uint32_t *ret_first);
/* Takes exactly [first, first + n): a warm restart puts each arena back where it was.
 * -EINVAL outside the window, -EEXIST when any of them is taken. */
int window_take_at(struct window *w, uint32_t first, uint32_t n);
/* Puts the slots back under PROT_NONE and marks them free. */
void window_give_back(struct window *w, uint32_t first, uint32_t n);

/* Whether pages freed from now on keep their content (another mrd takes the arenas over, or
 * clients outlive this one): returns what it was. */
static inline bool window_keep_content(struct window *w, bool keep)
{
	bool was = w->keep_content;

	w->keep_content = keep;
	return was;
}
/* The previous mrd's arenas had serials up to serial: new ones go on above. */
static inline void window_adopt_serial(struct window *w, uint64_t serial)
{
	if (serial > w->arena_serial)
		w->arena_serial = serial;
}

static inline uint8_t *window_slot(const struct window *w, uint32_t slot)
{
	return w->base + (uint64_t)slot * w->slot_size;
}
