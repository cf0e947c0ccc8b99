/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "base/config.h"
#include "fuzz-manager.h"
#include "log.h"
#include "control/manager.h"

struct manager *fuzz_manager_new(const char *const *settings)
{
	struct manager *m;
	struct config cfg;

	log_set_level(LOG_LEVEL_SILENT);
	config_init(&cfg);
	(void)config_set(&cfg, "mrd", "provider", "soft");
	(void)config_set(&cfg, "memory", "hugepages", "no");
	for (size_t i = 0; settings && settings[i]; i++)
		if (config_set_assignment(&cfg, settings[i]) < 0)
			abort();
	if (config_finish(&cfg) < 0 || manager_new(&cfg, &m) < 0)
		abort();
	config_done(&cfg);
	return m;
}
