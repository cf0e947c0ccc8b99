/* SPDX-License-Identifier: MIT */
/* The domain family: the two ways a client's QPs get keys of mrd's memory. ExportPd shares
 * the domain's device context and PD with the client; BindPd has mrd register into the
 * client's own PD. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fd-closer.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"
#include "core/domain.h"
#include "core/served-devices.h"
#include "provider/client-context.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"

int request_export_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		      struct wire_packet *pkt, struct reply *r)
{
	uint32_t handle;
	int fd, k;

	k = provider_export_pd(d->reg.base.pd, &fd, &handle);
	if (k == -EOPNOTSUPP) {
		reply_set_message(r, "the %s provider has no device to share",
				  provider_name(d->reg.base.provider));
		return k;
	}
	if (k < 0)
		return k;
	/* The context outlives mrd while the client holds it: the hand-over says who has it. */
	k = domain_note_export(d, &(struct context_holder){
					  .pid = c->owner.mem.pid, .uid = c->owner.mem.uid,
					  .start_time = mem_owner_start_time(&c->owner.mem),
					  .session = c->owner.mem.session });
	if (k == -EUSERS)
		reply_set_message(r, "domain %s: its device context is held by %d running "
				  "processes already, as many as mrd records for a hand-over",
				  d->name, DOMAIN_HOLDERS_MAX);
	if (k < 0) {
		close(fd);
		return k;
	}

	r->fds[r->n_fds++] = fd;
	mrd__export_pd_response__init(&r->body.export_pd);
	r->body.export_pd.pd_handle = handle;
	r->body.export_pd.device = d->reg.base.provider->caps.device;
	r->resp.body_case = MRD__RESPONSE__BODY_EXPORT_PD;
	r->resp.export_pd = &r->body.export_pd;
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
		if (n < core->n_domains + 1 && d->reg.base.provider &&
		    provider_cmd_fd(d->reg.base.provider) >= 0)
			fds[n++] = provider_cmd_fd(d->reg.base.provider);
	*ret = fds;
	*ret_n = n;
	return 0;
}

/* The fd is checked for itself first, so that a client learns what is wrong with it even
 * where mrd has no device to serve it. */
static int open_context(struct client *c, struct domain *d, int fd, struct client_context **ret,
			struct served_device **ret_device, struct reply *r)
{
	struct core *core = &c->manager->core;
	char ibdev[64];
	size_t n;
	int *fds, k;

	k = uverbs_fd_device(fd, "/sys", ibdev, sizeof(ibdev), r->message, sizeof(r->message));
	if (k < 0)
		return k;
	if (!d->reg.base.provider->ops->cmd_fd) {
		reply_set_message(r, "the %s provider has no RDMA device: BindPd needs mrd on a verbs "
				  "device (mrd --provider verbs)",
				  provider_name(d->reg.base.provider));
		return -EOPNOTSUPP;
	}
	*ret_device = served_device_find(core, ibdev);
	if (!*ret_device) {
		reply_set_message(r, "device %s is not one mrd serves ([mrd] devices = %s)", ibdev,
				  core->config.devices ? core->config.devices : "every one that opens");
		return -EXDEV;
	}
	k = own_fds(core, &fds, &n);
	if (k < 0)
		return k;
	k = client_context_open(fd, ibdev, "/sys", fds, n, ret, r->message, sizeof(r->message));
	free(fds);
	return k;
}

int request_bind_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		    struct wire_packet *pkt, struct reply *r)
{
	uint32_t handle = req->bind_pd->pd_handle;
	struct served_device *dev = NULL;
	struct client_context *ctx;
	int fd = take_request_fd(pkt, 0), k;

	if (c->bound || c->bound_lost) {
		reply_set_message(r, "this connection is bound to a PD already: one PD a "
				  "connection (connect again for another)");
		k = -EALREADY;
	} else if (c->keys_out) {
		reply_set_message(r, "BindPd comes before the connection's first MrLookup (or "
				  "anything else of the domain's PD): keys handed out before are of "
				  "the domain's PD");
		k = -EBUSY;
	} else
		k = open_context(c, d, fd, &ctx, &dev, r);
	/* mrd's copy, if any, was made: the received one goes where a client's fds go. */
	fd_closer_consume(c->manager->closer, fd, c->owner_uid);
	if (k < 0)
		return k;
	k = client_context_check_pd(ctx, handle, r->message, sizeof(r->message));
	if (k == -ENOENT)
		k = -EINVAL;
	if (k < 0) {
		client_context_close(ctx);
		return k;
	}
	k = bound_pd_open(&d->reg.cache, ctx, handle, &dev->caps, c->owner.mem.pid, &c->bound);
	if (k < 0)
		return k;
	c->bound_device = dev;
	dev->bound++;
	mrd__bind_pd_response__init(&r->body.bind_pd);
	r->body.bind_pd.device = dev->name;
	r->body.bind_pd.driver = c->bound->driver;
	r->resp.body_case = MRD__RESPONSE__BODY_BIND_PD;
	r->resp.bind_pd = &r->body.bind_pd;
	return 0;
}
