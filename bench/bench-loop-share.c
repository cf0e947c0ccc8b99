/* SPDX-License-Identifier: MIT */
/* make bench: a victim's Ping while 16 processes of one user send MrLookups of 64 cold 4 KiB
 * buffers each (issue 36: 64 small registrations per request, all on the loop, put the
 * victim's p99 at 1.16 s); then another user's lookups of fresh 2 MiB buffers (registered on
 * a worker) while 4 processes of the first register 256 MiB ones (issue 36: one FIFO of two
 * workers made them wait 845 ms p50). Prints the victim's p50, p99 and worst round trip idle
 * and under that load, and the attackers' rate: figures, to compare builds of mrd
 * ($MRD_BUILDDIR), not targets. Usage: bench-loop-share [rounds per attacker, default 8].
 * The second figure needs root (its victim is user nobody); it is left out otherwise. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "bench-util.h"

#define ATTACKERS 16
#define ADDRS 64 /* MrLookup's most */
#define BUF 4096
#define IDLE_PINGS 2000

/* One MrLookup of n addresses over the raw connection fd: 0 or -errno. */
static int lookup(int fd, uint64_t id, uint64_t *addrs, size_t n)
{
	static uint8_t buf[65536];
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MrLookupRequest q = MRD__MR_LOOKUP_REQUEST__INIT;
	Mrd__Response *resp;
	size_t len;
	int r;

	q.addresses = addrs;
	q.n_addresses = n;
	req.id = id;
	req.body_case = MRD__REQUEST__BODY_MR_LOOKUP;
	req.mr_lookup = &q;
	r = wire_send(fd, &req.base, WIRE_FRAME_MAX, NULL, 0, 0);
	if (r >= 0)
		r = bench_recv_reply(fd, buf, sizeof(buf), &len);
	if (r >= 0)
		r = bench_unpack_reply(buf, len, &resp);
	if (r < 0)
		return r;
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

/* An attacker: allocates rounds * 64 buffers, says so on ready, waits for go, then looks up 64
 * of them never looked up before per request, says so on ready again and waits for go before
 * it leaves (mrd's work when a client leaves is not this figure's). Exits 0 when every lookup
 * succeeded. */
static int attacker(const char *socket, unsigned rounds, int ready, int go)
{
	size_t n = (size_t)rounds * ADDRS;
	uint64_t *addrs = calloc(n, sizeof(*addrs));
	mrd_client *c = NULL;
	int fd, r;
	char ch;

	if (!addrs || mrd_client_connect(socket, &c) < 0)
		return 1;
	for (size_t i = 0; i < n; i++) {
		void *p;

		if (mrd_mem_alloc(c, BUF, 0, 0, &p) < 0)
			return 2;
		addrs[i] = (uint64_t)(uintptr_t)p;
	}
	fd = raw_connect(socket);
	if (fd < 0 || bench_raw_hello(fd, 0, "bench-loop-share") < 0)
		return 3;
	if (write(ready, "r", 1) != 1 || read(go, &ch, 1) != 1)
		return 4;
	for (unsigned i = 0; i < rounds; i++) {
		r = lookup(fd, 2 + i, addrs + (size_t)i * ADDRS, ADDRS);
		if (r < 0) {
			fprintf(stderr, "bench-loop-share: MrLookup: %s\n", strerror(-r));
			return 5;
		}
	}
	if (write(ready, "d", 1) != 1 || read(go, &ch, 1) != 1)
		return 4;
	close(fd);
	mrd_client_close(c);
	free(addrs);
	return 0;
}

static void report(const char *what, uint64_t *lat, size_t n)
{
	uint64_t p50 = bench_quantile(lat, n, 0.5), p99 = bench_quantile(lat, n, 0.99);
	uint64_t max = bench_quantile(lat, n, 1.0);

	printf("%-26s %7zu pings  p50 %9.3f ms  p99 %9.3f ms  max %9.3f ms\n", what, n,
	       p50 / 1e6, p99 / 1e6, max / 1e6);
}

#define BIG (256u << 20)
#define SMALL (2u << 20)
#define BIG_ATTACKERS 4
#define SMALL_LOOKUPS 200

/* Allocates, looks up and frees a buffer of size, over and over: until stop is set (a shared
 * flag), or n times with each lookup's round trip in lat. */
static int churn(const char *socket, size_t size, const volatile bool *stop, uint64_t *lat,
		 size_t n)
{
	mrd_client *c;
	size_t i = 0;

	if (mrd_client_connect(socket, &c) < 0)
		return 1;
	while (lat ? i < n : !*stop) {
		struct mrd_keys k;
		uint64_t t0;
		void *p;

		if (mrd_mem_alloc(c, size, 0, 0, &p) < 0)
			return 2;
		t0 = bench_now_ns();
		if (mrd_keys_query(c, p, &k) < 0)
			return 3;
		if (lat)
			lat[i] = bench_now_ns() - t0;
		if (mrd_mem_free(c, p) < 0)
			return 4;
		i++;
	}
	mrd_client_close(c);
	return 0;
}

/* Another user's (nobody's) 2 MiB lookups, alone and while root's processes register 256 MiB
 * buffers: the workers' share. */
static int worker_share(const char *socket)
{
	uint64_t *lat = mmap(NULL, 2 * SMALL_LOOKUPS * sizeof(*lat), PROT_READ | PROT_WRITE,
			     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	volatile bool *stop = mmap(NULL, sizeof(*stop), PROT_READ | PROT_WRITE,
				   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pids[BIG_ATTACKERS], victim;
	int status, failed = 0;

	if (lat == MAP_FAILED || stop == MAP_FAILED)
		return 1;
	*stop = false;
	for (unsigned pass = 0; pass < 2; pass++) {
		for (unsigned i = 0; pass == 1 && i < BIG_ATTACKERS; i++) {
			pids[i] = fork();
			if (pids[i] == 0)
				_exit(churn(socket, BIG, stop, NULL, 0));
		}
		if (pass == 1)
			usleep(500000); /* their queue builds up */
		victim = fork();
		if (victim == 0)
			_exit(setgid(65534) < 0 || setuid(65534) < 0 ? 5 :
			      churn(socket, SMALL, stop, lat + pass * SMALL_LOOKUPS,
				    SMALL_LOOKUPS));
		failed += waitpid(victim, &status, 0) < 0 || !WIFEXITED(status) ||
			  WEXITSTATUS(status) != 0;
		*stop = true;
		for (unsigned i = 0; pass == 1 && i < BIG_ATTACKERS; i++)
			failed += waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) ||
				  WEXITSTATUS(status) != 0;
		*stop = false;
	}
	printf("nobody's 2 MiB lookups     p50 %9.3f ms  p99 %9.3f ms  (alone)\n",
	       bench_quantile(lat, SMALL_LOOKUPS, 0.5) / 1e6,
	       bench_quantile(lat, SMALL_LOOKUPS, 0.99) / 1e6);
	printf("  while root's 4 x 256 MiB p50 %9.3f ms  p99 %9.3f ms%s\n",
	       bench_quantile(lat + SMALL_LOOKUPS, SMALL_LOOKUPS, 0.5) / 1e6,
	       bench_quantile(lat + SMALL_LOOKUPS, SMALL_LOOKUPS, 0.99) / 1e6,
	       failed ? "  (some FAILED)" : "");
	return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
	unsigned rounds = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 8;
	size_t cap = 1u << 22, n = 0;
	uint64_t *lat = calloc(cap, sizeof(*lat)), t0, t1;
	int ready[2], go[2], status, failed = 0;
	unsigned busy = ATTACKERS;
	pid_t pids[ATTACKERS];
	struct mrd_proc mrd;
	mrd_client *victim;
	char ch;
	int r;

	if (!lat || rounds == 0 || pipe2(ready, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0)
		return 1;
	r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\narena_size = 64M\n", NULL);
	if (r < 0) {
		fprintf(stderr, "bench-loop-share: cannot start mrd (MRD_BUILDDIR=%s): %s\n",
			getenv("MRD_BUILDDIR") ?: "(unset)", strerror(-r));
		return 1;
	}
	if (mrd_client_connect(mrd.socket, &victim) < 0)
		return 1;
	for (size_t i = 0; i < IDLE_PINGS; i++) {
		t0 = bench_now_ns();
		if (mrd_client_ping(victim) < 0)
			return 1;
		lat[n++] = bench_now_ns() - t0;
	}
	report("idle", lat, n);
	for (unsigned i = 0; i < ATTACKERS; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(attacker(mrd.socket, rounds, ready[1], go[0]));
	}
	for (unsigned i = 0; i < ATTACKERS; i++)
		if (read(ready[0], &ch, 1) != 1)
			return 1;
	n = 0;
	t0 = bench_now_ns();
	for (unsigned i = 0; i < ATTACKERS; i++)
		(void)!write(go[1], "g", 1);
	while (busy > 0 && n < cap) {
		struct pollfd pfd = { .fd = ready[0], .events = POLLIN };
		uint64_t s = bench_now_ns();

		if (mrd_client_ping(victim) < 0)
			return 1;
		lat[n++] = bench_now_ns() - s;
		while (busy > 0 && poll(&pfd, 1, 0) > 0 && read(ready[0], &ch, 1) == 1)
			busy--;
		if (waitpid(-1, &status, WNOHANG) > 0) { /* one failed */
			failed++;
			break;
		}
	}
	t1 = bench_now_ns();
	for (unsigned i = 0; i < ATTACKERS; i++)
		(void)!write(go[1], "q", 1);
	for (unsigned i = 0; i < ATTACKERS; i++)
		if (waitpid(pids[i], &status, 0) > 0)
			failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
	report("16 x 64 cold MrLookups", lat, n);
	printf("attackers: %u lookups of %u addresses in %.2f s (%.0f registrations/s)%s\n",
	       ATTACKERS * rounds, ADDRS, (t1 - t0) / 1e9,
	       (double)ATTACKERS * rounds * ADDRS / ((t1 - t0) / 1e9),
	       failed ? ", some FAILED" : "");
	mrd_client_close(victim);
	if (geteuid() == 0)
		failed += worker_share(mrd.socket);
	else
		printf("nobody's 2 MiB lookups: not measured (needs root, to run as nobody)\n");
	mrd_proc_stop(&mrd);
	free(lat);
	return failed ? 1 : 0;
}
