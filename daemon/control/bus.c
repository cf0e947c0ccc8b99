/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <systemd/sd-bus.h>

#include "escape.h"
#include "log.h"
#include "macro.h"
#include "status-page.h"
#include "time-util.h"
#include "provider/provider.h"
#include "registration/frmr-pool.h"
#include "core/access.h"
#include "core/domain-stats.h"
#include "core/domain.h"
#include "control/bus.h"
#include "control/client.h"
#include "control/manager.h"

struct bus {
	struct manager *manager;
	sd_bus *bus;
	sd_bus_slot *slot;
	struct event *io, *timer;
};

/* ---- properties: anyone may read them ---- */

static int prop_string(sd_bus *bus, const char *path, const char *interface,
		       const char *property, sd_bus_message *reply, void *userdata,
		       sd_bus_error *error)
{
	const struct manager *m = userdata;

	if (strcmp(property, "Version") == 0)
		return sd_bus_message_append(reply, "s", PACKAGE_VERSION);
	if (strcmp(property, "Provider") == 0)
		return sd_bus_message_append(reply, "s", provider_name(m->core.provider));
	return sd_bus_message_append(reply, "s", m->core.provider->caps.device);
}

/* The domain whose figures the caller may read, as the socket's views judge it
 * (access_peer_view): NULL for an admin (every domain), "" when the caller is unknown (none).
 * Only what the bus vouches for counts: no AUGMENT, whose fields come from /proc as it is now,
 * not as it was when the caller connected. A bus that vouches for the uid alone (dbus-daemon)
 * leaves groups out: such a caller sees its uid's domain. */
static const char *caller_view(sd_bus *bus, const struct manager *m, char *buf, size_t size)
{
	_cleanup_(sd_bus_creds_unrefp) sd_bus_creds *creds = NULL;
	struct process_place place = {};
	struct access_peer peer;
	const gid_t *groups = NULL;
	gid_t gid = (gid_t)-1;
	const char *view;
	pid_t pid = 0;
	uid_t uid;
	int n;

	if (sd_bus_query_sender_creds(sd_bus_get_current_message(bus),
				      SD_BUS_CREDS_EUID | SD_BUS_CREDS_EGID |
					      SD_BUS_CREDS_SUPPLEMENTARY_GIDS | SD_BUS_CREDS_PID,
				      &creds) < 0 ||
	    sd_bus_creds_get_euid(creds, &uid) < 0)
		return "";
	/* Root in a container is no admin here either: its place, where the bus names its pid
	 * (as it still runs as uid), as at the socket. */
	if (sd_bus_creds_get_pid(creds, &pid) < 0 || pid <= 0)
		place.other_userns = true; /* no namespace of mrd's can be told: no admin */
	else if (process_place_read(pid, uid, m->uid_map, &place) < 0)
		return "";
	(void)sd_bus_creds_get_egid(creds, &gid);
	n = sd_bus_creds_get_supplementary_gids(creds, &groups);
	if (n < 0)
		n = 0, groups = NULL;
	peer = (struct access_peer){ .uid = uid, .gid = gid, .fd = -1, .groups = groups,
				     .n_groups = (size_t)n, .nested_pidns = place.nested_pidns,
				     .other_userns = place.other_userns, .cgroup = place.cgroup,
				     .cgroup_user_made = manager_cgroup_user_made(m, place.cgroup) };
	if (access_is_admin(&m->core.config, &peer))
		view = NULL;
	else if (pid > 0 && manager_charged_uid(m, pid, uid, &peer.uid) < 0)
		view = ""; /* gone: whom it answers to cannot be told */
	else /* the domain of the user it is charged to, as at the socket */
		view = access_domain_name(&m->core.config, &peer, buf, size);
	free(place.cgroup);
	return view;
}

/* The caller's figures: an admin's are the daemon's, anyone else's its own domain's, as Status
 * on the socket (which users use mrd, and how much, is no one else's business). */
static int prop_count(sd_bus *bus, const char *path, const char *interface,
		      const char *property, sd_bus_message *reply, void *userdata,
		      sd_bus_error *error)
{
	const struct manager *m = userdata;
	char name[64];
	const char *view = caller_view(bus, m, name, sizeof(name));
	struct view_totals t;

	manager_view_totals(m, view, &t);
	if (strcmp(property, "Clients") == 0)
		return sd_bus_message_append(reply, "u", t.clients);
	if (strcmp(property, "Domains") == 0)
		return sd_bus_message_append(reply, "u", t.domains);
	if (strcmp(property, "Requests") == 0) /* daemon-wide: administrators alone */
		return sd_bus_message_append(reply, "t", view ? (uint64_t)0 : m->n_requests);
	return sd_bus_message_append(reply, "t", strcmp(property, "PinnedBytes") == 0 ?
							 t.pinned_bytes : t.allocated_bytes);
}

