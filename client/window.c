/* SPDX-License-Identifier: MIT */
/* Memory windows: in the domain-PD model mrd binds them over its MRs, on its own QP (a
 * request each); with the program's own QP libmrd binds them itself (own-windows.c). */
#include <errno.h>
#include <stdint.h>

#include "call.h"
#include "handle.h"
#include "own-windows.h"
#include "mrd/mrd.h"

#define WINDOW_ACCESS (MRD_WINDOW_REMOTE_READ | MRD_WINDOW_REMOTE_WRITE | MRD_WINDOW_REMOTE_ATOMIC)

MRD_EXPORT int mrd_window_grant(mrd_client *client, void *qp, const void *addr, size_t len,
				unsigned access, uint32_t *rkey)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowGrantRequest q = MRD__WINDOW_GRANT_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	if (!client || !rkey || len == 0 || (uintptr_t)addr + len < (uintptr_t)addr ||
	    access == 0 || (access & ~WINDOW_ACCESS))
		return set_last_error(-EINVAL, "mrd_window_grant: bad argument");
	if (qp)
		return own_window_grant(client, qp, addr, len, access, rkey);
	q.address = (uintptr_t)addr;
	q.length = len;
	q.access = access;
	req.body_case = MRD__REQUEST__BODY_WINDOW_GRANT;
	req.window_grant = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_WINDOW_GRANT)
		r = set_last_error(-EBADMSG, "malformed WindowGrant reply");
	else
		*rkey = resp->window_grant->rkey;
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_window_revoke(mrd_client *client, void *qp, uint32_t rkey)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__WindowRevokeRequest q = MRD__WINDOW_REVOKE_REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	if (!client)
		return set_last_error(-EINVAL, "mrd_window_revoke: bad argument");
	if (qp)
		return own_window_revoke(client, qp, rkey);
	q.rkey = rkey;
	req.body_case = MRD__REQUEST__BODY_WINDOW_REVOKE;
	req.window_revoke = &q;
	r = client_call(client, &req, &resp, NULL);
	if (r < 0)
		return r;
	if (resp->body_case != MRD__RESPONSE__BODY_WINDOW_REVOKE)
		r = set_last_error(-EBADMSG, "malformed WindowRevoke reply");
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

MRD_EXPORT int mrd_window_qp_gone(mrd_client *client, void *qp)
{
	if (!client || !qp)
		return set_last_error(-EINVAL, "mrd_window_qp_gone: bad argument");
	return own_windows_qp_gone(client, qp);
}
