/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/memfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "log.h"
#include "macro.h"
#include "base/fd-closer.h"
#include "memory/allocation.h"
#include "memory/arena.h"
#include "memory/memory.h"
#include "memory/window.h"


uint64_t hugepages_free(void)
{
	unsigned long long n = 0;
	FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "re");

	if (!f)
		return 0;
	if (fscanf(f, "%llu", &n) != 1)
		n = 0;
	fclose(f);
	return n;
}

static uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

static uint64_t pow2_at_least(uint64_t v)
{
	uint64_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

/* Maps the memfd at the first free slots that hold it, or at slot *at when at is not NULL. */
static int arena_map(struct arena *a, struct window *w, uint64_t length, uint64_t offset,
		     const uint32_t *at)
{
	uint32_t first;
	int r;

	a->n_slots = (uint32_t)((length + w->slot_size - 1) / w->slot_size);
	if (at) {
		first = *at; /* the previous mrd's: it kept to the share */
		r = window_take_at(w, first, a->n_slots);
	} else if (a->mem->window_bytes + (uint64_t)a->n_slots * w->slot_size >
		   config_window_bytes(a->mem->config, a->mem->quota))
		r = -EDQUOT; /* its share of the window, so one domain never takes it all */
	else
		r = window_take(w, a->n_slots, &first);
	if (r < 0) {
		a->n_slots = 0;
		return r;
	}
	a->id = first;
	/* NORESERVE: hugetlb would reserve every huge page of the arena up front; pages are
	 * taken one run at a time instead (fallocate in arena_alloc). */
	a->base = mmap(window_slot(w, first), length, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_FIXED | MAP_NORESERVE, a->memfd, (off_t)offset);
	if (a->base == MAP_FAILED) {
		r = negative_errno();
		a->base = NULL;
		window_give_back(w, first, a->n_slots);
		a->n_slots = 0;
		return r;
	}
	return 0;
}

/* What mrd needs to know of a memfd before it maps one it did not just make. */
struct memfd_info {
	uint64_t size;
	uint32_t page_size;
	bool hugetlb;
	int seals;
};

/* -EBADF unless fd is shared memory mrd can seal-check: a memfd (tmpfs or hugetlbfs). */
static int memfd_check(int fd, struct memfd_info *ret)
{
	struct statfs sfs;
	struct stat st;

	/* F_GET_SEALS first: it answers for shmem and hugetlbfs files alone and asks no
	 * filesystem, while fstat and fstatfs of a client's FUSE file would wait for its server. */
	ret->seals = fcntl(fd, F_GET_SEALS);
	if (ret->seals < 0)
		return -EBADF;
	if (fstat(fd, &st) < 0 || fstatfs(fd, &sfs) < 0)
		return negative_errno();
	if (!S_ISREG(st.st_mode) || (sfs.f_type != TMPFS_MAGIC && sfs.f_type != HUGETLBFS_MAGIC))
		return -EBADF;
	ret->size = (uint64_t)st.st_size;
	ret->hugetlb = sfs.f_type == HUGETLBFS_MAGIC;
	ret->page_size = (uint32_t)(ret->hugetlb ? (uint64_t)sfs.f_bsize :
						   (uint64_t)sysconf(_SC_PAGESIZE));
	return 0;
}

/* serial: a warm restart's, else 0 for the next one. */
static struct arena *arena_alloc_struct(struct memory *m, uint64_t serial)
{
	struct arena *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	a->memfd = -1;
	a->mem = m;
	a->serial = serial ? serial : ++m->window->arena_serial;
	return a;
}

static void arena_link(struct arena *a)
{
	LIST_INSERT_HEAD(&a->mem->arenas, a, link);
	a->mem->n_arenas++;
	a->mem->window_bytes += (uint64_t)a->n_slots * a->mem->window->slot_size;
}

int arena_new(struct memory *m, uint64_t min_size, bool hugetlb, struct arena **ret)
{
	struct window *w = m->window;
	struct arena *a;
	char name[96];
	int r;

	a = arena_alloc_struct(m, 0);
	if (!a)
		return -ENOMEM;
	a->hugetlb = hugetlb;
	a->page_size = hugetlb ? HUGE_PAGE_SIZE : (uint32_t)sysconf(_SC_PAGESIZE);
	/* Buddy allocators want a power of two pages; at least the configured arena size. */
	a->size = pow2_at_least(round_up(min_size > m->config->arena_size ?
						 min_size : m->config->arena_size,
					 a->page_size));

	snprintf(name, sizeof(name), "mrd-arena-%s", m->name);
	a->memfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING |
					      (hugetlb ? MFD_HUGETLB | (21 << MFD_HUGE_SHIFT) : 0));
	if (a->memfd < 0) {
		r = negative_errno();
		goto fail;
	}
	/* Sparse: only pages handed out get backed. Sealed so nobody can shrink it under a
	 * mapping (SIGBUS) or grow it. */
	if (ftruncate(a->memfd, (off_t)a->size) < 0 ||
	    fcntl(a->memfd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
		r = negative_errno();
		goto fail;
	}
	r = buddy_init(&a->buddy, (uint32_t)(a->size / a->page_size));
	if (r < 0)
		goto fail;
	r = arena_map(a, w, a->size, 0, NULL);
	if (r < 0)
		goto fail;
	if (!hugetlb)
		(void)madvise(a->base, a->size, MADV_HUGEPAGE); /* THP, where shmem allows it */

	arena_link(a);
	log_debug("domain %s: arena %u, %llu MiB of %s pages at %p", m->name, a->id,
		  (unsigned long long)(a->size >> 20), hugetlb ? "2 MiB" : "4 KiB", (void *)a->base);
	*ret = a;
	return 0;

fail:
	arena_free(a);
	return r;
}

/* An arena over memfd (consumed on success) as place says, at the first free slots or at
 * place->slot (adopt: a warm restart's, all its pages in use until arena_adopt_finish). */
static int arena_wrap(struct memory *m, int memfd, const struct arena_place *place, bool adopt,
		      struct arena **ret)
{
	struct arena *a = arena_alloc_struct(m, adopt ? place->serial : 0);
	int r;

	if (!a)
		return -ENOMEM;
	a->external = place->external;
	a->hugetlb = place->hugetlb;
	a->page_size = place->page_size;
	a->size = place->size;
	a->file_offset = place->file_offset;
	a->memfd = memfd;
	r = a->external ? 0 : buddy_init_used(&a->buddy, (uint32_t)(a->size / a->page_size));
	if (r >= 0)
		r = arena_map(a, m->window, a->size, a->file_offset,
			      adopt ? &place->slot : NULL);
	if (r < 0) {
		a->memfd = -1; /* still the caller's */
		arena_free(a);
		return r;
	}
	arena_link(a);
	*ret = a;
	return 0;
}

int arena_new_external(struct memory *m, int memfd, uint64_t offset, uint64_t length,
		       struct arena **ret)
{
	struct memfd_info info;
	int r;

	r = memfd_check(memfd, &info);
	if (r < 0)
		return r;
	if (!(info.seals & F_SEAL_SHRINK))
		return -EPERM;
	if (info.seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))
		return -EROFS;
	if (length == 0 || offset % info.page_size || length % info.page_size ||
	    offset + length < offset || offset + length > info.size)
		return -EINVAL;
	r = arena_wrap(m, memfd,
		       &(struct arena_place){ .size = length, .file_offset = offset,
					      .page_size = info.page_size,
					      .hugetlb = info.hugetlb, .external = true },
		       false, ret);
	return r == -EPERM ? -EROFS : r; /* mmap: a seal against writes added since */
}

