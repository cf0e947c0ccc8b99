/* SPDX-License-Identifier: MIT */
/* libFuzzer target: frame decode and every request handler, on the soft provider and the real
 * allocator. An input is a sequence of frames, each a 2-byte little-endian header and that
 * many bytes: the header's low 14 bits are the length; bit 14 sends the frame from a second
 * client (uid 2000, another domain, no admin) instead of the first (root, an admin); bit 15
 * puts a sealed 16 KiB memfd beside it (ExtmemAttach takes it; any other request must refuse
 * it). Every reply mrd sends must decode as a Response, and whatever both clients made goes
 * when they do. */
#include <assert.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "control/client.h"
#include "core/domain.h"
#include "fuzz-manager.h"
#include "control/manager.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char fuzz_corpus[] = "corpus";

static struct manager *fuzz_manager(void)
{
	static const char *const settings[] = { "limits.frame_bytes=4096",
						"limits.protocol_errors=8", NULL };
	static struct manager *m;

	if (!m)
		m = fuzz_manager_new(settings);
	return m;
}

/* The domain whose arena holds addr, NULL when none does. */
static const struct domain *owner(struct manager *m, uint64_t addr)
{
	struct domain *d;

	LIST_FOREACH(d, &m->core.domains, link)
		if (domain_find_arena(d, addr))
			return d;
	return NULL;
}

/* An address a reply hands the second client must be memory of its own domain. */
static void check_own(struct manager *m, uint64_t addr)
{
	const struct domain *d = owner(m, addr);

	if (addr && d && strcmp(d->name, "uid-2000") != 0)
		abort();
}

static void check_isolation(struct manager *m, const Mrd__Response *r)
{
	if (r->body_case == MRD__RESPONSE__BODY_ALLOC)
		check_own(m, r->alloc->address);
	else if (r->body_case == MRD__RESPONSE__BODY_MAP && r->map->arena)
		check_own(m, r->map->arena->address);
	else if (r->body_case == MRD__RESPONSE__BODY_EXTMEM_ATTACH)
		check_own(m, r->extmem_attach->address);
	else if (r->body_case == MRD__RESPONSE__BODY_MR_LOOKUP)
		for (size_t i = 0; i < r->mr_lookup->n_entries; i++)
			check_own(m, r->mr_lookup->entries[i]->start);
}

/* Reads every reply queued on fd and checks that each one decodes (and, for the second
 * client, names nothing of another domain); descriptors (status pages, arena memfds) are
 * closed. */
static void drain(struct manager *m, int fd, bool second)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct wire_packet pkt;

	while (wire_recv(fd, buf, sizeof(buf), &pkt, MSG_DONTWAIT) == 1) {
		Mrd__Response *resp = mrd__response__unpack(NULL, pkt.len, pkt.data);

		assert(resp && !pkt.truncated);
		if (second)
			check_isolation(m, resp);
		mrd__response__free_unpacked(resp, NULL);
		wire_packet_close_fds(&pkt);
	}
}

static int memfd_beside(void)
{
	int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0 || ftruncate(fd, 16384) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		abort();
	return fd;
}

static void add_client(struct manager *m, uid_t uid, int sv[2])
{
	struct ucred cred = { .pid = 1, .uid = uid, .gid = uid };
	struct client *c;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	if (manager_add_client(m, sv[0], &cred, cred.uid, NULL, &c) < 0)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct manager *m = fuzz_manager();
	int root[2], user[2];

	add_client(m, 0, root);
	add_client(m, 2000, user);
	while (size >= 2) {
		unsigned header = (unsigned)data[0] | (unsigned)data[1] << 8;
		size_t len = header & 0x3fff;
		int to = header & 0x4000 ? user[1] : root[1], fd = -1, r;

		data += 2;
		size -= 2;
		if (len > size)
			len = size;
		if (header & 0x8000)
			fd = memfd_beside();
		r = wire_send_raw(to, data, len, fd >= 0 ? &fd : NULL, fd >= 0, MSG_DONTWAIT);
		if (fd >= 0)
			close(fd);
		if (r < 0)
			break;
		data += len;
		size -= len;
		event_base_loop(m->core.base, EVLOOP_NONBLOCK);
		drain(m, root[1], false);
		drain(m, user[1], true);
	}

	close(root[1]);
	close(user[1]);
	/* Let mrd see the hang-ups and free the clients, or free those still there. */
	event_base_loop(m->core.base, EVLOOP_NONBLOCK);
	while (!LIST_EMPTY(&m->clients))
		client_free(LIST_FIRST(&m->clients));
	/* Nothing of theirs is left: no domain (once the workers' jobs that hold one are done),
	 * no arena's window slot. */
	for (int i = 0; i < 5000 && m->core.n_domains; i++) {
		event_base_loop(m->core.base, EVLOOP_NONBLOCK);
		if (m->core.n_domains)
			usleep(1000);
	}
	if (!LIST_EMPTY(&m->core.domains) || m->core.n_domains)
		abort();
	for (uint32_t i = 0; i < m->core.window.n_slots; i++)
		if (m->core.window.used[i])
			abort();
	return 0;
}
