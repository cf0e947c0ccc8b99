/* SPDX-License-Identifier: MIT */
/* mrd's main job, shown by two processes of one user: a receiver allocates a buffer from mrd
 * and tells a sender where it is; the sender looks up keys for its own buffer and for the
 * receiver's through libmrd's lookup cache and has mrd move bytes between them by keys alone
 * (mrd_dma: emulated on the soft provider, done by the device on verbs); then memory is freed,
 * the generation moves, and each side shows how its lookups were served, and memory allocated
 * again reuses the freed MR's handle with new keys. Usage: mrd-demo [SOCKET]; with $MRD_DEMO_MRCTL set
 * to mrctl's path (and root), it also shows mrd's own view while both are connected. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mrd/mrd.h>

#define BUF_SIZE (1u << 20)
#define LOOKUPS 1000000

static const char *sock;

static mrd_client *connect_or_die(const char *who)
{
	mrd_client *c = NULL;

	if (mrd_client_connect(sock, &c) < 0) {
		fprintf(stderr, "%s: cannot connect to mrd: %s\n", who, mrd_last_error());
		exit(EXIT_FAILURE);
	}
	return c;
}

static void report(const char *who, const mrd_cache *l, uint64_t total)
{
	printf("%s: %" PRIu64 " lookups: %" PRIu64 " served by the lookup cache, %" PRIu64
	       " asked mrd\n", who, total, total - mrd_cache_asked(l), mrd_cache_asked(l));
}

static int receiver(int to_sender, int from_sender)
{
	mrd_client *c = connect_or_die("receiver");
	mrd_cache *l;
	uint64_t addr, gen;
	char *buf, go;

	if (mrd_mem_alloc(c, BUF_SIZE, 0, 0, (void **)&buf) < 0) {
		fprintf(stderr, "receiver: alloc: %s\n", mrd_last_error());
		return EXIT_FAILURE;
	}
	if (mrd_cache_new(c, &l) < 0) {
		fprintf(stderr, "receiver: %s\n", mrd_last_error());
		return EXIT_FAILURE;
	}
	(void)mrd_cache_lkey(l, buf);
	gen = mrd_client_generation(c);
	printf("receiver (pid %d): domain %s, 1 MiB at %p, generation %" PRIu64 "\n", (int)getpid(),
	       mrd_client_domain(c), (void *)buf, gen);
	fflush(stdout);
	addr = (uintptr_t)buf;
	if (write(to_sender, &addr, sizeof(addr)) != sizeof(addr) || read(from_sender, &go, 1) != 1)
		return EXIT_FAILURE;

	printf("receiver: found \"%s\" at %p, written there by DMA\n", buf + 4096, (void *)(buf + 4096));
	/* The sender freed its buffer meanwhile: one load shows it, and the cache drops what the
	 * free made stale (nothing of ours: our entry still hits). */
	printf("receiver: generation %" PRIu64 " -> %" PRIu64 " without asking mrd\n", gen,
	       mrd_client_generation(c));
	(void)mrd_cache_lkey(l, buf);
	report("receiver", l, 2);
	mrd_cache_free(l);
	mrd_mem_free(c, buf);
	mrd_client_close(c);
	return EXIT_SUCCESS;
}

