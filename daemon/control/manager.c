/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <systemd/sd-daemon.h>

#include "log.h"
#include "time-util.h"
#include "wire.h"
#include "base/fd-closer.h"
#include "base/process.h"
#include "base/signal-source.h"
#include "base/worker-pool.h"
#include "provider/provider.h"
#include "registration/reg-allocation.h"
#include "core/access.h"
#include "core/domain-stats.h"
#include "core/domain.h"
#include "control/bus.h"
#include "control/client.h"
#include "control/dispatch.h"
#include "control/handover.h"
#include "control/manager.h"

#define REFUSED_LOG_INTERVAL_USEC (5 * USEC_PER_SEC)
#define ACCEPT_PER_WAKEUP 16u
/* A client's descriptor whose close runs this long counts as stuck: the closers start a
 * thread past their usual number for the next user (base/fd-closer.h). */
#define CLOSE_STUCK_USEC USEC_PER_SEC
#define SUBUID_PATH "/etc/subuid"

/* Keeps old's value of a key read only at start in new, noting its name when it changed. */
#define KEEP(field, name)                                                        \
	do {                                                                     \
		if (old->field != new->field) {                                  \
			new->field = old->field;                                 \
			n += (size_t)snprintf(changed + n, n < size ? size - n : 0, \
					      "%s%s", n ? ", " : "", name);      \
		}                                                                \
	} while (0)
#define KEEP_STRING(field, name)                                                 \
	do {                                                                     \
		if (!streq_ptr(old->field, new->field)) {                        \
			char *t_ = new->field;                                   \
			new->field = old->field;                                 \
			old->field = t_; /* freed with old */                    \
			n += (size_t)snprintf(changed + n, n < size ? size - n : 0, \
					      "%s%s", n ? ", " : "", name);      \
		}                                                                \
	} while (0)

static bool streq_ptr(const char *a, const char *b)
{
	return a == b || (a && b && strcmp(a, b) == 0);
}

void manager_view_totals(const struct manager *m, const char *view, struct view_totals *ret)
{
	const struct client *c;
	struct domain *d;

	memset(ret, 0, sizeof(*ret));
	LIST_FOREACH(c, &m->clients, link)
		ret->clients += access_view_shows(view, c->domain_name);
	LIST_FOREACH(d, &m->core.domains, link) {
		struct domain_stats s;

		if (!access_view_shows(view, d->name))
			continue;
		domain_stats(d, &s);
		ret->domains++;
		ret->allocated_bytes += s.allocated_bytes;
		ret->pinned_bytes += s.pinned_bytes;
		ret->quarantined_bytes += s.quarantined_bytes;
		ret->quarantined_runs += s.quarantined_runs;
	}
}

void manager_reconfigure(struct manager *m, struct config *new, char *changed, size_t size)
{
	struct client *c;

	struct config *old = &m->core.config;
	size_t n = 0;

	changed[0] = '\0';
	/* The listener, the provider, the window, the receive buffer and the workers were made
	 * from these. */
	KEEP_STRING(socket_path, "[mrd] socket");
	KEEP_STRING(provider, "[mrd] provider");
	KEEP_STRING(device, "[mrd] device");
	KEEP(bus, "[mrd] bus");
	KEEP(socket_mode, "[mrd] socket_mode");
	KEEP_STRING(socket_group, "[mrd] socket_group");
	new->socket_gid = old->socket_gid; /* resolved from it */
	new->socket_group_missing = old->socket_group_missing;
	KEEP(max_frame, "[limits] frame_bytes");
	KEEP(max_fds, "[limits] fds_per_message");
	KEEP(window_base, "[memory] window_base");
	KEEP(window_size, "[memory] window_size");
	KEEP(arena_size, "[memory] arena_size");
	KEEP(workers, "[cache] workers");
	KEEP(odp_chunk, "[cache] odp_chunk");
	config_done(old);
	*old = *new;
	config_init(new);
	log_set_level(old->log_level);
	domains_resolve_quotas(&m->core);
	/* admin_group may have changed: the clients connected now are judged by the new one. */
	LIST_FOREACH(c, &m->clients, link)
		c->admin = access_is_admin(&m->core.config, &(struct access_peer){
			.uid = c->owner.mem.uid, .gid = c->gid, .fd = c->fd,
			.nested_pidns = c->nested_pidns, .other_userns = c->other_userns });
}

#undef KEEP
#undef KEEP_STRING

