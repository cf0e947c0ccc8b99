/* SPDX-License-Identifier: MIT */
/* Which process a pid names: its start time tells it from a later process that got the pid. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* When pid started, in clock ticks since boot (/proc/pid/stat); 0 when that cannot be read. */
uint64_t process_start_time(pid_t pid);

/* Whether the process that was pid (started at start_time; 0: unknown, then it must still run
 * as uid) is gone: no such pid, a zombie, or another process under it. Only a certain answer
 * says gone: what cannot be read (and pid 0, a process mrd cannot see) is taken as alive. */
bool process_gone(pid_t pid, uid_t uid, uint64_t start_time);

/* The user who answers for the process pid that connected as uid (both as mrd sees them): uid,
 * or where the process runs in user namespaces below mrd's, the owner of the outermost one a
 * user other than root made — whoever made it holds every uid mapped in it and anything nested
 * (a user's /etc/subuid range through newuidmap), so one user never counts as many. Namespaces
 * root made alone (a container's) are an administrator's: their uids are their own. own_ns is
 * mrd's user namespace (st_dev and st_ino of /proc/self/ns/user; 0: unknown, then uid).
 * -ESRCH when pid no longer runs as uid: it exited and the pid went to another process, or it
 * changed uid, so its namespace tells nothing. -EACCES when mrd may not read the namespace of
 * another user's process (it lacks CAP_SYS_PTRACE, as under the shipped unit). */
int process_owner_uid(pid_t pid, uid_t uid, dev_t own_ns_dev, ino_t own_ns_ino,
		      uid_t *ret_owner);

/* The user whose subordinate uids (path: /etc/subuid, "user:first:count" lines, the ranges
 * newuidmap maps for a user) hold uid; uid itself when none does, when that user is root, when
 * uid is root, or when path cannot be read. */
uid_t subuid_owner(const char *path, uid_t uid);

/* The user a connection from pid (uid, as SO_PEERCRED has it) is charged to:
 * process_owner_uid's answer, or uid where mrd may not read the namespaces (-EACCES). Then,
 * whichever it was, a uid inside a user's range of subuid_path (/etc/subuid) is that user's
 * (subuid_owner): a setuid binary owned by a user's subordinate uid, run from mrd's own
 * namespace, is that user whatever mrd's capabilities. Errors as process_owner_uid's, -EACCES
 * aside. */
int process_charged_uid(pid_t pid, uid_t uid, dev_t own_ns_dev, ino_t own_ns_ino,
			const char *subuid_path, uid_t *ret_owner);

/* Where a process runs, as mrd sees it from its own namespaces, read from /proc files any
 * process may read (status, uid_map, cgroup: mrd keeps no CAP_SYS_PTRACE to open ns/). */
struct process_place {
	bool nested_pidns; /* in a pid namespace below mrd's (NSpid has more than one pid) */
	bool other_userns; /* in a user namespace whose uid_map reads otherwise than mrd's */
	char *cgroup;      /* its cgroup v2 path ("0::" line); NULL on a host with none, or
			    * where it is outside mrd's cgroup namespace ("/../...") */
};

/* Reads pid's place. own_uid_map: mrd's /proc/self/uid_map as read by process_uid_map. -ESRCH
 * when pid no longer runs as uid (it exited, and the pid may have gone to another process).
 * The caller frees ret->cgroup. The answer is pid's at the time of the reads: a connected
 * peer's pid is still its own unless it exited (Linux 6.1 has no SO_PEERPIDFD to pin it). */
int process_place_read(pid_t pid, uid_t uid, const char *own_uid_map, struct process_place *ret);

/* The text of path (a /proc/PID/uid_map) as one string the caller frees; NULL on failure. */
char *process_uid_map(const char *path);