static int sender(int from_receiver, int to_receiver)
{
	mrd_client *c = connect_or_die("sender");
	struct mrd_keys src, dst;
	mrd_cache *l;
	uint64_t remote, sum = 0;
	char *buf;
	int r;

	if (read(from_receiver, &remote, sizeof(remote)) != sizeof(remote))
		return EXIT_FAILURE;
	if (mrd_mem_alloc(c, BUF_SIZE, 0, 0, (void **)&buf) < 0 ||
	    mrd_mem_map(c, (void *)(uintptr_t)remote) < 0 || mrd_cache_new(c, &l) < 0) {
		fprintf(stderr, "sender: %s\n", mrd_last_error());
		return EXIT_FAILURE;
	}
	snprintf(buf + 128, 64, "hello from pid %d, by keys alone", (int)getpid());
	if (mrd_cache_keys(l, buf, &src) < 0 || mrd_cache_keys(l, (void *)(uintptr_t)remote, &dst) < 0) {
		fprintf(stderr, "sender: lookup: %s\n", mrd_last_error());
		return EXIT_FAILURE;
	}
	printf("sender (pid %d): my buffer %p lkey 0x%08x; receiver's %p rkey 0x%08x\n",
	       (int)getpid(), (void *)buf, src.lkey, (void *)(uintptr_t)remote, dst.rkey);
	r = mrd_dma(c, MRD_DMA_WRITE, src.lkey, buf + 128, dst.rkey,
		    (void *)(uintptr_t)(remote + 4096), 64);
	printf("sender: RDMA write of 64 bytes: %s\n", r < 0 ? mrd_last_error() : "done");

	/* The lookups an RDMA application makes per work request: almost all inline hits. */
	for (uint64_t i = 0; i < LOOKUPS; i++)
		sum += mrd_cache_lkey(l, buf + (i * 64) % BUF_SIZE);
	report("sender", l, LOOKUPS + 2);
	fflush(stdout);
	/* What mrd sees now, both of us connected (the demo script names mrctl). */
	if (getenv("MRD_DEMO_MRCTL") && sock) {
		char cmd[512];

		snprintf(cmd, sizeof(cmd), "%s --socket '%s' clients", getenv("MRD_DEMO_MRCTL"), sock);
		if (system(cmd) != 0)
			fprintf(stderr, "sender: %s failed\n", cmd);
	}

	/* Freed memory takes its keys along. */
	mrd_mem_free(c, buf);
	r = mrd_dma(c, MRD_DMA_WRITE, src.lkey, buf + 128, dst.rkey,
		    (void *)(uintptr_t)(remote + 4096), 64);
	printf("sender: the same DMA after free: %s: %s\n", strerror(-r), mrd_last_error());

	/* Allocated again: mrd moves the MR handle it parked at the free to the new memory
	 * instead of making a new one, and the move gives it new keys. */
	if (mrd_mem_alloc(c, BUF_SIZE, 0, 0, (void **)&buf) < 0 || mrd_cache_keys(l, buf, &dst) < 0) {
		fprintf(stderr, "sender: %s\n", mrd_last_error());
		return EXIT_FAILURE;
	}
	printf("sender: 1 MiB again at %p: lkey 0x%08x (was 0x%08x)\n", (void *)buf, dst.lkey,
	       src.lkey);
	fflush(stdout);
	if (getenv("MRD_DEMO_MRCTL") && sock) {
		char cmd[512];

		snprintf(cmd, sizeof(cmd), "%s --socket '%s' pools", getenv("MRD_DEMO_MRCTL"), sock);
		if (system(cmd) != 0)
			fprintf(stderr, "sender: %s failed\n", cmd);
	}
	mrd_mem_free(c, buf);
	if (write(to_receiver, "x", 1) != 1)
		return EXIT_FAILURE;
	mrd_cache_free(l);
	mrd_client_close(c);
	return sum ? EXIT_SUCCESS : EXIT_FAILURE;
}

int main(int argc, char **argv)
{
	int to_sender[2], to_receiver[2], status, r;
	pid_t pid;

	sock = argc > 1 ? argv[1] : NULL;
	if (pipe(to_sender) < 0 || pipe(to_receiver) < 0)
		return EXIT_FAILURE;
	pid = fork();
	if (pid < 0)
		return EXIT_FAILURE;
	if (pid == 0) {
		r = receiver(to_sender[1], to_receiver[0]);
		fflush(stdout);
		_exit(r);
	}
	r = sender(to_sender[0], to_receiver[1]);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		r = EXIT_FAILURE;
	return r;
}
