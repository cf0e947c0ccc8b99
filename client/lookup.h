/* SPDX-License-Identifier: MIT */
/* lookup.c's cache, for mempool.c, which fills it from a pool's own registration. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct mrd_lookup;
struct mrd_mr;

/* The cached part of a lookup (generation check, top half, bottom half, which refills the
 * top); -ENOENT when nothing cached holds a. */
int lookup_cached(struct mrd_lookup *l, uintptr_t a, struct mrd_mr *ret);
/* Into the bottom half (emptied first when full at its ceiling), and the top half too. */
void lookup_insert(struct mrd_lookup *l, const struct mrd_mr *mr, bool top);
