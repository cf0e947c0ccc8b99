/* SPDX-License-Identifier: MIT */
/* Refused requests in mrd's log, so that "why does my program get EDQUOT" has an answer there:
 * one line per client and reason (request, errno), naming pid, uid, domain, the request, the
 * errno and mrd's message. A client refused in a loop costs no memory per refusal (a fixed
 * table of reasons per client) and floods nothing: each reason once per client, and a token
 * bucket over all clients. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct client;

/* Reasons remembered per client: a refusal whose reason is new past these is counted, not
 * logged (one line says so, once). */
#define REFUSAL_REASONS_MAX 8
/* Lines mrd-wide: a burst of this many, then one per REFUSAL_REFILL_USEC. */
#define REFUSAL_BURST 50
#define REFUSAL_REFILL_USEC 1000000u

/* What one client had refused (struct client embeds it). */
struct refusal_memory {
	uint32_t seen[REFUSAL_REASONS_MAX]; /* request << 16 | errno, logged once each */
	unsigned n_seen;
	bool full_said;   /* the line "further reasons not logged" was written */
	uint64_t refused; /* every refusal */
	uint64_t logged;
};

/* mrd's token bucket (struct manager embeds it). */
struct refusal_limit {
	uint64_t last_usec; /* when tokens were last topped up; 0: never (a full bucket) */
	unsigned tokens;
	uint64_t suppressed; /* lines the bucket held back since the last one written */
};

/* c's request (the oneof case, and its name) was answered with error (negative errno) and
 * message: counted, and logged unless already logged for c or held back. */
void refusal_log(struct client *c, unsigned request, const char *name, int error,
		 const char *message);
/* c leaves: one line when it had refusals that were not logged (how many in all). */
void refusal_log_leave(struct client *c);
