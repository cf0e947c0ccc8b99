/* SPDX-License-Identifier: MIT */
/* What the process's own mappings say (/proc/self/maps, /proc/self/pagemap): whether a range
 * is plain private memory the shim may move, and which parts of a moved range still show
 * mrd's pages. No allocation on these paths: they run inside free(). */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* A piece of a moved range that still maps mrd's memory, with its protection. */
struct alias_piece {
	uintptr_t start, end;
	int prot;
};

/* 0 when every page of [start, end) is private anonymous memory readable and writable (heap,
 * mmap(MAP_ANONYMOUS)), not a stack; else -EOPNOTSUPP, and why says what is there. */
int address_space_movable(uintptr_t start, uintptr_t end, char *why, size_t why_size);

/* The mapping holding addr: 0 and [*ret_start, *ret_end), -ENOENT, or -errno. */
int address_space_mapping_of(uintptr_t addr, uintptr_t *ret_start, uintptr_t *ret_end);

/* The parts of [start, end) that map the same file, at the same offsets, as mrd's memory at
 * window (the alias made by moved_range_move); at most max pieces, their count returned
 * (-errno when /proc cannot be read). */
int address_space_alias_pieces(uintptr_t start, uintptr_t end, uintptr_t window,
			       struct alias_piece *pieces, int max);

/* 1 when the pages of mrd's memory at [window, window + length) are mapped anywhere but there
 * (at an alias, or wherever a mremap() took them), 0 when not, -errno when /proc cannot say:
 * only at 0 may they go back to mrd. */
int address_space_mapped_elsewhere(uintptr_t window, size_t length);

/* Quick check, one read of the page map: whether the pages of [start, end) (up to 2 MiB; of a
 * bigger range the first and the last) are present shared-file pages mapped more than once, as
 * a live alias's are (mrd's window maps them too). false says nothing for sure (the
 * program may have dropped the page tables, madvise(MADV_DONTNEED)): ask
 * address_space_alias_pieces then. */
_Bool address_space_looks_aliased(uintptr_t start, uintptr_t end);
/* The same of the one page holding addr. */
_Bool address_space_page_aliased(uintptr_t addr);
/* In a child of fork(): the page map opened before was the parent's. */
void address_space_after_fork(void);
