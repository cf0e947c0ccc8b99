/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "handle.h"
#include "memory.h"
#include "address-space.h"
#include "moved-range.h"
#include "write-hold.h"

#define MAX_PIECES 64

/* The index of the first range ending after addr. */
static size_t first_after(const struct moved_ranges *m, uintptr_t addr)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (m->v[mid]->end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void update_bounds(struct moved_ranges *m)
{
	uintptr_t lo = m->n ? m->v[0]->start : 0, hi = m->n ? m->v[m->n - 1]->end : 0;

	__atomic_store_n(&m->lo, lo, __ATOMIC_RELEASE);
	__atomic_store_n(&m->hi, hi, __ATOMIC_RELEASE);
}

struct moved_range *moved_ranges_overlapping(struct moved_ranges *m, uintptr_t start,
					     uintptr_t end, unsigned *n)
{
	size_t i = first_after(m, start), j = i;

	while (j < m->n && m->v[j]->start < end)
		j++;
	*n = (unsigned)(j - i);
	return j - i == 1 ? m->v[i] : NULL;
}

void moved_ranges_each_overlapping(struct moved_ranges *m, uintptr_t start, uintptr_t end,
				   void (*fn)(struct moved_range *r, void *arg), void *arg)
{
	size_t i = first_after(m, start);

	while (i < m->n && m->v[i]->start < end) {
		struct moved_range *r = m->v[i];

		fn(r, arg);
		if (i < m->n && m->v[i] == r)
			i++; /* still there: on to the next; else the next took its place */
	}
}

static int insert(struct moved_ranges *m, struct moved_range *r)
{
	size_t i = first_after(m, r->start);

	if (m->n == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 16;
		struct moved_range **v = realloc(m->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		m->v = v;
		m->cap = cap;
	}
	memmove(&m->v[i + 1], &m->v[i], (m->n - i) * sizeof(*m->v));
	m->v[i] = r;
	m->n++;
	update_bounds(m);
	return 0;
}

static void remove_range(struct moved_ranges *m, struct moved_range *r)
{
	size_t i = first_after(m, r->start);

	if (i < m->n && m->v[i] == r) {
		memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof(*m->v));
		m->n--;
		update_bounds(m);
	}
}

/* Page tables for the alias now, so that the page map tells a live alias at a glance. */
static void populate(uintptr_t start, uintptr_t end)
{
#ifdef MADV_POPULATE_READ
	if (madvise((void *)start, end - start, MADV_POPULATE_READ) == 0)
		return;
#endif
	for (uintptr_t p = start; p < end; p += (uintptr_t)sysconf(_SC_PAGESIZE))
		(void)*(volatile const char *)p;
}

/* Room for heap neighbours on each side of a range's pages in its allocation: as many pages
 * as it has (middleware allocates its buffers in pairs of one size: two 1 MiB heap buffers
 * share a page), 16 at least (a neighbour of a small buffer is often bigger), 16 MiB at most.
 * Untouched, it is no memory (mrd takes 4 KiB pages at first touch), only allocated bytes. */
#define ROOM_MAX ((uintptr_t)16 << 20)

static uintptr_t room_for(uintptr_t length, uintptr_t page)
{
	return length < 16 * page ? 16 * page : length > ROOM_MAX ? ROOM_MAX : length;
}

/* memcpy of whole pages of the program's, heap redzones and freed neighbours among them:
 * word by word, through no interceptor (a program under AddressSanitizer would report the
 * bytes around its buffer) and unchecked when libmrd itself is built with ASan. */
__attribute__((no_sanitize_address, noinline)) static void copy_pages(void *to, const void *from,
								    size_t len)
{
	volatile uint64_t *d = to;
	const volatile uint64_t *s = from;

	for (size_t i = 0; i < len / sizeof(uint64_t); i++)
		d[i] = s[i];
}

/* Moves the program's pages [start, end) onto mrd's at window: writes to them wait from before
 * the copy until mrd's pages are there, so none lands on the program's old pages once copied.
 * Nothing in between may take a lock a writer could hold (malloc's). */
static int move_pages(uintptr_t start, uintptr_t end, void *window, char *why, size_t why_size)
{
	struct write_hold hold;
	void *at;
	int k;

	k = write_hold_start(&hold, start, end, false, why, why_size);
	if (k < 0)
		return -EOPNOTSUPP;
	copy_pages(window, (void *)start, end - start);
	/* A second mapping of the same pages (old size 0 duplicates a shared mapping), over the
	 * program's own: the kernel swaps them in one step. */
	at = (void *)syscall(SYS_mremap, window, 0, end - start, MREMAP_MAYMOVE | MREMAP_FIXED,
			     (void *)start);
	k = at == (void *)start ? 0 : at == MAP_FAILED ? -errno : -EFAULT;
	write_hold_release(&hold, k == 0);
	if (k < 0) {
		snprintf(why, why_size, "mremap onto 0x%" PRIxPTR ": %s", start, strerror(-k));
		return k;
	}
	populate(start, end);
	return 0;
}

int moved_range_move(struct moved_ranges *m, mrd_client *mem, uintptr_t span_start,
		     uintptr_t span_end, unsigned access, struct moved_range **ret, char *why,
		     size_t why_size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = span_start & ~(page - 1), end = (span_end + page - 1) & ~(page - 1);
	uintptr_t room = room_for(end - start, page);
	uintptr_t before = start >= room + page ? room : 0;
	uintptr_t after = end <= UINTPTR_MAX - room ? room : 0;
	struct moved_range *r;
	void *base;
	int k;

	k = address_space_movable(start, end, why, why_size);
	if (k < 0)
		return k;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	k = memory_alloc_alias(mem, before + (end - start) + after, start - before, access,
			       span_start - (start - before), span_end - span_start, &base);
	if (k < 0 && before + after > 0) {
		/* The room is for neighbours to come: a buffer that fits the quota (or mrd's
		 * window) alone moves without it (its neighbours then fall through). */
		before = after = 0;
		k = memory_alloc_alias(mem, end - start, start, access, span_start - start,
				       span_end - span_start, &base);
	}
	if (k < 0) {
		snprintf(why, why_size, "mrd gave no memory: %s", mrd_last_error());
		free(r);
		return k;
	}
	k = move_pages(start, end, (char *)base + before, why, why_size);
	if (k < 0) {
		(void)mrd_mem_free(mem, base);
		free(r);
		return k;
	}
	*r = (struct moved_range){ .start = start, .end = end,
				   .spans = { { span_start, span_end } }, .n_spans = 1,
				   .window = (uintptr_t)base + before, .base = (uintptr_t)base,
				   .room_start = start - before, .room_end = end + after,
				   .access = access, .brk_seen = (uintptr_t)sbrk(0) };
	k = insert(m, r);
	if (k < 0) {
		/* Keep the program's bytes: back onto private memory. */
		moved_range_move_back(m, mem, r);
		return k;
	}
	*ret = r;
	return 0;
}

int moved_range_span_of(const struct moved_range *r, uintptr_t start, uintptr_t end)
{
	for (unsigned i = 0; i < r->n_spans; i++)
		if (r->spans[i].start <= start && end <= r->spans[i].end && !r->spans[i].dead)
			return (int)i;
	return -1;
}

int moved_range_drop_span(mrd_client *mem, struct moved_range *r, unsigned span, char *why,
			  size_t why_size)
{
	struct range_span *b = &r->spans[span];
	int k;

	/* Its keys first: whatever mrd answers, no buffer gets them again. */
	for (struct range_keys **p = &r->keys; *p;)
		if ((*p)->span == span) {
			struct range_keys *dead = *p;

			*p = dead->next;
			free(dead);
		} else
			p = &(*p)->next;
	k = memory_alias_span(mem, (void *)r->base, b->start - r->room_start, b->end - b->start,
			      true);
	if (k < 0) {
		snprintf(why, why_size, "mrd dropped no span [0x%" PRIxPTR ", 0x%" PRIxPTR "): %s",
			 b->start, b->end, mrd_last_error());
		b->dead = true;
		return k;
	}
	*b = (struct range_span){ 0, 0, 0, false };
	return 0;
}

int moved_range_add_span(struct moved_ranges *m, mrd_client *mem, struct moved_range *r,
			 uintptr_t span_start, uintptr_t span_end, unsigned *span, char *why,
			 size_t why_size)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = span_start & ~(page - 1), end = (span_end + page - 1) & ~(page - 1);
	unsigned slot;
	int k;

	for (unsigned i = 0; i < r->n_spans; i++)
		if (span_start < r->spans[i].end && r->spans[i].start < span_end) {
			/* Two MRs over one byte: mrd's cache holds one MR an address. */
			snprintf(why, why_size, "its bytes overlap part of a buffer registered "
				 "before");
			return -EOPNOTSUPP;
		}
	if (start < r->room_start || end > r->room_end) {
		snprintf(why, why_size, "its pages reach %zu bytes past the room of the moved "
			 "pages it shares ([0x%" PRIxPTR ", 0x%" PRIxPTR "))",
			 (size_t)(start < r->room_start ? r->room_start - start : end - r->room_end),
			 r->room_start, r->room_end);
		return -EOPNOTSUPP;
	}
	for (slot = 0; slot < r->n_spans && r->spans[slot].start != r->spans[slot].end; slot++)
		;
	if (slot == RANGE_SPANS_MAX) {
		snprintf(why, why_size, "its pages hold %d buffers registered before",
			 RANGE_SPANS_MAX);
		return -EOPNOTSUPP;
	}
	/* Its pages below the range, then above: each moved like the range's own. What moved
	 * stays r's when the rest fails (they move back with it). */
	if (start < r->start) {
		k = address_space_movable(start, r->start, why, why_size);
		if (k == 0)
			k = move_pages(start, r->start, (void *)(r->window - (r->start - start)), why,
				       why_size);
		if (k < 0)
			return k;
		r->window -= r->start - start;
		r->start = start;
		update_bounds(m);
	}
	if (end > r->end) {
		k = address_space_movable(r->end, end, why, why_size);
		if (k == 0)
			k = move_pages(r->end, end, (void *)(r->window + (r->end - r->start)), why,
				       why_size);
		if (k < 0)
			return k;
		r->end = end;
		update_bounds(m);
	}
	/* Then mrd's span: one the shim does not know of would refuse the next one there. */
	k = memory_alias_span(mem, (void *)r->base, span_start - r->room_start,
			      span_end - span_start, false);
	if (k < 0) {
		snprintf(why, why_size, "mrd added no span: %s", mrd_last_error());
		return k;
	}
	r->spans[slot] = (struct range_span){ span_start, span_end, 0, false };
	if (slot == r->n_spans)
		r->n_spans++;
	*span = slot;
	return 0;
}

