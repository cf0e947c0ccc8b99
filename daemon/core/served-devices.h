/* SPDX-License-Identifier: MIT */
/* The RDMA devices a client may bind a context of (BindPd): every device of the host, or
 * those [mrd] devices names, each with its caps, read once by opening it. The domains live on
 * one of them (core.provider's); a client bound to a PD on any of them gets keys there
 * (registration/bound-pd.h). */
#pragma once

#include <stddef.h>

#include "provider/provider.h"

struct core;

struct served_device {
	char name[64];
	struct provider_caps caps;
	unsigned bound; /* connections bound to a PD on it now */
};

/* What fits in one Status reply, and more than a host has NICs. */
#define SERVED_DEVICES_MAX 32

struct served_devices {
	struct served_device v[SERVED_DEVICES_MAX];
	size_t n;
};

/* Every device of the host that [mrd] devices lets clients bind, once mrd runs on verbs
 * (core.provider): the one it opened first, then the others, opened for their caps and closed.
 * A device that does not open is left out (logged). */
void served_devices_scan(struct core *core);
/* The one named name, NULL when mrd does not serve it: not on verbs, not allowed by [mrd]
 * devices, or it does not open. One added to the host since the scan is opened now. */
struct served_device *served_device_find(struct core *core, const char *name);
/* A connection bound a PD on dev (domain_bind_pd) / lets go of it (NULL-safe). */
void served_device_bind(struct served_device *dev);
void served_device_unbind(struct served_device *dev);
