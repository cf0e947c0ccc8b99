/* SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz-manager.h"
#include "log.h"
#include "manager.h"

struct manager *fuzz_manager_new(const char *const *settings)
{
	struct manager *m;
	struct config cfg;

	log_set_level(LOG_LEVEL_SILENT);
	config_init(&cfg);
	(void)config_set(&cfg, "mrd", "provider", "soft");
	(void)config_set(&cfg, "memory", "hugepages", "no");
	for (size_t i = 0; settings && settings[i]; i++) {
		char section[32], key[64];
		const char *dot = strchr(settings[i], '.'), *eq = strchr(settings[i], '=');

		if (!dot || !eq || eq < dot)
			abort();
		snprintf(section, sizeof(section), "%.*s", (int)(dot - settings[i]), settings[i]);
		snprintf(key, sizeof(key), "%.*s", (int)(eq - dot - 1), dot + 1);
		if (config_set(&cfg, section, key, eq + 1) < 0)
			abort();
	}
	if (config_finish(&cfg) < 0 || manager_new(&cfg, &m) < 0)
		abort();
	config_done(&cfg);
	return m;
}