static int reload_config_file(struct manager *m, const char *by, char *changed, size_t size)
{
	struct config new;
	int r;

	if (!m->load_config) {
		log_notice("%s: no configuration to reload", by);
		return -EOPNOTSUPP;
	}
	(void)sd_notify(0, "RELOADING=1");
	config_init(&new);
	r = m->load_config(m->load_config_data, &new);
	if (r < 0) {
		config_done(&new);
		log_error("%s: the configuration has errors (above): the running one stays", by);
		(void)sd_notify(0, "READY=1\nSTATUS=reload failed: the running configuration stays");
		return r;
	}
	manager_reconfigure(m, &new, changed, size);
	if (*changed)
		log_notice("%s: configuration reloaded; these keys change only at a restart, and "
			   "keep their running values: %s", by, changed);
	else
		log_notice("%s: configuration reloaded", by);
	(void)sd_notifyf(0, "READY=1\nSTATUS=configuration reloaded%s%s",
			 *changed ? "; needs a restart: " : "", changed);
	return 0;
}

int manager_reload(struct manager *m, const char *by, char *changed, size_t size)
{
	size_t n = m->core.served.n;
	int r;

	changed[0] = '\0';
	r = reload_config_file(m, by, changed, size);
	/* A device that came since: status lists it, so mrctl cdi (the udev rule's reload,
	 * then mrd-cdi.service) offers it to containers. */
	served_devices_scan(&m->core);
	for (size_t i = n; i < m->core.served.n; i++)
		log_info("device %s: new; clients may bind their own PDs on it (BindPd)",
			 m->core.served.v[i].name);
	return r;
}

void manager_shutdown(struct manager *m, const char *by)
{
	log_info("%s, shutting down", by);
	m->stop = true;
	event_base_loopbreak(m->core.base);
}

static void manager_on_signal(int sig, void *userdata)
{
	struct manager *m = userdata;
	char changed[512];

	if (sig == SIGHUP) {
		(void)manager_reload(m, "SIGHUP", changed, sizeof(changed));
		return;
	}
	if (sig == SIGUSR2) {
		m->reexec = true;
		event_base_loopbreak(m->core.base);
		return;
	}
	manager_shutdown(m, sig == SIGTERM ? "received SIGTERM" : "received SIGINT");
}

static void log_capabilities(const struct provider_caps *caps)
{
	char why[160];

	if (!caps->atomic)
		log_notice("device %s has no remote atomics: MRs are registered without "
			   "REMOTE_ATOMIC", caps->device);
	if (caps->odp && *provider_odp_gap(caps, registration_access(false, caps), why,
					   sizeof(why)))
		log_notice("on-demand memory is registered pinned: %s", why);
}

static int manager_open_provider(struct manager *m)
{
	const struct config *c = &m->core.config;
	int verbs_error, r;
	size_t hidden;

	r = provider_open(c->provider, c->device, &m->core.provider, &verbs_error);
	if ((r == -ENODEV || verbs_error) && (hidden = provider_verbs_hidden()) > 0)
		log_warning("%zu RDMA device(s) hidden from mrd: the kernel keeps each to its network "
			    "namespace (ib_core netns_mode=0) and mrd runs in another; run it in "
			    "theirs, without PrivateNetwork= (mrd(8), PRIVILEGES)", hidden);
	if (r == -ENODEV && c->device)
		return log_error_errno(r, "RDMA device '%s' not found (provider %s)", c->device,
				       c->provider);
	if (r == -ENODEV)
		return log_error_errno(r, "no RDMA device found; use provider = soft (or auto) to "
					  "run on the software NIC");
	if (r < 0)
		return log_error_errno(r, "cannot open the %s provider: %m", c->provider);
	if (verbs_error)
		log_info("no RDMA device found: using the soft provider (a software NIC)");
	log_info("provider %s, device %s", provider_name(m->core.provider),
		 m->core.provider->caps.device);
	log_capabilities(&m->core.provider->caps);
	return 0;
}

/* The signals the loop takes (from its signalfd: blocked in every thread for good). */
static void loop_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
	sigaddset(set, SIGUSR2);
}

void manager_block_signals(bool block)
{
	sigset_t set;

	loop_signals(&set);
	(void)sigprocmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
}

/* The one upcast from core to the manager: an arena went, so no client holds its id. */
static void forget_arena(struct core *core, uint32_t arena_id)
{
	client_forget_arena_all(container_of(core, struct manager, core), arena_id);
}

/* Where this process sees the whole cgroup v2 hierarchy (a cgroup2 mount of its root:
 * /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host), in a string the caller frees;
 * NULL where there is none. */
static char *cgroup_v2_mount(void)
{
	char line[1024], root[512], point[512];
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *found = NULL;

	while (f && !found && fgets(line, sizeof(line), f))
		if (strstr(line, " - cgroup2 ") &&
		    sscanf(line, "%*s %*s %*s %511s %511s", root, point) == 2 &&
		    strcmp(root, "/") == 0)
			found = strdup(point);
	if (f)
		fclose(f);
	return found;
}

/* mrd in a cgroup namespace of its own (a pod's, as containerd makes them) sees other pods'
 * cgroups as "/../..." paths, which tell no container from another: say so once. */
