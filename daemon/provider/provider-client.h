/* SPDX-License-Identifier: MIT */
/* A client's own PD as a provider (DESIGN.md §3, client PD): registrations go into PD
 * pd_handle of the client's context (provider/client-context.h), so the caches above need no
 * second code path. It makes and drops MRs and nothing else: no PDs of its own, no pools
 * (rereg and park are the client's objects' business), no Dma, no events. */
#pragma once

#include <stdint.h>

#include "provider/provider.h"

struct client_context;

/* A provider over ctx (taken: closed with it) and its PD pd_handle; caps are the device's
 * (mrd's own context on it: the same device), less what this provider cannot do. */
int client_provider_open(struct client_context *ctx, uint32_t pd_handle,
			 const struct provider_caps *device_caps, struct provider **ret,
			 struct provider_pd **ret_pd);
