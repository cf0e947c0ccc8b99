/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <grp.h>
#include <pwd.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>
#include <inttypes.h>

#include "macro.h"
#include "wire.h"
#include "base/config.h"

void config_init(struct config *c)
{
	*c = (struct config){
		.log_level = LOG_LEVEL_INFO,
		.bus = true,
		.max_clients = 1024,
		.max_clients_per_user = 256,
		.max_user_containers = 4,
		.max_inflight = 64,
		.max_frame = WIRE_FRAME_DEFAULT,
		.max_fds = 4,
		.max_protocol_errors = 16,
		.max_pinned_bytes = QUOTA_HOST_DEFAULT,
		.socket_mode = 0660,
		.window_base = 0x200000000000ULL, /* 32 TiB: clear of heaps, stacks and ASan */
		.window_size = 4ULL << 40,
		.arena_size = 1ULL << 30,
		.hugepages = HUGEPAGES_AUTO,
		.reconnect_grace_s = 60,
		.quota = { .allocated_bytes = QUOTA_HOST_DEFAULT,
			   .pinned_bytes = QUOTA_HOST_DEFAULT,
			   .arenas = 64,
			   .allocations = 65536,
			   .clients = 256,
			   .mempools = 256,
			   .memory_windows = 4096 },
		.async_bytes = 1ULL << 20,
		.odp_chunk = 1ULL << 30,
		.workers = 2,
		.pools = { .enabled = true, .aging_s = FRMR_AGING_DEFAULT_S, .max_queued = 4096 },
	};
}

static void group_free(struct domain_group *g)
{
	free(g->name);
	free(g->uids);
	free(g->gids);
	for (size_t i = 0; i < g->n_cgroups; i++)
		free(g->cgroups[i]);
	free(g->cgroups);
}

void config_done(struct config *c)
{
	free(c->socket_path);
	free(c->provider);
	free(c->device);
	free(c->devices);
	free(c->admin_group);
	free(c->socket_group);
	for (size_t i = 0; i < c->n_groups; i++)
		group_free(&c->groups[i]);
	free(c->groups);
	free(c->policies);
	free(c->quotas);
	config_init(c);
}

static int set_string(char **field, const char *value)
{
	char *s = NULL;

	if (*value) {
		s = strdup(value);
		if (!s)
			return -ENOMEM;
	}
	free(*field);
	*field = s;
	return 0;
}

/* Device names, separated by spaces or commas: each as sysfs names one (at most 63 bytes of
 * letters, digits, '_', '-' and '.'), 32 at most. */
