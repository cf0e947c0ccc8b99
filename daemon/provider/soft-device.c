/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "provider/soft-device.h"

static struct {
	pthread_mutex_t lock;
	unsigned users; /* open contexts */
	int fd;
	bool failed;
	bool removed; /* failed by 'G': without an event */
	bool port_down;
} dev = { PTHREAD_MUTEX_INITIALIZER, 0, -1, false, false, false };

/* $MRD_SOFT_EVENTS, a test knob: a FIFO (a file would read as events once, then EOF). */
static int events_fifo_open(int *ret)
{
	const char *path = getenv("MRD_SOFT_EVENTS");
	struct stat st;
	int fd;

	*ret = -1;
	if (!path || !*path)
		return 0;
	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		log_error_errno(-errno, "MRD_SOFT_EVENTS: cannot open %s: %m", path);
		return -EINVAL;
	}
	if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
		close(fd);
		log_error("MRD_SOFT_EVENTS: %s is not a FIFO (mkfifo(3) it)", path);
		return -EINVAL;
	}
	*ret = fd;
	return 0;
}

int soft_device_open(void)
{
	int r = 0;

	pthread_mutex_lock(&dev.lock);
	if (dev.users == 0)
		r = events_fifo_open(&dev.fd);
	if (r == 0)
		dev.users++;
	pthread_mutex_unlock(&dev.lock);
	return r;
}

void soft_device_close(void)
{
	pthread_mutex_lock(&dev.lock);
	if (--dev.users == 0 && dev.fd >= 0) {
		close(dev.fd);
		dev.fd = -1;
	}
	pthread_mutex_unlock(&dev.lock);
}

int soft_device_fd(void)
{
	return dev.fd; /* set while any context is open, which its caller is */
}

/* Locked. */
static int read_locked(struct provider_event *ret)
{
	char c;

	if (dev.fd < 0)
		return -EAGAIN;
	for (;;) {
		ssize_t n = read(dev.fd, &c, 1);

		if (n == 1)
			break;
		if (n < 0 && errno == EINTR)
			continue;
		return -EAGAIN;
	}
	*ret = (struct provider_event){ .kind = PROVIDER_EVENT_OTHER, .name = "unknown" };
	switch (c) {
	case 'F':
		__atomic_store_n(&dev.failed, true, __ATOMIC_RELEASE);
		*ret = (struct provider_event){ .kind = PROVIDER_EVENT_DEVICE_FATAL,
						.name = "device fatal error" };
		break;
	case 'G': /* removed, as rxe is: no event says so (soft_device_removed) */
		__atomic_store_n(&dev.failed, true, __ATOMIC_RELEASE);
		dev.removed = true;
		ret->name = "device removed";
		break;
	case 'R':
		dev.removed = false;
		__atomic_store_n(&dev.failed, false, __ATOMIC_RELEASE);
		ret->name = "device back";
		break;
	case 'D':
		__atomic_store_n(&dev.port_down, true, __ATOMIC_RELAXED);
		*ret = (struct provider_event){ .kind = PROVIDER_EVENT_PORT_DOWN, .port = 1,
						.name = "port error" };
		break;
	case 'U':
		__atomic_store_n(&dev.port_down, false, __ATOMIC_RELAXED);
		*ret = (struct provider_event){ .kind = PROVIDER_EVENT_PORT_ACTIVE, .port = 1,
						.name = "port active" };
		break;
	case 'Q':
		*ret = (struct provider_event){ .kind = PROVIDER_EVENT_FOREIGN,
						.name = "local work queue catastrophic error" };
		break;
	}
	return 0;
}

int soft_device_read_event(struct provider_event *ret)
{
	int r;

	pthread_mutex_lock(&dev.lock);
	r = read_locked(ret);
	pthread_mutex_unlock(&dev.lock);
	return r;
}

bool soft_device_failed(void)
{
	struct provider_event ev;
	bool failed;

	if (!__atomic_load_n(&dev.failed, __ATOMIC_ACQUIRE))
		return false; /* every op asks: no lock while the device is well */
	pthread_mutex_lock(&dev.lock);
	if (dev.failed)
		while (read_locked(&ev) == 0 && dev.failed)
			;
	failed = dev.failed;
	pthread_mutex_unlock(&dev.lock);
	return failed;
}

bool soft_device_port_active(void)
{
	return !__atomic_load_n(&dev.port_down, __ATOMIC_RELAXED);
}

bool soft_device_removed(void)
{
	bool removed;

	if (!soft_device_failed())
		return false;
	pthread_mutex_lock(&dev.lock);
	removed = dev.removed;
	pthread_mutex_unlock(&dev.lock);
	return removed;
}
