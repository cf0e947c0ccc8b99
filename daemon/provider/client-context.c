/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/kcmp.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl.h>

#include "macro.h"
#include "provider/client-context.h"

struct client_context {
	int fd;             /* mrd's duplicate of the client's command fd */
	uint32_t driver_id; /* RDMA_DRIVER_*: each ioctl header names it */
	const char *driver;
};

/* Drivers whose rdma-core provider sends REG_MR with the core command and response alone, as
 * mrd does (rdma-core providers/mlx5/verbs.c mlx5_reg_mr, rxe/rxe.c rxe_reg_mr: a bare struct
 * ibv_reg_mr and ib_uverbs_reg_mr_resp). Others add driver data: siw a key byte in and the
 * STag out (providers/siw/siw.c siw_reg_mr; the kernel's siw_reg_user_mr refuses a command
 * without them), irdma a reg_type (providers/irdma/uverbs.c irdma_ureg_mr). */
static const struct {
	uint32_t id;
	const char *name;
} drivers[] = {
	{ RDMA_DRIVER_MLX5, "mlx5" },
	{ RDMA_DRIVER_RXE, "rxe" },
};

static int read_line(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return negative_errno();
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return -EIO;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/* What a file of this mode is, for a refusal. */
static const char *file_kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return "a regular file";
	case S_IFDIR:
		return "a directory";
	case S_IFIFO:
		return "a pipe";
	case S_IFSOCK:
		return "a socket";
	case S_IFBLK:
		return "a block device";
	case S_IFLNK:
		return "a symbolic link";
	case 0:
		return "an anonymous file (eventfd, epoll, ...)";
	default:
		return "a file of no known kind";
	}
}

int uverbs_fd_device(int fd, const char *sysfs_root, char *ibdev, size_t ibdev_size, char *why,
		     size_t why_size)
{
	char dir[512], path[1024], line[64];
	struct statx stx;
	struct dirent *e;
	dev_t rdev;
	DIR *d;
	int r = -ENOTTY;

	/* AT_STATX_DONT_SYNC: what the kernel holds of the inode. fstat asks a FUSE file's server
	 * whenever its attributes are stale, and one that never answers froze mrd's loop. */
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &stx) < 0) {
		r = negative_errno();
		if (r == -EBADF) {
			snprintf(why, why_size, "no such file descriptor");
			return r;
		}
		snprintf(why, why_size, "mrd cannot tell what file it is (statx: %s), so no uverbs "
			 "command file", strerror(-r));
		return -ENOTTY;
	}
	if (!(stx.stx_mask & STATX_TYPE)) {
		/* FUSE without allow_other tells mrd nothing of its files. */
		snprintf(why, why_size, "its filesystem does not tell mrd what file it is, so no "
			 "uverbs command file");
		return -ENOTTY;
	}
	if (!S_ISCHR(stx.stx_mode)) {
		snprintf(why, why_size, "%s, not a character device, so no uverbs command file",
			 file_kind(stx.stx_mode));
		return -ENOTTY;
	}
	rdev = makedev(stx.stx_rdev_major, stx.stx_rdev_minor);
	snprintf(dir, sizeof(dir), "%s/class/infiniband_verbs", sysfs_root);
	d = opendir(dir);
	if (!d) {
		snprintf(why, why_size, "character device %u:%u is no uverbs device (no %s)",
			 major(rdev), minor(rdev), dir);
		return -ENOTTY;
	}
	while (r < 0 && (e = readdir(d))) {
		unsigned maj, min;

		if (strncmp(e->d_name, "uverbs", 6) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s/dev", dir, e->d_name);
		if (read_line(path, line, sizeof(line)) < 0 ||
		    sscanf(line, "%u:%u", &maj, &min) != 2 || makedev(maj, min) != rdev)
			continue;
		snprintf(path, sizeof(path), "%s/%s/ibdev", dir, e->d_name);
		if (read_line(path, ibdev, ibdev_size) == 0 && *ibdev)
			r = 0;
	}
	closedir(d);
	if (r < 0)
		snprintf(why, why_size, "character device %u:%u is no uverbs device",
			 major(rdev), minor(rdev));
	return r;
}

