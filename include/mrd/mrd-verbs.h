/* SPDX-License-Identifier: MIT */
/*
 * Optional libibverbs helpers for libmrd users that post on QPs of their own. Two models: the
 * keys are of the program's own PD (mrd_verbs_bind_pd: any device mrd can register for), or
 * of the domain's PD, imported (mrd_verbs_import_pd: mlx5 alone, a PD shared with every
 * client of the domain). Only this header needs <infiniband/verbs.h>; link with -libverbs.
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

/*
 * Binds the handle to pd, a PD the program allocated on its own context (ibv_alloc_pd): the
 * keys mrd hands out through the handle from then on are valid on pd's QPs. pd must stay
 * allocated while the handle lives (mrd's MRs in it keep ibv_dealloc_pd at EBUSY meanwhile).
 * Before the first lookup; see mrd_client_bind_pd().
 */
static inline int mrd_verbs_bind_pd(mrd_client *client, struct ibv_pd *pd)
{
	if (!pd)
		return -EINVAL;
	return mrd_client_bind_pd(client, pd->context->cmd_fd, pd->handle);
}

#ifdef __cplusplus
}
#endif

#endif
