/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>

#include "provider.h"

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
