/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "escape.h"
#include "log.h"
#include "time-util.h"
#include "control/client.h"
#include "control/manager.h"
#include "control/refusal-log.h"

/* "EDQUOT", for grep; a number where the C library has no names. */
static const char *errno_name(int e, char *buf, size_t size)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
	const char *s = strerrorname_np(e);

	if (s)
		return s;
#endif
	snprintf(buf, size, "errno %d", e);
	return buf;
}

/* Whether the bucket has a line left; takes it. */
static bool refusal_token(struct refusal_limit *l)
{
	uint64_t now = now_usec(CLOCK_MONOTONIC);

	if (l->last_usec == 0) {
		l->tokens = REFUSAL_BURST;
		l->last_usec = now;
	} else if (now - l->last_usec >= REFUSAL_REFILL_USEC) {
		uint64_t add = (now - l->last_usec) / REFUSAL_REFILL_USEC;

		l->tokens = add >= REFUSAL_BURST - l->tokens ? REFUSAL_BURST
							     : l->tokens + (unsigned)add;
		l->last_usec += add * REFUSAL_REFILL_USEC;
	}
	if (l->tokens == 0) {
		l->suppressed++;
		return false;
	}
	l->tokens--;
	return true;
}

/* Refusals of policy (quotas, rights) are news for an administrator; the rest, a program's
 * own mistakes, are info. */
static enum log_level refusal_level(int error)
{
	switch (-error) {
	case EDQUOT: case EPERM: case EACCES: case EUSERS:
		return LOG_LEVEL_NOTICE;
	default:
		return LOG_LEVEL_INFO;
	}
}

/* "; N more lines held back" when the bucket held some back since the last line. */
static const char *suppressed_note(struct refusal_limit *l, char *buf, size_t size)
{
	buf[0] = '\0';
	if (l->suppressed) {
		snprintf(buf, size, " (%" PRIu64 " refusal line%s held back before this: rate limit)",
			 l->suppressed, l->suppressed == 1 ? "" : "s");
		l->suppressed = 0;
	}
	return buf;
}

void refusal_log(struct client *c, unsigned request, const char *name, int error,
		 const char *message)
{
	struct refusal_memory *mem = &c->refusals;
	struct refusal_limit *lim = &c->manager->refusal_limit;
	uint32_t reason = (request & 0xffffu) << 16 | ((unsigned)-error & 0xffffu);
	char escaped[ESCAPE_SIZE(256)], note[96], number[24];
	enum log_level level = refusal_level(error);

	mem->refused++;
	if (level > log_get_level())
		return;
	for (unsigned i = 0; i < mem->n_seen; i++)
		if (mem->seen[i] == reason)
			return;
	if (mem->n_seen == REFUSAL_REASONS_MAX) {
		if (mem->full_said || !refusal_token(lim))
			return;
		mem->full_said = true;
		log_full(level, "client %" PRIu64 " (pid %d, uid %u, domain %s): refused for %u "
			 "reasons already; further reasons are not logged%s", c->id,
			 (int)c->owner.mem.pid, (unsigned)c->owner.mem.uid, c->domain_name,
			 REFUSAL_REASONS_MAX, suppressed_note(lim, note, sizeof(note)));
		return;
	}
	/* Held back: not remembered, so a later one of the same reason may still be logged. */
	if (!refusal_token(lim))
		return;
	mem->seen[mem->n_seen++] = reason;
	mem->logged++;
	/* The message may echo what the client sent (a name): escaped, one line. */
	log_full(level, "refused %s of client %" PRIu64 " (pid %d, uid %u, domain %s): %s (%s): "
		 "%s%s", name, c->id, (int)c->owner.mem.pid, (unsigned)c->owner.mem.uid,
		 c->domain_name, errno_name(-error, number, sizeof(number)), strerror(-error),
		 text_escape(message, 0, escaped, sizeof(escaped)),
		 suppressed_note(lim, note, sizeof(note)));
}

void refusal_log_leave(struct client *c)
{
	struct refusal_memory *mem = &c->refusals;
	char note[96];

	if (mem->refused == mem->logged || mem->logged == 0 ||
	    LOG_LEVEL_INFO > log_get_level() || !refusal_token(&c->manager->refusal_limit))
		return;
	log_info("client %" PRIu64 " (pid %d, uid %u, domain %s) left: %" PRIu64 " of its "
		 "requests refused, %" PRIu64 " of them logged%s", c->id, (int)c->owner.mem.pid,
		 (unsigned)c->owner.mem.uid, c->domain_name, mem->refused, mem->logged,
		 suppressed_note(&c->manager->refusal_limit, note, sizeof(note)));
}
