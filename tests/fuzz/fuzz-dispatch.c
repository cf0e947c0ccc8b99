/* SPDX-License-Identifier: MIT */
/* libFuzzer target: frame decode and dispatch. An input is a sequence of frames, each a
 * 2-byte little-endian length and that many bytes, sent by one fresh client; every reply mrd
 * sends must decode as a Response, and whatever the client allocated goes when it does. */
#include <assert.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "client.h"
#include "log.h"
#include "manager.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct manager *fuzz_manager(void)
{
	static struct manager *m;
	struct config cfg;

	if (m)
		return m;
	log_set_level(LOG_LEVEL_SILENT);
	config_init(&cfg);
	(void)config_set(&cfg, "limits", "frame_bytes", "4096");
	(void)config_set(&cfg, "limits", "protocol_errors", "8");
	if (config_finish(&cfg) < 0 || manager_new(&cfg, &m) < 0)
		abort();
	config_done(&cfg);
	return m;
}

/* Reads every reply queued on fd and checks that each one decodes; descriptors (status pages,
 * arena memfds) are closed. */
static void drain(int fd)
{
	static uint8_t buf[WIRE_FRAME_MAX];
	struct wire_packet pkt;

	while (wire_recv(fd, buf, sizeof(buf), &pkt, MSG_DONTWAIT) == 1) {
		Mrd__Response *resp = mrd__response__unpack(NULL, pkt.len, pkt.data);

		assert(resp && !pkt.truncated);
		mrd__response__free_unpacked(resp, NULL);
		wire_packet_close_fds(&pkt);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct manager *m = fuzz_manager();
	struct ucred cred = { .pid = 1, .uid = 0, .gid = 0 };
	struct client *c;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	if (manager_add_client(m, sv[0], &cred, &c) < 0)
		abort();

	while (size >= 2) {
		size_t len = (size_t)data[0] | (size_t)data[1] << 8;

		data += 2;
		size -= 2;
		if (len > size)
			len = size;
		if (wire_send_raw(sv[1], data, len, NULL, 0, MSG_DONTWAIT) < 0)
			break;
		data += len;
		size -= len;
		event_base_loop(m->base, EVLOOP_NONBLOCK);
		drain(sv[1]);
	}

	close(sv[1]);
	/* Let mrd see the hang-up and free the client, or free it if it is still there. */
	event_base_loop(m->base, EVLOOP_NONBLOCK);
	while (!LIST_EMPTY(&m->clients))
		client_free(LIST_FIRST(&m->clients));
	return 0;
}
