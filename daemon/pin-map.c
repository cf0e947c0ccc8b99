/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "macro.h"
#include "pin-map.h"

static int default_lock(uintptr_t start, size_t len)
{
	return mlock((void *)start, len) < 0 ? negative_errno() : 0;
}

static int default_unlock(uintptr_t start, size_t len)
{
	return munlock((void *)start, len) < 0 ? negative_errno() : 0;
}

void pin_map_init(struct pin_map *m)
{
	*m = (struct pin_map){ .lock = default_lock, .unlock = default_unlock };
}

void pin_map_done(struct pin_map *m)
{
	for (size_t i = 0; i < m->n; i++)
		(void)m->unlock(m->segs[i].start, m->segs[i].end - m->segs[i].start);
	free(m->segs);
	m->segs = NULL;
	m->n = m->cap = 0;
	m->pinned_bytes = 0;
}

unsigned pin_map_count(const struct pin_map *m, uintptr_t addr)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (addr < m->segs[mid].start)
			hi = mid;
		else if (addr >= m->segs[mid].end)
			lo = mid + 1;
		else
			return m->segs[mid].count;
	}
	return 0;
}

/* Appends [start, end) with count to out, merging with the previous segment when it
 * continues it with the same count. Zero counts are dropped. */
static void emit(struct pin_seg *out, size_t *n, uintptr_t start, uintptr_t end, unsigned count)
{
	if (start >= end || count == 0)
		return;
	if (*n > 0 && out[*n - 1].end == start && out[*n - 1].count == count) {
		out[*n - 1].end = end;
		return;
	}
	out[(*n)++] = (struct pin_seg){ start, end, count };
}

/* Rebuilds the segment list with delta (+1 or -1) applied over [start, end). Gaps inside the
 * range become count-1 segments for +1. Calls visit() on every piece whose count goes 0 -> 1
 * (delta +1) or 1 -> 0 (delta -1); the caller decides what that means. */
static int rebuild(struct pin_map *m, uintptr_t start, uintptr_t end, int delta,
		   struct pin_seg **ret, size_t *ret_n, struct pin_seg **ret_changed,
		   size_t *ret_n_changed)
{
	/* Each old segment yields at most 3 pieces; each gap (n + 1 of them) one more. */
	size_t cap = 3 * m->n + m->n + 2, n = 0, n_changed = 0;
	struct pin_seg *out = malloc(cap * sizeof(*out));
	struct pin_seg *changed = malloc(cap * sizeof(*changed));
	uintptr_t cursor = start;

	if (!out || !changed) {
		free(out);
		free(changed);
		return -ENOMEM;
	}

	for (size_t i = 0; i <= m->n; i++) {
		const struct pin_seg *s = i < m->n ? &m->segs[i] : NULL;
		uintptr_t s_start = s ? s->start : UINTPTR_MAX, s_end = s ? s->end : UINTPTR_MAX;

		/* The gap before s, inside the range. */
		if (cursor < end && cursor < s_start) {
			uintptr_t gap_end = s_start < end ? s_start : end;

			if (delta < 0)
				goto not_pinned;
			emit(out, &n, cursor, gap_end, 1);
			changed[n_changed++] = (struct pin_seg){ cursor, gap_end, 1 };
			cursor = gap_end;
		}
		if (!s)
			break;

		/* s split into before / inside / after the range. */
		{
			uintptr_t in_start = s_start > start ? s_start : start;
			uintptr_t in_end = s_end < end ? s_end : end;

			if (in_start >= in_end) {
				emit(out, &n, s_start, s_end, s->count);
				continue;
			}
			emit(out, &n, s_start, in_start, s->count);
			emit(out, &n, in_start, in_end, (unsigned)((int)s->count + delta));
			if (delta < 0 && s->count == 1)
				changed[n_changed++] = (struct pin_seg){ in_start, in_end, 0 };
			emit(out, &n, in_end, s_end, s->count);
			cursor = in_end > cursor ? in_end : cursor;
		}
	}

	*ret = out;
	*ret_n = n;
	*ret_changed = changed;
	*ret_n_changed = n_changed;
	return 0;

not_pinned:
	free(out);
	free(changed);
	return -EINVAL;
}

static void replace(struct pin_map *m, struct pin_seg *segs, size_t n)
{
	free(m->segs);
	m->segs = segs;
	m->n = m->cap = n;
}

int pin_map_pin(struct pin_map *m, uintptr_t start, uintptr_t end)
{
	struct pin_seg *segs, *fresh;
	size_t n, n_fresh, locked;
	int r;

	if (start >= end)
		return -EINVAL;
	r = rebuild(m, start, end, +1, &segs, &n, &fresh, &n_fresh);
	if (r < 0)
		return r;

	for (locked = 0; locked < n_fresh; locked++) {
		r = m->lock(fresh[locked].start, fresh[locked].end - fresh[locked].start);
		if (r < 0)
			break;
	}
	if (r < 0) {
		while (locked-- > 0)
			(void)m->unlock(fresh[locked].start, fresh[locked].end - fresh[locked].start);
		free(segs);
		free(fresh);
		return r;
	}
	for (size_t i = 0; i < n_fresh; i++)
		m->pinned_bytes += fresh[i].end - fresh[i].start;
	free(fresh);
	replace(m, segs, n);
	return 0;
}

int pin_map_unpin(struct pin_map *m, uintptr_t start, uintptr_t end)
{
	struct pin_seg *segs, *gone;
	size_t n, n_gone;
	int r;

	if (start >= end)
		return -EINVAL;
	r = rebuild(m, start, end, -1, &segs, &n, &gone, &n_gone);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n_gone; i++) {
		(void)m->unlock(gone[i].start, gone[i].end - gone[i].start);
		m->pinned_bytes -= gone[i].end - gone[i].start;
	}
	free(gone);
	replace(m, segs, n);
	return 0;
}