/* The header alone: the kernel checks driver_id before it looks the method up
 * (Linux 6.12 drivers/infiniband/core/uverbs_ioctl.c, ib_uverbs_cmd_verbs), so a method no
 * object has tells the context's driver without doing anything: -EPROTONOSUPPORT for the
 * right id, -EINVAL for a wrong one. */
static int probe_driver(int fd, uint32_t id)
{
	struct ib_uverbs_ioctl_hdr hdr = {
		.length = sizeof(hdr),
		.object_id = UVERBS_OBJECT_DEVICE,
		.method_id = 0xffff,
		.driver_id = id,
	};

	return ioctl(fd, RDMA_VERBS_IOCTL, &hdr) < 0 ? negative_errno() : 0;
}

/* Whether fd is the open file of one of own (kcmp KCMP_FILE: fstat cannot tell two opens of a
 * uverbs node apart). 1, 0, or negative errno where the kernel cannot say. */
static int own_file(int fd, const int *own, size_t n)
{
	pid_t pid = getpid();

	for (size_t i = 0; i < n; i++) {
		long k = syscall(SYS_kcmp, pid, pid, KCMP_FILE, fd, own[i]);

		if (k == 0)
			return 1;
		if (k < 0)
			return negative_errno();
	}
	return 0;
}

int client_context_open(int fd, const char *device, const char *sysfs_root, const int *own_fds,
			size_t n_own_fds, struct client_context **ret, char *why, size_t why_size)
{
	struct client_context *ctx;
	char ibdev[64];
	int r = uverbs_fd_device(fd, sysfs_root, ibdev, sizeof(ibdev), why, why_size);
	uint32_t id;

	if (r < 0)
		return r;
	if (strcmp(ibdev, device) != 0) {
		snprintf(why, why_size, "a context of device %s, not of %s", ibdev, device);
		return -EXDEV;
	}
	r = own_file(fd, own_fds, n_own_fds);
	if (r != 0) {
		if (r > 0)
			snprintf(why, why_size, "the file of one of mrd's own contexts on %s, not a "
				 "client's", device);
		else
			snprintf(why, why_size, "cannot tell whether it is one of mrd's own contexts "
				 "(kcmp: %s)", strerror(-r));
		return -EPERM;
	}
	for (id = 0; id < 64; id++) {
		r = probe_driver(fd, id);
		if (r != -EINVAL)
			break;
	}
	if (r != -EPROTONOSUPPORT) {
		snprintf(why, why_size, "the uverbs file of %s answers no driver (%s)", device,
			 r == -EINVAL ? "none of 64 ids" : strerror(-r));
		return r == -EINVAL || r == 0 ? -ENOTTY : r;
	}
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	ctx->driver_id = id;
	for (size_t i = 0; i < ELEMENTSOF(drivers); i++)
		if (drivers[i].id == id)
			ctx->driver = drivers[i].name;
	if (!ctx->driver) {
		snprintf(why, why_size, "%s's driver (RDMA_DRIVER id %u) is not one whose REG_MR "
			 "mrd can send (mlx5, rxe: their REG_MR carries no driver data)",
			 device, id);
		free(ctx);
		return -EOPNOTSUPP;
	}
	ctx->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (ctx->fd < 0) {
		r = negative_errno();
		snprintf(why, why_size, "cannot keep the context's file: %s", strerror(-r));
		free(ctx);
		return r;
	}
	*ret = ctx;
	return 0;
}

void client_context_close(struct client_context *ctx)
{
	if (!ctx)
		return;
	close(ctx->fd);
	free(ctx);
}

const char *client_context_driver(const struct client_context *ctx)
{
	return ctx->driver;
}

/* One write command (IB_USER_VERBS_CMD_*) through the ioctl path: the write() path refuses a
 * caller with other credentials than the opener's (ib_safe_file_access), the ioctl path does
 * not, and takes no driver data here (no UVERBS_ATTR_UHW). */
