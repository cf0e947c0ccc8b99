/* SPDX-License-Identifier: MIT */
/* Shutdown and Reload: mrctl's stop and reload for hosts without systemd, on the socket rather
 * than by a signal to a pid, so that they work across pid namespaces and only root and the
 * admin group may make them (the dispatch table's .admin). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/client.h"
#include "control/dispatch.h"
#include "control/manager.h"

int request_shutdown(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		     struct wire_packet *pkt, struct reply *r)
{
	Mrd__ShutdownResponse *body = reply_body(r, MRD__RESPONSE__BODY_SHUTDOWN);
	char by[96];

	body->pid = (uint32_t)getpid();
	snprintf(by, sizeof(by), "mrctl shutdown from pid %d uid %u", (int)c->owner.mem.pid,
		 (unsigned)c->owner.mem.uid);
	/* The loop stops after this event: the reply is sent (or queued and dropped with the
	 * client) first. */
	manager_shutdown(c->manager, by);
	return 0;
}

int request_reload(struct client *c, struct domain *no_domain, const Mrd__Request *req,
		   struct wire_packet *pkt, struct reply *r)
{
	Mrd__ReloadResponse *body;
	char by[96], changed[512], *keys;
	int k;

	snprintf(by, sizeof(by), "mrctl reload from pid %d uid %u", (int)c->owner.mem.pid,
		 (unsigned)c->owner.mem.uid);
	k = manager_reload(c->manager, by, changed, sizeof(changed));
	if (k == -EOPNOTSUPP) {
		reply_set_message(r, "this mrd has no configuration to reload");
		return k;
	}
	if (k < 0) {
		reply_set_message(r, "the configuration has errors (mrd's log says where): the "
				  "running one stays");
		return -EINVAL;
	}
	keys = strdup(changed);
	r->owned[r->n_owned++] = keys;
	if (!keys)
		return -ENOMEM;
	body = reply_body(r, MRD__RESPONSE__BODY_RELOAD);
	body->restart_keys = keys;
	return 0;
}
