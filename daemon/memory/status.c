/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "macro.h"
#include "memory/status.h"

/* Written here, read-only for everyone else (F_SEAL_FUTURE_WRITE lets our own writable mapping
 * stay while refusing any new one). */
int status_page_open(struct status_page *s, const char *name, uint64_t generation)
{
	char memfd_name[80];

	snprintf(memfd_name, sizeof(memfd_name), "mrd-status-%s", name);
	s->fd = memfd_create(memfd_name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->fd < 0)
		return negative_errno();
	if (ftruncate(s->fd, MRD_STATUS_PAGE_SIZE) < 0)
		return negative_errno();
	s->page = mmap(NULL, MRD_STATUS_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
	if (s->page == MAP_FAILED) {
		s->page = NULL;
		return negative_errno();
	}
	/* Every client of the domain trusts what it reads here, so no client may write it, by
	 * any path: clients get a read-only reopen (status_page_fd), and the file's mode keeps
	 * them from reopening it read-write through /proc/self/fd (a memfd is born 0777; the
	 * mode is all that stops that on kernels before FUTURE_WRITE). FUTURE_WRITE (Linux 5.1)
	 * keeps this writable mapping of ours and refuses any new one, write(), and punching
	 * holes, to everyone, root included; SEAL keeps anyone from adding seals of their own. */
	if (fchmod(s->fd, 0444) < 0)
		return negative_errno();
	if (fcntl(s->fd, F_ADD_SEALS,
		  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0 &&
	    fcntl(s->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return negative_errno();
	s->page->magic = MRD_STATUS_MAGIC;
	s->page->layout_version = MRD_STATUS_LAYOUT;
	s->page->size = sizeof(*s->page);
	s->page->generation = generation;
	/* Nothing before the first generation can be told from here: a client that cached at a
	 * previous page's (a reconnect) drops everything. */
	s->page->freed[generation % MRD_STATUS_FREED] =
		(struct mrd_status_freed){ generation, 0, UINT64_MAX };
	return 0;
}

void status_page_close(struct status_page *s)
{
	if (s->page)
		munmap(s->page, MRD_STATUS_PAGE_SIZE);
	s->page = NULL;
	s->fd = safe_close(s->fd);
}

int status_page_fd(const struct status_page *s)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", s->fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? negative_errno() : fd;
}

void status_page_bump_range(struct status_page *s, uint64_t start, uint64_t end)
{
	uint64_t generation = s->page->generation + 1; /* we alone write it */
	struct mrd_status_freed *f = &s->page->freed[generation % MRD_STATUS_FREED];

	/* A seqlock of one record: marked being written, the range, then whose it is; readers
	 * of the generation it held before see a mismatch instead of a torn range. Release
	 * stores, not a fence (which ThreadSanitizer cannot follow): a reader that acquires a new
	 * bound sees the mark too. */
	__atomic_store_n(&f->generation, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&f->start, start, __ATOMIC_RELEASE);
	__atomic_store_n(&f->end, end, __ATOMIC_RELEASE);
	__atomic_store_n(&f->generation, generation, __ATOMIC_RELEASE);
	/* Then the generation: whoever sees it finds its record. */
	__atomic_store_n(&s->page->generation, generation, __ATOMIC_RELEASE);
}

void status_page_bump(struct status_page *s)
{
	status_page_bump_range(s, 0, UINT64_MAX);
}