static void warn_cgroup_namespace(const struct manager *m)
{
	struct process_place init = {};

	if (m->cgroup_mount && process_place_read(1, 0, NULL, &init) == 0 && !init.cgroup)
		log_warning("mrd runs in a cgroup namespace of its own: clients in containers get "
			    "their uid's domain, not their container's; run mrd in the host's "
			    "(nsenter --cgroup=/proc/1/ns/cgroup, or hostPID and that in a pod)");
	free(init.cgroup);
}

int manager_new(struct config *config, struct manager **ret)
{
	_cleanup_(manager_freep) struct manager *m = NULL;
	sigset_t signals;
	struct stat st;
	int r;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->listen_fd = -1;
	LIST_INIT(&m->clients);
	LIST_INIT(&m->core.domains);
	LIST_INIT(&m->old_contexts);
	m->core.arena_gone = forget_arena;
	m->core.config = *config;
	config_init(config);
	m->start_usec = now_usec(CLOCK_MONOTONIC);
	/* Clients in user namespaces below this one answer to their owners (manager_on_accept). */
	if (stat("/proc/self/ns/user", &st) == 0) {
		m->userns_dev = st.st_dev;
		m->userns_ino = st.st_ino;
	} else
		log_warning_errno(-errno, "cannot tell mrd's user namespace (/proc/self/ns/user: %m): "
					  "clients in user namespaces count as the uids they show");
	m->cgroup_mount = cgroup_v2_mount();
	warn_cgroup_namespace(m);
	/* Without it every client counts as in another user namespace: none is an admin. */
	m->uid_map = process_uid_map("/proc/self");
	if (!m->uid_map)
		log_warning_errno(-errno, "cannot read /proc/self/uid_map: %m; no client will be an "
					  "admin");
	if (getrandom(&m->instance, sizeof(m->instance), 0) != sizeof(m->instance))
		m->instance = m->start_usec ^ ((uint64_t)getpid() << 32);

	r = manager_open_provider(m);
	if (r < 0)
		return r;
	served_devices_scan(&m->core);
	for (size_t i = 0; i < m->core.served.n; i++)
		log_info("device %s: clients may bind their own PDs on it (BindPd)",
			 m->core.served.v[i].name);
	r = window_reserve(&m->core.window, m->core.config.window_base, m->core.config.window_size,
			   m->core.config.arena_size);
	if (r == -EADDRINUSE)
		return log_error_errno(r, "the address window 0x%llx+0x%llx is taken in mrd; move it "
					  "with [memory] window_base (or window_size) in mrd.conf",
				       (unsigned long long)m->core.config.window_base,
				       (unsigned long long)m->core.config.window_size);
	if (r < 0)
		return log_error_errno(r, "cannot reserve the address window: %m");

	m->core.base = event_base_new();
	if (!m->core.base)
		return -ENOMEM;
	r = fd_closer_new(CLOSE_STUCK_USEC, &m->closer);
	if (r < 0)
		return log_error_errno(r, "cannot start the descriptor closer: %m");
	m->core.closer = m->closer;
	r = device_watch_start(&m->core);
	if (r < 0)
		return log_error_errno(r, "cannot watch the device's events: %m");
	r = worker_pool_new(m->core.base, m->core.config.workers, &m->core.workers);
	if (r < 0)
		return log_error_errno(r, "cannot start worker threads: %m");

	/* One packet at a time, plus one byte so an oversized frame shows as truncated. */
	m->recv_buf_size = m->core.config.max_frame + 1;
	m->recv_buf = malloc(m->recv_buf_size);
	if (!m->recv_buf)
		return -ENOMEM;

	loop_signals(&signals);
	r = signal_source_new(m->core.base, &signals, manager_on_signal, m, &m->signals);
	if (r < 0)
		return r;

	*ret = TAKE_PTR(m);
	return 0;
}

