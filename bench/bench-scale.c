/* SPDX-License-Identifier: MIT */
/* make bench: what mrd and libmrd keep per thing, as memory (issue 20 asks these printed). A
 * private mrd's resident memory with no client, then with 1,000 connected clients (each a
 * libmrd handle: socket, Hello, its domain joined), then with 4,096 cached MRs; and this
 * process's own anonymous memory before and after a lookup cache holds 4,096 entries in its
 * bottom half. Figures, not ratios: there is no baseline to hold them against, so nothing
 * here has a target. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mrd/mrd.h>

#include "bench-util.h"

#define CLIENTS 1000
#define MRS 4096

/* A field of /proc/PID/status in KiB ("VmRSS", "RssAnon"), or -1. */
static long status_kib(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t n = strlen(field);
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, n) == 0 && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* mrd's anonymous and file-backed resident memory, shared memory (arenas, status pages) left
 * out: that is the clients' memory, not mrd's bookkeeping. */
static long private_kib(pid_t pid)
{
	long anon = status_kib(pid, "RssAnon"), file = status_kib(pid, "RssFile");

	return anon < 0 || file < 0 ? -1 : anon + file;
}

int main(void)
{
	static mrd_client *clients[CLIENTS];
	static void *bufs[MRS];
	struct mrd_proc mrd;
	mrd_cache *cache = NULL;
	long idle, with_clients, with_mrs, mine_before, mine_after;
	unsigned n = 0;
	int r;

	/* A descriptor per handle here, two per client in mrd (socket, a status page fd briefly). */
	r = open_files_limit_set(4 * CLIENTS + 256);
	if (r < 0) {
		fprintf(stderr, "bench-scale: cannot raise the open-file limit: %s\n", strerror(-r));
		return 1;
	}
	r = mrd_proc_start(&mrd, "[memory]\nhugepages = no\n[limits]\nclients = 2048\n"
			   "clients_per_user = 2048\n[quota]\nclients = 2048\n", NULL);
	if (r < 0) {
		fprintf(stderr, "bench-scale: mrd did not start: %s\n", strerror(-r));
		return 1;
	}
	idle = private_kib(mrd.pid);
	for (; n < CLIENTS; n++) {
		r = mrd_client_connect(mrd.socket, &clients[n]);
		if (r < 0) {
			fprintf(stderr, "bench-scale: client %u: %s\n", n, mrd_last_error());
			goto out;
		}
	}
	r = mrd_client_ping(clients[CLIENTS - 1]); /* every Hello answered */
	if (r < 0)
		goto out;
	with_clients = private_kib(mrd.pid);

	/* One allocation an MR: each lookup registers its own (an MR never spans two). */
	for (unsigned i = 0; i < MRS; i++) {
		struct mrd_keys keys;

		r = mrd_mem_alloc(clients[0], 4096, 0, 0, &bufs[i]);
		if (r >= 0)
			r = mrd_keys_query(clients[0], bufs[i], &keys);
		if (r < 0) {
			fprintf(stderr, "bench-scale: MR %u: %s\n", i, mrd_last_error());
			goto out;
		}
	}
	with_mrs = private_kib(mrd.pid);

	mine_before = status_kib(getpid(), "RssAnon");
	r = mrd_cache_new(clients[0], &cache);
	for (unsigned i = 0; r >= 0 && i < MRS; i++) {
		struct mrd_keys keys;

		r = mrd_cache_keys(cache, bufs[i], &keys);
	}
	if (r < 0) {
		fprintf(stderr, "bench-scale: cache: %s\n", mrd_last_error());
		goto out;
	}
	mine_after = status_kib(getpid(), "RssAnon");

	printf("bench-scale: resident memory, shared memory (arenas, status pages) left out "
	       "[informational: no baseline]\n");
	printf("scale-clients-%u: mrd %ld KiB idle, %ld KiB with %u clients: %.0f bytes per "
	       "client\n", CLIENTS, idle, with_clients, CLIENTS,
	       (double)(with_clients - idle) * 1024 / CLIENTS);
	printf("scale-mrs-%u: mrd %ld KiB more with %u cached MRs (an allocation each): %.0f bytes "
	       "per MR and its allocation\n", MRS, with_mrs - with_clients, MRS,
	       (double)(with_mrs - with_clients) * 1024 / MRS);
	printf("scale-cache-%u: libmrd %ld KiB more for a lookup cache of %u entries: %.0f bytes "
	       "per cached entry (asked mrd %" PRIu64 " times)\n", MRS, mine_after - mine_before, MRS,
	       (double)(mine_after - mine_before) * 1024 / MRS, mrd_cache_asked(cache));
	r = 0;
out:
	mrd_cache_free(cache);
	while (n > 0)
		mrd_client_close(clients[--n]);
	mrd_proc_stop(&mrd);
	return r < 0 ? 1 : 0;
}
