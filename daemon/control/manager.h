/* SPDX-License-Identifier: MIT */
/* The daemon itself: its event loop, listening sockets, clients and their users' shares,
 * domains, devices and workers, signals and hand-over. It embeds core (struct core). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "u64-map.h"
#include "base/config.h"
#include "base/fd-list.h"
#include "base/process.h"
#include "core/core.h"
#include "control/handover.h"
#include "control/old-context.h"
#include "control/refusal-log.h"

struct event_base;
struct event;
struct client;
struct domain;
struct provider;
struct worker_pool;
struct bus;
struct fd_closer;
struct signal_source;

/* What one user holds of the slots mrd shares out: its uid (process_owner_uid: a user
 * namespace's identities are its owner's) and its connections, bare ones included. */
struct user_share {
	uid_t uid;
	unsigned clients;
	size_t out_bytes; /* replies its connections hold unread (control/client.h) */
	/* The domains of containers in cgroups the user made itself (rootless ones) that its
	 * clients are in, each with how many: [limits] container_domains_per_user at most. */
	struct user_container {
		char name[64];
		unsigned clients;
	} *containers;
	unsigned n_containers;
};

/* The daemon: owns the event loop, the configuration, the listening socket and every client. */
struct manager {
	struct core core; /* what domains and the layers below read */
	struct signal_source *signals; /* SIGTERM, SIGINT, SIGHUP, SIGUSR2 */

	int listen_fd;
	struct event *listen_event;
	struct event *accept_retry_event; /* re-arms the listener after EMFILE */
	char *bound_path;                 /* unlinked on exit; NULL when systemd owns the socket */

	bool reexec;               /* SIGUSR2 asked for a re-exec with a hand-over */
	const char *exe_path;      /* what a re-exec runs, with argv (main's); NULL: none */
	char **argv;
	bool detached;             /* no terminal, logs to syslog: so is the re-executed image */
	bool stop;                 /* SIGTERM/SIGINT came: it wins over a re-exec asked for */
	struct event *grace_timer; /* after a hand-over: orphans wait for their owners */
	/* Names of what the previous mrd left in systemd's FD store: removed from it once mrd
	 * serves (if it fails to start, the next try may still take them). */
	struct fd_list fd_store_taken;
	struct bus *bus;             /* NULL: not on the system bus */
	/* Contexts earlier mrds exported and handed over while clients held them. */
	struct old_contexts old_contexts;

	LIST_HEAD(, client) clients;
	unsigned n_clients;
	struct fd_closer *closer; /* every descriptor from a client that mrd lets go of */
	struct u64_map users; /* uid + 1 -> struct user_share, while it has a connection */
	char *uid_map;        /* mrd's own /proc/self/uid_map, for its clients' places */
	char *cgroup_mount;   /* where mrd sees the cgroup v2 hierarchy; NULL: nowhere */
	dev_t userns_dev;     /* mrd's own user namespace (0: unknown) */
	ino_t userns_ino;
	uint64_t next_client_id;

	uint8_t *recv_buf; /* one packet at a time: the loop is single-threaded */
	size_t recv_buf_size;

	uint64_t start_usec;
	uint64_t instance; /* random: tells clients two mrd starts apart */
	uint64_t refused_log_usec; /* rate limit for "too many clients" */
	unsigned refused_since_log;
	uint64_t dropped_log_usec; /* the same for "dropping client" */
	unsigned dropped_since_log;
	struct refusal_limit refusal_limit; /* lines about refused requests, all clients */

	/* SIGHUP: reads the configuration again (main's: file, folder, command line) into *ret;
	 * NULL: no reload. */
	int (*load_config)(void *data, struct config *ret);
	void *load_config_data;

	/* counters shown by Status */
	uint64_t n_requests;
	uint64_t n_protocol_errors;
	uint64_t n_clients_dropped;
};

/* Set by a detached mrd for the image it re-executes. */
#define MANAGER_DETACHED_ENV "MRD_DETACHED"

/* Blocks (or unblocks) the signals the loop reads from its signalfd; the mask survives exec.
 * mrd blocks them from its start for good: no thread of it ever takes one by a handler. */
void manager_block_signals(bool block);

/* Takes ownership of *config (left re-initialised). */
int manager_new(struct config *config, struct manager **ret);
struct manager *manager_free(struct manager *m);
DEFINE_CLEANUP(struct manager, manager_free)

/* Swaps in new (taken over, left re-initialised). Keys mrd reads only at start keep their
 * running values; their names, when they changed, go to changed ("" when none). */
void manager_reconfigure(struct manager *m, struct config *new, char *changed, size_t size);

/* Takes the socket from systemd (LISTEN_FDS) or binds config.socket_path, and what a previous
 * mrd handed over (daemon/control/handover.h), then joins the system bus unless [mrd] bus = no. */
int manager_listen(struct manager *m);

/* Serves until SIGTERM/SIGINT; tells systemd READY=1 and STOPPING=1. Hands the memory over
 * into systemd's FD store at the end when it has one, or re-executes at SIGUSR2. */
int manager_run(struct manager *m);

/* Adopts a connected socket with the given peer credentials (accept path and tests), charged to
 * owner (the user who answers for the peer: process_owner_uid), in place (its namespaces and
 * cgroup; NULL: mrd's namespaces, no cgroup). -EUSERS when mrd serves [limits] clients, or
 * owner (other than root) [limits] clients_per_user. */
int manager_add_client(struct manager *m, int fd, const struct ucred *cred, uid_t owner,
		       const struct process_place *place, struct client **ret);
/* A client's connection closed: its user's share goes down (and away at 0). */
void manager_user_share_put(struct manager *m, struct user_share *u);
/* A client of a container domain that counted in u's (user_share.containers) closed. */
void manager_user_container_put(struct user_share *u, const char *domain);
/* Whether the cgroup (a path in the cgroup v2 hierarchy) is one a user made: a user may make
 * cgroups of any name below its own delegated subtree (systemd chowns it to the user), and
 * one a user made is the user's; root's runtimes (rootful podman, Kubernetes) make root's.
 * What cannot be told is taken as a user's. */
bool manager_cgroup_user_made(const struct manager *m, const char *cgroup);
/* The user a process pid of uid is charged to (process_charged_uid, with mrd's namespace and
 * /etc/subuid). */
int manager_charged_uid(const struct manager *m, pid_t pid, uid_t uid, uid_t *ret);

uint64_t manager_uptime_usec(const struct manager *m);

/* SIGHUP's, and mrctl reload's (by names which, for the log): the configuration read again
 * (load_config) and swapped in, new devices looked for. 0, -EOPNOTSUPP without load_config,
 * or the load's error (logged; the running configuration stays). changed as for
 * manager_reconfigure. */
int manager_reload(struct manager *m, const char *by, char *changed, size_t size);
/* SIGTERM's, and mrctl shutdown's: the loop ends (manager_run returns) once this event is
 * handled; by says why, in the log. */
void manager_shutdown(struct manager *m, const char *by);

/* The daemon's figures as far as view (access_view's: NULL for everything) shows them. */
struct view_totals {
	uint32_t domains, clients;
	uint64_t allocated_bytes, pinned_bytes;
	uint64_t quarantined_bytes; /* freed runs the device kept an MR over (registrar.h) */
	uint32_t quarantined_runs;
};
void manager_view_totals(const struct manager *m, const char *view, struct view_totals *ret);