int arena_adopt(struct memory *m, int memfd, const struct arena_place *place, struct arena **ret)
{
	struct memfd_info info;

	if (memfd_check(memfd, &info) < 0)
		return -EINVAL;
	/* Only what mrd itself would have made: a wrong state must not map anything else. */
	if (info.hugetlb != place->hugetlb || info.page_size != place->page_size ||
	    !(info.seals & F_SEAL_SHRINK) || place->size == 0 || place->size % info.page_size ||
	    place->file_offset % info.page_size || place->file_offset > info.size ||
	    place->size > info.size - place->file_offset)
		return -EINVAL;
	if (!place->external &&
	    (place->file_offset != 0 || place->size != info.size || !(info.seals & F_SEAL_GROW) ||
	     (place->size / info.page_size) & (place->size / info.page_size - 1)))
		return -EINVAL;
	if (place->serial > m->window->arena_serial)
		m->window->arena_serial = place->serial;
	return arena_wrap(m, memfd, place, true, ret);
}

int arena_adopt_finish(struct arena *a)
{
	uint64_t next = 0;

	if (a->external)
		return a->n_runs == 1 && a->runs[0]->offset == 0 && a->runs[0]->length == a->size ?
			       0 : -EINVAL;
	for (size_t i = 0; i <= a->n_runs; i++) {
		uint64_t start = i < a->n_runs ? a->runs[i]->offset : a->size;

		if (start > next)
			buddy_free(&a->buddy, (uint32_t)(next / a->page_size),
				   (uint32_t)((start - next) / a->page_size));
		if (i < a->n_runs)
			next = a->runs[i]->offset + a->runs[i]->length;
	}
	return 0;
}