static int invoke_write(struct client_context *ctx, uint32_t cmd, void *in, size_t in_len,
			void *out, size_t out_len)
{
	struct {
		struct ib_uverbs_ioctl_hdr hdr;
		struct ib_uverbs_attr attrs[3];
	} c;

	memset(&c, 0, sizeof(c));
	c.hdr.object_id = UVERBS_OBJECT_DEVICE;
	c.hdr.method_id = UVERBS_METHOD_INVOKE_WRITE;
	c.hdr.num_attrs = out_len ? 3 : 2; /* the kernel wants length to match num_attrs */
	c.hdr.length = (uint16_t)(sizeof(c.hdr) + c.hdr.num_attrs * sizeof(c.attrs[0]));
	c.hdr.driver_id = ctx->driver_id;
	c.attrs[0].attr_id = UVERBS_ATTR_WRITE_CMD;
	c.attrs[0].len = sizeof(uint64_t);
	c.attrs[0].data = cmd;
	c.attrs[1].attr_id = UVERBS_ATTR_CORE_IN;
	c.attrs[1].len = (uint16_t)in_len;
	if (in_len <= sizeof(c.attrs[1].data)) /* the kernel takes what fits in data inline */
		memcpy(&c.attrs[1].data, in, in_len);
	else
		c.attrs[1].data = (uintptr_t)in;
	c.attrs[2].attr_id = UVERBS_ATTR_CORE_OUT;
	c.attrs[2].len = (uint16_t)out_len;
	c.attrs[2].data = (uintptr_t)out;
	return ioctl(ctx->fd, RDMA_VERBS_IOCTL, &c) < 0 ? negative_errno() : 0;
}

int client_context_reg(struct client_context *ctx, uint32_t pd_handle, void *start,
		       size_t length, uint64_t iova, unsigned ib_access, struct client_mr *ret)
{
	struct ib_uverbs_reg_mr cmd = {
		.start = (uintptr_t)start,
		.length = length,
		.hca_va = iova,
		.pd_handle = pd_handle,
		.access_flags = ib_access,
	};
	struct ib_uverbs_reg_mr_resp resp = { 0 };
	int r;

	if (length == 0) /* the page offsets the kernel checks (ib_uverbs_reg_mr) */
		return -EINVAL;
	r = invoke_write(ctx, IB_USER_VERBS_CMD_REG_MR, &cmd, sizeof(cmd), &resp, sizeof(resp));
	if (r < 0)
		return r;
	*ret = (struct client_mr){ resp.mr_handle, resp.lkey, resp.rkey };
	return 0;
}

int client_context_dereg(struct client_context *ctx, uint32_t mr_handle)
{
	struct ib_uverbs_dereg_mr cmd = { .mr_handle = mr_handle };

	return invoke_write(ctx, IB_USER_VERBS_CMD_DEREG_MR, &cmd, sizeof(cmd), NULL, 0);
}

int client_context_dealloc_mw(struct client_context *ctx, uint32_t mw_handle)
{
	struct ib_uverbs_dealloc_mw cmd = { .mw_handle = mw_handle };

	return invoke_write(ctx, IB_USER_VERBS_CMD_DEALLOC_MW, &cmd, sizeof(cmd), NULL, 0);
}

int client_context_check_pd(struct client_context *ctx, uint32_t pd_handle, char *why,
			    size_t why_size)
{
	size_t ps = (size_t)sysconf(_SC_PAGESIZE);
	void *page = mmap(NULL, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct client_mr mr;
	int r;

	if (page == MAP_FAILED)
		return negative_errno();
	memset(page, 0, ps); /* present: the kernel pins it */
	r = client_context_reg(ctx, pd_handle, page, ps, (uintptr_t)page,
			       IB_UVERBS_ACCESS_LOCAL_WRITE, &mr);
	if (r < 0)
		snprintf(why, why_size, "cannot register into PD %u of the %s context: %s%s",
			 pd_handle, ctx->driver, strerror(-r),
			 r == -EINVAL || r == -ENOENT ?
				 " (no such PD in that context, or no context yet)" : "");
	else if ((r = client_context_dereg(ctx, mr.handle)) < 0)
		snprintf(why, why_size, "cannot deregister a probe MR in PD %u of the %s context: %s",
			 pd_handle, ctx->driver, strerror(-r));
	munmap(page, ps);
	return r;
}
