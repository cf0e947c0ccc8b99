/* SPDX-License-Identifier: MIT */
/* mrd's configuration: mrd.conf and its drop-ins parsed into one struct (defaults sized to the
 * host), read by every layer and written only here. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "mrd/mrd.h" /* MRD_SOCKET_DEFAULT */


enum hugepages_mode { HUGEPAGES_AUTO, HUGEPAGES_YES, HUGEPAGES_NO };

/* [domains]: clients whose uid or gid (primary or supplementary) is listed, or whose cgroup
 * (or one of its ancestors) matches a cgroup glob, share a domain. A name with a '*' is one
 * domain per cgroup matched: the '*' stands for that cgroup's short name (core/access.c). */
struct domain_group {
	char *name;
	uid_t *uids;
	size_t n_uids;
	gid_t *gids;
	size_t n_gids;
	char **cgroups; /* fnmatch(3) globs over cgroup v2 paths, FNM_PATHNAME */
	size_t n_cgroups;
};

/* How a domain's MR cache registers on a miss (registration/mr-cache.h). */
enum mr_policy { MR_POLICY_CONTIG, MR_POLICY_PAGE, MR_POLICY_ODP };

/* [pools]: a domain's FRMR-style handle pools (registration/frmr-pool.h). */
#define FRMR_AGING_DEFAULT_S 60
struct frmr_pools_config {
	bool enabled;
	unsigned aging_s;    /* a parked handle idle this long is destroyed ... */
	unsigned pinned;     /* ... unless its pool has no more than this many */
	unsigned max_queued; /* parked handles of the domain; more are destroyed at release */
};

/* The limits a request can pass, each refused with config_quota_refusal(). */
enum quota_key {
	QUOTA_ALLOCATED_BYTES,
	QUOTA_PINNED_BYTES,
	QUOTA_ARENAS,
	QUOTA_ALLOCATIONS,
	QUOTA_MEMPOOLS,
	QUOTA_CLIENTS,
	QUOTA_WINDOW_BYTES,
	QUOTA_MEMORY_WINDOWS, /* memory windows bound (mrd_window_grant) */
	LIMIT_PINNED_BYTES, /* [limits] pinned_bytes: all domains together (domain NULL) */
};

/* A domain's quotas: [quota], with the keys the first [quotas] line matching its name sets
 * (config_quota_for). A [quotas] line is one too: the keys it sets, and its glob. Byte
 * limits are QUOTA_HOST_DEFAULT until config_fit_host sizes them to the host. */
struct quota {
	uint64_t allocated_bytes, pinned_bytes;
	unsigned arenas, allocations, clients, mempools;
	unsigned memory_windows; /* windows bound at once (mrd_window_grant) */
	uint64_t window_bytes; /* 0: config_window_bytes' default */
	unsigned set;  /* 1 << enum quota_key of each key the [quotas] line set */
	char glob[64]; /* that line's */
};

/* Every value mrd reads from mrd.conf and its command line; see mrd.conf(5). */
struct config {
	char *socket_path;
	char *provider;   /* "auto", "soft" or "verbs" */
	char *device;     /* NULL: the first device */
	char *devices;    /* whose contexts clients may bind (BindPd), by name; NULL: every one */
	char *admin_group;
	gid_t admin_gid;  /* resolved from admin_group; valid when admin_group is set */
	/* The socket mrd binds itself (not one systemd passes): its mode, and its group, by name
	 * or number; NULL: the group mrd, where it exists. */
	unsigned socket_mode;
	char *socket_group;
	gid_t socket_gid;           /* resolved by config_finish */
	bool socket_group_missing;  /* socket_group unset and no group mrd: socket_gid is root's */
	enum log_level log_level;
	bool bus;         /* serve org.mrd.Mrd1 on the system bus */

	unsigned max_clients;
	unsigned max_clients_per_user; /* connections of one user (process_owner_uid), root aside */
	unsigned max_user_containers;  /* domains of containers a user's own cgroups hold */
	unsigned max_inflight;         /* replies queued per client before mrd stops reading it */
	unsigned max_frame;            /* bytes per request packet */
	unsigned max_fds;              /* descriptors per request packet */
	unsigned max_protocol_errors;  /* malformed frames before a client is dropped */
	uint64_t max_pinned_bytes;     /* pinned by all domains together */