struct arena *arena_free(struct arena *a)
{
	if (!a)
		return NULL;
	if (a->n_slots)
		window_give_back(a->mem->window, a->id, a->n_slots);
	if (a->link.le_prev) {
		LIST_REMOVE(a, link);
		a->mem->n_arenas--;
		a->mem->window_bytes -= (uint64_t)a->n_slots * a->mem->window->slot_size;
	}
	buddy_done(&a->buddy);
	free(a->runs);
	if (a->memfd >= 0 && a->mem->closer && *a->mem->closer)
		fd_closer_consume_own(*a->mem->closer, a->memfd);
	else
		safe_close(a->memfd);
	free(a);
	return NULL;
}

int arena_alloc(struct arena *a, uint64_t size, uint64_t align, uint64_t *ret_offset,
		uint64_t *ret_length)
{
	uint64_t n = round_up(size, a->page_size) / a->page_size;
	uint64_t align_pages = align > a->page_size ? pow2_at_least(align) / a->page_size : 1;
	int64_t first;

	if (a->external)
		return -ENOSPC;
	if (n == 0 || n > a->buddy.n_pages || align_pages > a->buddy.n_pages)
		return -ENOSPC;
	first = buddy_alloc(&a->buddy, (uint32_t)n, (uint32_t)align_pages);
	if (first < 0)
		return first == -ENOMEM ? -ENOSPC : (int)first;

	/* A client may have written into the run after it was freed: hand it out empty. */
	arena_punch(a, (uint64_t)first * a->page_size, n * a->page_size);
	/* Huge pages are taken now, not at first touch, so running out is an error here
	 * rather than a SIGBUS in a client later. */
	if (a->hugetlb && fallocate(a->memfd, 0, (off_t)((uint64_t)first * a->page_size),
				    (off_t)(n * a->page_size)) < 0) {
		int r = negative_errno();

		buddy_free(&a->buddy, (uint32_t)first, (uint32_t)n);
		return r == -ENOSPC ? -ENOMEM : r;
	}
	a->n_allocations++;
	*ret_offset = (uint64_t)first * a->page_size;
	*ret_length = n * a->page_size;
	return 0;
}

/* Punches from the first page the memfd has in the range on (SEEK_DATA), nothing when it has
 * none: a punch, however empty its range, walks the page tables of every process that maps it,
 * 0.1 ms a GiB each (and mrd's loop punches every Alloc's run), where SEEK_DATA skips a hole in
 * microseconds. Not hole by hole: SEEK_HOLE reads every page of the data, 11 ms a GiB. hugetlbfs
 * reports no holes, and what lseek cannot tell is punched whole. */
void arena_punch(const struct arena *a, uint64_t offset, uint64_t length)
{
	off_t data = lseek(a->memfd, (off_t)offset, SEEK_DATA);

	if (data < 0 && errno == ENXIO)
		return; /* no page from offset on */
	if (data > (off_t)offset) {
		if ((uint64_t)data >= offset + length)
			return;
		length -= (uint64_t)data - offset;
		offset = (uint64_t)data;
	}
	(void)fallocate(a->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset,
			(off_t)length);
}

void arena_return(struct arena *a, uint64_t offset, uint64_t length)
{
	a->n_allocations--;
	if (!a->external)
		buddy_free(&a->buddy, (uint32_t)(offset / a->page_size),
			   (uint32_t)(length / a->page_size));
}

void arena_release(struct arena *a, uint64_t offset, uint64_t length)
{
	/* Not while another mrd takes the memory over: their content is what it adopts. */
	if (!a->external && !a->mem->window->keep_content)
		arena_punch(a, offset, length);
	arena_return(a, offset, length);
}
