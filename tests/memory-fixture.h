/* SPDX-License-Identifier: MIT */
/* A domain's memory for the suites below core, set up as a domain would: a configuration, a
 * window of its own and memory over it with its status page. No domain, no manager. */
#pragma once

#include <stdint.h>

#include "base/config.h"
#include "memory/memory.h"
#include "memory/window.h"

/* Default configuration but for the window, the arena size and no huge pages; the window
 * goes where MRD_TEST_WINDOW_BASE says, when set (TSan claims mrd's default one: see
 * tools/check-sanitizers.sh). The status page starts at generation. */
void memory_fixture_open(struct config *cfg, struct window *window, struct memory *mem,
			 uint64_t window_size, uint64_t arena_size, uint64_t generation);
/* The allocations went before. */
void memory_fixture_close(struct config *cfg, struct window *window, struct memory *mem);