bool moved_range_intact(struct moved_range *r, uintptr_t start, uintptr_t end)
{
	uintptr_t brk = (uintptr_t)sbrk(0);
	struct alias_piece pieces[2];
	int n;

	/* No look without the page map's word, even where the shim saw no change: a library can
	 * unmap and map again behind its back (libfabric's memhooks call the kernel's munmap
	 * themselves), and a kept registration would hand out keys to mrd's old pages. */
	if (brk == r->brk_seen && address_space_page_aliased(start))
		return true;
	if (!address_space_looks_aliased(start, end)) {
		n = address_space_alias_pieces(start, end, r->window + (start - r->start), pieces, 2);
		if (n != 1 || pieces[0].start != start || pieces[0].end != end)
			return false;
	}
	if (start == r->start && end == r->end)
		r->brk_seen = brk;
	return true;
}

/* Private anonymous memory again under each piece of r the program still maps: its bytes are
 * copied aside and the copy swapped in by one mremap, so another thread never sees the pages
 * empty, and writes wait from before the copy until the swap (hold: a child of fork() has no
 * other thread; a piece whose writers cannot be held stays mrd's, see libmrd-preload(8)). The piece stays a mapping of its own beside the program's (the kernel
 * merges no anonymous mappings of different origins); a later move of the same pages takes
 * its place. */
