/* SPDX-License-Identifier: MIT */
/* On mlx5, ibv_open_device creates the context's DEVX uid with the opener's rights: RAW_TX
 * where it is capable(CAP_NET_RAW), INTERNAL_DEV_RES where capable(CAP_SYS_RAWIO) (Linux
 * drivers/infiniband/hw/mlx5/devx.c mlx5_ib_devx_create, called by mlx5_ib_alloc_ucontext in
 * main.c). A client that imports the context (ibv_import_device on the exported cmd_fd) acts
 * under that uid. The kernel's other raw-packet checks (uverbs_cmd.c, fs.c: flow steering)
 * ask capable() of the caller, which mrd's clients are not. mrd needs neither right. */
#include <errno.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "base/privileges.h"

static const int raw_caps[] = { CAP_NET_RAW, CAP_SYS_RAWIO };

int privileges_drop_raw(void)
{
	struct __user_cap_header_struct head = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3] = {};

	/* The bounding set first: shrinking it takes CAP_SETPCAP, which capset keeps. */
	for (size_t i = 0; i < sizeof(raw_caps) / sizeof(raw_caps[0]); i++) {
		if (prctl(PR_CAPBSET_READ, raw_caps[i], 0, 0, 0) == 1 &&
		    prctl(PR_CAPBSET_DROP, raw_caps[i], 0, 0, 0) < 0)
			(void)log_full_errno(errno == EPERM ? LOG_LEVEL_DEBUG : LOG_LEVEL_NOTICE,
					     -errno, "cannot drop capability %d from the bounding "
					     "set: %m", raw_caps[i]);
		/* EINVAL: a kernel without ambient capabilities (before 4.3) has none to lower */
		if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, raw_caps[i], 0, 0) < 0 &&
		    errno != EINVAL)
			return log_error_errno(-errno, "cannot lower ambient capability %d: %m",
					       raw_caps[i]);
	}
	if (syscall(SYS_capget, &head, caps) < 0)
		return log_error_errno(-errno, "capget: %m");
	for (size_t i = 0; i < sizeof(raw_caps) / sizeof(raw_caps[0]); i++) {
		struct __user_cap_data_struct *c = &caps[CAP_TO_INDEX(raw_caps[i])];

		c->effective &= ~CAP_TO_MASK(raw_caps[i]);
		c->permitted &= ~CAP_TO_MASK(raw_caps[i]);
		c->inheritable &= ~CAP_TO_MASK(raw_caps[i]);
	}
	if (syscall(SYS_capset, &head, caps) < 0) /* giving up is always allowed */
		return log_error_errno(-errno, "capset: %m");
	return 0;
}
