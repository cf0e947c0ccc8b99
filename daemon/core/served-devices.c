/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "core/core.h"
#include "core/served-devices.h"

/* The soft provider has no device: nothing to bind. */
static bool on_verbs(const struct core *core)
{
	return core->provider && core->provider->ops == &provider_verbs_ops;
}

static struct served_device *add(struct core *core, const char *name)
{
	struct served_devices *s = &core->served;
	struct provider *p;
	int k;

	if (s->n == SERVED_DEVICES_MAX)
		return NULL;
	if (strcmp(name, core->provider->caps.device) == 0) {
		s->v[s->n] = (struct served_device){ .caps = core->provider->caps };
	} else {
		k = provider_verbs_ops.open(name, &p);
		if (k < 0) {
			log_warning_errno(k, "device %s: cannot open it for its caps: %m; clients "
					  "cannot bind its contexts", name);
			return NULL;
		}
		s->v[s->n] = (struct served_device){ .caps = p->caps };
		provider_close(p);
	}
	snprintf(s->v[s->n].name, sizeof(s->v[s->n].name), "%s", name);
	return &s->v[s->n++];
}

void served_devices_scan(struct core *core)
{
	char names[SERVED_DEVICES_MAX][64];
	size_t n;

	if (!on_verbs(core))
		return;
	(void)served_device_find(core, core->provider->caps.device); /* first: the domains' */
	n = provider_verbs_devices(names, SERVED_DEVICES_MAX);
	for (size_t i = 0; i < n && i < SERVED_DEVICES_MAX; i++)
		(void)served_device_find(core, names[i]);
}

struct served_device *served_device_find(struct core *core, const char *name)
{
	struct served_devices *s = &core->served;

	if (!on_verbs(core) || !config_serves_device(&core->config, name))
		return NULL;
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i].name, name) == 0)
			return &s->v[i];
	return add(core, name);
}

void served_device_bind(struct served_device *dev)
{
	dev->bound++;
}

void served_device_unbind(struct served_device *dev)
{
	if (dev)
		dev->bound--;
}
