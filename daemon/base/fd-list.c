/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "macro.h"
#include "base/fd-list.h"

void fd_list_done(struct fd_list *f)
{
	for (size_t i = 0; i < f->n; i++) {
		safe_close(f->fds[i]);
		free(f->names[i]);
	}
	free(f->fds);
	free(f->names);
	*f = (struct fd_list){};
}

int fd_list_add(struct fd_list *f, int fd, const char *name)
{
	int *fds = realloc(f->fds, (f->n + 1) * sizeof(*fds));
	char **names;

	if (fds)
		f->fds = fds;
	names = fds ? realloc(f->names, (f->n + 1) * sizeof(*names)) : NULL;
	if (names)
		f->names = names;
	if (!fds || !names || !(f->names[f->n] = strdup(name))) {
		safe_close(fd);
		return -ENOMEM;
	}
	f->fds[f->n++] = fd;
	return 0;
}

int fd_list_take(struct fd_list *f, const char *name)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->fds[i] >= 0 && strcmp(f->names[i], name) == 0) {
			int fd = f->fds[i];

			f->fds[i] = -1;
			return fd;
		}
	return -ENOENT;
}

/* f's names joined by ':'; NULL: out of memory. */
static char *names_joined(const struct fd_list *f)
{
	size_t len = 1;
	char *names;

	for (size_t i = 0; i < f->n; i++)
		len += strlen(f->names[i]) + 1;
	names = calloc(1, len);
	for (size_t i = 0; names && i < f->n; i++) {
		if (i)
			strcat(names, ":");
		strcat(names, f->names[i]);
	}
	return names;
}

/* Every descriptor at above or higher. */
static int lift(struct fd_list *f, int above)
{
	for (size_t i = 0; i < f->n; i++) {
		int high = fcntl(f->fds[i], F_DUPFD_CLOEXEC, above);

		if (high < 0)
			return negative_errno();
		close(f->fds[i]);
		f->fds[i] = high;
	}
	return 0;
}

int fd_list_export(struct fd_list *f, int start)
{
	_cleanup_free_ char *names = names_joined(f);
	char num[32];
	int r;

	if (!names)
		return -ENOMEM;
	r = lift(f, start + (int)f->n);
	if (r < 0)
		return r;
	snprintf(num, sizeof(num), "%zu", f->n);
	setenv("LISTEN_FDS", num, 1);
	setenv("LISTEN_FDNAMES", names, 1);
	snprintf(num, sizeof(num), "%d", (int)getpid());
	setenv("LISTEN_PID", num, 1);
	return 0;
}

void fd_list_place(struct fd_list *f, int start)
{
	for (size_t i = 0; i < f->n; i++) {
		(void)dup2(f->fds[i], start + (int)i);
		close(f->fds[i]);
		f->fds[i] = -1;
	}
}