static void copy_to_private(const struct moved_range *r, bool hold)
{
	/* r itself (the program's heap) may lie on these pages: nothing of it is read once the
	 * first of them is replaced, only the stack. */
	struct alias_piece pieces[MAX_PIECES];
	int n = address_space_alias_pieces(r->start, r->end, r->window, pieces, MAX_PIECES);

	for (int i = 0; i < n; i++) {
		size_t len = pieces[i].end - pieces[i].start;
		void *tmp = (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE,
					    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct write_hold h;
		char why[128];
		bool held, swapped;

		if (tmp == MAP_FAILED)
			continue; /* the pages stay mrd's: the memory cannot be freed safely */
		/* Read-only pieces have no writer to hold off. */
		held = hold && (pieces[i].prot & PROT_WRITE) &&
		       write_hold_start(&h, pieces[i].start, pieces[i].end, true, why,
					sizeof(why)) == 0;
		if (hold && (pieces[i].prot & PROT_WRITE) && !held) {
			/* Writers that cannot be held off (the thread's own stack, no descriptor
			 * for the userfaultfd this moment): the pages stay mrd's until the
			 * program unmaps them, mrd's memory kept for the while, no write lost. */
			syscall(SYS_munmap, tmp, len);
			continue;
		}
		copy_pages(tmp, (void *)pieces[i].start, len);
		if (pieces[i].prot != (PROT_READ | PROT_WRITE))
			(void)mprotect(tmp, len, pieces[i].prot);
		swapped = (void *)syscall(SYS_mremap, tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED,
					  (void *)pieces[i].start) != MAP_FAILED;
		if (held)
			write_hold_release(&h, swapped);
		if (!swapped)
			syscall(SYS_munmap, tmp, len);
	}
}

static void drop(struct moved_ranges *m, mrd_client *mem, struct moved_range *r)
{
	remove_range(m, r);
	/* Freeing mrd's memory punches its pages: only once the program maps none of them,
	 * where they were or wherever a mremap() took them. */
	if (address_space_mapped_elsewhere(r->base, r->room_end - r->room_start) == 0)
		(void)mrd_mem_free(mem, (void *)r->base);
	r->gone = true;
	moved_range_put(r);
}

/* Both run inside free(), which keeps errno. */
void moved_range_move_back(struct moved_ranges *m, mrd_client *mem, struct moved_range *r)
{
	int e = errno;

	copy_to_private(r, true);
	drop(m, mem, r);
	errno = e;
}

void moved_range_forget(struct moved_ranges *m, mrd_client *mem, struct moved_range *r)
{
	int e = errno;

	drop(m, mem, r);
	errno = e;
}

void moved_ranges_fork_copy(struct moved_ranges *m)
{
	address_space_after_fork();
	for (size_t i = 0; i < m->n; i++)
		copy_to_private(m->v[i], false);
}

void moved_ranges_fork_forget(struct moved_ranges *m)
{
	for (size_t i = 0; i < m->n; i++) {
		m->v[i]->gone = true;
		moved_range_put(m->v[i]);
	}
	m->n = 0;
	update_bounds(m);
}

int moved_ranges_atfork(void (*copy)(void), void (*prepare)(void), void (*parent)(void),
			void (*child)(void))
{
	int k = copy ? pthread_atfork(NULL, NULL, copy) : 0;

	libmrd_init_once();
	return k ? k : pthread_atfork(prepare, parent, child);
}

void moved_range_put(struct moved_range *r)
{
	if (!r->gone || r->live > 0 || r->kept > 0)
		return;
	while (r->keys) {
		struct range_keys *k = r->keys;

		r->keys = k->next;
		free(k);
	}
	free(r);
}
