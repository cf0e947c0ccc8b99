/* SPDX-License-Identifier: MIT */
/* Stand-ins for verbs-loopback.c, for the tests that include provider-verbs.c over a fake
 * libibverbs (test-verbs-rereg, test-verbs-revive): the Dma path is not what they test. */
#pragma once

#include <errno.h>
#include <stdbool.h>

int verbs_loopback_new(struct ibv_pd *pd, struct verbs_loopback **ret) { return -EOPNOTSUPP; }
void verbs_loopback_free(struct verbs_loopback *lb) {}
int verbs_loopback_transfer(struct verbs_loopback *lb, bool read, uint32_t lkey, uint64_t laddr,
			    uint32_t rkey, uint64_t raddr, size_t length)
{
	return -EOPNOTSUPP;
}
const char *verbs_loopback_unsupported(enum ibv_node_type node, enum ibv_transport_type transport)
{
	return NULL;
}
bool verbs_loopback_owns(const struct verbs_loopback *lb, const void *element) { return false; }
int verbs_loopback_bind(struct verbs_loopback *lb, struct ibv_mw *mw, struct ibv_mr *mr,
			uint64_t addr, uint64_t length, unsigned ibv_access, uint32_t rkey,
			struct verbs_loopback_pair **ret_pair)
{
	return -EOPNOTSUPP;
}
int verbs_loopback_invalidate(struct verbs_loopback *lb, uint32_t rkey,
			      struct verbs_loopback_pair *pair)
{
	return -EOPNOTSUPP;
}
void verbs_loopback_unbound(struct verbs_loopback *lb, struct verbs_loopback_pair *pair) {}
bool verbs_loopback_has_windows(const struct verbs_loopback *lb) { return false; }
int verbs_loopback_replace(struct verbs_loopback *lb) { return -EOPNOTSUPP; }
int verbs_loopback_mend(struct verbs_loopback *lb) { return -EOPNOTSUPP; }
int verbs_loopback_settle(struct verbs_loopback *lb) { return 0; }
bool verbs_loopback_ready(const struct verbs_loopback *lb) { return false; }
unsigned verbs_loopback_generation(const struct verbs_loopback *lb) { return 0; }
void verbs_loopback_set_elements_lock(struct verbs_loopback *lb, pthread_mutex_t *lock) {}
