/* SPDX-License-Identifier: MIT */
/* Passing the hand-over on (control/handover.h): at a stop into systemd's FD store, at SIGUSR2
 * across mrd's own re-exec, after the clients' own PDs let go; and, once the next mrd took it
 * over, the grace its allocations wait in for their owners. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "log.h"
#include "macro.h"
#include "time-util.h"
#include "base/fd-closer.h"
#include "base/fd-list.h"
#include "registration/bound-pd.h"
#include "core/domain-handover.h"
#include "core/domain.h"
#include "control/client.h"
#include "control/handover.h"
#include "control/manager.h"

#define BARRIER_TIMEOUT_USEC (5 * USEC_PER_SEC)

unsigned handover_fd_store_max(void)
{
	const char *e = getenv("FDSTORE");
	unsigned long v;
	char *end;

	if (!e || !getenv("NOTIFY_SOCKET"))
		return 0;
	errno = 0;
	v = strtoul(e, &end, 10);
	return errno || end == e || *end || v > UINT32_MAX ? 0 : (unsigned)v;
}

int handover_to_fd_store(struct manager *m)
{
	struct fd_list f;
	unsigned n_allocations, max = handover_fd_store_max();
	int r;

	r = handover_save(m, &f, &n_allocations);
	if (r < 0)
		return log_error_errno(r, "cannot save the state for the next mrd: %m; its clients' "
					  "memory is not handed over");
	if (m->core.n_domains == 0 && LIST_EMPTY(&m->old_contexts)) {
		fd_list_done(&f);
		return 0; /* nothing to keep */
	}
	if (f.n > max) {
		log_error("%zu descriptors to hand over, but systemd keeps %u "
			  "(FileDescriptorStoreMax=): clients' memory is not handed over", f.n, max);
		fd_list_done(&f);
		return -E2BIG;
	}
	/* The arenas first, the state last: a state in the store names only stored arenas. */
	for (size_t i = f.n; i-- > 0;) {
		char msg[320];

		/* FDPOLL=0: a memfd never hangs up, systemd need not watch it. */
		snprintf(msg, sizeof(msg), "FDSTORE=1\nFDPOLL=0\nFDNAME=%s", f.names[i]);
		r = sd_pid_notify_with_fds(0, 0, msg, &f.fds[i], 1);
		if (r <= 0) {
			log_error_errno(r < 0 ? r : -ENOTCONN, "cannot store %s with systemd: %m",
					f.names[i]);
			fd_list_done(&f);
			return r < 0 ? r : -ENOTCONN;
		}
	}
	/* Only once systemd holds them may the pages stop being ours to free. */
	r = sd_notify_barrier(0, BARRIER_TIMEOUT_USEC);
	if (r < 0)
		log_warning_errno(r, "systemd did not confirm the FD store: %m");
	window_keep_content(&m->core.window, true);
	log_notice("handed %u allocation(s) in %zu arena(s) to systemd's FD store for the next mrd",
		   n_allocations, f.n - 1);
	fd_list_done(&f);
	return 0;
}

unsigned handover_unbind_clients(struct manager *m)
{
	struct client *c;

	__atomic_store_n(&m->core.stopping, true, __ATOMIC_RELEASE);
	m->core.workers = worker_pool_free(m->core.workers);
	LIST_FOREACH(c, &m->clients, link)
		if (c->bound) {
			c->bound = bound_pd_close(c->bound);
			c->bound_lost = true; /* no key of the domain's PD for it, ever */
		}
	domains_finish_leaving(&m->core); /* and those of clients that left */
	/* What is left holds MRs the device kept (a failed dereg, now or before). */
	return domains_client_pds_left(&m->core);
}

/* The workers again, after an unbind for a hand-over that did not happen. */
static void restart_workers(struct manager *m)
{
	int r;

	__atomic_store_n(&m->core.stopping, false, __ATOMIC_RELEASE);
	r = worker_pool_new(m->core.base, m->core.config.workers, &m->core.workers);
	if (r < 0)
		log_error_errno(r, "cannot start worker threads again: %m; big registrations run on "
				"the loop");
}

static int reexec(struct manager *m);

/* How long a re-exec waits for the closers to empty: descriptors mrd just let go of close
 * in well under this; one a client holds up does not close at all. */
#define REEXEC_CLOSER_WAIT_USEC (2 * USEC_PER_SEC)

