/* SPDX-License-Identifier: MIT */
/*
 * Optional libibverbs helpers for libmrd users that create their own QPs and CQs on the PD of
 * their domain. Only this header needs <infiniband/verbs.h>; link with -libverbs.
 */
#ifndef MRD_MRD_VERBS_H
#define MRD_MRD_VERBS_H

#include <errno.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <mrd/mrd.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Imports the device context and PD of the caller's domain from mrd. The keys mrd hands out
 * for this domain are valid on *ret_pd. Release with ibv_unimport_pd(*ret_pd) (the PD belongs
 * to mrd: never ibv_dealloc_pd it) and ibv_close_device(*ret_context).
 * Returns 0 or a negative errno value; -EOPNOTSUPP on the soft provider.
 */
static inline int mrd_verbs_import_pd(mrd_client *client, struct ibv_context **ret_context,
				      struct ibv_pd **ret_pd)
{
	struct ibv_context *context;
	struct ibv_pd *pd;
	uint32_t handle;
	int fd, r;

	r = mrd_client_get_pd(client, &fd, &handle);
	if (r < 0)
		return r;
	context = ibv_import_device(fd);
	if (!context) {
		r = errno > 0 ? -errno : -EIO;
		close(fd);
		return r;
	}
	pd = ibv_import_pd(context, handle); /* the context owns fd from here on */
	if (!pd) {
		r = errno > 0 ? -errno : -EIO;
		ibv_close_device(context);
		return r;
	}
	*ret_context = context;
	*ret_pd = pd;
	return 0;
}

#ifdef __cplusplus
}
#endif

#endif
