/* SPDX-License-Identifier: MIT */
/* Framing shared by mrd and libmrd: one protobuf-c message per SOCK_SEQPACKET packet,
 * file descriptors as SCM_RIGHTS beside it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "mrd.pb-c.h"

#define MRD_PROTOCOL_VERSION_MIN 1
#define MRD_PROTOCOL_VERSION_MAX 1

/* Request families a Hello may ask for; HelloResponse.capabilities says which mrd serves. */
enum {
	MRD_CAP_PING = 1u << 0,
	MRD_CAP_STATUS = 1u << 1,
	MRD_CAP_EXPORT_PD = 1u << 2,
	MRD_CAP_MEMORY = 1u << 3, /* JoinDomain, Alloc, Free, Map, Extmem*, Clients */
	MRD_CAP_MR = 1u << 4,     /* MrLookup, Dma */
	MRD_CAP_MEMPOOL = 1u << 5, /* MempoolRegister, MempoolUnregister, Pools */
};
#define MRD_CAPS_SERVED \
	((uint64_t)(MRD_CAP_PING | MRD_CAP_STATUS | MRD_CAP_EXPORT_PD | MRD_CAP_MEMORY | \
		    MRD_CAP_MR | MRD_CAP_MEMPOOL))
#define MRD_LOOKUP_BATCH_MAX 64
#define MRD_DMA_MAX (64u << 20)
/* Ranges in one MempoolRegister, and bytes of a mempool name (with its NUL). */
#define MRD_MEMPOOL_RANGES_MAX 1024
#define MRD_MEMPOOL_NAME_MAX 64

/* Hard ceilings; the daemon's configured limits must stay below them. */
#define WIRE_FRAME_MAX (1024u * 1024u)
#define WIRE_FDS_MAX 16u
/* The most descriptors one sendmsg can carry (the kernel's SCM_MAX_FD). wire_recv takes them
 * all: any the kernel could not hand over it would release itself, in the receiver's thread,
 * and that last close can block (a lingering socket). */
#define WIRE_RECV_FDS_MAX 253u
#define WIRE_FRAME_DEFAULT (64u * 1024u)

struct wire_packet {
	uint8_t *data;
	size_t len;           /* bytes received (or the packet's real size when truncated) */
	bool truncated;       /* the packet did not fit the buffer */
	bool fds_truncated;   /* the kernel dropped descriptors (MSG_CTRUNC) */
	int fds[WIRE_RECV_FDS_MAX]; /* every one received: more than WIRE_FDS_MAX is the caller's to refuse */
	size_t n_fds;
};

/* Packs msg and sends it with n_fds descriptors (not consumed). flags: extra sendmsg flags
 * (MSG_DONTWAIT). Returns 0 or -errno; -EMSGSIZE when the packed message exceeds max_frame. */
int wire_send(int fd, const ProtobufCMessage *msg, size_t max_frame, const int *fds, size_t n_fds,
	      int flags);

/* Sends an already packed frame. */
int wire_send_raw(int fd, const void *data, size_t len, const int *fds, size_t n_fds, int flags);

/* Receives one packet into buf (cap bytes). Returns 1 with *pkt filled, 0 at end of stream,
 * or -errno (-EAGAIN on a non-blocking socket with nothing queued). Received descriptors
 * are O_CLOEXEC and owned by the caller (wire_packet_close_fds; mrd: fd_closer), all of
 * them: wire_recv closes none. */
int wire_recv(int fd, uint8_t *buf, size_t cap, struct wire_packet *pkt, int flags);

void wire_packet_close_fds(struct wire_packet *pkt);

/* Packs msg into a new malloc'd buffer; -EMSGSIZE when larger than max_frame. */
int wire_pack(const ProtobufCMessage *msg, size_t max_frame, uint8_t **ret, size_t *ret_len);
