/* SPDX-License-Identifier: MIT */
/* What the benches that drive a verbs device themselves share (they run in the rxe VM). */
#pragma once

#include <string.h>

#include <infiniband/verbs.h>

/* The device named device, opened; NULL when there is none (the bench then says why and exits
 * 77). */
static inline struct ibv_context *bench_open_verbs(const char *device)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	for (int i = 0; l && l[i] && !ctx; i++)
		if (strcmp(ibv_get_device_name(l[i]), device) == 0)
			ctx = ibv_open_device(l[i]);
	if (l)
		ibv_free_device_list(l);
	return ctx;
}
