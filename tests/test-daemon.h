/* SPDX-License-Identifier: MIT */
/* In-process daemon for tests: a manager without a listener, clients on socketpairs with
 * chosen credentials, and helpers that send requests and wait for replies. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "test-util.h"
#include "wire.h"
#include "base/worker-pool.h"

struct client;
struct manager;

struct domain;
extern struct manager *td_manager;

/* Starts td_manager with the given "section.key=value" settings (NULL-terminated list). */
void td_start(const char *const *settings);
/* td_start with a 4 GiB window, 64 MiB arenas, no huge pages, and setting (NULL: none). */
void td_start_small(const char *setting);
void td_stop(void);

/* A client of td_manager with this identity; returns the test's end of the socketpair. */
int td_add_client(uid_t uid, gid_t gid, struct client **ret);
/* td_add_client plus a successful Hello. */
int td_hello_client(uid_t uid, struct client **ret);
/* The same for a client of process pid (claims after a warm restart check it). */
int td_add_client_of(pid_t pid, uid_t uid, gid_t gid, struct client **ret);
int td_hello_client_of(pid_t pid, uid_t uid, struct client **ret);

void td_pump(void);
/* Runs the loop until cond holds or TEST_WAIT_S passed; the caller asserts it after. */
#define td_pump_until(cond)                                                      \
	do {                                                                     \
		double td_start_ = test_now_s();                                 \
		while (!(cond) && test_now_s() - td_start_ < TEST_WAIT_S) {      \
			td_pump();                                               \
			usleep(1000);                                            \
		}                                                                \
	} while (0)

void td_send_frame(int fd, const void *data, size_t len, const int *fds, size_t n_fds);
void td_send_request(int fd, Mrd__Request *req, const int *fds, size_t n_fds);

/* Runs the loop until a reply arrives; NULL at end of stream. Descriptors that came with it go
 * to fds (closed when fds is NULL); *n_fds says how many. */
Mrd__Response *td_recv_reply(int fd, int *fds, size_t *n_fds);

/* The next reply must have this id and status (a positive errno, 0 for success). */
Mrd__Response *td_expect(int fd, uint64_t id, int error);
Mrd__Response *td_expect_fds(int fd, uint64_t id, int error, int *fds, size_t *n_fds);
void td_expect_free(int fd, uint64_t id, int error);

/* Alloc of size bytes that must succeed; returns the address (any memfd is closed). */
uint64_t td_alloc(int fd, uint64_t id, uint64_t size);
/* Alloc that must succeed, its reply returned (any memfd is closed). */
/* Alloc with AllocRequest.alias and alias_access, answered with error: the reply for 0, else
 * NULL. */
Mrd__Response *td_alloc_alias(int fd, uint64_t id, uint64_t size, uint32_t flags, uint64_t alias,
			      uint32_t alias_access, int error);
/* The same with AllocRequest.span_offset and span_length. */
Mrd__Response *td_alloc_span(int fd, uint64_t id, uint64_t size, uint32_t flags, uint64_t alias,
			     uint32_t alias_access, uint64_t span_offset, uint64_t span_length,
			     int error);
Mrd__Response *td_alloc_reply(int fd, uint64_t id, uint64_t size, uint32_t flags);
/* The same with AllocFlags. */
uint64_t td_alloc_flags(int fd, uint64_t id, uint64_t size, uint32_t flags);
/* Free of addr; its reply must carry error (a positive errno, 0 for success). */
void td_free(int fd, uint64_t id, uint64_t addr, int error);
/* The same request, its reply left for the test to take. */
void td_send_free(int fd, uint64_t id, uint64_t addr);

/* MrLookup of one address, its reply left for the test to take. */
void td_send_lookup(int fd, uint64_t id, uint64_t addr);
/* The same; its reply must carry error; the entry goes to out (when not NULL)
 * on success. */
void td_lookup(int fd, uint64_t id, uint64_t addr, int error, Mrd__MrEntry *out);
/* ExtmemAttach of [off, off + len) of memfd; its reply must carry error, and is returned. */
Mrd__Response *td_attach(int fd, uint64_t id, int memfd, uint64_t off, uint64_t len, int error);
/* A new memfd of size bytes, sealed against shrinking, attached whole (the attach must
 * succeed, its address goes to *ret_address); returns the memfd, the caller's to close. */
int td_attach_sealed(int fd, uint64_t id, uint64_t size, uint64_t *ret_address);
/* MempoolRegister of n ranges (extmem: objects in attached memory), its reply left for the
 * test to take. */
void td_send_mempool_register(int fd, uint64_t id, const char *name, const uint64_t *starts,
			      const uint64_t *lengths, size_t n, bool extmem);

/* JoinDomain that must succeed, resuming (resume_instance, resume_session) when not 0; the
 * status page's descriptor goes to *status_fd (closed when NULL). Returns the reply. */
Mrd__Response *td_join(int fd, uint64_t id, uint64_t resume_instance, uint64_t resume_session,
		       int *status_fd);

/* MempoolUnregister of name, not waiting for the answer. */
void td_send_mempool_unregister(int fd, uint64_t id, const char *name);
/* MempoolUnregister of name; its reply must carry error. */
void td_mempool_unregister(int fd, uint64_t id, const char *name, int error);

/* Dma (op: PROVIDER_DMA_*) of len bytes between laddr under l's lkey and raddr under rm's
 * rkey, its reply left for the test to take. */
void td_send_dma(int fd, uint64_t id, unsigned op, const Mrd__MrEntry *l, uint64_t laddr,
		 const Mrd__MrEntry *rm, uint64_t raddr, uint64_t len);
/* The same; its reply must carry error. */
void td_dma(int fd, uint64_t id, unsigned op, const Mrd__MrEntry *l, uint64_t laddr,
	    const Mrd__MrEntry *rm, uint64_t raddr, uint64_t len, int error);

/* td_stop(), then td_start() with one worker thread and [cache] async_bytes = 1M (4G window,
 * 64M arenas, no huge pages): what the tests of work on workers share. */
void td_start_one_worker(void);

/* A job that keeps one worker busy until the test lets go: what waits behind it waits for as
 * long as the test wants, deterministically. */
struct td_blocker {
	struct work work;
	int fd[2];
	bool entered; /* the worker runs it (set there: read it atomically) */
	bool done;
};
void td_block_worker(struct td_blocker *b);
/* The same, for another pool of td_manager's (its Dma thread). */
void td_block_pool(struct td_blocker *b, struct worker_pool *pool);
/* td_block_worker as one of key's jobs (a domain's: &domain->mem): its turn and its worker. */
void td_block_worker_as(struct td_blocker *b, const void *key);
/* Lets it go and runs the loop until its completion ran. */
void td_unblock_worker(struct td_blocker *b);

/* Runs the loop (up to TEST_WAIT_S) until *count, which the loop's work brings down, is 0,
 * and checks that it is: workers' jobs finishing, domains closing. */
void td_pump_until_zero(const unsigned *count);
/* Until every domain closed (jobs hold theirs). */
void td_wait_domains_closed(void);
/* The open domain called name, or NULL. */
struct domain *td_find_domain(const char *name);
