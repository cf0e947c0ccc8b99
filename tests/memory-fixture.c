/* SPDX-License-Identifier: MIT */
#include <check.h>
#include <stdlib.h>

#include "memory-fixture.h"

void memory_fixture_open(struct config *cfg, struct window *window, struct memory *mem,
			 uint64_t window_size, uint64_t arena_size, uint64_t generation)
{
	const char *base = getenv("MRD_TEST_WINDOW_BASE");

	config_init(cfg);
	cfg->window_size = window_size;
	cfg->arena_size = arena_size;
	cfg->hugepages = HUGEPAGES_NO;
	if (base)
		ck_assert_int_eq(config_set(cfg, "memory", "window_base", base), 0);
	ck_assert_int_eq(window_reserve(window, cfg->window_base, cfg->window_size,
					cfg->arena_size), 0);
	memory_init(mem, cfg, &cfg->quota, window, "unit");
	ck_assert_int_eq(status_page_open(&mem->status, "unit", generation), 0);
}

void memory_fixture_close(struct config *cfg, struct window *window, struct memory *mem)
{
	memory_done(mem);
	window_release(window);
	config_done(cfg);
}
