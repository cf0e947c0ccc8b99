/* SPDX-License-Identifier: MIT */
/* What the fuzz targets share: one manager for every input. */
#pragma once

struct manager;

/* A manager on the soft provider without huge pages, with settings ("section.key=value",
 * NULL-terminated) on top, logs silenced; aborts when it cannot start. */
struct manager *fuzz_manager_new(const char *const *settings);