/* Each open domain's generation, by name: what moves when its clients' caches must flush.
 * An admin sees every domain; anyone else only its own, as on the socket (which users use mrd
 * is no one else's business). */
static int prop_generations(sd_bus *bus, const char *path, const char *interface,
			    const char *property, sd_bus_message *reply, void *userdata,
			    sd_bus_error *error)
{
	const struct manager *m = userdata;
	const struct domain *d;
	char name[64];
	const char *only = caller_view(bus, m, name, sizeof(name));
	int r;

	r = sd_bus_message_open_container(reply, 'a', "{st}");
	LIST_FOREACH(d, &m->core.domains, link) {
		if (r < 0)
			return r;
		if (!access_view_shows(only, d->name))
			continue;
		r = sd_bus_message_append(reply, "{st}", d->name, domain_generation(d));
	}
	return r < 0 ? r : sd_bus_message_close_container(reply);
}

/* ---- Dump: one JSON object, the daemon's and every domain's figures and pools ---- */

static void dump_pools(FILE *f, struct domain *d, const struct domain_stats *s)
{
	struct frmr_pool_stats *st;
	size_t n = s->n_pools;

	fputs(",\"pools_off\":", f);
	json_write_string(f, s->pools_off);
	fprintf(f, ",\"quarantine\":{\"on\":%s,\"parked\":%" PRIu64 ",\"unparked\":%" PRIu64 "}",
		s->keys_quarantine_on ? "true" : "false", s->keys_held, s->keys_unparked);
	fputs(",\"pools\":[", f);
	st = n ? calloc(n, sizeof(*st)) : NULL;
	if (st) {
		size_t got = domain_pool_stats(d, st, n);

		for (size_t i = 0; i < got && i < n; i++)
			fprintf(f, "%s{\"access\":%u,\"odp\":%s,\"internal\":%s,\"vendor\":%" PRIu32
				",\"pages\":%" PRIu64 ",\"queued\":%" PRIu64 ",\"in_use\":%" PRIu64
				",\"max_in_use\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
				",\"aged\":%" PRIu64 ",\"aging_s\":%u,\"pinned\":%u}",
				i ? "," : "", st[i].key.access, st[i].key.odp ? "true" : "false",
				st[i].key.internal ? "true" : "false", st[i].key.vendor,
				st[i].key.pages, st[i].queued, st[i].in_use, st[i].max_in_use,
				st[i].hits, st[i].misses, st[i].aged, st[i].aging_s, st[i].pinned);
		free(st);
	}
	fputc(']', f);
}

/* The bus policy lets uid 0 call the methods: root in a container too, where it has the bus's
 * socket. 0 for an admin as the socket judges it (access_is_admin), else an error to return. */
static int caller_admin(sd_bus_message *msg, const struct manager *m, sd_bus_error *error)
{
	char name[64];

	if (!caller_view(sd_bus_message_get_bus(msg), m, name, sizeof(name)))
		return 0;
	return sd_bus_error_setf(error, SD_BUS_ERROR_ACCESS_DENIED,
				 "%s needs root in mrd's namespaces: root in a container is no "
				 "administrator", sd_bus_message_get_member(msg));
}

static int method_dump(sd_bus_message *msg, void *userdata, sd_bus_error *error)
{
	struct manager *m = userdata;
	_cleanup_free_ char *json = NULL;
	struct domain *d;
	size_t size;
	FILE *f;
	bool first = true;
	int r = caller_admin(msg, m, error);

	if (r < 0)
		return r;
	f = open_memstream(&json, &size);
	if (!f)
		return -ENOMEM;
	fputs("{\"version\":", f);
	json_write_string(f, PACKAGE_VERSION);
	fputs(",\"provider\":", f);
	json_write_string(f, provider_name(m->core.provider));
	fputs(",\"device\":", f);
	json_write_string(f, m->core.provider->caps.device);
	fprintf(f, ",\"uptime_usec\":%" PRIu64 ",\"clients\":%u,\"requests\":%" PRIu64
		",\"domains\":[", manager_uptime_usec(m), m->n_clients, m->n_requests);
	LIST_FOREACH(d, &m->core.domains, link) {
		struct domain_stats s;

		domain_stats(d, &s);
		fputs(first ? "{\"name\":" : ",{\"name\":", f);
		first = false;
		json_write_string(f, d->name);
		fprintf(f, ",\"clients\":%u,\"allocated_bytes\":%" PRIu64 ",\"allocations\":%zu"
			",\"arenas\":%u,\"pinned_bytes\":%" PRIu64 ",\"generation\":%" PRIu64
			",\"mrs\":%u,\"client_pd_mrs\":%u,\"client_pd_mr_bytes\":%" PRIu64
			",\"lookups\":%" PRIu64 ",\"misses\":%" PRIu64
			",\"registrations\":%" PRIu64 ",\"deregistrations\":%" PRIu64, s.clients,
			s.allocated_bytes, s.allocations, s.arenas, s.pinned_bytes, s.generation,
			domain_pd_mrs(d), s.client_pd_mrs, s.client_pd_mr_bytes, s.lookups, s.misses,
			s.registrations, s.deregistrations);
		dump_pools(f, d, &s);
		fputc('}', f);
	}
	fputs("]}", f);
	if (fclose(f) != 0)
		return -ENOMEM;
	return sd_bus_reply_method_return(msg, "s", json);
}