int handover_reexec(struct manager *m)
{
	unsigned live, stuck;
	uid_t stuck_uid;
	bool stuck_own;
	int r;

	if (!m->exe_path || !m->argv || access(m->exe_path, X_OK) < 0)
		return log_error_errno(m->exe_path ? -errno : -ENOENT,
				       "SIGUSR2: cannot re-execute %s: %m; mrd goes on as it is",
				       m->exe_path ? m->exe_path : "mrd");
	/* exec closes what waits at the closers itself, on this thread, and cannot end while a
	 * closer is stuck in a close(): let them finish, or stay. */
	r = fd_closer_quiesce(m->closer, REEXEC_CLOSER_WAIT_USEC, &stuck_own, &stuck_uid, &stuck);
	if (r < 0) {
		char who[32] = "mrd's own memory";

		if (!stuck_own)
			snprintf(who, sizeof(who), "uid %u", (unsigned)stuck_uid);
		return log_error_errno(r, "SIGUSR2: %u descriptor(s) of %s are still being "
				       "closed (a close that does not return: a FUSE file whose "
				       "server does not answer? /sys/fs/fuse/connections/*/abort "
				       "ends it); exec would wait for them; mrd goes on as it is",
				       stuck, who);
	}
	/* First, while nothing is saved: a client PD's MR the device keeps would outlive this mrd
	 * in the client's context, over pages the next one hands out again. */
	live = handover_unbind_clients(m);
	if (live > 0) {
		restart_workers(m);
		return log_error_errno(-EBUSY, "SIGUSR2: %u client PD(s) keep MRs mrd could not "
				       "deregister (quarantined runs, mrctl status): they would "
				       "outlive mrd over memory the next one reuses; mrd goes on as "
				       "it is", live);
	}
	r = reexec(m); /* returns only when it could not */
	restart_workers(m);
	return r;
}

static int reexec(struct manager *m)
{
	struct fd_list f;
	unsigned n_allocations;
	int r, sock;

	r = handover_save(m, &f, &n_allocations);
	if (r < 0)
		return log_error_errno(r, "SIGUSR2: cannot save the state: %m; mrd goes on as it is");
	/* The socket too: connections made meanwhile wait in its backlog. */
	sock = fcntl(m->listen_fd, F_DUPFD_CLOEXEC, 3);
	r = sock < 0 ? negative_errno() :
		       fd_list_add(&f, sock, m->bound_path ? HANDOVER_BOUND_SOCKET_NAME : HANDOVER_SOCKET_NAME);
	if (r >= 0)
		r = fd_list_export(&f, SD_LISTEN_FDS_START);
	if (r < 0) {
		fd_list_done(&f);
		return log_error_errno(r, "SIGUSR2: %m; mrd goes on as it is");
	}
	log_notice("SIGUSR2: re-executing %s with %u allocation(s) in %zu arena(s)", m->exe_path,
		   n_allocations, f.n - 2);
	(void)sd_notifyf(0, "RELOADING=1\nSTATUS=re-executing\nMONOTONIC_USEC=%" PRIu64,
			 now_usec(CLOCK_MONOTONIC));
	if (m->detached)
		setenv(MANAGER_DETACHED_ENV, "1", 1);
	/* From here there is no way back: descriptors 3 and up are the hand-over's. */
	fd_list_place(&f, SD_LISTEN_FDS_START);
	fd_list_done(&f);
	execv(m->exe_path, m->argv);
	log_error_errno(-errno, "SIGUSR2: exec %s: %m; exiting", m->exe_path);
	_exit(EXIT_FAILURE);
}

static void on_grace_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct manager *m = userdata;
	unsigned waiting = domains_reap_orphans(&m->core, false);

	if (waiting == 0) {
		event_free(m->grace_timer);
		m->grace_timer = NULL;
	} else
		log_debug("%u allocation(s) still wait for live processes to reconnect", waiting);
}

void handover_end_grace(struct manager *m)
{
	if (m->grace_timer) {
		event_free(m->grace_timer);
		m->grace_timer = NULL;
	}
	(void)domains_reap_orphans(&m->core, true);
}

int handover_start_grace(struct manager *m)
{
	/* Every so often, what waits for a process that is gone goes. */
	struct timeval grace = { .tv_sec = m->core.config.reconnect_grace_s };

	m->grace_timer = event_new(m->core.base, -1, EV_PERSIST, on_grace_tick, m);
	if (!m->grace_timer || event_add(m->grace_timer, &grace) < 0)
		return -ENOMEM;
	return 0;
}
