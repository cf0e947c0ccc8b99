/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "macro.h"
#include "provider/pin-map.h"

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
	free(m->spare);
	free(m->changed);
	m->segs = m->spare = m->changed = NULL;
	m->n = m->cap = m->pins = 0;
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

/* Appends [start, end) with count to out (cap entries), merging with the previous segment
 * when it continues it with the same count. Zero counts are dropped. False when out is full. */
static bool emit(struct pin_seg *out, size_t *n, size_t cap, uintptr_t start, uintptr_t end,
		 unsigned count)
{
	if (start >= end || count == 0)
		return true;
	if (*n > 0 && out[*n - 1].end == start && out[*n - 1].count == count) {
		out[*n - 1].end = end;
		return true;
	}
	if (*n == cap)
		return false;
	out[(*n)++] = (struct pin_seg){ start, end, count };
	return true;
}

/* Makes room for the segments of pins ranges. Every boundary between segments is an end of a
 * pinned range, so there are fewer than 2 * pins segments, and pieces that change; an unpin,
 * which must not fail for want of memory, never needs more room than the pins before it. */
static int reserve(struct pin_map *m, size_t pins)
{
	size_t want = 2 * pins + 2;
	struct pin_seg *p;

	if (want <= m->cap)
		return 0;
	p = realloc(m->segs, want * sizeof(*p));
	if (!p)
		return -ENOMEM;
	m->segs = p;
	p = realloc(m->spare, want * sizeof(*p));
	if (!p)
		return -ENOMEM;
	m->spare = p;
	p = realloc(m->changed, want * sizeof(*p));
	if (!p)
		return -ENOMEM;
	m->changed = p;
	m->cap = want;
	return 0;
}

/* Builds in m->spare the segment list with delta (+1 or -1) applied over [start, end). Gaps
 * inside the range become count-1 segments for +1. Lists in m->changed every piece whose count
 * goes 0 -> 1 (delta +1) or 1 -> 0 (delta -1); the caller decides what that means. Returns
 * the number of segments built, and of changed pieces in *ret_n_changed. */
static int rebuild(struct pin_map *m, uintptr_t start, uintptr_t end, int delta,
		   size_t *ret_n, size_t *ret_n_changed)
{
	struct pin_seg *out = m->spare, *changed = m->changed;
	size_t n = 0, n_changed = 0, cap = m->cap;
	uintptr_t cursor = start;

	for (size_t i = 0; i <= m->n; i++) {
		const struct pin_seg *s = i < m->n ? &m->segs[i] : NULL;
		uintptr_t s_start = s ? s->start : UINTPTR_MAX, s_end = s ? s->end : UINTPTR_MAX;

		/* The gap before s, inside the range. */
		if (cursor < end && cursor < s_start) {
			uintptr_t gap_end = s_start < end ? s_start : end;

			if (delta < 0)
				return -EINVAL; /* not pinned */
			if (n_changed == cap || !emit(out, &n, cap, cursor, gap_end, 1))
				return -ENOMEM; /* unpins of other ranges than were pinned */
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
				if (!emit(out, &n, cap, s_start, s_end, s->count))
					return -ENOMEM;
				continue;
			}
			if (!emit(out, &n, cap, s_start, in_start, s->count) ||
			    !emit(out, &n, cap, in_start, in_end, (unsigned)((int)s->count + delta)))
				return -ENOMEM;
			if (delta < 0 && s->count == 1) {
				if (n_changed == cap)
					return -ENOMEM;
				changed[n_changed++] = (struct pin_seg){ in_start, in_end, 0 };
			}
			if (!emit(out, &n, cap, in_end, s_end, s->count))
				return -ENOMEM;
			cursor = in_end > cursor ? in_end : cursor;
		}
	}
	*ret_n = n;
	*ret_n_changed = n_changed;
	return 0;
}

/* The built list becomes the map's. */
static void replace(struct pin_map *m, size_t n)
{
	struct pin_seg *old = m->segs;

	m->segs = m->spare;
	m->spare = old;
	m->n = n;
}

int pin_map_pin(struct pin_map *m, uintptr_t start, uintptr_t end)
{
	const struct pin_seg *fresh;
	size_t n, n_fresh, locked;
	int r;

	if (start >= end)
		return -EINVAL;
	r = reserve(m, m->pins + 1);
	if (r < 0)
		return r;
	r = rebuild(m, start, end, +1, &n, &n_fresh);
	if (r < 0)
		return r;
	fresh = m->changed;

	for (locked = 0; locked < n_fresh; locked++) {
		r = m->lock(fresh[locked].start, fresh[locked].end - fresh[locked].start);
		if (r < 0)
			break;
	}
	if (r < 0) {
		while (locked-- > 0)
			(void)m->unlock(fresh[locked].start, fresh[locked].end - fresh[locked].start);
		return r;
	}
	for (size_t i = 0; i < n_fresh; i++)
		m->pinned_bytes += fresh[i].end - fresh[i].start;
	replace(m, n);
	m->pins++;
	return 0;
}

int pin_map_unpin(struct pin_map *m, uintptr_t start, uintptr_t end)
{
	const struct pin_seg *gone = m->changed;
	size_t n, n_gone;
	int r;

	if (start >= end)
		return -EINVAL;
	r = rebuild(m, start, end, -1, &n, &n_gone);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n_gone; i++) {
		(void)m->unlock(gone[i].start, gone[i].end - gone[i].start);
		m->pinned_bytes -= gone[i].end - gone[i].start;
	}
	replace(m, n);
	m->pins--;
	return 0;
}

uint64_t pin_map_unpinned_bytes(const struct pin_map *m, uintptr_t start, uintptr_t end)
{
	uint64_t bytes = end > start ? end - start : 0;
	size_t lo = 0, hi = m->n;

	/* The first segment that ends after start. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->segs[mid].end <= start)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < m->n && m->segs[i].start < end; i++) {
		uintptr_t s = m->segs[i].start > start ? m->segs[i].start : start;
		uintptr_t e = m->segs[i].end < end ? m->segs[i].end : end;

		bytes -= e - s;
	}
	return bytes;
}
