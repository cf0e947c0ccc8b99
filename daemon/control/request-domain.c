/* SPDX-License-Identifier: MIT */
/* The domain family: the two ways a client's QPs get keys of mrd's memory. ExportPd shares
 * the domain's device context and PD with the client; BindPd has mrd register into the
 * client's own PD. */
#include "base/fd-closer.h"
#include "provider/provider.h"
#include "registration/bound-pd.h"
#include "core/domain.h"
#include "core/served-devices.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

int request_export_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		      struct wire_packet *pkt, struct reply *r)
{
	Mrd__ExportPdResponse *body;
	uint32_t handle;
	int fd, k;

	k = domain_export_pd(d, &(struct context_holder){
				     .pid = c->owner.mem.pid, .uid = c->owner.mem.uid,
				     .start_time = mem_owner_start_time(&c->owner.mem),
				     .session = c->owner.mem.session },
			     &fd, &handle, r->message, sizeof(r->message));
	if (k < 0)
		return k;
	r->fds[r->n_fds++] = fd;
	body = reply_body(r, MRD__RESPONSE__BODY_EXPORT_PD);
	body->pd_handle = handle;
	body->device = (char *)domain_provider(d)->caps.device;
	return 0;
}

int request_bind_pd(struct client *c, struct domain *d, const Mrd__Request *req,
		    struct wire_packet *pkt, struct reply *r)
{
	Mrd__BindPdResponse *body;
	int fd = take_request_fd(pkt, 0), k;

	if (c->bound || c->bound_lost) {
		reply_set_message(r, "this connection is bound to a PD already: one PD a "
				  "connection (connect again for another)");
		k = -EALREADY;
	} else if (c->keys_out) {
		reply_set_message(r, "mrd_client_bind_pd() comes before the handle's first key "
				  "lookup (or anything else of the domain's PD): keys handed out "
				  "before are of the domain's PD");
		k = -EBUSY;
	} else
		k = domain_bind_pd(d, fd, req->bind_pd->pd_handle, c->owner.mem.pid, &c->bound,
				   &c->bound_device, r->message, sizeof(r->message));
	/* mrd's copy, if any, was made: the received one goes where a client's fds go. */
	fd_closer_consume(c->manager->closer, fd, c->owner_uid);
	if (k < 0)
		return k;
	body = reply_body(r, MRD__RESPONSE__BODY_BIND_PD);
	body->device = c->bound_device->name;
	body->driver = c->bound->driver;
	return 0;
}