static int set_devices(char **field, const char *value)
{
	size_t n = 0, len = 0;

	for (const char *p = value;; p++) {
		if (*p == ' ' || *p == ',' || *p == '\0') {
			n += len > 0;
			if (len > 63 || n > 32)
				return -EINVAL;
			len = 0;
			if (!*p)
				break;
		} else if (isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.')
			len++;
		else
			return -EINVAL;
	}
	return set_string(field, n ? value : "");
}

bool config_serves_device(const struct config *c, const char *name)
{
	size_t len = strlen(name);

	if (!c->devices)
		return true;
	for (const char *p = c->devices; *p;) {
		size_t w = strcspn(p, " ,");

		if (w == len && strncmp(p, name, len) == 0)
			return true;
		p += w;
		p += strspn(p, " ,");
	}
	return false;
}

static int set_unsigned(unsigned *field, const char *value, unsigned min, unsigned max)
{
	unsigned long v;
	char *end;

	if (!isdigit((unsigned char)*value))
		return -EINVAL;
	errno = 0;
	v = strtoul(value, &end, 10);
	if (errno || *end)
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*field = (unsigned)v;
	return 0;
}

/* File permission bits, in octal as chmod takes them: 0660, 660. */
static int set_mode(unsigned *field, const char *value)
{
	unsigned long v;
	char *end;

	if (!isdigit((unsigned char)*value))
		return -EINVAL;
	errno = 0;
	v = strtoul(value, &end, 8);
	if (errno || *end)
		return -EINVAL;
	if (v > 0777)
		return -ERANGE;
	*field = (unsigned)v;
	return 0;
}

static int set_bool(bool *field, const char *value)
{
	if (strcmp(value, "yes") == 0 || strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
		*field = true;
	else if (strcmp(value, "no") == 0 || strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
		*field = false;
	else
		return -EINVAL;
	return 0;
}

/* Bytes with an optional binary suffix: 4096, 64K, 2M, 1G, 4T. */
static int set_bytes(uint64_t *field, const char *value, uint64_t min, uint64_t max)
{
	unsigned long long v;
	char *end;
	unsigned shift = 0;

	if (!isdigit((unsigned char)*value))
		return -EINVAL;
	/* Decimal, or hexadecimal with 0x; never octal ("010G" is 10 GiB). */
	errno = 0;
	v = strtoull(value, &end, strncmp(value, "0x", 2) == 0 ? 16 : 10);
	if (errno)
		return -EINVAL;
	switch (*end) {
	case 'K': shift = 10; end++; break;
	case 'M': shift = 20; end++; break;
	case 'G': shift = 30; end++; break;
	case 'T': shift = 40; end++; break;
	default: break;
	}
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	v <<= shift;
	if (v < min || v > max)
		return -ERANGE;
	*field = v;
	return 0;
}

/* A byte limit whose default follows the host's memory: empty is that default. */
static int set_host_bytes(uint64_t *field, const char *value)
{
	if (*value == '\0') {
		*field = QUOTA_HOST_DEFAULT;
		return 0;
	}
	return set_bytes(field, value, 0, UINT64_MAX);
}

/* "uid:1000 uid:1001 gid:27" (names work too: "uid:alice gid:rdma"). */
static int parse_policy(const char *value, int *ret)
{
	if (strcmp(value, "contig") == 0)
		*ret = MR_POLICY_CONTIG;
	else if (strcmp(value, "page") == 0)
		*ret = MR_POLICY_PAGE;
	else if (strcmp(value, "odp") == 0)
		*ret = MR_POLICY_ODP;
	else
		return -EINVAL;
	return 0;
}

/* A [policies] line: name = contig | page | odp, for the domain of that name (a [domains]
 * group or uid-N). */
static int add_policy(struct config *c, const char *name, const char *value)
{
	struct domain_policy p = {}, *grown;
	int r;

	if (strlen(name) == 0 || strlen(name) >= sizeof(p.name))
		return -EINVAL;
	r = parse_policy(value, &p.policy);
	if (r < 0)
		return r;
	for (size_t i = 0; i < c->n_policies; i++)
		if (strcmp(c->policies[i].name, name) == 0) {
			c->policies[i].policy = p.policy; /* the later line wins, as for any key */
			return 0;
		}
	snprintf(p.name, sizeof(p.name), "%s", name);
	grown = realloc(c->policies, (c->n_policies + 1) * sizeof(*grown));
	if (!grown)
		return -ENOMEM;
	c->policies = grown;
	c->policies[c->n_policies++] = p;
	return 0;
}

uint64_t config_window_bytes(const struct config *c, const struct quota *q)
{
	uint64_t share = c->window_size / 8;

	if (q->window_bytes)
		return q->window_bytes;
	if (share < 4 * c->arena_size)
		share = 4 * c->arena_size;
	return share < c->window_size ? share : c->window_size;
}

int config_quota_refusal(const struct config *c, const struct quota *q, enum quota_key key,
			 const char *domain, uint64_t used, uint64_t asked, char *why,
			 size_t why_size)
{
	static const struct {
		const char *section, *name, *verb;
	} keys[] = {
		[QUOTA_ALLOCATED_BYTES] = { "quota", "allocated_bytes", "allocate" },
		[QUOTA_PINNED_BYTES] = { "quota", "pinned_bytes", "pin" },
		[QUOTA_ARENAS] = { "quota", "arenas", "add" },
		[QUOTA_ALLOCATIONS] = { "quota", "allocations", "add" },
		[QUOTA_MEMPOOLS] = { "quota", "mempools", "add" },
		[QUOTA_CLIENTS] = { "quota", "clients", "add" },
		[QUOTA_WINDOW_BYTES] = { "quota", "window_bytes", "map" },
		[QUOTA_MEMORY_WINDOWS] = { "quota", "memory_windows", "bind" },
		[LIMIT_PINNED_BYTES] = { "limits", "pinned_bytes", "pin" },
	};
	uint64_t limit;
	char where[96];
	/* The [quotas] line that set the key is where to raise it. */
	bool line = key != LIMIT_PINNED_BYTES && (q->set & (1u << key));

	switch (key) {
	case QUOTA_ALLOCATED_BYTES: limit = q->allocated_bytes; break;
	case QUOTA_PINNED_BYTES: limit = q->pinned_bytes; break;
	case QUOTA_ARENAS: limit = q->arenas; break;
	case QUOTA_ALLOCATIONS: limit = q->allocations; break;
	case QUOTA_MEMPOOLS: limit = q->mempools; break;
	case QUOTA_CLIENTS: limit = q->clients; break;
	case QUOTA_WINDOW_BYTES: limit = config_window_bytes(c, q); break;
	case QUOTA_MEMORY_WINDOWS: limit = q->memory_windows; break;
	default: limit = c->max_pinned_bytes; break;
	}
	/* Without "in mrd.conf" the glob fits in a reply (test_quota_refusal_fits_a_reply). */
	if (line)
		snprintf(where, sizeof(where), "[quotas] %s %s", q->glob, keys[key].name);
	else
		snprintf(where, sizeof(where), "[%s] %s in mrd.conf", keys[key].section,
			 keys[key].name);
	snprintf(why, why_size, "%s.%s (%" PRIu64 ") would be exceeded %s%s: %" PRIu64 " in use, "
		 "tried to %s %" PRIu64 " more; raise %s and reload mrd", keys[key].section,
		 keys[key].name, limit, domain ? "in domain " : "by all domains",
		 domain ? domain : "", used, keys[key].verb, asked, where);
	return -EDQUOT;
}

int config_policy_for(const struct config *c, const char *name)
{
	for (size_t i = 0; i < c->n_policies; i++)
		if (strcmp(c->policies[i].name, name) == 0)
			return c->policies[i].policy;
	return c->mr_policy;
}

/* Whether name may name a [domains] line: the characters mrctl shows, at most 63 bytes, at most
 * one '*' (a domain per cgroup), and none of the prefixes of the domains mrd names itself
 * (uid-N; a container's ctr-… and pod-…), which a fixed name could otherwise join. */
static bool group_name_valid(const char *name)
{
	const char *star = strchr(name, '*');

	if (strlen(name) == 0 || strlen(name) > 63 || strncmp(name, "uid-", 4) == 0 ||
	    strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-*") !=
		    strlen(name))
		return false;
	if (star && strchr(star + 1, '*'))
		return false;
	return strncmp(name, "ctr-", 4) != 0 && strncmp(name, "pod-", 4) != 0;
}

/* A member "cgroup:GLOB": an absolute path glob. */
static int add_cgroup_member(struct domain_group *g, const char *glob)
{
	char **grown;

	if (glob[0] != '/')
		return -EINVAL;
	grown = realloc(g->cgroups, (g->n_cgroups + 1) * sizeof(char *));
	if (!grown)
		return -ENOMEM;
	g->cgroups = grown;
	g->cgroups[g->n_cgroups] = strdup(glob);
	return g->cgroups[g->n_cgroups] ? (g->n_cgroups++, 0) : -ENOMEM;
}

/* One key of [quota] into q, as [quota] and [quotas] lines write it: which (enum quota_key),
 * -ENOENT unknown, or set_*'s error. */
static int set_quota_key(struct quota *q, const char *key, const char *value)
{
	static const char *const names[] = {
		[QUOTA_ALLOCATED_BYTES] = "allocated_bytes", [QUOTA_PINNED_BYTES] = "pinned_bytes",
		[QUOTA_ARENAS] = "arenas", [QUOTA_ALLOCATIONS] = "allocations",
		[QUOTA_MEMPOOLS] = "mempools", [QUOTA_CLIENTS] = "clients",
		[QUOTA_WINDOW_BYTES] = "window_bytes", [QUOTA_MEMORY_WINDOWS] = "memory_windows",
	};
	int k = 0, r;

	while (k < (int)ELEMENTSOF(names) && strcmp(key, names[k]) != 0)
		k++;
	switch (k) {
	case QUOTA_ALLOCATED_BYTES: r = set_host_bytes(&q->allocated_bytes, value); break;
	case QUOTA_PINNED_BYTES: r = set_host_bytes(&q->pinned_bytes, value); break;
	case QUOTA_ARENAS: r = set_unsigned(&q->arenas, value, 1, 1u << 16); break;
	case QUOTA_ALLOCATIONS: r = set_unsigned(&q->allocations, value, 1, 1u << 24); break;
	case QUOTA_MEMPOOLS: r = set_unsigned(&q->mempools, value, 1, 1u << 20); break;
	case QUOTA_CLIENTS: r = set_unsigned(&q->clients, value, 1, 1u << 20); break;
	case QUOTA_WINDOW_BYTES: r = set_bytes(&q->window_bytes, value, 0, UINT64_MAX); break;
	case QUOTA_MEMORY_WINDOWS: r = set_unsigned(&q->memory_windows, value, 1, 1u << 20); break;
	default: return -ENOENT;
	}
	return r < 0 ? r : k;
}

/* A glob of domain names: the characters of names ([domains], uid-N, ctr-..., pod-...) and
 * fnmatch's *, ? and [...] (closed: fnmatch would take an open '[' as a plain one). */
static bool valid_glob(const char *glob)
{
	size_t n = strlen(glob);

	if (n == 0 || n >= sizeof(((struct quota *)NULL)->glob))
		return false;
	for (const char *p = glob; *p; p++) {
		if (*p == '[') {
			const char *end = p + 1;

			end += *end == '!' || *end == '^';
			end += *end == ']'; /* first in the set: a member */
			end = strchr(end, ']');
			if (!end)
				return false;
			p = end;
		} else if (!isalnum((unsigned char)*p) && !strchr("_.-*?", *p))
			return false;
	}
	return true;
}

/* A [quotas] line: glob = key=value ..., keys of [quota]. The same glob again replaces its
 * line in place (the later file wins, as for any key). -EINVAL or set_quota_key's error,
 * with why saying what is wrong. */
static int add_quotas(struct config *c, const char *glob, const char *value, char *why,
		      size_t why_size)
{
	_cleanup_free_ char *copy = strdup(value);
	struct quota line = {}, *grown;
	char *save = NULL;
	int r;

	if (!copy)
		goto nomem;
	if (!valid_glob(glob)) {
		snprintf(why, why_size, "bad glob: letters, digits, '_.-' and '*?[...]', at most "
			 "63");
		return -EINVAL;
	}
	snprintf(line.glob, sizeof(line.glob), "%s", glob);
	for (char *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
		char *eq = strchr(tok, '=');

		if (!eq) {
			snprintf(why, why_size, "expected key=value, got '%s'", tok);
			return -EINVAL;
		}
		*eq = '\0';
		r = set_quota_key(&line, tok, eq + 1);
		if (r == -ENOENT) {
			snprintf(why, why_size, "unknown key '%s' (the keys of [quota])", tok);
			return -EINVAL;
		}
		if (r < 0) {
			snprintf(why, why_size, "bad value for '%s': %s", tok, strerror(-r));
			return r;
		}
		line.set |= 1u << r;
	}
	if (!line.set) {
		snprintf(why, why_size, "expected key=value ...");
		return -EINVAL;
	}
	for (size_t i = 0; i < c->n_quotas; i++)
		if (strcmp(c->quotas[i].glob, glob) == 0) {
			c->quotas[i] = line;
			return 0;
		}
	grown = realloc(c->quotas, (c->n_quotas + 1) * sizeof(*grown));
	if (!grown)
		goto nomem;
	c->quotas = grown;
	c->quotas[c->n_quotas++] = line;
	return 0;
nomem:
	snprintf(why, why_size, "out of memory");
	return -ENOMEM;
}

void config_quota_for(const struct config *c, const char *name, struct quota *ret)
{
	*ret = c->quota;
	for (size_t i = 0; i < c->n_quotas; i++) {
		const struct quota *l = &c->quotas[i];

		if (fnmatch(l->glob, name, 0) != 0)
			continue;
#define TAKE(key, field) if (l->set & (1u << (key))) ret->field = l->field
		TAKE(QUOTA_ALLOCATED_BYTES, allocated_bytes);
		TAKE(QUOTA_PINNED_BYTES, pinned_bytes);
		TAKE(QUOTA_ARENAS, arenas);
		TAKE(QUOTA_ALLOCATIONS, allocations);
		TAKE(QUOTA_MEMPOOLS, mempools);
		TAKE(QUOTA_CLIENTS, clients);
		TAKE(QUOTA_WINDOW_BYTES, window_bytes);
		TAKE(QUOTA_MEMORY_WINDOWS, memory_windows);
#undef TAKE
		ret->set = l->set;
		memcpy(ret->glob, l->glob, sizeof(ret->glob));
		return;
	}
}

static int add_group(struct config *c, const char *name, const char *value)
{
	_cleanup_free_ char *copy = strdup(value);
	struct domain_group g = {}, *groups;
	char *save = NULL;
	int r;

	if (!copy)
		return -ENOMEM;
	if (!group_name_valid(name))
		return -EINVAL;
	for (size_t i = 0; i < c->n_groups; i++)
		if (strcmp(c->groups[i].name, name) == 0)
			return -EEXIST;
	for (char *tok = strtok_r(copy, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
		bool is_uid = strncmp(tok, "uid:", 4) == 0;
		unsigned long id;
		char *end;
		void *grown;

		if (strncmp(tok, "cgroup:", 7) == 0) {
			r = add_cgroup_member(&g, tok + 7);
			if (r == -ENOMEM)
				goto nomem;
			if (r < 0)
				goto bad;
			continue;
		}
		if (!is_uid && strncmp(tok, "gid:", 4) != 0)
			goto bad;
		tok += 4;
		errno = 0;
		id = strtoul(tok, &end, 10);
		if (*tok && !*end && !errno && id < UINT32_MAX)
			;
		else if (is_uid && getpwnam(tok))
			id = getpwnam(tok)->pw_uid;
		else if (!is_uid && getgrnam(tok))
			id = getgrnam(tok)->gr_gid;
		else
			goto bad;
		if (is_uid) {
			grown = realloc(g.uids, (g.n_uids + 1) * sizeof(uid_t));
			if (!grown)
				goto nomem;
			g.uids = grown;
			g.uids[g.n_uids++] = (uid_t)id;
		} else {
			grown = realloc(g.gids, (g.n_gids + 1) * sizeof(gid_t));
			if (!grown)
				goto nomem;
			g.gids = grown;
			g.gids[g.n_gids++] = (gid_t)id;
		}
	}
	/* A per-cgroup name needs a cgroup to name it by. */
	if (g.n_uids + g.n_gids + g.n_cgroups == 0 || (strchr(name, '*') && g.n_cgroups == 0) ||
	    (strchr(name, '*') && g.n_uids + g.n_gids > 0))
		goto bad;
	g.name = strdup(name);
	groups = realloc(c->groups, (c->n_groups + 1) * sizeof(*groups));
	if (!g.name || !groups) {
		if (groups)
			c->groups = groups;
		goto nomem;
	}
	c->groups = groups;
	c->groups[c->n_groups++] = g;
	return 0;
bad:
	group_free(&g);
	return -EINVAL;
nomem:
	group_free(&g);
	return -ENOMEM;
}

int config_set(struct config *c, const char *section, const char *key, const char *value)
{
	int r;

	if (strcmp(section, "mrd") == 0) {
		if (strcmp(key, "socket") == 0)
			return *value == '/' ? set_string(&c->socket_path, value) : -EINVAL;
		if (strcmp(key, "provider") == 0) {
			if (strcmp(value, "auto") && strcmp(value, "soft") && strcmp(value, "verbs"))
				return -EINVAL;
			return set_string(&c->provider, value);
		}
		if (strcmp(key, "device") == 0)
			return set_string(&c->device, value);
		if (strcmp(key, "devices") == 0)
			return set_devices(&c->devices, value);
		if (strcmp(key, "admin_group") == 0)
			return set_string(&c->admin_group, value);
		if (strcmp(key, "socket_group") == 0)
			return set_string(&c->socket_group, value);
		if (strcmp(key, "socket_mode") == 0)
			return set_mode(&c->socket_mode, value);
		if (strcmp(key, "bus") == 0)
			return set_bool(&c->bus, value);
		if (strcmp(key, "log_level") == 0) {
			r = log_level_from_string(value);
			if (r < 0)
				return r;
			c->log_level = r;
			return 0;
		}
	} else if (strcmp(section, "limits") == 0) {
		if (strcmp(key, "clients") == 0)
			return set_unsigned(&c->max_clients, value, 1, 1u << 20);
		if (strcmp(key, "clients_per_user") == 0)
			return set_unsigned(&c->max_clients_per_user, value, 1, 1u << 20);
		if (strcmp(key, "container_domains_per_user") == 0)
			return set_unsigned(&c->max_user_containers, value, 0, 64);
		if (strcmp(key, "requests_in_flight") == 0)
			return set_unsigned(&c->max_inflight, value, 1, 4096);
		if (strcmp(key, "frame_bytes") == 0)
			return set_unsigned(&c->max_frame, value, 512, WIRE_FRAME_MAX);
		if (strcmp(key, "fds_per_message") == 0)
			return set_unsigned(&c->max_fds, value, 0, WIRE_FDS_MAX);
		if (strcmp(key, "protocol_errors") == 0)
			return set_unsigned(&c->max_protocol_errors, value, 0, 1u << 20);
		if (strcmp(key, "pinned_bytes") == 0)
			return set_host_bytes(&c->max_pinned_bytes, value);
	} else if (strcmp(section, "memory") == 0) {
		if (strcmp(key, "window_base") == 0)
			return set_bytes(&c->window_base, value, 1ULL << 32, 1ULL << 47);
		if (strcmp(key, "window_size") == 0)
			return set_bytes(&c->window_size, value, 1ULL << 30, 64ULL << 40);
		if (strcmp(key, "arena_size") == 0)
			return set_bytes(&c->arena_size, value, 2ULL << 20, 1ULL << 40);
		if (strcmp(key, "reconnect_grace") == 0)
			return set_unsigned(&c->reconnect_grace_s, value, 1, 86400);
		if (strcmp(key, "hugepages") == 0) {
			if (strcmp(value, "auto") == 0)
				c->hugepages = HUGEPAGES_AUTO;
			else if (strcmp(value, "yes") == 0)
				c->hugepages = HUGEPAGES_YES;
			else if (strcmp(value, "no") == 0)
				c->hugepages = HUGEPAGES_NO;
			else
				return -EINVAL;
			return 0;
		}
	} else if (strcmp(section, "quota") == 0) {
		r = set_quota_key(&c->quota, key, value);
		return r < 0 ? r : 0;
	} else if (strcmp(section, "quotas") == 0) {
		char why[128];

		return add_quotas(c, key, value, why, sizeof(why));
	} else if (strcmp(section, "cache") == 0) {
		if (strcmp(key, "policy") == 0)
			return parse_policy(value, &c->mr_policy);
		if (strcmp(key, "async_bytes") == 0)
			return set_bytes(&c->async_bytes, value, 4096, UINT64_MAX);
		if (strcmp(key, "workers") == 0)
			return set_unsigned(&c->workers, value, 1, 64);
		if (strcmp(key, "odp_chunk") == 0)
			return set_bytes(&c->odp_chunk, value, 2ULL << 20, 1ULL << 40);
	} else if (strcmp(section, "windows") == 0) {
		if (strcmp(key, "remote") == 0) {
			if (strcmp(value, "window-only") != 0 && strcmp(value, "mr") != 0)
				return -EINVAL;
			c->window_only = strcmp(value, "window-only") == 0;
			return 0;
		}
	} else if (strcmp(section, "pools") == 0) {
		if (strcmp(key, "enabled") == 0)
			return set_bool(&c->pools.enabled, value);
		if (strcmp(key, "aging") == 0)
			return set_unsigned(&c->pools.aging_s, value, 1, 1u << 30);
		if (strcmp(key, "pinned") == 0)
			return set_unsigned(&c->pools.pinned, value, 0, 1u << 20);
		if (strcmp(key, "max_queued") == 0)
			return set_unsigned(&c->pools.max_queued, value, 0, 1u << 24);
	} else if (strcmp(section, "domains") == 0)
		return add_group(c, key, value);
	else if (strcmp(section, "policies") == 0)
		return add_policy(c, key, value);
	return -ENOENT;
}

int config_set_assignment(struct config *c, const char *assignment)
{
	const char *dot = strchr(assignment, '.'), *eq = strchr(assignment, '=');
	char section[32], key[64];

	if (!dot || !eq || eq < dot || dot - assignment >= (ptrdiff_t)sizeof(section) ||
	    eq - dot - 1 >= (ptrdiff_t)sizeof(key))
		return -EINVAL;
	snprintf(section, sizeof(section), "%.*s", (int)(dot - assignment), assignment);
	snprintf(key, sizeof(key), "%.*s", (int)(eq - dot - 1), dot + 1);
	return config_set(c, section, key, eq + 1);
}

static char *strip(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int config_load_file(struct config *c, const char *path)
{
	_cleanup_free_ char *line = NULL;
	char section[64] = "";
	size_t cap = 0;
	unsigned lineno = 0;
	struct stat st;
	FILE *f;
	int r = 0;

	f = fopen(path, "re");
	if (!f)
		return negative_errno();
	if (fstat(fileno(f), &st) < 0 || S_ISDIR(st.st_mode)) {
		fclose(f);
		return log_error_errno(-EINVAL, "%s: is a directory, not a configuration file", path);
	}

	while (getline(&line, &cap, f) >= 0) {
		char *s = strip(line), *eq;

		lineno++;
		if (*s == '\0' || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');
			if (!end || end[1] != '\0' || (size_t)(end - s - 1) >= sizeof(section)) {
				r = log_error_errno(-EINVAL, "%s:%u: bad section header", path, lineno);
				break;
			}
			*end = '\0';
			snprintf(section, sizeof(section), "%s", s + 1);
			continue;
		}
		eq = strchr(s, '=');
		if (!eq) {
			r = log_error_errno(-EINVAL, "%s:%u: expected key = value", path, lineno);
			break;
		}
		*eq = '\0';
		if (strcmp(section, "quotas") == 0) {
			char why[128];

			r = add_quotas(c, strip(s), strip(eq + 1), why, sizeof(why));
			if (r < 0) {
				r = log_error_errno(-EINVAL, "%s:%u: [quotas] %s: %s", path,
						    lineno, strip(s), why);
				break;
			}
			continue;
		}
		r = config_set(c, section, strip(s), strip(eq + 1));
		if (r == -ENOENT) {
			r = log_error_errno(-EINVAL, "%s:%u: unknown key '%s' in section [%s]", path,
					    lineno, strip(s), section);
			break;
		}
		if (r < 0) {
			log_error_errno(r, "%s:%u: bad value for '%s': %m", path, lineno, strip(s));
			r = -EINVAL; /* said, with its line */
			break;
		}
	}
	if (r == 0 && ferror(f))
		r = log_error_errno(-EIO, "%s: read error", path);
	fclose(f);
	return r;
}

static int conf_file(const struct dirent *e)
{
	size_t n = strlen(e->d_name);

	return e->d_name[0] != '.' && n > 5 && strcmp(e->d_name + n - 5, ".conf") == 0;
}

int config_load(struct config *c, const char *path, bool must_exist)
{
	char dir[PATH_MAX], file[PATH_MAX];
	struct dirent **names = NULL;
	int n, r;

	r = config_load_file(c, path);
	if (r == -ENOENT && !must_exist)
		r = 0;
	if (r < 0)
		return r;
	if ((size_t)snprintf(dir, sizeof(dir), "%s.d", path) >= sizeof(dir))
		return log_error_errno(-ENAMETOOLONG, "%s.d: path too long", path);
	n = scandir(dir, &names, conf_file, alphasort);
	if (n < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 :
		       log_error_errno(negative_errno(), "cannot read %s: %m", dir);
	for (int i = 0; i < n; i++) {
		if (r == 0) {
			if ((size_t)snprintf(file, sizeof(file), "%s/%s", dir, names[i]->d_name) >=
			    sizeof(file))
				r = log_error_errno(-ENAMETOOLONG, "%s/%s: path too long", dir,
						    names[i]->d_name);
			else
				r = config_load_file(c, file);
			if (r == -ENOENT) /* gone since the listing */
				r = 0;
			else if (r < 0 && r != -EINVAL && r != -EIO)
				r = log_error_errno(r, "cannot read %s: %m", file);
		}
		free(names[i]);
	}
	free(names);
	return r < 0 ? -EINVAL : 0;
}

/* MemTotal: what the kernel can give out, less what it keeps for itself. */
static uint64_t host_memory(void)
{
	struct sysinfo si;

	if (sysinfo(&si) < 0 || si.totalram == 0)
		return UINT64_MAX; /* unknown: no cut */
	return (uint64_t)si.totalram * (si.mem_unit ? si.mem_unit : 1);
}

/* A limit left to its default becomes host / fraction. One set above the host's memory is cut
 * to it when it bounds pinned memory (more cannot be pinned: it would only let the host run out),
 * and kept, with a warning, when it bounds allocated memory, which is sparse and pageable (an
 * ODP allocation takes pages only where it is touched). */
static void fit(uint64_t *field, const char *key, uint64_t host, uint64_t fraction, bool cut)
{
	if (*field == QUOTA_HOST_DEFAULT)
		*field = host == UINT64_MAX ? UINT64_MAX : host / fraction;
	else if (*field > host) {
		log_warning("%s = %" PRIu64 " is more than this host's memory (%" PRIu64 " bytes)%s",
			    key, *field, host, cut ? ": using that" : "");
		if (cut)
			*field = host;
	}
}

void config_fit_host(struct config *c, uint64_t host_bytes)
{
	fit(&c->quota.allocated_bytes, "[quota] allocated_bytes", host_bytes, 2, false);
	fit(&c->quota.pinned_bytes, "[quota] pinned_bytes", host_bytes, 4, true);
	fit(&c->max_pinned_bytes, "[limits] pinned_bytes", host_bytes, 2, true);
	for (size_t i = 0; i < c->n_quotas; i++) {
		struct quota *l = &c->quotas[i];
		char key[128];

		snprintf(key, sizeof(key), "[quotas] %s allocated_bytes", l->glob);
		if (l->set & (1u << QUOTA_ALLOCATED_BYTES))
			fit(&l->allocated_bytes, key, host_bytes, 2, false);
		snprintf(key, sizeof(key), "[quotas] %s pinned_bytes", l->glob);
		if (l->set & (1u << QUOTA_PINNED_BYTES))
			fit(&l->pinned_bytes, key, host_bytes, 4, true);
	}
}

/* A group by number or name: 0, or -ENOENT. */
static int resolve_group(const char *name, gid_t *ret)
{
	struct group *g;
	char *end;
	unsigned long gid;

	errno = 0;
	gid = strtoul(name, &end, 10);
	if (*name && *end == '\0' && !errno && gid < UINT_MAX)
		*ret = (gid_t)gid;
	else if ((g = getgrnam(name)))
		*ret = g->gr_gid;
	else
		return -ENOENT;
	return 0;
}

int config_finish(struct config *c)
{
	/* The window is carved into arena-sized slots. */
	if (c->odp_chunk & (c->odp_chunk - 1))
		return log_error_errno(-EINVAL, "[cache] odp_chunk must be a power of two");
	if (c->arena_size & (c->arena_size - 1))
		return log_error_errno(-EINVAL, "[memory] arena_size must be a power of two");
	if (c->window_base % c->arena_size || c->window_size % c->arena_size)
		return log_error_errno(-EINVAL, "[memory] window_base and window_size must be "
						"multiples of arena_size");
	if (c->quota.window_bytes && c->quota.window_bytes < c->arena_size)
		return log_error_errno(-EINVAL, "[quota] window_bytes must be at least [memory] "
						"arena_size (or 0: an eighth of the window)");
	for (size_t i = 0; i < c->n_quotas; i++)
		if (c->quotas[i].window_bytes && c->quotas[i].window_bytes < c->arena_size)
			return log_error_errno(-EINVAL, "[quotas] %s: window_bytes must be at "
					       "least [memory] arena_size (or 0: an eighth of the "
					       "window)", c->quotas[i].glob);
	/* The last page below 128 TiB is never mappable: stay strictly below it. */
	if (c->window_base + c->window_size >= (1ULL << 47))
		return log_error_errno(-EINVAL, "[memory] window_base + window_size must stay "
						"below 128 TiB (user address space)");
	if (!c->socket_path && set_string(&c->socket_path, MRD_SOCKET_DEFAULT) < 0)
		return -ENOMEM;
	if (!c->provider && set_string(&c->provider, "auto") < 0)
		return -ENOMEM;
	if (c->admin_group && resolve_group(c->admin_group, &c->admin_gid) < 0)
		return log_error_errno(-ENOENT, "admin_group '%s': no such group", c->admin_group);
	/* The group mrd.socket and mrd.sysusers name; a host without it gets a socket only root
	 * may use, and mrd says so when it binds one. */
	c->socket_group_missing = false;
	if (c->socket_group) {
		if (resolve_group(c->socket_group, &c->socket_gid) < 0)
			return log_error_errno(-ENOENT, "socket_group '%s': no such group",
					       c->socket_group);
	} else if (resolve_group(SOCKET_GROUP_DEFAULT, &c->socket_gid) < 0) {
		c->socket_gid = getegid();
		c->socket_group_missing = true;
	}
	config_fit_host(c, host_memory());
	return 0;
}
