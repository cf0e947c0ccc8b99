/* SPDX-License-Identifier: MIT */
/* The two ways a client's QPs get keys of a domain's memory: ExportPd shares the domain's
 * device context and PD with the client; BindPd has mrd register into the client's own PD. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "provider/client-context.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"
#include "core/core.h"
#include "core/domain.h"
#include "core/served-devices.h"

int domain_export_pd(struct domain *d, const struct context_holder *holder, int *ret_fd,
		     uint32_t *ret_handle, char *why, size_t why_size)
{
	uint32_t handle;
	int fd, k;

	k = provider_export_pd(d->reg.base.pd, &fd, &handle);
	if (k == -EOPNOTSUPP) {
		snprintf(why, why_size, "the %s provider has no device to share",
			 provider_name(d->reg.base.provider));
		return k;
	}
	if (k < 0)
		return k;
	/* The context outlives mrd while the client holds it: the hand-over says who has it. */
	k = domain_note_export(d, holder);
	if (k == -EUSERS)
		snprintf(why, why_size, "domain %s: its device context is held by %d running "
			 "processes already, as many as mrd records for a hand-over", d->name,
			 DOMAIN_HOLDERS_MAX);
	if (k < 0) {
		close(fd);
		return k;
	}
	*ret_fd = fd;
	*ret_handle = handle;
	return 0;
}

/* The command fds of every context mrd has open on the device (the domains' and the one the
 * core checks with): a client that imported one (ExportPd) holds a copy, which passes every
 * other check of a client's own context. */
static int own_fds(struct core *core, int **ret, size_t *ret_n)
{
	int *fds = calloc(core->n_domains + 1, sizeof(*fds));
	const struct domain *d;
	size_t n = 0;

	if (!fds)
		return -ENOMEM;
	if (provider_cmd_fd(core->provider) >= 0)
		fds[n++] = provider_cmd_fd(core->provider);
	LIST_FOREACH(d, &core->domains, link)
		if (n < core->n_domains + 1 && d->reg.base.provider && provider_cmd_fd(d->reg.base.provider) >= 0)
			fds[n++] = provider_cmd_fd(d->reg.base.provider);
	*ret = fds;
	*ret_n = n;
	return 0;
}

/* The fd is checked for itself first, so that a client learns what is wrong with it even
 * where mrd has no device to serve it. */
static int open_context(struct domain *d, int fd, struct client_context **ret,
			struct served_device **ret_device, char *why, size_t why_size)
{
	struct core *core = d->core;
	struct served_device *dev;
	char ibdev[64];
	size_t n;
	int *fds, k;

	k = uverbs_fd_device(fd, "/sys", ibdev, sizeof(ibdev), why, why_size);
	if (k < 0)
		return k;
	if (!d->reg.base.provider->ops->cmd_fd) {
		snprintf(why, why_size, "the %s provider has no RDMA device: mrd_client_bind_pd() needs mrd on a "
			 "verbs device (mrd --provider verbs)", provider_name(d->reg.base.provider));
		return -EOPNOTSUPP;
	}
	dev = served_device_find(core, ibdev);
	if (!dev) {
		snprintf(why, why_size, "device %s is not one mrd serves ([mrd] devices = %s)", ibdev,
			 core->config.devices ? core->config.devices : "every one that opens");
		return -EXDEV;
	}
	k = own_fds(core, &fds, &n);
	if (k < 0)
		return k;
	k = client_context_open(fd, ibdev, "/sys", fds, n, ret, why, why_size);
	free(fds);
	if (k >= 0)
		*ret_device = dev;
	return k;
}

int domain_bind_pd(struct domain *d, int fd, uint32_t pd_handle, pid_t pid,
		   struct bound_pd **ret, struct served_device **ret_device, char *why,
		   size_t why_size)
{
	struct served_device *dev;
	struct client_context *ctx;
	int k;

	k = open_context(d, fd, &ctx, &dev, why, why_size);
	if (k < 0)
		return k;
	k = client_context_check_pd(ctx, pd_handle, why, why_size);
	if (k == -ENOENT)
		k = -EINVAL;
	if (k < 0) {
		client_context_close(ctx);
		return k;
	}
	k = bound_pd_open(&d->reg.cache, ctx, pd_handle, &dev->caps, pid, ret);
	if (k < 0)
		return k;
	served_device_bind(dev);
	*ret_device = dev;
	return 0;
}