struct manager *manager_free(struct manager *m)
{
	if (!m)
		return NULL;
	m->bus = bus_free(m->bus);
	/* Jobs finish first: their completions still need clients and domains. */
	__atomic_store_n(&m->core.stopping, true, __ATOMIC_RELEASE);
	m->core.workers = worker_pool_free(m->core.workers);
	m->core.dma_worker = worker_pool_free(m->core.dma_worker);
	/* Clients may outlive mrd, their memory mapped: it keeps its content until they let go
	 * (the kernel frees the pages with the last mapping). */
	window_keep_content(&m->core.window, true);
	while (!LIST_EMPTY(&m->clients))
		client_free(LIST_FIRST(&m->clients)); /* releases their domains */
	domains_finish_leaving(&m->core); /* and what those that left before still own */
	handover_end_grace(m); /* and the domains still waiting for their owners */
	m->core.closer = NULL; /* arenas freed from here on close their memfds at once */
	m->closer = fd_closer_free(m->closer); /* after every client's descriptors */
	u64_map_done(&m->users); /* empty: the clients took their shares along */
	device_watch_stop(&m->core);
	provider_close(m->core.provider);
	window_release(&m->core.window);
	if (m->listen_event)
		event_free(m->listen_event);
	if (m->accept_retry_event)
		event_free(m->accept_retry_event);
	safe_close(m->listen_fd);
	if (m->bound_path) {
		unlink(m->bound_path);
		free(m->bound_path);
	}
	signal_source_free(m->signals);
	if (m->core.base)
		event_base_free(m->core.base);
	free(m->recv_buf);
	free(m->uid_map);
	free(m->cgroup_mount);
	free(m->core.floors);
	old_contexts_free(&m->old_contexts);
	fd_list_done(&m->fd_store_taken);
	config_done(&m->core.config);
	free(m);
	return NULL;
}

uint64_t manager_uptime_usec(const struct manager *m)
{
	return now_usec(CLOCK_MONOTONIC) - m->start_usec;
}

/* Sends the one reply a refused connection gets, so its Hello fails with a reason. */
static void send_refusal(int fd, int error, const char *message)
{
	Mrd__Response resp = MRD__RESPONSE__INIT;

	resp.status = -error;
	resp.message = (char *)message;
	(void)wire_send(fd, &resp.base, WIRE_FRAME_MAX, NULL, 0, MSG_DONTWAIT);
}

static uint64_t user_key(uid_t uid) { return (uint64_t)uid + 1; /* 0 is no key */ }

void manager_user_share_put(struct manager *m, struct user_share *u)
{
	if (--u->clients > 0)
		return;
	u64_map_remove(&m->users, user_key(u->uid));
	free(u->containers);
	free(u);
}

void manager_user_container_put(struct user_share *u, const char *domain)
{
	for (unsigned i = 0; i < u->n_containers; i++)
		if (strcmp(u->containers[i].name, domain) == 0) {
			if (--u->containers[i].clients == 0)
				u->containers[i] = u->containers[--u->n_containers];
			return;
		}
}

/* A client of u's joins the container domain named domain: 0, or -EDQUOT when u's clients are
 * in [limits] container_domains_per_user others already. */
static int user_container_get(struct manager *m, struct user_share *u, const char *domain)
{
	struct user_container *grown;

	for (unsigned i = 0; i < u->n_containers; i++)
		if (strcmp(u->containers[i].name, domain) == 0) {
			u->containers[i].clients++;
			return 0;
		}
	if (u->n_containers >= m->core.config.max_user_containers)
		return -EDQUOT;
	grown = realloc(u->containers, (u->n_containers + 1) * sizeof(*grown));
	if (!grown)
		return -ENOMEM;
	u->containers = grown;
	snprintf(grown[u->n_containers].name, sizeof(grown->name), "%s", domain);
	grown[u->n_containers++].clients = 1;
	return 0;
}

int manager_charged_uid(const struct manager *m, pid_t pid, uid_t uid, uid_t *ret)
{
	return process_charged_uid(pid, uid, m->userns_dev, m->userns_ino, SUBUID_PATH, ret);
}

bool manager_cgroup_user_made(const struct manager *m, const char *cgroup)
{
	_cleanup_free_ char *path = NULL;
	struct stat st;

	if (!m->cgroup_mount || !cgroup || asprintf(&path, "%s%s", m->cgroup_mount, cgroup) < 0)
		return true;
	return stat(path, &st) < 0 || st.st_uid != 0;
}

