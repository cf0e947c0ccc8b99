/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "address-space.h"

/* One line of /proc/self/maps. */
struct mapping {
	uintptr_t start, end;
	int prot;
	bool shared;
	uint64_t offset;
	unsigned long dev_major, dev_minor, inode;
	char path[64]; /* enough to tell "[heap]", "[stack]" and a memfd from one another */
};

/* Reads the maps line by line with read(2) into a stack buffer: stdio would malloc, and this
 * runs inside free(). Calls fn for each mapping until it returns non-zero; that value, 0, or
 * -errno. */
static int each_mapping(int (*fn)(const struct mapping *m, void *arg), void *arg)
{
	char buf[8192];
	size_t have = 0;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	int r = 0;

	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		char *line = buf, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			break;
		}
		have += (size_t)n;
		buf[have] = '\0';
		while ((nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			struct mapping m = { 0 };
			char perms[5] = "", path[256] = "";

			*nl = '\0';
			if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %" SCNx64 " %lx:%lx %lu %255s",
				   &m.start, &m.end, perms, &m.offset, &m.dev_major, &m.dev_minor,
				   &m.inode, path) >= 7) {
				m.prot = (perms[0] == 'r' ? PROT_READ : 0) |
					 (perms[1] == 'w' ? PROT_WRITE : 0) |
					 (perms[2] == 'x' ? PROT_EXEC : 0);
				m.shared = perms[3] == 's';
				snprintf(m.path, sizeof(m.path), "%s", path);
				r = fn(&m, arg);
				if (r)
					goto out;
			}
			line = nl + 1;
		}
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
		if (n == 0)
			break;
		if (have == sizeof(buf) - 1) /* a line longer than the buffer: skip it */
			have = 0;
	}
out:
	close(fd);
	return r;
}

struct movable_walk {
	uintptr_t start, end, next; /* next: the first byte not yet seen covered */
	char *why;
	size_t why_size;
};

static int check_movable(const struct mapping *m, void *arg)
{
	struct movable_walk *w = arg;

	if (m->end <= w->next)
		return 0;
	if (m->start > w->next) {
		snprintf(w->why, w->why_size, "nothing is mapped at 0x%" PRIxPTR, w->next);
		return -EOPNOTSUPP;
	}
	if (m->shared || m->inode != 0 || (m->prot & (PROT_READ | PROT_WRITE)) !=
	    (PROT_READ | PROT_WRITE) || (m->path[0] && strcmp(m->path, "[heap]") != 0)) {
		snprintf(w->why, w->why_size, "0x%" PRIxPTR "-0x%" PRIxPTR " is %s%s%s%s",
			 m->start, m->end, m->shared ? "shared " : "",
			 m->inode ? "a file mapping " : "",
			 (m->prot & PROT_WRITE) ? "" : "not writable ",
			 m->path[0] ? m->path : "");
		return -EOPNOTSUPP;
	}
	w->next = m->end;
	return w->next >= w->end ? 1 : 0;
}

int address_space_movable(uintptr_t start, uintptr_t end, char *why, size_t why_size)
{
	struct movable_walk w = { start, end, start, why, why_size };
	int r = each_mapping(check_movable, &w);

	if (r == 1)
		return 0;
	if (r == 0) {
		snprintf(why, why_size, "nothing is mapped at 0x%" PRIxPTR, w.next);
		return -EOPNOTSUPP;
	}
	if (r != -EOPNOTSUPP)
		snprintf(why, why_size, "/proc/self/maps: %s", strerror(-r));
	return r == -EOPNOTSUPP ? r : -EOPNOTSUPP;
}

struct holding_walk {
	uintptr_t addr, start, end;
};

static int find_holding(const struct mapping *m, void *arg)
{
	struct holding_walk *w = arg;

	if (m->start > w->addr || w->addr >= m->end)
		return 0;
	w->start = m->start;
	w->end = m->end;
	return 1;
}

int address_space_mapping_of(uintptr_t addr, uintptr_t *ret_start, uintptr_t *ret_end)
{
	struct holding_walk w = { .addr = addr };
	int r = each_mapping(find_holding, &w);

	if (r <= 0)
		return r < 0 ? r : -ENOENT;
	*ret_start = w.start;
	*ret_end = w.end;
	return 0;
}

struct pieces_walk {
	uintptr_t start, end, window;
	struct mapping file; /* the window's mapping, once found */
	bool found;
	struct alias_piece *pieces;
	int n, max;
};

