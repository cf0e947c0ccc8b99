/* SPDX-License-Identifier: MIT */
/* A libmrd program that outlives a restart of mrd (systemctl restart mrd): it fills a buffer of
 * mrd's memory, waits until mrd goes away, reconnects, and finds the buffer where it was, with
 * its content; then asks for its keys again (the old ones died with the old mrd).
 * Usage: mrd-restart [SOCKET [SECONDS]]: how long to wait for mrd to go, and to come back. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mrd/mrd.h>

#define SIZE (4u << 20)

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 131 + 7);
}

static int fail(const char *what, int r)
{
	fprintf(stderr, "mrd-restart: %s: %s (%s)\n", what, strerror(-r), mrd_last_error());
	return EXIT_FAILURE;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : NULL; /* NULL: $MRD_SOCKET, else the default */
	int seconds = argc > 2 ? atoi(argv[2]) : 60;
	struct mrd_keys keys;
	mrd_client *client;
	uint8_t *buf;
	int r;

	r = mrd_client_connect(path, &client);
	if (r < 0)
		return fail("connect", r);
	r = mrd_mem_alloc_keys(client, SIZE, 0, 0, (void **)&buf, &keys);
	if (r < 0)
		return fail("alloc", r);
	for (size_t i = 0; i < SIZE; i++)
		buf[i] = pattern(i);
	printf("ready: 4 MiB at %p, lkey 0x%x\n", (void *)buf, keys.lkey);
	fflush(stdout);

	/* mrd going away shows as POLLHUP on the handle's descriptor. */
	struct pollfd p = { .fd = mrd_client_fd(client), .events = POLLRDHUP };
	if (poll(&p, 1, seconds * 1000) != 1)
		return fail("waiting for mrd to go away", -ETIMEDOUT);
	printf("mrd went away: %s\n", strerror(-mrd_client_check(client)));

	/* The next mrd may not listen yet: try again, for as long as we waited. */
	for (int tries = seconds * 10; tries > 0; tries--) {
		r = mrd_client_reconnect(client);
		if (r != -ECONNREFUSED && r != -ENOENT && r != -ECONNRESET)
			break;
		nanosleep(&(struct timespec){ .tv_nsec = 100000000 }, NULL);
	}
	if (r < 0)
		return fail("reconnect", r);
	for (size_t i = 0; i < SIZE; i++)
		if (buf[i] != pattern(i)) {
			printf("reconnected: %d allocations back, but byte %zu at %p changed\n", r, i,
			       (void *)buf);
			return EXIT_FAILURE;
		}
	printf("reconnected: %d allocations back, 4 MiB at %p with its content\n", r, (void *)buf);
	r = mrd_keys_query(client, buf, &keys);
	if (r < 0)
		return fail("keys after the restart", r);
	printf("keys again: lkey 0x%x\n", keys.lkey);
	r = mrd_mem_free(client, buf);
	mrd_client_close(client);
	return r < 0 ? fail("free", r) : EXIT_SUCCESS;
}
