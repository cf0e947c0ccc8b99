/* SPDX-License-Identifier: MIT */
/* Two RC QPs of one PD, connected to each other through the device's own port. They let mrd
 * carry out an RDMA WRITE or READ through keys a client holds (the Dma request) on a real
 * device, so that the device, not mrd, judges the keys, their access and their bounds.
 * Not thread-safe: its owner serialises transfers. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>

struct ibv_pd;
struct verbs_loopback;

/* Why two QPs of a device of this node and transport type cannot connect on loopback, or
 * NULL where they can: caps.dma is false on such a device, with this reason. */
const char *verbs_loopback_unsupported(enum ibv_node_type node, enum ibv_transport_type transport);

/* -ENETDOWN when no port of the device is active. */
int verbs_loopback_new(struct ibv_pd *pd, struct verbs_loopback **ret);
void verbs_loopback_free(struct verbs_loopback *lb);
/* Whether element, an async event's QP or CQ, is one of lb's (NULL-safe): compared, never
 * read, since a pointer that is not mrd's may be anything. */
bool verbs_loopback_owns(const struct verbs_loopback *lb, const void *element);

/* An RDMA WRITE (local -> remote) or READ (remote -> local) of length bytes, posted on one QP
 * to the other, split at the port's largest message, each part awaited. -EKEYREJECTED when
 * the device refused a key (not valid, not granting the access, or the range outside it: a
 * completion does not say which), -ETIMEDOUT when a part did not complete in time, -EIO for
 * any other failed completion. After a refused key the QPs are replaced; after any other
 * failure the loopback is of no further use (its port or address may be gone): free it. */
int verbs_loopback_transfer(struct verbs_loopback *lb, bool read, uint32_t lkey, uint64_t laddr,
			    uint32_t rkey, uint64_t raddr, uint64_t length);