/* ---- Flush and SetPoolSettings: root ---- */

/* Decimal digits only, no sign, no spaces, and not (uid_t)-1. */
static int parse_uid(const char *s, unsigned *ret)
{
	unsigned long long v = 0;

	if (!*s)
		return -EINVAL;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -EINVAL;
		v = v * 10 + (unsigned)(*s - '0');
		if (v >= UINT32_MAX)
			return -ERANGE;
	}
	*ret = (unsigned)v;
	return 0;
}

static int method_flush(sd_bus_message *msg, void *userdata, sd_bus_error *error)
{
	struct manager *m = userdata;
	struct flush_counts counts;
	const char *scope, *want = NULL;
	char name[64];
	int pools, gc, r;
	unsigned uid;

	r = caller_admin(msg, m, error);
	if (r < 0)
		return r;
	r = sd_bus_message_read(msg, "sbb", &scope, &pools, &gc);
	if (r < 0)
		return r;
	if (strncmp(scope, "uid:", 4) == 0) {
		r = parse_uid(scope + 4, &uid);
		if (r < 0)
			return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
						 "bad uid in '%s': decimal, below 4294967295", scope);
		want = access_domain_name(&m->core.config, &ACCESS_PEER_UID((uid_t)uid), name,
					  sizeof(name));
	} else if (*scope)
		want = scope;
	r = domains_flush(&m->core, want, pools, gc, &counts);
	if (r == -ENOENT)
		return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "no domain %s is open",
					 want);
	log_info("bus: flushed %u domain(s)%s%s", counts.domains, pools ? ", pools" : "",
		 gc ? ", gc" : "");
	return sd_bus_reply_method_return(msg, "utu", counts.domains, counts.handles,
					  counts.pools_removed);
}

/* a{sv} of key parts (access u, odp b, internal b, vendor u, pages t) into a match. */
static int read_match(sd_bus_message *msg, struct frmr_match *match, int64_t *aging,
		      int64_t *pinned, sd_bus_error *error)
{
	int r = sd_bus_message_enter_container(msg, 'a', "{sv}");

	if (r < 0)
		return r;
	while ((r = sd_bus_message_enter_container(msg, 'e', "sv")) > 0) {
		const char *key;
		uint32_t u;
		uint64_t t;
		int b;

		r = sd_bus_message_read(msg, "s", &key);
		if (r < 0)
			return r;
		if (match && (strcmp(key, "access") == 0 || strcmp(key, "vendor") == 0)) {
			r = sd_bus_message_read(msg, "v", "u", &u);
			if (strcmp(key, "access") == 0)
				match->access = u;
			else
				match->vendor = u;
		} else if (match && (strcmp(key, "odp") == 0 || strcmp(key, "internal") == 0)) {
			r = sd_bus_message_read(msg, "v", "b", &b);
			if (strcmp(key, "odp") == 0)
				match->odp = b;
			else
				match->internal = b;
		} else if (match && strcmp(key, "pages") == 0) {
			r = sd_bus_message_read(msg, "v", "t", &t);
			match->pages = t > INT64_MAX ? INT64_MAX : (int64_t)t;
		} else if (!match && (strcmp(key, "aging") == 0 || strcmp(key, "pinned") == 0)) {
			r = sd_bus_message_read(msg, "v", "u", &u);
			if (strcmp(key, "aging") == 0)
				*aging = u;
			else
				*pinned = u;
		} else
			return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
						 "unknown key '%s'", key);
		if (r == -ENXIO) /* a variant of another type */
			return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
						 "'%s' has the wrong type (see mrd(8), D-BUS)", key);
		if (r < 0)
			return r;
		r = sd_bus_message_exit_container(msg);
		if (r < 0)
			return r;
	}
	if (r < 0)
		return r;
	return sd_bus_message_exit_container(msg);
}

