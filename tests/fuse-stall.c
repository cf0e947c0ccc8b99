/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fuse.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuse-stall.h"

/* The server: runs in a child until killed. */
_Noreturn static void fuse_serve(int dev)
{
	static uint8_t buf[FUSE_MIN_READ_BUFFER + 65536];
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);

	/* Gone with the suite, and holding none of its output pipes. */
	(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
	(void)dup2(null, STDOUT_FILENO);
	(void)dup2(null, STDERR_FILENO);

	for (;;) {
		struct fuse_in_header *in = (void *)buf;
		struct {
			struct fuse_out_header h;
			union {
				struct fuse_init_out init;
				struct fuse_entry_out entry;
				struct fuse_attr_out attr;
				struct fuse_open_out open;
			} u;
		} ans;
		struct fuse_attr *attr = NULL;
		size_t len = 0;
		ssize_t n = read(dev, buf, sizeof(buf));

		if (n < 0 && (errno == EINTR || errno == ENOENT))
			continue;
		if (n < (ssize_t)sizeof(*in))
			_exit(0); /* unmounted */
		memset(&ans, 0, sizeof(ans));
		switch (in->opcode) {
		case FUSE_INIT: {
			const struct fuse_init_in *i = (const void *)(in + 1);

			ans.u.init.major = FUSE_KERNEL_VERSION;
			ans.u.init.minor = FUSE_KERNEL_MINOR_VERSION;
			ans.u.init.max_readahead = i->max_readahead;
			ans.u.init.max_write = 4096;
			len = sizeof(ans.u.init);
			break;
		}
		case FUSE_LOOKUP:
			if (strcmp((const char *)(in + 1), "f") != 0) {
				ans.h.error = -ENOENT;
				break;
			}
			ans.u.entry.nodeid = 2;
			ans.u.entry.entry_valid = ans.u.entry.attr_valid = 3600;
			attr = &ans.u.entry.attr;
			len = sizeof(ans.u.entry);
			break;
		case FUSE_GETATTR:
			ans.u.attr.attr_valid = 3600;
			attr = &ans.u.attr.attr;
			len = sizeof(ans.u.attr);
			break;
		case FUSE_OPEN:
			ans.u.open.fh = 1;
			len = sizeof(ans.u.open);
			break;
		case FUSE_RELEASE:
		case FUSE_RELEASEDIR:
			break;
		case FUSE_FLUSH:
		case FUSE_STATFS: /* mrd must not ask: fstatfs would wait here too */
		case FUSE_FORGET:
		case FUSE_BATCH_FORGET:
		case FUSE_INTERRUPT:
			continue; /* no answer */
		default:
			ans.h.error = -ENOSYS;
		}
		if (attr) {
			attr->ino = in->opcode == FUSE_LOOKUP ? 2 : in->nodeid;
			attr->mode = attr->ino == FUSE_ROOT_ID ? S_IFDIR | 0755 : S_IFREG | 0600;
			attr->nlink = 1;
			attr->blksize = 4096;
		}
		ans.h.unique = in->unique;
		ans.h.len = (uint32_t)(sizeof(ans.h) + (ans.h.error ? 0 : len));
		(void)!write(dev, &ans, ans.h.len);
	}
}

int fuse_stall_start(struct fuse_stall *fs, char *why, size_t why_size)
{
	char opts[128];
	int dev, r;

	memset(fs, 0, sizeof(*fs));
	snprintf(fs->dir, sizeof(fs->dir), "/tmp/mrd-fuse-stall-XXXXXX");
	if (!mkdtemp(fs->dir)) {
		r = -errno;
		snprintf(why, why_size, "mkdtemp: %s", strerror(errno));
		fs->dir[0] = '\0';
		return r;
	}
	dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0", dev);
	if (dev < 0 || mount("mrd-test", fs->dir, "fuse", MS_NOSUID | MS_NODEV, opts) < 0) {
		r = -errno;
		snprintf(why, why_size, "no FUSE mount here (%s)", strerror(errno));
		if (dev >= 0)
			close(dev);
		rmdir(fs->dir);
		fs->dir[0] = '\0';
		return r;
	}
	fs->server = fork();
	if (fs->server < 0) {
		r = -errno;
		snprintf(why, why_size, "fork: %s", strerror(errno));
		close(dev);
		fuse_stall_stop(fs);
		return r;
	}
	if (fs->server == 0)
		fuse_serve(dev);
	close(dev);
	snprintf(fs->file, sizeof(fs->file), "%s/f", fs->dir);
	return 0;
}

void fuse_stall_stop(struct fuse_stall *fs)
{
	if (fs->server > 0) {
		(void)kill(fs->server, SIGKILL);
		(void)waitpid(fs->server, NULL, 0);
		fs->server = 0;
	}
	if (fs->dir[0]) {
		(void)umount2(fs->dir, MNT_DETACH);
		(void)rmdir(fs->dir);
		fs->dir[0] = '\0';
	}
}