static int find_window(const struct mapping *m, void *arg)
{
	struct pieces_walk *w = arg;

	if (m->start <= w->window && w->window < m->end) {
		w->file = *m;
		w->found = true;
		return 1;
	}
	return 0;
}

static int collect(const struct mapping *m, void *arg)
{
	struct pieces_walk *w = arg;
	uintptr_t s = m->start > w->start ? m->start : w->start;
	uintptr_t e = m->end < w->end ? m->end : w->end;
	/* The file offset window's byte has, and the one s would have as its alias. */
	uint64_t want = w->file.offset + (w->window - w->file.start) + (s - w->start);

	if (s >= e || !m->shared || m->inode != w->file.inode ||
	    m->dev_major != w->file.dev_major || m->dev_minor != w->file.dev_minor ||
	    m->offset + (s - m->start) != want)
		return 0;
	if (w->n == w->max)
		return -E2BIG;
	w->pieces[w->n++] = (struct alias_piece){ s, e, m->prot };
	return 0;
}

int address_space_alias_pieces(uintptr_t start, uintptr_t end, uintptr_t window,
			       struct alias_piece *pieces, int max)
{
	struct pieces_walk w = { .start = start, .end = end, .window = window, .pieces = pieces,
				 .max = max };
	int r = each_mapping(find_window, &w);

	if (r < 0)
		return r;
	if (!w.found)
		return 0;
	r = each_mapping(collect, &w);
	return r < 0 ? r : w.n;
}

struct elsewhere_walk {
	struct mapping file; /* the window's mapping */
	uint64_t lo, hi;     /* the file's bytes in question */
	bool found;
};

static int other_mapping(const struct mapping *m, void *arg)
{
	struct elsewhere_walk *w = arg;

	if (m->start == w->file.start || m->inode != w->file.inode ||
	    m->dev_major != w->file.dev_major || m->dev_minor != w->file.dev_minor)
		return 0;
	if (m->offset < w->hi && w->lo < m->offset + (m->end - m->start)) {
		w->found = true;
		return 1;
	}
	return 0;
}

int address_space_mapped_elsewhere(uintptr_t window, size_t length)
{
	struct pieces_walk pw = { .window = window };
	struct elsewhere_walk w;
	int r = each_mapping(find_window, &pw);

	if (r < 0)
		return r;
	if (!pw.found)
		return 0;
	w = (struct elsewhere_walk){ .file = pw.file,
				     .lo = pw.file.offset + (window - pw.file.start) };
	w.hi = w.lo + length;
	r = each_mapping(other_mapping, &w);
	return r < 0 ? r : w.found;
}

#define PM_PRESENT (1ull << 63)
#define PM_FILE (1ull << 61)
#define PM_EXCLUSIVE (1ull << 56) /* mapped once: an alias's page is mapped at the window too */

#define LOOK_PAGES 512 /* every page up to 2 MiB; beyond, the first and the last */

static bool aliased_entries(int fd, uintptr_t first_page, size_t n)
{
	uint64_t e[LOOK_PAGES];
	ssize_t got = pread(fd, e, n * 8, (off_t)(first_page * 8));

	if (got != (ssize_t)(n * 8))
		return false;
	for (size_t i = 0; i < n; i++)
		if ((e[i] & (PM_PRESENT | PM_FILE | PM_EXCLUSIVE)) != (PM_PRESENT | PM_FILE))
			return false;
	return true;
}

/* The page map, opened once: a registration that hits reads one entry (one syscall). It is
 * this process's: a child of fork() opens its own (address_space_after_fork). */
static int pagemap_fd = -1;

static int pagemap(void)
{
	if (pagemap_fd < 0)
		pagemap_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	return pagemap_fd;
}

void address_space_after_fork(void)
{
	if (pagemap_fd >= 0)
		close(pagemap_fd);
	pagemap_fd = -1;
}

bool address_space_looks_aliased(uintptr_t start, uintptr_t end)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), first = start / page;
	uintptr_t last = (end - 1) / page;
	int fd = pagemap();

	if (fd < 0)
		return false;
	if (last - first < LOOK_PAGES)
		return aliased_entries(fd, first, last - first + 1);
	return aliased_entries(fd, first, 1) && aliased_entries(fd, last, 1);
}

bool address_space_page_aliased(uintptr_t addr)
{
	int fd = pagemap();

	return fd >= 0 && aliased_entries(fd, addr / (uintptr_t)sysconf(_SC_PAGESIZE), 1);
}