int manager_add_client(struct manager *m, int fd, const struct ucred *cred, uid_t owner,
		       const struct process_place *place, struct client **ret)
{
	struct access_peer peer = { .uid = cred->uid, .gid = cred->gid, .fd = fd };
	bool admin, user_container = false;
	struct user_share *u;
	char domain[64];
	int r;

	if (m->n_clients >= m->core.config.max_clients)
		return -EUSERS;
	/* Bare connections count too: a slot is taken at accept, Hello or not. Root's are
	 * not limited, so an administrator gets in while users hold their shares. */
	u = u64_map_get(&m->users, user_key(owner));
	if (u && owner != 0 && u->clients >= m->core.config.max_clients_per_user)
		return -EUSERS;
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return -ENOMEM;
		u->uid = owner;
		r = u64_map_put(&m->users, user_key(owner), u);
		if (r < 0) {
			free(u);
			return r;
		}
	}
	u->clients++;

	if (place) {
		peer.nested_pidns = place->nested_pidns;
		peer.other_userns = place->other_userns;
		peer.cgroup = place->cgroup;
		peer.cgroup_user_made = manager_cgroup_user_made(m, place->cgroup);
	}
	admin = access_is_admin(&m->core.config, &peer);
	/* The owner's domain: its namespaces' identities are its own (docs/design.md, "Users"). */
	peer.uid = owner;
	access_domain_name(&m->core.config, &peer, domain, sizeof(domain));
	/* A user who makes cgroups and pid namespaces makes containers, each a domain with its own
	 * quotas: a few per user, then the user's own domain. A pid namespace of the user's in a
	 * cgroup of root's that no runtime made (each login's session scope) counts too. */
	if (owner != 0 && access_is_container_domain(domain) &&
	    (peer.cgroup_user_made || !access_cgroup_of_runtime(peer.cgroup))) {
		r = user_container_get(m, u, domain);
		if (r == -EDQUOT) {
			log_info("uid %u has %u container domains open ([limits] "
				 "container_domains_per_user): client pid %d of %s joins the "
				 "user's own", (unsigned)owner, u->n_containers, (int)cred->pid,
				 domain);
			peer.nested_pidns = false;
			access_domain_name(&m->core.config, &peer, domain, sizeof(domain));
		} else if (r < 0) {
			manager_user_share_put(m, u);
			return r;
		} else
			user_container = true;
	}
	r = client_new(m, fd, cred->pid, cred->uid, cred->gid, admin, domain, ret);
	if (r < 0) {
		if (user_container)
			manager_user_container_put(u, domain);
		manager_user_share_put(m, u);
		return r;
	}
	(*ret)->owner_uid = owner;
	(*ret)->share = u;
	(*ret)->user_container = user_container;
	(*ret)->nested_pidns = place && place->nested_pidns;
	(*ret)->other_userns = peer.other_userns;
	return 0;
}

/* Why manager_add_client said -EUSERS, for the refused peer (uid, answered for by owner). */
static void refusal_reason(const struct manager *m, uid_t uid, uid_t owner, char *buf,
			   size_t size)
{
	int n;

	if (m->n_clients >= m->core.config.max_clients) {
		snprintf(buf, size, "mrd serves too many clients; see limits.clients");
		return;
	}
	n = snprintf(buf, size, "uid %u has %u connections open ([limits] clients_per_user)",
		     (unsigned)owner, m->core.config.max_clients_per_user);
	if (owner != uid && n >= 0 && (size_t)n < size)
		snprintf(buf + n, size - (size_t)n, "; this is uid %u, in a user namespace of uid %u",
			 (unsigned)uid, (unsigned)owner);
}

/* Refusals are logged once per REFUSED_LOG_INTERVAL_USEC, with how many there were: a flood
 * of them must not flood the journal. */
static void log_refusal(struct manager *m, const struct ucred *cred, const char *why)
{
	uint64_t now = now_usec(CLOCK_MONOTONIC);

	m->refused_since_log++;
	if (now - m->refused_log_usec < REFUSED_LOG_INTERVAL_USEC)
		return;
	log_warning("refused %u connection(s), last from pid %d uid %u: %s", m->refused_since_log,
		    (int)cred->pid, (unsigned)cred->uid, why);
	m->refused_log_usec = now;
	m->refused_since_log = 0;
}

/* Root is not refused for it, so that an administrator gets in whatever root's programs did
 * (as with [limits] clients_per_user). */
static bool closer_lane_full(struct manager *m, uid_t owner)
{
	return owner != 0 && fd_closer_lane_full(m->closer, owner);
}

/* Where the peer cred names runs (base/process.h). A peer whose pid mrd cannot see (0: in a pid
 * namespace outside mrd's, which only happens when mrd runs in one) gets its uid's domain, and
 * is in no namespace of mrd's: root in a sibling container is no admin. */
static int client_place(struct manager *m, const struct ucred *cred, struct process_place *ret)
{
	if (cred->pid <= 0) {
		*ret = (struct process_place){ .other_userns = true };
		return 0;
	}
	return process_place_read(cred->pid, cred->uid, m->uid_map, ret);
}

/* A peer whose identity or place (what) cannot be read: it exited or changed its uid before
 * mrd took the connection. Refused saying so; its socket goes to lane's closers (it may hold
 * what it sent). */
static void refuse_unreadable(struct manager *m, int fd, const struct ucred *cred, int r,
			      const char *what, uid_t lane)
{
	char why[256];

	log_debug_errno(r, "refusing pid %d uid %u: cannot read its %s: %m", (int)cred->pid,
			(unsigned)cred->uid, what);
	snprintf(why, sizeof(why), "mrd cannot tell which %s the connecting process is in (it "
		 "exited or changed its uid before mrd took the connection): connect again", what);
	send_refusal(fd, -ESRCH, why);
	fd_closer_consume_socket(m->closer, fd, lane);
}

