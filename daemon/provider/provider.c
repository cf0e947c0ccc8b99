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

int provider_advise(struct provider_mr *mr, enum provider_advice advice, uint64_t iova,
		    size_t length)
{
	struct provider *p = mr->pd->provider;
	uint64_t max = p->caps.advise_max;

	/* Cut at multiples of max, page-aligned as it is: whole pages in every piece. Lost, before
	 * any piece: -ENODEV, so a lose waiting for the prefetches in progress waits for one piece
	 * at most, not the rest of the range. */
	while (max && length > max - iova % max) {
		uint64_t piece = max - iova % max;
		int r = provider_lost(p) ? -ENODEV : p->ops->advise(mr, advice, iova, (size_t)piece);

		if (r < 0)
			return r;
		iova += piece;
		length -= (size_t)piece;
	}
	return provider_lost(p) ? -ENODEV : p->ops->advise(mr, advice, iova, length);
}

const char *provider_odp_bits_name(uint32_t bits, char *buf, size_t size)
{
	static const char *const names[] = { "send",   "recv", "write", "read",
					     "atomic", "srq",  "flush", "atomic_write" };
	size_t at = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (bits & (1u << i) && at < size)
			at += (size_t)snprintf(buf + at, size - at, "%s%s", at ? "," : "", names[i]);
	if (at == 0)
		snprintf(buf, size, "none");
	return buf;
}

const char *provider_odp_gap(const struct provider_caps *c, unsigned access, char *buf,
			     size_t size)
{
	char have[64], lack[64];

	if (provider_odp_covers(c, access))
		buf[0] = '\0';
	else if (!c->odp)
		snprintf(buf, size, "the device has no on-demand paging");
	else
		snprintf(buf, size, "the device's RC on-demand paging covers %s, not %s",
			 provider_odp_bits_name(c->odp_rc_caps, have, sizeof(have)),
			 provider_odp_bits_name(provider_odp_needs(access) & ~c->odp_rc_caps, lack,
						sizeof(lack)));
	return buf;
}