static int method_set_pools(sd_bus_message *msg, void *userdata, sd_bus_error *error)
{
	struct manager *m = userdata;
	struct frmr_match match = FRMR_MATCH_ANY;
	int64_t aging = -1, pinned = -1;
	unsigned changed;
	const char *domain;
	int r;

	r = caller_admin(msg, m, error);
	if (r >= 0)
		r = sd_bus_message_read(msg, "s", &domain);
	if (r >= 0)
		r = read_match(msg, &match, NULL, NULL, error);
	if (r >= 0)
		r = read_match(msg, NULL, &aging, &pinned, error);
	if (r < 0)
		return r;
	if (aging < 0 && pinned < 0)
		return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
					 "nothing to set: give aging or pinned");
	r = domains_set_pools(&m->core, domain, &match, aging, pinned, &changed);
	if (r == -ENOENT)
		return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "no domain %s is open",
					 domain);
	if (r == -EINVAL)
		return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS,
					 "aging must be 1 second or more");
	if (r < 0)
		return r;
	return sd_bus_reply_method_return(msg, "u", changed);
}

static const sd_bus_vtable mrd_vtable[] = {
	SD_BUS_VTABLE_START(0),
	SD_BUS_PROPERTY("Version", "s", prop_string, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Provider", "s", prop_string, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Device", "s", prop_string, 0, SD_BUS_VTABLE_PROPERTY_CONST),
	SD_BUS_PROPERTY("Clients", "u", prop_count, 0, 0),
	SD_BUS_PROPERTY("Domains", "u", prop_count, 0, 0),
	SD_BUS_PROPERTY("Requests", "t", prop_count, 0, 0),
	SD_BUS_PROPERTY("PinnedBytes", "t", prop_count, 0, 0),
	SD_BUS_PROPERTY("AllocatedBytes", "t", prop_count, 0, 0),
	SD_BUS_PROPERTY("Generations", "a{st}", prop_generations, 0, 0),
	SD_BUS_METHOD("Dump", "", "s", method_dump, 0),
	SD_BUS_METHOD("Flush", "sbb", "utu", method_flush, 0),
	SD_BUS_METHOD("SetPoolSettings", "sa{sv}a{sv}", "u", method_set_pools, 0),
	SD_BUS_VTABLE_END
};

/* ---- sd-bus on the libevent loop: one event on the bus fd, re-armed after each round ---- */

static void bus_arm(struct bus *b);

static void bus_on_event(evutil_socket_t fd, short what, void *userdata)
{
	struct bus *b = userdata;
	int r;

	while ((r = sd_bus_process(b->bus, NULL)) > 0)
		;
	if (r < 0) {
		log_warning_errno(r, "bus: lost the connection: %m; serving on without it");
		event_del(b->io);
		event_del(b->timer);
		return;
	}
	bus_arm(b);
}

static void bus_arm(struct bus *b)
{
	int events = sd_bus_get_events(b->bus);
	uint64_t until;

	event_del(b->io);
	event_assign(b->io, b->manager->core.base, sd_bus_get_fd(b->bus),
		     (events & POLLIN ? EV_READ : 0) | (events & POLLOUT ? EV_WRITE : 0),
		     bus_on_event, b);
	(void)event_add(b->io, NULL);
	event_del(b->timer);
	if (sd_bus_get_timeout(b->bus, &until) >= 0 && until != UINT64_MAX) {
		uint64_t now = now_usec(CLOCK_MONOTONIC), left = until > now ? until - now : 0;
		struct timeval tv = { (time_t)(left / 1000000), (suseconds_t)(left % 1000000) };

		(void)evtimer_add(b->timer, &tv);
	}
}

struct bus *bus_free(struct bus *b)
{
	if (!b)
		return NULL;
	if (b->io)
		event_free(b->io);
	if (b->timer)
		event_free(b->timer);
	sd_bus_slot_unref(b->slot);
	sd_bus_flush_close_unref(b->bus);
	free(b);
	return NULL;
}

int bus_new(struct manager *m, struct bus **ret)
{
	struct bus *b;
	int r;

	*ret = NULL;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->manager = m;
	r = sd_bus_open_system(&b->bus);
	if (r < 0) {
		log_warning_errno(r, "bus: no system bus: %m; serving on the socket alone");
		bus_free(b);
		return 0;
	}
	r = sd_bus_add_object_vtable(b->bus, &b->slot, BUS_PATH, BUS_INTERFACE, mrd_vtable, m);
	if (r >= 0)
		r = sd_bus_request_name(b->bus, BUS_NAME, 0);
	if (r < 0) {
		log_warning_errno(r, "bus: cannot own %s: %m; serving on the socket alone", BUS_NAME);
		bus_free(b);
		return r == -ENOMEM ? r : 0;
	}
	b->io = event_new(m->core.base, -1, 0, bus_on_event, b);
	b->timer = evtimer_new(m->core.base, bus_on_event, b);
	if (!b->io || !b->timer) {
		bus_free(b);
		return -ENOMEM;
	}
	bus_arm(b);
	log_info("bus: %s on the system bus", BUS_NAME);
	*ret = b;
	return 0;
}