static void manager_on_accept_retry(evutil_socket_t fd, short what, void *userdata)
{
	struct manager *m = userdata;

	event_add(m->listen_event, NULL);
}

static void manager_on_accept(evutil_socket_t lfd, short what, void *userdata)
{
	struct manager *m = userdata;

	/* A bounded number per wake-up: each costs a walk of /proc, and clients' requests wait
	 * meanwhile. The listener is level-triggered, so what is left wakes it again on the loop's
	 * next turn, after the events that came in meanwhile. */
	for (unsigned taken = 0; taken < ACCEPT_PER_WAKEUP; taken++) {
		struct process_place place;
		struct ucred cred;
		socklen_t len = sizeof(cred);
		struct client *c;
		uid_t owner;
		int fd, r;

		fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				/* Out of descriptors: stop accepting for a moment instead of spinning. */
				struct timeval tv = { 0, 100 * 1000 };
				log_warning_errno(-errno, "accept: %m; pausing the listener");
				event_del(m->listen_event);
				event_add(m->accept_retry_event, &tv);
			} else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warning_errno(-errno, "accept: %m");
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
			log_warning_errno(-errno, "SO_PEERCRED: %m");
			fd_closer_consume_socket(m->closer, fd, (uid_t)-1);
			continue;
		}
		r = manager_charged_uid(m, cred.pid, cred.uid, &owner);
		if (r < 0) {
			/* Its namespace cannot be told, so neither can whom it is charged to. Its
			 * lane is that of the user whose range holds the uid, when one does, so
			 * that subordinate uids do not make lanes of their own. */
			refuse_unreadable(m, fd, &cred, r, "user namespace",
					  subuid_owner(SUBUID_PATH, cred.uid));
			continue;
		}
		r = client_place(m, &cred, &place);
		if (r < 0) {
			refuse_unreadable(m, fd, &cred, r, "namespaces and cgroup", owner);
			continue;
		}
		r = manager_add_client(m, fd, &cred, owner, &place, &c);
		free(place.cgroup);
		if (r == 0 && closer_lane_full(m, owner)) {
			/* Its user's descriptors wait at the closers: it adds none until they go. */
			send_refusal(fd, -ETOOMANYREFS, "mrd is still closing descriptors this user "
							"sent it; connect again later");
			log_refusal(m, &cred, "descriptors of its user still being closed");
			client_free(c); /* its socket goes to that lane too: it may hold what it sent */
			continue;
		}
		if (r == -EUSERS) {
			char why[200];

			refusal_reason(m, cred.uid, owner, why, sizeof(why));
			send_refusal(fd, r, why);
			log_refusal(m, &cred, why);
		} else if (r < 0)
			log_warning_errno(r, "cannot add client pid %d: %m", (int)cred.pid);
		if (r < 0) {
			/* It may hold what the client sent already, descriptors too. */
			fd_closer_consume_socket(m->closer, fd, owner);
			continue;
		}
		log_debug("client %" PRIu64 " connected: pid %d uid %u gid %u, charged to uid %u",
			  c->id, (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid,
			  (unsigned)owner);
	}
}

/* Creates the socket's folder (/run/mrd) when missing, as mrd.tmpfiles would: 0755 whatever
 * the umask, in the socket's group; its parent must exist. One that exists is left as it is,
 * with a warning when others than root (and mrd's own user) may replace the socket in it: its
 * owner, or its group or everyone where it is writable to them without the sticky bit. */
static int socket_folder(const char *folder, gid_t gid)
{
	struct stat st;

	if (mkdir(folder, 0755) == 0) {
		if (chmod(folder, 0755) < 0 || chown(folder, (uid_t)-1, gid) < 0)
			return log_error_errno(-errno, "cannot set up %s: %m", folder);
		return 0;
	}
	if (errno != EEXIST)
		return log_error_errno(-errno, "cannot create %s: %m", folder);
	if (stat(folder, &st) < 0)
		return log_error_errno(-errno, "cannot stat %s: %m", folder);
	if (!S_ISDIR(st.st_mode))
		return log_error_errno(-ENOTDIR, "%s is not a folder", folder);
	if (st.st_uid != 0 && st.st_uid != geteuid())
		log_warning("%s belongs to uid %u, who can replace mrd's socket there; give it to "
			    "root, mode 0755", folder, (unsigned)st.st_uid);
	else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
		log_warning("%s is writable by others (mode %04o): they can replace mrd's socket "
			    "there; make it 0755", folder, (unsigned)(st.st_mode & 07777));
	return 0;
}

/* Whether path holds a socket another mrd serves: -EADDRINUSE; 0 when nothing is there or
 * what is there can go (a stale socket). */
