/* SPDX-License-Identifier: MIT */
/* A small libmrd client for tests/window-debuggers.sh, run under valgrind or built with
 * -fsanitize=thread: connects (timed), allocates, looks a key up, writes the memory.
 * Prints "connect_s=<seconds> lkey=<key>"; exits 1 naming the call that failed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mrd/mrd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	mrd_client *c;
	mrd_cache *l;
	uint32_t lkey;
	double t0;
	void *p;
	int r;

	if (argc != 2) {
		fprintf(stderr, "usage: window-client SOCKET\n");
		return 2;
	}
	t0 = now();
	r = mrd_client_connect(argv[1], &c);
	if (r < 0) {
		printf("connect: %s: %s\n", strerror(-r), mrd_last_error());
		return 1;
	}
	printf("connect_s=%.3f ", now() - t0);
	r = mrd_mem_alloc(c, 1 << 20, 0, 0, &p);
	if (r < 0) {
		printf("alloc: %s: %s\n", strerror(-r), mrd_last_error());
		return 1;
	}
	memset(p, 0x5a, 1 << 20);
	r = mrd_cache_new(c, &l);
	lkey = r < 0 ? MRD_KEY_INVALID : mrd_cache_lkey(l, (char *)p + 4096);
	if (lkey == MRD_KEY_INVALID) {
		printf("lookup: %s\n", mrd_last_error());
		return 1;
	}
	printf("lkey=0x%x\n", lkey);
	mrd_cache_free(l);
	r = mrd_mem_free(c, p);
	mrd_client_close(c);
	return r < 0;
}