	/* [memory] */
	uint64_t window_base, window_size, arena_size;
	enum hugepages_mode hugepages;
	unsigned reconnect_grace_s; /* after a warm restart: how often orphans of gone processes go */

	/* [cache] */
	int mr_policy;        /* enum mr_policy */
	uint64_t async_bytes; /* registrations this big or bigger run on a worker thread */
	unsigned workers;     /* worker threads */
	uint64_t odp_chunk;   /* address space of one ODP child */

	/* [windows] remote = window-only: the domain's pinned MRs carry no remote rights of their
	 * own, every remote grant is a memory window (mrd_window_grant); false: mr, the default. */
	bool window_only;

	/* [pools]: FRMR-style handle pools, per domain */
	struct frmr_pools_config pools;

	/* [quota]: every domain's, but for what [quotas] sets */
	struct quota quota;
	/* [quotas]: lines in file order (a glob given again keeps its place) */
	struct quota *quotas;
	size_t n_quotas;

	struct domain_group *groups;
	size_t n_groups;
	/* [policies]: domains whose cache policy is not [cache] policy */
	struct domain_policy {
		char name[64];
		int policy; /* enum mr_policy */
	} *policies;
	size_t n_policies;
};

/* A byte limit left to its default, a fraction of the host's memory (config_fit_host). */
#define QUOTA_HOST_DEFAULT UINT64_MAX
/* The group of the socket mrd binds, as mrd.socket has it (SocketGroup=mrd). */
#define SOCKET_GROUP_DEFAULT "mrd"

void config_init(struct config *c);
void config_done(struct config *c);

/* Reads an INI file into c. A missing file is -ENOENT; a bad line is -EINVAL after one log
 * line naming file:line. */
int config_load_file(struct config *c, const char *path);

/* Sets one key of section [section]; -ENOENT unknown key, -EINVAL bad value, -ERANGE out of
 * bounds. Shared by the file parser and tests. */
int config_set(struct config *c, const char *section, const char *key, const char *value);

/* config_set of one "section.key=value" (how tests and fuzzers write a setting); -EINVAL when it
 * is not of that form. */
int config_set_assignment(struct config *c, const char *assignment);

/* config_load_file of path (missing: -ENOENT when must_exist, else nothing), then of each
 * *.conf file in the folder path.d, in lexical order: later files override earlier ones.
 * Every failure is logged with file:line; returns -ENOENT (path missing) or -EINVAL. */
int config_load(struct config *c, const char *path, bool must_exist);

/* Resolves names (admin and socket groups), sizes the byte limits to the host
 * (config_fit_host) and checks cross-key rules; logs what is wrong. */
int config_finish(struct config *c);

/* Byte limits left to their defaults become fractions of host_bytes (the host's memory): per
 * domain, allocated_bytes 1/2 and pinned_bytes 1/4; [limits] pinned_bytes, the sum over all
 * domains, 1/2. One set above host_bytes gets a warning, and a pinned one is cut to it. */
void config_fit_host(struct config *c, uint64_t host_bytes);
/* How much of the address window a domain's arenas may take: q's window_bytes, by default an
 * eighth of the window (so that eight domains always fit), at least 4 arenas. */
uint64_t config_window_bytes(const struct config *c, const struct quota *q);
/* The quotas of the domain named name: [quota], and what the first [quotas] line whose glob
 * matches name (fnmatch) sets. */
void config_quota_for(const struct config *c, const char *name, struct quota *ret);

/* Writes to why the one refusal every path gives for passing key: the key as mrd.conf names it,
 * its limit (q's, the domain's; LIMIT_PINNED_BYTES: c's, q unused), what domain (NULL: all
 * domains) has in use, what the request tried to add, and where to raise it ([quotas] and the
 * line's glob when that line set it, else [quota]; the quotas change at a reload). Returns
 * -EDQUOT. */
int config_quota_refusal(const struct config *c, const struct quota *q, enum quota_key key,
			 const char *domain, uint64_t used, uint64_t asked, char *why,
			 size_t why_size);

/* The cache policy of the domain named name: its [policies] line, else [cache] policy. */
int config_policy_for(const struct config *c, const char *name);
/* Whether [mrd] devices lets clients bind contexts of the RDMA device name. */
bool config_serves_device(const struct config *c, const char *name);
