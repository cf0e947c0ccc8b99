/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "provider/provider.h"

int provider_open(const char *kind, const char *device, struct provider **ret,
		  int *ret_verbs_error)
{
	int r;

	*ret_verbs_error = 0;
	if (!kind || strcmp(kind, "auto") == 0) {
		r = provider_verbs_ops.open(device, ret);
		/* Fall back only when no device exists at all and none was asked for by name. */
		if (r != -ENODEV || device)
			return r;
		*ret_verbs_error = r;
		return provider_soft_ops.open(NULL, ret);
	}
	if (strcmp(kind, "verbs") == 0)
		return provider_verbs_ops.open(device, ret);
	if (strcmp(kind, "soft") == 0)
		return provider_soft_ops.open(device, ret);
	return -EINVAL;
}

const char *provider_strerror(const struct provider *p, int r)
{
	static __thread char why[96];

	if (r != -EKEYEXPIRED || !p->caps.max_keys)
		return strerror(-r);
	snprintf(why, sizeof(why), "the domain's %" PRIu64 " %s keys are used up (mrd(8), PROVIDERS)",
		 p->caps.max_keys, provider_name(p));
	return why;
}
