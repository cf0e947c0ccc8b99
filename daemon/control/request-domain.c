/* SPDX-License-Identifier: MIT */
/* The domain family: ExportPd (share the domain's device context and PD with a client). */
#include <errno.h>
#include <unistd.h>

#include "control/client.h"
#include "control/dispatch.h"
#include "core/domain.h"
#include "provider/provider.h"

int request_export_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		      struct wire_packet *pkt, struct reply *r)
{
	uint32_t handle;
	int fd, k;

	k = provider_export_pd(d->reg.pd, &fd, &handle);
	if (k == -EOPNOTSUPP) {
		reply_set_message(r, "the %s provider has no device to share",
				  provider_name(d->reg.provider));
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
	r->body.export_pd.device = d->reg.provider->caps.device;
	r->resp.body_case = MRD__RESPONSE__BODY_EXPORT_PD;
	r->resp.export_pd = &r->body.export_pd;
	return 0;
}
