/* SPDX-License-Identifier: MIT */
/* libFuzzer target: a warm restart's adoption (daemon/control/handover.c) of a state mrd did not write.
 * An input is the content of the "mrd-state" memfd; three memfds are passed beside it, as
 * "mrd-arena-1" (an arena as mrd makes them), "mrd-arena-2" (a small attached memfd) and
 * "mrd-arena-3" (an arena of two slots). Whatever the state says, mrd takes it whole or not at
 * all, maps nothing outside its window or two things on one slot, leaves the memfds' content
 * alone, and gives every slot back when the orphans go. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memory/arena.h"
#include "core/domain.h"
#include "fuzz-manager.h"
#include "control/handover.h"
#include "control/manager.h"

#define MiB (1ull << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char fuzz_corpus[] = "corpus-handover";

static const struct {
	const char *name;
	uint64_t size;
	unsigned seals;
} passed_memfds[] = {
	{ "mrd-arena-1", 64 * MiB, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL },
	{ "mrd-arena-2", 256 * 1024, F_SEAL_SHRINK },
	{ "mrd-arena-3", 128 * MiB, F_SEAL_GROW | F_SEAL_SHRINK },
};
#define N_MEMFDS (sizeof(passed_memfds) / sizeof(passed_memfds[0]))
#define CANARY 0x5a

static int memfds[N_MEMFDS];

static struct manager *fuzz_manager(void)
{
	static const char *const settings[] = { "memory.window_size=4G", "memory.arena_size=64M",
						NULL };
	static struct manager *m;

	if (m)
		return m;
	m = fuzz_manager_new(settings);
	/* Sparse memfds with a canary in their first and last page. */
	for (size_t i = 0; i < N_MEMFDS; i++) {
		uint8_t canary = CANARY;

		memfds[i] = memfd_create(passed_memfds[i].name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (memfds[i] < 0 || ftruncate(memfds[i], (off_t)passed_memfds[i].size) < 0 ||
		    pwrite(memfds[i], &canary, 1, 0) != 1 ||
		    pwrite(memfds[i], &canary, 1, (off_t)passed_memfds[i].size - 1) != 1 ||
		    fcntl(memfds[i], F_ADD_SEALS, passed_memfds[i].seals) < 0)
			abort();
	}
	return m;
}

static void check_canaries(void)
{
	for (size_t i = 0; i < N_MEMFDS; i++) {
		uint8_t a = 0, b = 0;

		if (pread(memfds[i], &a, 1, 0) != 1 ||
		    pread(memfds[i], &b, 1, (off_t)passed_memfds[i].size - 1) != 1 ||
		    a != CANARY || b != CANARY)
			abort();
	}
}

/* What was adopted lies in the window, one arena per slot, each allocation inside its arena. */
static void check_adopted(struct manager *m)
{
	uint32_t used = 0, slots = 0;
	struct domain *d;

	for (uint32_t i = 0; i < m->core.window.n_slots; i++)
		used += m->core.window.used[i];
	LIST_FOREACH(d, &m->core.domains, link) {
		struct arena *a;

		LIST_FOREACH(a, &d->mem.arenas, link) {
			if (a->base != window_slot(&m->core.window, a->id) || a->n_slots == 0 ||
			    a->id + (uint64_t)a->n_slots > m->core.window.n_slots ||
			    a->size > (uint64_t)a->n_slots * m->core.window.slot_size)
				abort();
			slots += a->n_slots;
			for (size_t i = 0; i < a->n_runs; i++)
				if (a->runs[i]->arena != a || a->runs[i]->length == 0 ||
				    a->runs[i]->offset + a->runs[i]->length > a->size ||
				    (i > 0 && a->runs[i - 1]->offset + a->runs[i - 1]->length >
						      a->runs[i]->offset))
					abort();
		}
	}
	if (used != slots)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct manager *m = fuzz_manager();
	char *names[N_MEMFDS + 1] = { (char *)HANDOVER_STATE_NAME };
	int fds[N_MEMFDS + 1];
	struct fd_list passed = { .fds = fds, .names = names, .n = N_MEMFDS + 1 };

	fds[0] = memfd_create("state", MFD_CLOEXEC);
	if (fds[0] < 0 || (size && write(fds[0], data, size) != (ssize_t)size))
		abort();
	for (size_t i = 0; i < N_MEMFDS; i++) {
		fds[i + 1] = fcntl(memfds[i], F_DUPFD_CLOEXEC, 3);
		names[i + 1] = (char *)passed_memfds[i].name;
	}
	if (handover_adopt(m, &passed) < 0)
		abort();
	for (size_t i = 0; i < N_MEMFDS + 1; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	check_canaries();
	check_adopted(m);

	/* As at a hand-over, so the canaries can be checked again. */
	m->core.window.keep_content = true;
	handover_end_grace(m);
	m->core.window.keep_content = false;
	check_canaries();
	if (!LIST_EMPTY(&m->core.domains) || m->core.n_domains || m->grace_timer)
		abort();
	/* The next input is another restart: the previous mrd's generations are not its own. */
	free(m->core.floors);
	m->core.floors = NULL;
	m->core.n_floors = 0;
	for (uint32_t i = 0; i < m->core.window.n_slots; i++)
		if (m->core.window.used[i])
			abort();
	return 0;
}
