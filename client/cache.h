/* SPDX-License-Identifier: MIT */
/* lookup.c's key cache, for mempool.c, which fills it from a pool's own registration. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "mrd/mrd.h"

/* The cached part of a lookup (generation check, top half, bottom half, which refills the
 * top); -ENOENT when nothing cached holds a. */
int cache_find(mrd_cache *cache, uintptr_t a, struct mrd_keys *ret);
/* Into the bottom half (emptied first when full at its ceiling), and the top half too. */
void cache_insert(mrd_cache *cache, const struct mrd_keys *keys, bool top);