static int socket_in_use(const char *path, const struct sockaddr_un *sa)
{
	_cleanup_close_ int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (probe < 0)
		return log_error_errno(-errno, "socket: %m");
	if (connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
		return log_error_errno(-EADDRINUSE, "another mrd is serving %s", path);
	if (errno == ENOENT)
		return 0;
	if (errno != ECONNREFUSED)
		return log_error_errno(-errno, "%s exists and is not a socket we can replace: %m",
				       path);
	log_info("replacing stale socket %s", path);
	return 0;
}

/* Binds path, replacing a stale socket but never a live mrd's; the socket gets mode and gid
 * ([mrd] socket_mode, socket_group) before anyone can reach it. It is made in a folder of
 * mrd's own beside path (mkdtemp: 0700, nobody else can put a link in it), bound through
 * /proc/self/fd and set up by name relative to that folder's descriptor, then renamed into
 * place: a user who may write the socket's folder never gets mrd to chown or chmod another
 * file through a link (a name swapped between bind and chmod did). */
static int bind_socket(const char *path, unsigned mode, gid_t gid, int *ret_fd)
{
	_cleanup_close_ int fd = -1, parent = -1, own = -1;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char folder[sizeof(sa.sun_path)], tmp[sizeof(sa.sun_path) + 32];
	const char *base, *slash = strrchr(path, '/');
	const char *own_name;
	struct stat st = { 0 }, again;
	mode_t old_umask;
	bool bound = false;
	int r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return log_error_errno(-ENAMETOOLONG, "socket path too long: %s", path);
	strcpy(sa.sun_path, path);
	base = slash ? slash + 1 : path;
	if (!*base)
		return log_error_errno(-EINVAL, "socket path names a folder: %s", path);
	if (!slash)
		strcpy(folder, ".");
	else if (slash == path)
		strcpy(folder, "/");
	else
		snprintf(folder, sizeof(folder), "%.*s", (int)(slash - path), path);
	if (slash && slash != path) {
		r = socket_folder(folder, gid);
		if (r < 0)
			return r;
	}
	r = socket_in_use(path, &sa);
	if (r < 0)
		return r;

	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return log_error_errno(-errno, "socket: %m");
	parent = open(folder, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (parent < 0)
		return log_error_errno(-errno, "cannot open %s: %m", folder);
	snprintf(tmp, sizeof(tmp), "%s/.mrd-bind.XXXXXX", folder);
	if (!mkdtemp(tmp))
		return log_error_errno(-errno, "cannot make a folder beside %s: %m", path);
	own_name = strrchr(tmp, '/') + 1;
	own = openat(parent, own_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (own < 0 || fstat(own, &st) < 0 || st.st_uid != geteuid() ||
	    (st.st_mode & 07777) != 0700) {
		r = log_error_errno(own < 0 ? -errno : -EPERM, "%s changed under mrd: not binding "
				    "there", tmp);
		goto out;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/s", own);
	/* Root's alone until fchownat and fchmodat below (the kernel checks write permission on
	 * the socket at connect). */
	old_umask = umask(0177);
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
	umask(old_umask);
	if (r < 0) {
		log_error_errno(r, "cannot bind %s: %m", path);
		goto out;
	}
	bound = true;
	/* Who may connect: the socket's group (identity still comes from SO_PEERCRED, limits
	 * from quotas). Only mrd writes in its folder: these names are its socket's. */
	if (fchownat(own, "s", (uid_t)-1, gid, AT_SYMLINK_NOFOLLOW) < 0 ||
	    fchmodat(own, "s", mode, 0) < 0) {
		r = log_error_errno(-errno, "cannot give %s group %u and mode %04o: %m", path,
				    (unsigned)gid, mode);
		goto out;
	}
	/* rename replaces whatever has the name now, a link included, and follows nothing. */
	if (renameat(own, "s", parent, base) < 0) {
		r = log_error_errno(-errno, "cannot put the socket at %s: %m", path);
		goto out;
	}
	bound = false;
	if (listen(fd, SOMAXCONN) < 0) {
		r = log_error_errno(-errno, "listen: %m");
		(void)unlinkat(parent, base, 0);
		goto out;
	}
	*ret_fd = TAKE_FD(fd);
out:
	if (bound)
		(void)unlinkat(own, "s", 0);
	/* The name may have been moved by whoever owns the folder: only mrd's own goes. */
	if (fstatat(parent, own_name, &again, AT_SYMLINK_NOFOLLOW) == 0 && own >= 0 &&
	    again.st_dev == st.st_dev && again.st_ino == st.st_ino)
		(void)unlinkat(parent, own_name, AT_REMOVEDIR);
	return r;
}

/* A listening socket passed to mrd: systemd's (socket activation), or its own across a
 * re-exec (then it is mrd's to unlink at exit). */
static int take_listen_fd(struct manager *m, int fd, const char *name)
{
	if (m->listen_fd >= 0)
		return log_error_errno(-EINVAL, "more than one socket passed (LISTEN_FDS); mrd takes "
						"exactly one");
	if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
		return log_error_errno(-EINVAL, "the socket passed (%s) is not a listening "
						"AF_UNIX SOCK_SEQPACKET socket", name);
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
		return log_error_errno(-errno, "fcntl: %m");
	if (strcmp(name, HANDOVER_BOUND_SOCKET_NAME) == 0) {
		m->bound_path = strdup(m->core.config.socket_path);
		if (!m->bound_path)
			return -ENOMEM;
		log_info("serving on %s, kept across the re-exec", m->core.config.socket_path);
	} else
		log_info("serving on the socket passed by systemd");
	m->listen_fd = fd;
	return 0;
}

/* Descriptors passed as systemd passes them (LISTEN_FDS, LISTEN_FDNAMES): a listening socket,
 * and what a previous mrd handed over. */
static int take_passed_fds(struct manager *m)
{
	struct fd_list passed = {};
	char **names = NULL;
	int n, r = 0;

	n = sd_listen_fds_with_names(1, &names);
	if (n < 0)
		return log_error_errno(n, "sd_listen_fds: %m");
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;

		(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
		if (r >= 0 && handover_fd_name(names[i]))
			r = fd_list_add(&passed, fd, names[i]);
		else if (r >= 0)
			r = take_listen_fd(m, fd, names[i]);
		else
			close(fd);
	}
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (r >= 0)
		r = handover_adopt(m, &passed);
	/* Their names stay, for FDSTOREREMOVE once mrd serves (manager_run). */
	for (size_t i = 0; i < passed.n; i++)
		passed.fds[i] = safe_close(passed.fds[i]);
	m->fd_store_taken = passed;
	return r;
}

int manager_listen(struct manager *m)
{
	int r;

	r = take_passed_fds(m);
	if (r < 0)
		return r;
	if (m->listen_fd < 0) {
		const struct config *c = &m->core.config;

		r = bind_socket(c->socket_path, c->socket_mode, c->socket_gid, &m->listen_fd);
		if (r < 0)
			return r;
		m->bound_path = strdup(c->socket_path);
		if (!m->bound_path)
			return -ENOMEM;
		if (c->socket_group_missing && !(c->socket_mode & 0006)) /* the group matters */
			log_warning("no group " SOCKET_GROUP_DEFAULT " on this host: %s keeps mrd's "
				    "group (%u), so only root and its members may connect; create it "
				    "(systemd-sysusers) or name another with [mrd] socket_group",
				    c->socket_path, (unsigned)c->socket_gid);
		log_info("serving on %s (mode %04o, group %u)", c->socket_path, c->socket_mode,
			 (unsigned)c->socket_gid);
	}

	m->listen_event = event_new(m->core.base, m->listen_fd, EV_READ | EV_PERSIST,
				    manager_on_accept, m);
	m->accept_retry_event = evtimer_new(m->core.base, manager_on_accept_retry, m);
	if (!m->listen_event || !m->accept_retry_event)
		return -ENOMEM;
	if (event_add(m->listen_event, NULL) < 0)
		return -EIO;
	return m->core.config.bus ? bus_new(m, &m->bus) : 0;
}

int manager_run(struct manager *m)
{
	int r;

	(void)sd_notifyf(0, "READY=1\nSTATUS=serving %u client slots\nMAINPID=%lu",
			 m->core.config.max_clients, (unsigned long)getpid());
	/* Taken (or refused) for good: out of systemd's FD store, or the next stop would add to
	 * them. */
	for (size_t i = 0; i < m->fd_store_taken.n && getenv("NOTIFY_SOCKET"); i++)
		(void)sd_notifyf(0, "FDSTOREREMOVE=1\nFDNAME=%s", m->fd_store_taken.names[i]);
	fd_list_done(&m->fd_store_taken);
	for (;;) {
		r = event_base_dispatch(m->core.base);
		if (r < 0 || !m->reexec || m->stop)
			break;
		/* The signals stay blocked across exec for the new image's loop to read; one that
		 * came with SIGUSR2 is taken now, and a SIGTERM among them wins. */
		(void)event_base_loop(m->core.base, EVLOOP_NONBLOCK);
		if (m->stop)
			break;
		m->reexec = false;
		(void)handover_reexec(m); /* returns only when it could not */
	}
	if (r >= 0 && handover_fd_store_max() > 0) {
		unsigned live = handover_unbind_clients(m);

		if (live > 0)
			log_error("%u client PD(s) keep MRs mrd could not deregister: clients' memory "
				  "is not handed over (it would be reused under them)", live);
		else
			(void)handover_to_fd_store(m);
	}
	(void)sd_notify(0, "STOPPING=1");
	if (r < 0)
		return log_error_errno(-EIO, "event loop failed");
	return 0;
}
