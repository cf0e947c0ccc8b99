/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* A client's own verbs context, reached through its uverbs command fd (DESIGN.md §3, client
 * PD): mrd registers its own mapping of the client's memory into a PD of that context with
 * REG_MR through the kernel's ioctl path, so the MR is the client's (its QPs use the keys, its
 * last fd's close destroys the MR) while the kernel pins mrd's pages (mrd holds CAP_IPC_LOCK).
 * The fd comes from the client: it is checked before the first ioctl, and the driver must be
 * one whose REG_MR needs no driver data. */
struct client_context;

struct client_mr {
	uint32_t handle; /* in the client's context: what DEREG_MR names */
	uint32_t lkey, rkey;
};

/* The RDMA device whose uverbs character device fd is, looked up under sysfs_root ("/sys" in
 * mrd: class/infiniband_verbs/uverbsN/{dev,ibdev}); its name goes to ibdev. -ENOTTY (with why,
 * which names what fd is instead): fd is no uverbs device, or its kind cannot be told; -EBADF:
 * no fd. Nothing of fd is read, and its filesystem is asked nothing (a FUSE server that never
 * answers): statx without a sync, and sysfs. */
int uverbs_fd_device(int fd, const char *sysfs_root, char *ibdev, size_t ibdev_size, char *why,
		     size_t why_size);

/* Takes a duplicate of fd (close-on-exec; the caller keeps its own) once it is a uverbs device
 * of device with a driver mrd can register for; -EXDEV: another device's; -EOPNOTSUPP: its
 * driver's REG_MR needs driver data (or is unknown); -ENOTTY, -EBADF as uverbs_fd_device.
 * -EPERM: fd is the open file of one of own_fds (mrd's own contexts, whose cmd_fd an importer
 * holds: every check above passes for it, but an MR made there is no client's, outlives the
 * client and its memory), or mrd cannot tell (no kcmp). */
int client_context_open(int fd, const char *device, const char *sysfs_root, const int *own_fds,
			size_t n_own_fds, struct client_context **ret, char *why, size_t why_size);
/* Closes mrd's copy: once the client's are closed too, the kernel destroys every object of the
 * context, the MRs mrd made in it with them. NULL is fine. */
void client_context_close(struct client_context *ctx);

/* The kernel's name of the driver (RDMA_DRIVER_*), e.g. "rxe". */
const char *client_context_driver(const struct client_context *ctx);

/* REG_MR of [start, start + length) of mrd's own mapping into PD pd_handle of the context, at
 * iova (the client's address: same offset in the page). Negative errno as the kernel answers
 * (-EINVAL for a PD handle the context does not have, -EIO once the device is gone). */
int client_context_reg(struct client_context *ctx, uint32_t pd_handle, void *start,
		       size_t length, uint64_t iova, unsigned ib_access, struct client_mr *ret);
int client_context_dereg(struct client_context *ctx, uint32_t mr_handle);
/* Deallocates memory window mw_handle of the context (IB_USER_VERBS_CMD_DEALLOC_MW): the kernel
 * destroys it only if that handle is a window's (uobj_perform_destroy checks the type). */
int client_context_dealloc_mw(struct client_context *ctx, uint32_t mw_handle);

/* Whether pd_handle is a PD of the context that mrd can register into: one page of mrd's own
 * registered and deregistered there. 0, or the reason in why. */
int client_context_check_pd(struct client_context *ctx, uint32_t pd_handle, char *why,
			    size_t why_size);
