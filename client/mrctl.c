/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <getopt.h>
#include <poll.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "connection.h"
#include "escape.h"
#include "macro.h"
#include "mrd-metrics.h"
#include "time-util.h"

static const char *arg_socket;
static bool arg_json;
static bool arg_pretty; /* --json=pretty: indented */
static bool arg_human;  /* -h: sizes in KiB, MiB, GiB */
static bool arg_wide;   /* -w: every column of clients */
static int arg_metrics = -1; /* stats: enum metrics_format; -1: text or JSON */
static const char *arg_output;

static void help(void)
{
	printf("Usage: mrctl [OPTION]... COMMAND\n"
	       "Show and control mrd, the memory-registration daemon.\n\n"
	       "Commands:\n"
	       "  status              daemon version, uptime, provider, device capabilities,\n"
	       "                      device state and client count, freed memory\n"
	       "                      quarantined (its dereg failed), old device contexts\n"
	       "                      clients still hold after a restart\n"
	       "  clients             every client (mrctl itself left out) and domain, with\n"
	       "                      usage against each quota, the domain's MRs and those\n"
	       "                      mrd holds in its clients' own PDs (-w: every column)\n"
	       "  stats               each domain's counters: lookups, registrations, ODP work\n"
	       "  pools               each domain's MR handle pools (key; handles parked and in\n"
	       "                      use; hits, misses, aging, pinned minimum) or why they are\n"
	       "                      off, and its key quarantine (MRs parked, unparked)\n"
	       "  pools set           change aging and/or the pinned minimum of pools (below)\n"
	       "  mempools            registered mempools, their MRs and how many share each\n"
	       "  flush               rebuild the MR tables and bump the generations, so every\n"
	       "                      client's lookup caches start over, and try failed deregs\n"
	       "                      of quarantined memory again (options below)\n"
	       "  dump                status, clients, stats, pools and mempools together, then each\n"
	       "                      domain: arenas, MR table, and every MR with keys, kind\n"
	       "                      (cache, odp, mempool), pages and owner\n"
	       "  cdi                 a CDI spec (YAML) for container runtimes: devices mrd/rdma=all\n"
	       "                      and one per RDMA device mrd serves, with the socket's folder,\n"
	       "                      the shim, LD_PRELOAD and MRD_SOCKET (options below)\n"
	       "  reload              mrd reads its configuration again (as at SIGHUP)\n"
	       "  shutdown            mrd stops (as at SIGTERM); mrctl waits until it has gone\n"
	       "Anyone may ask for the views, but one who is not root or in mrd's admin group\n"
	       "sees only its own domain; pools set, flush, reload and shutdown need an\n"
	       "administrator (they work across pid namespaces, unlike a signal). Names\n"
	       "clients chose are shown escaped; long views are fetched page by page, and a\n"
	       "list mrd cut says how many it left out.\n\n"
	       "Options:\n"
	       "  -s, --socket PATH   talk to mrd at PATH (default: $MRD_SOCKET, else %s)\n"
	       "  -j, --json[=pretty] print JSON instead of text (one line; pretty: indented)\n"
	       "  -h, --human         sizes in KiB, MiB, GiB, TiB (1024-based) in text\n"
	       "  -w, --wide          clients: every column (GID, allocations, arenas,\n"
	       "                      generation, lookups, misses, own-PD bytes)\n"
	       "      --help          show this help\n"
	       "  -V, --version       show the version\n\n"
	       "Options of 'pools set' (the key options pick pools; without any, every pool\n"
	       "and the pools made later):\n"
	       "  --aging SEC         destroy handles parked longer than SEC seconds (>= 1)\n"
	       "  --pinned N          but keep N per pool however long they idle\n"
	       "  --domain NAME       in domain NAME only\n"
	       "  --access LIST       pools of this access: lw,rw,rr,ra,mw (or the bits as a number)\n"
	       "  --pages N           pools of this size class\n"
	       "  --odp yes|no        on-demand pools, or not\n"
	       "  --internal yes|no   pools of MRs whose keys stay in mrd, or not\n"
	       "  --vendor N          pools of this vendor key\n\n"
	       "Options of 'flush' (without --domain or --uid: every domain):\n"
	       "  --domain NAME       domain NAME only\n"
	       "  --uid N             the domain of uid N only\n"
	       "  --pools             also destroy the parked MR handles above each pool's\n"
	       "                      pinned minimum\n"
	       "  --gc                also destroy every parked handle, pinned ones too, and the\n"
	       "                      pools left empty (not those set by their key)\n\n"
	       "Options of 'stats' (metrics for a scraper, all domains' figures: mrctl(8)):\n"
	       "  --openmetrics       print them in the OpenMetrics text format\n"
	       "  --prometheus        print them in Prometheus's text format (0.0.4), as\n"
	       "                      node-exporter's textfile collector reads it\n"
	       "  --output FILE       write them to FILE instead, replaced whole (a file beside\n"
	       "                      it, synced, renamed over it), mode 0644; FILE, where it\n"
	       "                      exists, must be a regular file\n\n"
	       "Options of 'cdi' (podman run --device mrd/rdma=all; mrctl(8), CONTAINERS):\n"
	       "  --output FILE       write the spec to FILE (say /run/cdi/mrd.yaml) as stats\n"
	       "                      does; - or none: standard output\n"
	       "  --preload PATH      the shim to mount (default: %s)\n\n"
	       "pools set, flush, reload and shutdown need root or mrd's admin group; the other\n"
	       "commands show anyone its own domain, and root and the admin group every domain.\n"
	       "See mrctl(8).\n",
	       MRD_SOCKET_DEFAULT, MRD_PRELOAD_PATH);
}

/* Strings from mrd, names clients chose among them, escaped for root's terminal (a ring of
 * buffers: one printf may take several). cell: in a table, where a space would forge a
 * column. */
static const char *escape_ring(const char *s, unsigned flags)
{
	static char ring[8][ESCAPE_SIZE(256)];
	static unsigned next;
	char *buf = ring[next++ % ELEMENTSOF(ring)];

	return text_escape(s, flags, buf, sizeof(ring[0]));
}
static const char *esc(const char *s) { return escape_ring(s, 0); }
static const char *cell(const char *s) { return escape_ring(s, ESCAPE_SPACE); }

/* A byte count as text: the number, or with -h the 1024-based unit that keeps it below 1024
 * ("1.5 MiB"; exact bytes below 1 KiB). A ring of buffers: one printf may take several. */
static const char *size_text(uint64_t v)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	static char ring[8][32];
	static unsigned next;
	char *buf = ring[next++ % ELEMENTSOF(ring)];
	double d = (double)v;
	size_t u = 0;

	if (!arg_human || v < 1024) {
		snprintf(buf, sizeof(ring[0]), "%" PRIu64 "%s", v, arg_human ? " B" : "");
		return buf;
	}
	d /= 1024;
	while (d >= 1024 && u + 1 < ELEMENTSOF(units)) {
		d /= 1024;
		u++;
	}
	snprintf(buf, sizeof(ring[0]), "%.*f %s", d < 10 ? 1 : 0, d, units[u]);
	return buf;
}

/* "N bytes", or with -h as size_text shows it: for sentences. */
static const char *size_words(uint64_t v)
{
	static char ring[4][40];
	static unsigned next;
	char *buf = ring[next++ % ELEMENTSOF(ring)];

	if (arg_human)
		return size_text(v);
	snprintf(buf, sizeof(ring[0]), "%" PRIu64 " bytes", v);
	return buf;
}

/* used/quota, sizes as size_text shows them (no space: one table cell). */
static const char *size_pair(uint64_t used, uint64_t quota, char *buf, size_t size)
{
	char a[32], b[32];

	snprintf(a, sizeof(a), "%s", size_text(used));
	snprintf(b, sizeof(b), "%s", size_text(quota));
	for (char *p = a; *p; p++)
		if (*p == ' ')
			memmove(p, p + 1, strlen(p));
	for (char *p = b; *p; p++)
		if (*p == ' ')
			memmove(p, p + 1, strlen(p));
	snprintf(buf, size, "%s/%s", a, b);
	return buf;
}

static const char *yes_no(bool b) { return b ? "yes" : "no"; }
static const char *json_bool(bool b) { return b ? "true" : "false"; }

/* Device contexts earlier mrds exported and handed over while clients held them: their MRs,
 * pins and keys live until those close them. */
static void print_old_contexts_json(Mrd__OldContextInfo *const *o, size_t n)
{
	printf(",\"old_contexts\":[");
	for (size_t i = 0; i < n; i++) {
		printf("%s{\"domain\":", i ? "," : "");
		json_write_string(stdout, o[i]->domain);
		printf(",\"device\":");
		json_write_string(stdout, o[i]->device);
		printf(",\"pinned_bytes\":%" PRIu64 ",\"mrs\":%" PRIu32 ",\"handed_over_usec\":%" PRIu64
		       ",\"holder_pids\":[", o[i]->pinned_bytes, o[i]->mrs, o[i]->handed_over_usec);
		for (size_t k = 0; k < o[i]->n_holder_pids; k++)
			printf("%s%" PRIu32, k ? "," : "", o[i]->holder_pids[k]);
		printf("]}");
	}
	printf("]");
}

static void print_old_contexts(Mrd__OldContextInfo *const *o, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		printf("old context:      domain %s on %s, held by pid", esc(o[i]->domain),
		       esc(o[i]->device));
		for (size_t k = 0; k < o[i]->n_holder_pids; k++)
			printf("%s%" PRIu32, k ? ", " : " ", o[i]->holder_pids[k]);
		printf(": %" PRIu32 " MRs and %s %s at the hand-over %.0f s ago, "
		       "alive until they close it (call mrd_client_get_pd again)\n", o[i]->mrs,
		       size_text(o[i]->pinned_bytes), arg_human ? "pinned" : "pinned bytes",
		       (double)(now_usec(CLOCK_REALTIME) - o[i]->handed_over_usec) / 1e6);
	}
}

static void print_status(const Mrd__StatusResponse *s)
{
	const char *why;

	if (arg_json) {
		printf("{\"version\":");
		json_write_string(stdout, s->server_version);
		printf(",\"pid\":%" PRIu32 ",\"uptime_usec\":%" PRIu64 ",\"provider\":", s->pid,
		       s->uptime_usec);
		json_write_string(stdout, s->provider);
		printf(",\"device\":");
		json_write_string(stdout, s->device);
		printf(",\"max_mr_size\":%" PRIu64 ",\"odp\":%s,\"odp_implicit\":%s"
		       ",\"rereg_translation\":%s,\"dma\":%s",
		       s->max_mr_size, json_bool(s->odp), json_bool(s->odp_implicit),
		       json_bool(s->rereg_translation), json_bool(s->dma));
		if (*s->no_dma) {
			printf(",\"no_dma\":");
			json_write_string(stdout, s->no_dma);
		}
		printf(",\"mw\":%s", json_bool(s->mw));
		if (*s->no_mw) {
			printf(",\"no_mw\":");
			json_write_string(stdout, s->no_mw);
		}
		if (*s->mw_wide) {
			printf(",\"mw_wide\":");
			json_write_string(stdout, s->mw_wide);
		}
		printf(",\"atomic\":%s,\"odp_rc\":", json_bool(s->atomic));
		json_write_string(stdout, s->odp_rc);
		printf(",\"odp_pinned\":");
		json_write_string(stdout, s->odp_pinned);
		printf(",\"device_state\":");
		json_write_string(stdout, s->device_state);
		printf(",\"device_failed_since\":%" PRIu64 ",\"device_failure\":",
		       s->device_failed_since);
		json_write_string(stdout, s->device_failure);
		printf(",\"port_active\":%s,\"device_failures\":%" PRIu64
		       ",\"device_returns\":%" PRIu64 ",\"foreign_events\":%" PRIu64,
		       json_bool(s->port_active), s->device_failures, s->device_returns,
		       s->foreign_events);
		printf(",\"domains\":%" PRIu32 ",\"clients\":%" PRIu32 ",\"max_clients\":%" PRIu32
		       ",\"quarantined_bytes\":%" PRIu64 ",\"quarantined_runs\":%" PRIu32,
		       s->domains, s->clients, s->max_clients, s->quarantined_bytes,
		       s->quarantined_runs);
		print_old_contexts_json(s->old_contexts, s->n_old_contexts);
		printf(",\"devices\":[");
		for (size_t i = 0; i < s->n_devices; i++) {
			const Mrd__DeviceInfo *d = s->devices[i];

			printf("%s{\"name\":", i ? "," : "");
			json_write_string(stdout, d->name);
			printf(",\"domains\":%s,\"max_mr_size\":%" PRIu64 ",\"odp\":%s,\"atomic\":%s"
			       ",\"port_active\":%s,\"bound\":%" PRIu32 "}", json_bool(d->domains),
			       d->max_mr_size, json_bool(d->odp), json_bool(d->atomic),
			       json_bool(d->port_active), d->bound);
		}
		printf("]");
		if (*s->view) { /* not an administrator: its own domain's figures alone */
			printf(",\"view\":");
			json_write_string(stdout, s->view);
			printf("}\n");
			return;
		}
		printf(",\"view\":null,\"requests\":%" PRIu64 ",\"protocol_errors\":%" PRIu64
		       ",\"clients_dropped\":%" PRIu64 "}\n",
		       s->requests, s->protocol_errors, s->clients_dropped);
		return;
	}
	printf("version:          %s\n"
	       "pid:              %" PRIu32 "\n"
	       "uptime:           %.1f s\n"
	       "provider:         %s\n"
	       "device:           %s\n"
	       "max MR size:      %s\n"
	       "ODP:              %s (implicit: %s)\n"
	       "rereg translate:  %s\n"
	       "DMA by keys:      %s%s%s%s\n",
	       esc(s->server_version), s->pid, (double)s->uptime_usec / 1e6, esc(s->provider),
	       esc(s->device), size_words(s->max_mr_size), yes_no(s->odp), yes_no(s->odp_implicit),
	       yes_no(s->rereg_translation), yes_no(s->dma), *s->no_dma ? " (" : "",
	       esc(s->no_dma), *s->no_dma ? ")" : "");
	why = *s->no_mw ? s->no_mw : s->mw_wide; /* not there, or wider than granted */
	printf("memory windows:   %s%s%s%s\n", yes_no(s->mw), *why ? " (" : "", esc(why),
	       *why ? ")" : "");
	printf("remote atomics:   %s\n"
	       "ODP over RC:      %s%s%s\n",
	       s->atomic ? "yes" : "no (MRs are registered without REMOTE_ATOMIC)", esc(s->odp_rc),
	       *s->odp_pinned ? "; on-demand memory is pinned: " : "", esc(s->odp_pinned));
	if (strcmp(s->device_state, "failed") == 0) {
		time_t since = (time_t)s->device_failed_since;
		char when[64];

		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&since));
		printf("device state:     failed since %s (%s), reopening\n", when,
		       esc(s->device_failure));
	} else
		printf("device state:     ok\n");
	printf("port:             %s\n"
	       "device failures:  %" PRIu64 " (back %" PRIu64 " times); foreign events: %" PRIu64 "\n",
	       s->port_active ? "active" : "down", s->device_failures, s->device_returns,
	       s->foreign_events);
	if (s->quarantined_runs)
		printf("quarantined:      %s in %" PRIu32 " freed runs the device kept "
		       "an MR over (dereg failed; mrctl flush tries again)\n",
		       size_words(s->quarantined_bytes),
		       s->quarantined_runs);
	print_old_contexts(s->old_contexts, s->n_old_contexts);
	for (size_t i = 0; i < s->n_devices; i++) {
		const Mrd__DeviceInfo *d = s->devices[i];

		/* Clients bind PDs of their own contexts on any of these (mrd_client_bind_pd(3)). */
		printf("%s%s%s: max MR size %s, ODP %s, remote atomics %s, port %s%s",
		       i ? "" : "devices:          ", i ? "                  " : "", esc(d->name),
		       size_text(d->max_mr_size), yes_no(d->odp), yes_no(d->atomic),
		       d->port_active ? "active" : "down", d->domains ? ", the domains'" : "");
		if (!*s->view)
			printf(", %" PRIu32 " bound", d->bound);
		printf("\n");
	}
	if (*s->view) {
		printf("domain:           %s (%s open; root and the admin group see every domain)\n"
		       "clients:          %" PRIu32 " of %" PRIu32 " in the domain\n",
		       esc(s->view), s->domains ? "yours," : "not", s->clients, s->max_clients);
		return;
	}
	printf("domains:          %" PRIu32 "\n"
	       "clients:          %" PRIu32 " of %" PRIu32 "\n"
	       "requests:         %" PRIu64 "\n"
	       "protocol errors:  %" PRIu64 "\n"
	       "clients dropped:  %" PRIu64 "\n",
	       s->domains, s->clients, s->max_clients, s->requests, s->protocol_errors,
	       s->clients_dropped);
}

/* Sends req; on success *ret is a reply carrying body_case. Every failure is printed. */
static int call(struct conn *c, const char *name, Mrd__Request *req, int body_case,
		Mrd__Response **ret)
{
	Mrd__Response *resp;
	int r;

	r = conn_call(c, req, &resp, NULL);
	if (r < 0) {
		fprintf(stderr, "mrctl: %s: %s\n", name, strerror(-r));
		return r;
	}
	r = response_error(resp);
	if (r < 0)
		fprintf(stderr, "mrctl: %s: %s\n", name,
			resp->message && *resp->message ? esc(resp->message) : strerror(-r));
	else if ((int)resp->body_case != body_case) {
		fprintf(stderr, "mrctl: %s: malformed reply\n", name);
		r = -EBADMSG;
	}
	if (r < 0) {
		mrd__response__free_unpacked(resp, NULL);
		return r;
	}
	*ret = resp;
	return 0;
}

/* A paged request: sent with *cursor 0, then again from each page's next until one says 0.
 * page() shows one reply and returns its next. */
static int call_pages(struct conn *c, const char *name, Mrd__Request *req, int body_case,
		      uint32_t *cursor, uint32_t (*page)(const Mrd__Response *resp, void *userdata),
		      void *userdata)
{
	*cursor = 0;
	do {
		Mrd__Response *resp;
		int r = call(c, name, req, body_case, &resp);

		if (r < 0)
			return r;
		*cursor = page(resp, userdata);
		mrd__response__free_unpacked(resp, NULL);
	} while (*cursor);
	return 0;
}

/* The Status request, which status and stats --openmetrics both show. */
static int call_status(struct conn *c, const char *name, Mrd__Response **ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__StatusRequest status = MRD__STATUS_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_STATUS;
	req.status = &status;
	return call(c, name, &req, MRD__RESPONSE__BODY_STATUS_REPLY, ret);
}

/* The FrmrPools request, which pools and stats --openmetrics both show. */
static int call_pools(struct conn *c, const char *name, Mrd__Response **ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__FrmrPoolsRequest pools = MRD__FRMR_POOLS_REQUEST__INIT;

	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS;
	req.frmr_pools = &pools;
	return call(c, name, &req, MRD__RESPONSE__BODY_FRMR_POOLS, ret);
}

static int cmd_status(struct conn *c)
{
	Mrd__Response *resp;
	int r = call_status(c, "status", &resp);

	if (r < 0)
		return r;
	print_status(resp->status_reply);
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

static void print_domains_omitted(uint32_t n)
{
	if (n)
		printf("... %" PRIu32 " more domains not shown (one reply holds what fits)\n", n);
}

static void print_clients(const Mrd__ClientsResponse *r)
{
	if (arg_json) {
		printf("{\"clients\":[");
		for (size_t i = 0; i < r->n_clients; i++) {
			const Mrd__ClientInfo *c = r->clients[i];

			printf("%s{\"id\":%" PRIu64 ",\"pid\":%" PRIu32 ",\"uid\":%" PRIu32
			       ",\"gid\":%" PRIu32 ",\"name\":", i ? "," : "", c->id, c->pid, c->uid,
			       c->gid);
			json_write_string(stdout, c->name);
			printf(",\"domain\":");
			json_write_string(stdout, c->domain);
			printf(",\"allocated_bytes\":%" PRIu64 ",\"allocations\":%" PRIu32
			       ",\"admin\":%s", c->allocated_bytes, c->allocations,
			       json_bool(c->admin));
			if (*c->bound_driver) {
				printf(",\"bound_pd\":{\"driver\":");
				json_write_string(stdout, c->bound_driver);
				printf(",\"pd\":%" PRIu32 ",\"mrs\":%" PRIu32
				       ",\"mr_bytes\":%" PRIu64 ",\"registrations\":%" PRIu64 "}",
				       c->bound_pd, c->bound_mrs, c->bound_mr_bytes,
				       c->bound_registrations);
			}
			printf("}");
		}
		printf("],\"domains\":[");
		for (size_t i = 0; i < r->n_domains; i++) {
			const Mrd__DomainInfo *d = r->domains[i];

			printf("%s{\"name\":", i ? "," : "");
			json_write_string(stdout, d->name);
			printf(",\"clients\":%" PRIu32 ",\"allocated_bytes\":%" PRIu64
			       ",\"allocations\":%" PRIu32 ",\"arenas\":%" PRIu32
			       ",\"pinned_bytes\":%" PRIu64 ",\"generation\":%" PRIu64
			       ",\"quota\":{\"clients\":%" PRIu32 ",\"allocated_bytes\":%" PRIu64
			       ",\"allocations\":%" PRIu32 ",\"arenas\":%" PRIu32
			       ",\"pinned_bytes\":%" PRIu64 "},\"mrs\":%" PRIu32
			       ",\"client_pd_mrs\":%" PRIu32 ",\"client_pd_mr_bytes\":%" PRIu64
			       ",\"lookups\":%" PRIu64
			       ",\"misses\":%" PRIu64 ",\"table_overflow\":%s,\"waiting\":%" PRIu32
			       ",\"quarantined_bytes\":%" PRIu64 ",\"quarantined_runs\":%" PRIu32
			       ",\"memory_windows\":%" PRIu32 ",\"quota_memory_windows\":%" PRIu32 "}",
			       d->clients, d->allocated_bytes, d->allocations, d->arenas,
			       d->pinned_bytes, d->generation, d->quota_clients,
			       d->quota_allocated_bytes, d->quota_allocations, d->quota_arenas,
			       d->quota_pinned_bytes, d->mrs, d->client_pd_mrs,
			       d->client_pd_mr_bytes, d->lookups, d->misses,
			       json_bool(d->table_overflow), d->waiting, d->quarantined_bytes,
			       d->quarantined_runs, d->memory_windows, d->quota_memory_windows);
		}
		printf("]");
		print_old_contexts_json(r->old_contexts, r->n_old_contexts);
		printf(",\"clients_omitted\":%" PRIu32 ",\"domains_omitted\":%" PRIu32 "}\n",
		       r->clients_omitted, r->domains_omitted);
		return;
	}
	if (r->n_clients == 0)
		printf("no client is connected%s\n", r->clients_omitted ? " that fits" : "");
	else if (arg_wide)
		printf("%-6s %-8s %-6s %-6s %-16s %-16s %14s %6s %-14s\n", "ID", "PID", "UID", "GID",
		       "NAME", "DOMAIN", "ALLOCATED", "ALLOCS", "PD");
	else
		printf("%-6s %-8s %-6s %-16s %-16s %10s %6s %s\n", "ID", "PID", "UID", "NAME",
		       "DOMAIN", "ALLOCATED", "ALLOCS", "PD");
	for (size_t i = 0; i < r->n_clients; i++) {
		const Mrd__ClientInfo *c = r->clients[i];
		char pd[96] = "domain";

		/* Whose PD its keys are of: the domain's, or its own context's (BindPd). */
		if (*c->bound_driver && arg_wide)
			snprintf(pd, sizeof(pd), "own:%s/%" PRIu32 "(%" PRIu32 " MRs, %s)",
				 cell(c->bound_driver), c->bound_pd, c->bound_mrs,
				 size_words(c->bound_mr_bytes));
		else if (*c->bound_driver)
			snprintf(pd, sizeof(pd), "own:%s/%" PRIu32 "(%" PRIu32 ")",
				 cell(c->bound_driver), c->bound_pd, c->bound_mrs);
		for (char *p = pd; *p; p++)
			if (*p == ' ')
				*p = '_'; /* one cell */
		if (arg_wide)
			printf("%-6" PRIu64 " %-8" PRIu32 " %-6" PRIu32 " %-6" PRIu32 " %-16s %-16s "
			       "%14s %6" PRIu32 " %-14s%s\n", c->id, c->pid, c->uid, c->gid,
			       cell(c->name), *c->domain ? cell(c->domain) : "-",
			       size_text(c->allocated_bytes), c->allocations, pd,
			       c->admin ? "  admin" : "");
		else
			printf("%-6" PRIu64 " %-8" PRIu32 " %-6" PRIu32 " %-16s %-16s %10s %6"
			       PRIu32 " %s%s\n", c->id, c->pid, c->uid, cell(c->name),
			       *c->domain ? cell(c->domain) : "-", size_text(c->allocated_bytes),
			       c->allocations, pd, c->admin ? " admin" : "");
	}
	if (r->clients_omitted)
		printf("... %" PRIu32 " more clients not shown (one reply holds what fits)\n",
		       r->clients_omitted);
	/* MRS: the domain's PD's, as dump counts them (cache, ODP children, mempools);
	 * OWN-PD: those in its clients' own PDs (BindPd), which libmrd-preload.so's programs
	 * register into. No header for a table without rows. */
	if (r->n_domains && arg_wide)
		printf("\n%-16s %9s %22s %16s %12s %22s %12s %6s %10s %16s %10s %8s\n", "DOMAIN",
		       "CLIENTS", "ALLOCATED BYTES", "ALLOCATIONS", "ARENAS", "PINNED BYTES",
		       "GENERATION", "MRS", "OWN-PD MRS", "OWN-PD MR BYTES", "LOOKUPS", "MISSES");
	else if (r->n_domains)
		printf("\n%-16s %7s %23s %23s %6s %6s\n", "DOMAIN", "CLIENTS", "ALLOCATED/QUOTA",
		       "PINNED/QUOTA", "MRS", "OWN-PD");
	for (size_t i = 0; i < r->n_domains; i++) {
		const Mrd__DomainInfo *d = r->domains[i];
		char clients[24], alloc[64], allocs[32], arenas[24], pinned[64];

		/* Usage / quota for each limit. */
		snprintf(clients, sizeof(clients), "%" PRIu32 "/%" PRIu32, d->clients, d->quota_clients);
		size_pair(d->allocated_bytes, d->quota_allocated_bytes, alloc, sizeof(alloc));
		snprintf(allocs, sizeof(allocs), "%" PRIu32 "/%" PRIu32, d->allocations,
			 d->quota_allocations);
		snprintf(arenas, sizeof(arenas), "%" PRIu32 "/%" PRIu32, d->arenas, d->quota_arenas);
		size_pair(d->pinned_bytes, d->quota_pinned_bytes, pinned, sizeof(pinned));
		if (arg_wide)
			printf("%-16s %9s %22s %16s %12s %22s %12" PRIu64 " %6" PRIu32 " %10" PRIu32
			       " %16s %10" PRIu64 " %8" PRIu64 "%s", cell(d->name), clients, alloc,
			       allocs, arenas, pinned, d->generation, d->mrs, d->client_pd_mrs,
			       size_text(d->client_pd_mr_bytes), d->lookups, d->misses,
			       d->table_overflow ? "  (table overflow)" : "");
		else
			printf("%-16s %7s %23s %23s %6" PRIu32 " %6" PRIu32 "%s", cell(d->name),
			       clients, alloc, pinned, d->mrs, d->client_pd_mrs,
			       d->table_overflow ? " (table overflow)" : "");
		if (d->waiting)
			printf("  (%" PRIu32 " waiting for their owners after a restart)", d->waiting);
		if (d->quarantined_runs)
			printf("  (%s in %" PRIu32 " runs quarantined: dereg failed)",
			       size_words(d->quarantined_bytes), d->quarantined_runs);
		if (d->memory_windows)
			printf("  (%" PRIu32 "/%" PRIu32 " memory windows bound)", d->memory_windows,
			       d->quota_memory_windows);
		printf("\n");
	}
	print_domains_omitted(r->domains_omitted);
	if (r->n_old_contexts)
		printf("\n");
	print_old_contexts(r->old_contexts, r->n_old_contexts);
}

/* The Clients request, which clients and stats both show. */
static int call_clients(struct conn *c, const char *name, Mrd__Response **ret)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ClientsRequest clients = MRD__CLIENTS_REQUEST__INIT;

	clients.skip_caller = true; /* mrctl's own connection is no news */
	req.body_case = MRD__REQUEST__BODY_CLIENTS;
	req.clients = &clients;
	return call(c, name, &req, MRD__RESPONSE__BODY_CLIENTS, ret);
}

static int cmd_clients(struct conn *c)
{
	Mrd__Response *resp;
	int r = call_clients(c, "clients", &resp);

	if (r < 0)
		return r;
	print_clients(resp->clients);
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

static void print_stats(const Mrd__ClientsResponse *r)
{
	if (arg_json)
		printf("{\"domains\":[");
	for (size_t i = 0; i < r->n_domains; i++) {
		const Mrd__DomainInfo *d = r->domains[i];

		if (arg_json) {
			printf("%s{\"name\":", i ? "," : "");
			json_write_string(stdout, d->name);
			printf(",\"lookups\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"mrs\":%" PRIu32
			       ",\"registrations\":%" PRIu64 ",\"deregistrations\":%" PRIu64
			       ",\"odp_children\":%" PRIu32 ",\"odp_faults\":%" PRIu64
			       ",\"odp_children_created\":%" PRIu64
			       ",\"odp_children_destroyed\":%" PRIu64
			       ",\"odp_prefetch_requests\":%" PRIu64 ",\"odp_prefetch_pages\":%" PRIu64
			       ",\"odp_invalidations\":%" PRIu64 ",\"quarantined_bytes\":%" PRIu64
			       ",\"quarantined_runs\":%" PRIu32 "}",
			       d->lookups, d->misses, d->mrs, d->registrations, d->deregistrations,
			       d->odp_children, d->odp_faults, d->odp_children_created,
			       d->odp_children_destroyed, d->odp_prefetch_requests,
			       d->odp_prefetch_pages, d->odp_invalidations, d->quarantined_bytes,
			       d->quarantined_runs);
			continue;
		}
		printf("%sdomain %s\n"
		       "  lookups:                %" PRIu64 " (%" PRIu64 " missed)\n"
		       "  MRs:                    %" PRIu32 " (in the domain's PD: cache, ODP, mempools)\n"
		       "  registrations:          %" PRIu64 " made, %" PRIu64 " let go\n"
		       "  ODP children:           %" PRIu32 " live, %" PRIu64 " made, %" PRIu64
		       " destroyed\n"
		       "  ODP faults:             %" PRIu64 "\n"
		       "  ODP prefetches:         %" PRIu64 " requests, %" PRIu64 " pages\n"
		       "  ODP invalidations:      %" PRIu64 "\n"
		       "  quarantined:            %s in %" PRIu32 " freed runs (dereg "
		       "failed)\n",
		       i ? "\n" : "", esc(d->name), d->lookups, d->misses, d->mrs, d->registrations,
		       d->deregistrations, d->odp_children, d->odp_children_created,
		       d->odp_children_destroyed, d->odp_faults, d->odp_prefetch_requests,
		       d->odp_prefetch_pages, d->odp_invalidations, size_words(d->quarantined_bytes),
		       d->quarantined_runs);
	}
	if (arg_json)
		printf("],\"domains_omitted\":%" PRIu32 "}\n", r->domains_omitted);
	else if (r->n_domains == 0 && r->domains_omitted == 0)
		printf("no domain is open\n");
	else
		print_domains_omitted(r->domains_omitted);
}

/* A file beside path, to be renamed over it: *ret its stream, *tmp its name. path, where it
 * exists, must be a regular file: rename(2) would replace a link or a device node, not write
 * through it. */
static int output_open(const char *path, FILE **ret, char **tmp)
{
	struct stat st;
	int fd, r;

	if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
		return S_ISDIR(st.st_mode) ? -EISDIR : -EEXIST;
	if (asprintf(tmp, "%s.XXXXXX", path) < 0) {
		*tmp = NULL;
		return -ENOMEM;
	}
	fd = mkostemp(*tmp, O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		goto fail;
	}
	/* node-exporter reads it as its own user. */
	if (fchmod(fd, 0644) < 0 || !(*ret = fdopen(fd, "w"))) {
		r = -errno;
		close(fd);
		unlink(*tmp);
		goto fail;
	}
	return 0;
fail:
	free(*tmp);
	*tmp = NULL;
	return r;
}

/* f written and synced, then renamed over path, so that a reader sees the old file or the new
 * one, never a part of one; on any failure the file beside it goes. */
static int output_commit(FILE *f, char *tmp, const char *path)
{
	int r = 0;

	if (fflush(f) != 0)
		r = -errno;
	else if (ferror(f)) /* an earlier write failed; errno is long gone */
		r = -EIO;
	else if (fsync(fileno(f)) < 0)
		r = -errno;
	if (fclose(f) != 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0)
		unlink(tmp);
	free(tmp);
	return r;
}

/* stats --openmetrics/--prometheus: Status, Clients and FrmrPools asked first, so that a
 * failure writes nothing. */
static int cmd_metrics(struct conn *c)
{
	Mrd__Response *st = NULL, *cl = NULL, *po = NULL;
	struct metrics m;
	char *tmp = NULL;
	FILE *f = stdout;
	int r;

	r = call_status(c, "stats", &st);
	if (r >= 0)
		r = call_clients(c, "stats", &cl);
	if (r >= 0)
		r = call_pools(c, "stats", &po);
	if (r < 0)
		goto out;
	if (arg_output) {
		r = output_open(arg_output, &f, &tmp);
		if (r < 0) {
			fprintf(stderr, "mrctl: stats: %s: %s\n", arg_output,
				r == -EEXIST ? "exists and is not a regular file" : strerror(-r));
			goto out;
		}
	}
	metrics_init(&m, f, (enum metrics_format)arg_metrics);
	mrd_metrics_write(&m, st->status_reply, cl->clients, po->frmr_pools);
	if (arg_output) {
		r = output_commit(f, tmp, arg_output);
		if (r < 0)
			fprintf(stderr, "mrctl: stats: %s: %s\n", arg_output, strerror(-r));
	} else {
		r = fflush(stdout) != 0 ? -errno : ferror(stdout) ? -EIO : 0;
		if (r < 0)
			fprintf(stderr, "mrctl: stats: standard output: %s\n", strerror(-r));
	}
out:
	if (st)
		mrd__response__free_unpacked(st, NULL);
	if (cl)
		mrd__response__free_unpacked(cl, NULL);
	if (po)
		mrd__response__free_unpacked(po, NULL);
	return r;
}

/* mrctl cdi: a CDI spec (Container Device Interface, read by podman, containerd and CRI-O) of
 * kind mrd/rdma: "all" and one device per RDMA device mrd serves, each its uverbs node and
 * rdma_cm; every device mounts mrd's socket folder and the shim read-only and sets LD_PRELOAD
 * and MRD_SOCKET. Version 0.3.0 and no key that came later (deviceNodes' hostPath,
 * additionalGids): podman 4.3.1 (Debian 12) reads its specs strictly and refuses a spec with a
 * key it does not know, and a device with no edits, hence MRD_SOCKET in each device's. */
#define CDI_DEV_DIR "/dev/infiniband"
#define CDI_VERBS_CLASS "/sys/class/infiniband_verbs"

static const char *arg_preload;

struct cdi_device {
	const char *name;
	char node[sizeof(CDI_DEV_DIR "/uverbs") + 12];
};

static bool is_char_device(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISCHR(st.st_mode);
}

/* The uverbs node of RDMA device ibdev, by /sys/class/infiniband_verbs/uverbsN/ibdev. */
static int cdi_find_node(const char *ibdev, char *node, size_t size)
{
	DIR *d = opendir(CDI_VERBS_CLASS);
	struct dirent *e;
	int r = -ENOENT;

	if (!d)
		return -errno;
	while (r == -ENOENT && (e = readdir(d))) {
		char path[512], name[128] = "";
		FILE *f;

		if (strncmp(e->d_name, "uverbs", 6) != 0)
			continue;
		snprintf(path, sizeof(path), CDI_VERBS_CLASS "/%s/ibdev", e->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		if (!fgets(name, sizeof(name), f))
			name[0] = 0;
		fclose(f);
		name[strcspn(name, "\n")] = 0;
		if (strcmp(name, ibdev) == 0 &&
		    (size_t)snprintf(node, size, CDI_DEV_DIR "/%s", e->d_name) < size)
			r = is_char_device(node) ? 0 : -ENODEV;
	}
	closedir(d);
	return r;
}

/* CDI's device names: a letter or digit, then letters, digits, '_', '.', ':' or '-'. */
static bool cdi_name_ok(const char *s)
{
	if (!(('a' <= *s && *s <= 'z') || ('A' <= *s && *s <= 'Z') || ('0' <= *s && *s <= '9')))
		return false;
	return s[strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")] == 0;
}

/* JSON's quoted strings are YAML's double-quoted ones. */
static void cdi_device_edits(FILE *f, const char *name, const char *env_socket,
			     const struct cdi_device *devs, size_t n, const char *rdma_cm)
{
	fprintf(f, "- name: ");
	json_write_string(f, name);
	fprintf(f, "\n  containerEdits:\n    env:\n    - ");
	json_write_string(f, env_socket);
	fputc('\n', f);
	if (n == 0)
		return;
	fprintf(f, "    deviceNodes:\n");
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "    - path: ");
		json_write_string(f, devs[i].node);
		fputc('\n', f);
	}
	if (rdma_cm) {
		fprintf(f, "    - path: ");
		json_write_string(f, rdma_cm);
		fputc('\n', f);
	}
}

static void cdi_mount(FILE *f, const char *path, bool exec)
{
	fprintf(f, "  - hostPath: ");
	json_write_string(f, path);
	fprintf(f, "\n    containerPath: ");
	json_write_string(f, path);
	/* The shim is mapped executable; nothing in the socket's folder is. A read-only mount
	 * still connects to the socket (write on a socket is not write to the file system), and
	 * root in a container cannot unlink it. */
	fprintf(f, "\n    options:\n    - \"ro\"\n    - \"nosuid\"\n    - \"nodev\"\n%s    - \"bind\"\n",
		exec ? "" : "    - \"noexec\"\n");
}

static void cdi_write(FILE *f, const char *env_preload, const char *env_socket,
		      const char *folder, const char *shim, const struct cdi_device *devs, size_t n,
		      const char *rdma_cm)
{
	fprintf(f, "# mrd's CDI spec, written by mrctl cdi (mrd %s), which rewrites it when devices\n"
		   "# come and go (mrctl(8)): podman run --device mrd/rdma=all (or =DEVICE) ...\n"
		   "cdiVersion: \"0.3.0\"\n"
		   "kind: \"mrd/rdma\"\n"
		   "containerEdits:\n"
		   "  env:\n"
		   "  - ", PACKAGE_VERSION);
	json_write_string(f, env_preload);
	fprintf(f, "\n  mounts:\n");
	cdi_mount(f, folder, false);
	cdi_mount(f, shim, true);
	fprintf(f, "devices:\n");
	cdi_device_edits(f, "all", env_socket, devs, n, rdma_cm);
	for (size_t i = 0; i < n; i++)
		cdi_device_edits(f, devs[i].name, env_socket, &devs[i], 1, rdma_cm);
}

static int cdi_oom(void)
{
	fprintf(stderr, "mrctl: cdi: out of memory\n");
	return -ENOMEM;
}

static int cmd_cdi(struct conn *c)
{
	const char *socket = conn_socket_path(arg_socket);
	const char *shim = arg_preload ? arg_preload : MRD_PRELOAD_PATH;
	const char *rdma_cm = CDI_DEV_DIR "/rdma_cm";
	_cleanup_free_ struct cdi_device *devs = NULL;
	_cleanup_free_ char *folder = NULL, *env_preload = NULL, *env_socket = NULL;
	const Mrd__StatusResponse *s;
	Mrd__Response *resp;
	const char *out = arg_output && strcmp(arg_output, "-") != 0 ? arg_output : NULL;
	char *tmp = NULL, *slash;
	FILE *f = stdout;
	size_t n = 0;
	int r;

	/* The container sees the same paths: they must not depend on a working directory. */
	if (socket[0] != '/' || shim[0] != '/') {
		fprintf(stderr, "mrctl: cdi: %s: the path must be absolute\n",
			socket[0] != '/' ? socket : shim);
		return -EINVAL;
	}
	if (access(shim, R_OK) < 0) {
		r = -errno;
		fprintf(stderr, "mrctl: cdi: %s: %s (the shim, libmrd-preload.so; --preload names "
			"another)\n", shim, strerror(-r));
		return r;
	}
	folder = strdup(socket);
	if (!folder)
		return cdi_oom();
	if (asprintf(&env_preload, "LD_PRELOAD=%s", shim) < 0) {
		env_preload = NULL; /* undefined after a failure */
		return cdi_oom();
	}
	if (asprintf(&env_socket, "MRD_SOCKET=%s", socket) < 0) {
		env_socket = NULL;
		return cdi_oom();
	}
	slash = strrchr(folder, '/');
	slash[slash == folder] = 0; /* "/mrd.sock": "/" */

	r = call_status(c, "cdi", &resp);
	if (r < 0)
		return r;
	s = resp->status_reply;
	devs = calloc(s->n_devices ? s->n_devices : 1, sizeof(*devs));
	if (!devs) {
		r = cdi_oom();
		goto out;
	}
	/* A device mrd lists but that has gone (mrd keeps the names it saw) is left out: a node
	 * in the spec that is not on the host fails every container that asks for "all". */
	for (size_t i = 0; i < s->n_devices; i++) {
		const char *name = s->devices[i]->name;

		if (!cdi_name_ok(name)) {
			fprintf(stderr, "mrctl: cdi: device %s: not a CDI device name; left out\n",
				esc(name));
			continue;
		}
		r = cdi_find_node(name, devs[n].node, sizeof(devs[n].node));
		if (r < 0) {
			fprintf(stderr, "mrctl: cdi: device %s: no uverbs node in " CDI_DEV_DIR
				" (%s); left out\n", name, strerror(-r));
			continue;
		}
		devs[n++].name = name;
	}
	if (!is_char_device(rdma_cm)) {
		if (n)
			fprintf(stderr, "mrctl: cdi: no %s (is rdma_ucm loaded?): programs that use "
				"librdmacm will not connect\n", rdma_cm);
		rdma_cm = NULL;
	}

	if (out) {
		r = output_open(out, &f, &tmp);
		if (r < 0) {
			fprintf(stderr, "mrctl: cdi: %s: %s\n", out,
				r == -EEXIST ? "exists and is not a regular file" : strerror(-r));
			goto out;
		}
	}
	cdi_write(f, env_preload, env_socket, folder, shim, devs, n, rdma_cm);
	if (out) {
		r = output_commit(f, tmp, out);
		if (r < 0)
			fprintf(stderr, "mrctl: cdi: %s: %s\n", out, strerror(-r));
	} else {
		r = fflush(stdout) != 0 ? -errno : ferror(stdout) ? -EIO : 0;
		if (r < 0)
			fprintf(stderr, "mrctl: cdi: standard output: %s\n", strerror(-r));
	}
out:
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

static int cmd_stats(struct conn *c)
{
	Mrd__Response *resp;
	int r;

	if (arg_metrics >= 0)
		return cmd_metrics(c);
	r = call_clients(c, "stats", &resp);

	if (r < 0)
		return r;
	print_stats(resp->clients);
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

static void print_mempool(const Mrd__MempoolInfo *p, bool first)
{
	if (arg_json) {
		printf("%s{\"domain\":", first ? "" : ",");
		json_write_string(stdout, p->domain);
		printf(",\"pid\":%" PRId32 ",\"client\":", p->pid);
		json_write_string(stdout, p->client_name);
		printf(",\"name\":");
		json_write_string(stdout, p->name);
		printf(",\"extmem\":%s,\"mrs\":[", json_bool(p->extmem));
		for (size_t k = 0; k < p->n_mrs; k++) {
			const Mrd__MempoolMrInfo *m = p->mrs[k];

			printf("%s{\"start\":%" PRIu64 ",\"end\":%" PRIu64 ",\"lkey\":%" PRIu32
			       ",\"rkey\":%" PRIu32 ",\"sharers\":%" PRIu32 ",\"hugepage\":%s"
			       ",\"pending\":%s}", k ? "," : "", m->start, m->end, m->lkey, m->rkey,
			       m->sharers, json_bool(m->hugepage), json_bool(m->pending));
		}
		printf("]}");
		return;
	}
	/* Names quoted and escaped: a name cannot pass for the rest of the line. */
	printf("%spool \"%s\" of pid %" PRId32 " (\"%s\"), domain %s%s: %zu MR%s\n",
	       first ? "" : "\n", esc(p->name), p->pid, esc(p->client_name), esc(p->domain),
	       p->extmem ? ", extmem" : "", p->n_mrs, p->n_mrs == 1 ? "" : "s");
	printf("  %-18s %-18s %10s %10s %8s\n", "START", "END", "LKEY", "RKEY", "SHARERS");
	for (size_t k = 0; k < p->n_mrs; k++) {
		const Mrd__MempoolMrInfo *m = p->mrs[k];

		printf("  0x%016" PRIx64 " 0x%016" PRIx64 " 0x%08" PRIx32 " 0x%08" PRIx32 " %8" PRIu32
		       "%s%s\n", m->start, m->end, m->lkey, m->rkey, m->sharers,
		       m->hugepage ? "  huge page" : "", m->pending ? "  (registering)" : "");
	}
}

/* shown: how many pools the pages before showed. */
static uint32_t print_mempools_page(const Mrd__Response *resp, void *shown)
{
	const Mrd__MempoolsResponse *page = resp->mempools;
	size_t *n = shown;

	for (size_t i = 0; i < page->n_mempools; i++, (*n)++)
		print_mempool(page->mempools[i], *n == 0);
	/* An mrd without pages answers with next 0; one that moved nothing on is done. */
	return page->n_mempools ? page->next : 0;
}

/* Page by page (each a snapshot: a pool registered or dropped meanwhile may be missed). */
static int cmd_mempools(struct conn *c)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__MempoolsRequest mempools = MRD__MEMPOOLS_REQUEST__INIT;
	size_t shown = 0;
	int r;

	req.body_case = MRD__REQUEST__BODY_MEMPOOLS;
	req.mempools = &mempools;
	if (arg_json)
		printf("{\"mempools\":[");
	r = call_pages(c, "mempools", &req, MRD__RESPONSE__BODY_MEMPOOLS, &mempools.first,
		       print_mempools_page, &shown);
	if (r < 0)
		return r;
	if (arg_json)
		printf("]}\n");
	else if (shown == 0)
		printf("no mempools registered\n");
	return 0;
}

/* Access bits by the names mrctl shows and takes (MRD_ACCESS_* of daemon/provider/provider.h). */
static const char *const access_names[] = { "lw", "rw", "rr", "ra", NULL, "mw" }; /* 4: odp */

static const char *access_string(uint32_t access, char *buf, size_t size)
{
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < ELEMENTSOF(access_names); i++)
		if ((access & (1u << i)) && access_names[i])
			n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%s", n ? "," : "",
					      access_names[i]);
	return n ? buf : "-";
}

/* The key quarantine of a domain (mrd(8), Retirement on free). */
static void print_quarantine(const Mrd__FrmrDomainInfo *d)
{
	if (!d->quarantine_on) {
		printf("  key quarantine: off (released keys do not come back on this device)\n");
		return;
	}
	printf("  key quarantine: %" PRIu64 " released MR%s parked, keys dead; %" PRIu64
	       " released unparked (their keys may come back)\n", d->quarantined,
	       d->quarantined == 1 ? "" : "s", d->unparked);
}

static void print_frmr_pools(const Mrd__FrmrPoolsResponse *r)
{
	char access[32];

	if (arg_json) {
		printf("{\"domains\":[");
		for (size_t i = 0; i < r->n_domains; i++) {
			const Mrd__FrmrDomainInfo *d = r->domains[i];

			printf("%s{\"domain\":", i ? "," : "");
			json_write_string(stdout, d->domain);
			printf(",\"on\":%s,\"off_reason\":", json_bool(!*d->off));
			json_write_string(stdout, d->off);
			printf(",\"queued\":%" PRIu64 ",\"max_queued\":%" PRIu32 ",\"aging_s\":%" PRIu32
			       ",\"pinned\":%" PRIu32 ",\"pools\":[", d->queued, d->max_queued,
			       d->aging_s, d->pinned);
			for (size_t k = 0; k < d->n_pools; k++) {
				const Mrd__FrmrPoolInfo *p = d->pools[k];

				printf("%s{\"access\":%" PRIu32 ",\"odp\":%s,\"internal\":%s"
				       ",\"vendor\":%" PRIu32 ",\"pages\":%" PRIu64 ",\"queued\":%" PRIu64
				       ",\"in_use\":%" PRIu64 ",\"max_in_use\":%" PRIu64
				       ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"aged\":%" PRIu64
				       ",\"aging_s\":%" PRIu32 ",\"pinned\":%" PRIu32 "}",
				       k ? "," : "", p->access, json_bool(p->odp), json_bool(p->internal),
				       p->vendor, p->pages, p->queued, p->in_use, p->max_in_use, p->hits,
				       p->misses, p->aged, p->aging_s, p->pinned);
			}
			printf("],\"quarantine\":{\"on\":%s,\"parked\":%" PRIu64 ",\"unparked\":%"
			       PRIu64 "}}", json_bool(d->quarantine_on), d->quarantined, d->unparked);
		}
		printf("],\"pools_omitted\":%" PRIu32 ",\"domains_omitted\":%" PRIu32 "}\n",
		       r->pools_omitted, r->domains_omitted);
		return;
	}
	if (r->n_domains == 0 && r->domains_omitted == 0) {
		printf("no domain is open\n");
		return;
	}
	for (size_t i = 0; i < r->n_domains; i++) {
		const Mrd__FrmrDomainInfo *d = r->domains[i];

		if (*d->off)
			printf("%sdomain %s: handle pools off: %s\n", i ? "\n" : "", esc(d->domain),
			       esc(d->off));
		else
			printf("%sdomain %s: %zu pool%s, %" PRIu64 " handle%s parked (at most %" PRIu32
			       "); new pools: aging %" PRIu32 " s, pinned %" PRIu32 "\n",
			       i ? "\n" : "", esc(d->domain), d->n_pools, d->n_pools == 1 ? "" : "s",
			       d->queued, d->queued == 1 ? "" : "s", d->max_queued, d->aging_s,
			       d->pinned);
		print_quarantine(d);
		if (*d->off)
			continue;
		if (d->n_pools == 0)
			continue;
		printf("  %-11s %-3s %-3s %6s %8s %7s %7s %7s %9s %9s %7s %6s %6s\n", "ACCESS", "ODP",
		       "INT", "VENDOR", "PAGES", "QUEUED", "IN_USE", "MAX_USE", "HITS", "MISSES",
		       "AGED", "AGING", "PINNED");
		for (size_t k = 0; k < d->n_pools; k++) {
			const Mrd__FrmrPoolInfo *p = d->pools[k];

			printf("  %-11s %-3s %-3s %6" PRIu32 " %8" PRIu64 " %7" PRIu64 " %7" PRIu64
			       " %7" PRIu64 " %9" PRIu64 " %9" PRIu64 " %7" PRIu64 " %5" PRIu32 "s %6"
			       PRIu32 "\n", access_string(p->access, access, sizeof(access)),
			       yes_no(p->odp), yes_no(p->internal), p->vendor, p->pages, p->queued,
			       p->in_use, p->max_in_use, p->hits, p->misses, p->aged, p->aging_s,
			       p->pinned);
		}
	}
	if (r->pools_omitted)
		printf("... %" PRIu32 " more pools%s not shown (one reply holds what fits)\n",
		       r->pools_omitted, r->domains_omitted ? " and domains" : "");
}

static int cmd_pools(struct conn *c)
{
	Mrd__Response *resp;
	int r = call_pools(c, "pools", &resp);

	if (r < 0)
		return r;
	print_frmr_pools(resp->frmr_pools);
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

/* mrctl pools set: what the options asked for (arg_set.given says which). */
static Mrd__FrmrPoolsSetRequest arg_set = MRD__FRMR_POOLS_SET_REQUEST__INIT;

static int cmd_pools_set(struct conn *c)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__Response *resp;
	int r;

	req.body_case = MRD__REQUEST__BODY_FRMR_POOLS_SET;
	req.frmr_pools_set = &arg_set;
	r = call(c, "pools set", &req, MRD__RESPONSE__BODY_FRMR_POOLS_SET, &resp);
	if (r < 0)
		return r;
	if (arg_json)
		printf("{\"changed\":%" PRIu32 "}\n", resp->frmr_pools_set->changed);
	else
		printf("%" PRIu32 " pool%s changed\n", resp->frmr_pools_set->changed,
		       resp->frmr_pools_set->changed == 1 ? "" : "s");
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

/* Which command an option belongs to. */
enum {
	OPT_POOLS_SET = 1u << 0,
	OPT_FLUSH = 1u << 1,
	OPT_DOMAIN = 1u << 2, /* flush and pools set */
	OPT_STATS = 1u << 3,
	OPT_CDI = 1u << 4,
	OPT_OUTPUT = 1u << 5, /* stats and cdi */
};

/* mrctl flush: what the options asked for. */
static Mrd__FlushRequest arg_flush = MRD__FLUSH_REQUEST__INIT;

static int cmd_flush(struct conn *c)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__Response *resp;
	const Mrd__FlushResponse *f;
	int r;

	req.body_case = MRD__REQUEST__BODY_FLUSH;
	req.flush = &arg_flush;
	r = call(c, "flush", &req, MRD__RESPONSE__BODY_FLUSH, &resp);
	if (r < 0)
		return r;
	f = resp->flush;
	if (arg_json)
		printf("{\"domains\":%" PRIu32 ",\"handles\":%" PRIu64 ",\"pools_removed\":%" PRIu32
		       "}\n", f->domains, f->handles, f->pools_removed);
	else
		printf("%" PRIu32 " domain%s flushed: tables rebuilt, generation bumped; %" PRIu64
		       " parked handle%s destroyed, %" PRIu32 " pool%s removed\n", f->domains,
		       f->domains == 1 ? "" : "s", f->handles, f->handles == 1 ? "" : "s",
		       f->pools_removed, f->pools_removed == 1 ? "" : "s");
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

/* Decimal digits only: no sign, no spaces, no octal or hex. */
static int parse_u64(const char *s, uint64_t max, uint64_t *ret)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return -ERANGE;
	*ret = v;
	return 0;
}

static int parse_access(const char *s, uint32_t *ret)
{
	uint64_t v;
	char buf[64], *save = NULL;

	if (strncmp(s, "0x", 2) == 0 && s[2]) { /* the bits, in hex */
		char *end;

		errno = 0;
		v = strtoull(s + 2, &end, 16);
		if (errno || *end || v > 0xf)
			return -EINVAL;
		*ret = (uint32_t)v;
		return 0;
	}
	if (parse_u64(s, 0xf, &v) == 0) {
		*ret = (uint32_t)v;
		return 0;
	}
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	snprintf(buf, sizeof(buf), "%s", s);
	*ret = 0;
	if (!*s || s[0] == ',' || s[strlen(s) - 1] == ',' || strstr(s, ",,"))
		return -EINVAL; /* an empty name */
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		size_t i;

		for (i = 0; i < ELEMENTSOF(access_names); i++)
			if (access_names[i] && strcmp(t, access_names[i]) == 0)
				break;
		if (i == ELEMENTSOF(access_names))
			return -EINVAL;
		*ret |= 1u << i;
	}
	return 0;
}

static int parse_yes_no(const char *s, protobuf_c_boolean *ret)
{
	if (strcmp(s, "yes") == 0)
		*ret = true;
	else if (strcmp(s, "no") == 0)
		*ret = false;
	else
		return -EINVAL;
	return 0;
}

/* One `pools set` option into arg_set; a message and -EINVAL when its value is bad. */
static int parse_set_option(int opt, const char *value)
{
	uint64_t v = 0;
	int r;

	switch (opt) {
	case 'A':
		r = parse_u64(value, UINT32_MAX, &v);
		arg_set.aging_s = (uint32_t)v;
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_AGING;
		if (r == 0 && v == 0)
			r = -ERANGE;
		break;
	case 'P':
		r = parse_u64(value, UINT32_MAX, &v);
		arg_set.pinned = (uint32_t)v;
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PINNED;
		break;
	case 'a':
		r = parse_access(value, &arg_set.access);
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_ACCESS;
		break;
	case 'n':
		r = parse_u64(value, UINT64_MAX, &v);
		arg_set.pages = v;
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PAGES;
		if (r == 0 && v == 0)
			r = -ERANGE;
		break;
	case 'o':
		r = parse_yes_no(value, &arg_set.odp);
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_ODP;
		break;
	case 'i':
		r = parse_yes_no(value, &arg_set.internal);
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_INTERNAL;
		break;
	case 'v':
		r = parse_u64(value, UINT32_MAX, &v);
		arg_set.vendor = (uint32_t)v;
		arg_set.given |= MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_VENDOR;
		break;
	default:
		return -EINVAL;
	}
	if (r < 0)
		fprintf(stderr, "mrctl: bad value '%s' for an option of 'pools set'\n", value);
	return r;
}

static const char *const mr_kinds[] = { "cache", "odp", "mempool", "client-pd" };

struct dump_state {
	bool first_domain;  /* the first domain shown */
	bool header_shown;  /* the first page's: the domain's header and arenas */
	uint32_t n_printed; /* MRs the pages before showed */
};

static uint32_t print_dump_page(const Mrd__Response *resp, void *userdata)
{
	const Mrd__DomainDumpResponse *d = resp->domain_dump;
	struct dump_state *st = userdata;

	if (!st->header_shown) {
		st->header_shown = true;
		if (arg_json) {
			printf("%s{\"domain\":", st->first_domain ? "" : ",");
			json_write_string(stdout, d->domain);
			printf(",\"table\":{\"entries\":%" PRIu32 ",\"capacity\":%" PRIu32
			       ",\"overflow\":%s},\"arenas\":[", d->table_entries,
			       d->table_capacity, json_bool(d->table_overflow));
		} else {
			/* The domain's PD's MRs, what clients' MRS column counts; client PDs'
			 * apart, as its OWN-PD MRS. */
			uint32_t mrs = d->domain_pd_mrs <= d->mrs_total ? d->domain_pd_mrs
								       : d->mrs_total;
			uint32_t own = d->mrs_total - mrs;
			printf("%sdomain %s: %zu arena%s, table %" PRIu32 " of %" PRIu32
			       " entries%s, %" PRIu32 " MR%s", st->first_domain ? "" : "\n",
			       esc(d->domain), d->n_arenas, d->n_arenas == 1 ? "" : "s",
			       d->table_entries, d->table_capacity,
			       d->table_overflow ? " (overflowed)" : "", mrs, mrs == 1 ? "" : "s");
			if (own)
				printf(" and %" PRIu32 " in clients' own PDs", own);
			printf("\n");
		}
		for (size_t i = 0; i < d->n_arenas; i++) {
			const Mrd__DumpArena *a = d->arenas[i];

			if (arg_json)
				printf("%s{\"address\":%" PRIu64 ",\"size\":%" PRIu64
				       ",\"page_size\":%" PRIu32 ",\"hugetlb\":%s,\"external\":%s"
				       ",\"allocations\":%" PRIu32 "}", i ? "," : "", a->address,
				       a->size, a->page_size, json_bool(a->hugetlb),
				       json_bool(a->external), a->allocations);
			else
				printf("  arena 0x%016" PRIx64 " %12s, %7s pages%s%s, %" PRIu32
				       " allocation%s\n", a->address, size_words(a->size),
				       size_text(a->page_size), a->hugetlb ? ", huge" : "",
				       a->external ? ", external" : "", a->allocations,
				       a->allocations == 1 ? "" : "s");
		}
		if (arg_json)
			printf("],\"mrs\":[");
		else if (d->mrs_total)
			printf("  %-18s %-18s %10s %10s %-7s %8s %8s %7s\n", "START", "END",
			       "LKEY", "RKEY", "KIND", "PAGES", "PID", "SHARERS");
	}
	for (size_t i = 0; i < d->n_mrs; i++, st->n_printed++) {
		const Mrd__DumpMr *m = d->mrs[i];
		const char *kind = m->kind < ELEMENTSOF(mr_kinds) ? mr_kinds[m->kind] : "?";

		if (arg_json)
			printf("%s{\"start\":%" PRIu64 ",\"end\":%" PRIu64 ",\"lkey\":%" PRIu32
			       ",\"rkey\":%" PRIu32 ",\"kind\":\"%s\",\"pages\":%" PRIu64
			       ",\"owner_pid\":%" PRId32 ",\"sharers\":%" PRIu32 "}",
			       st->n_printed ? "," : "", m->start, m->end, m->lkey, m->rkey, kind,
			       m->pages, m->owner_pid, m->sharers);
		else
			printf("  0x%016" PRIx64 " 0x%016" PRIx64 " 0x%08" PRIx32 " 0x%08" PRIx32
			       " %-7s %8" PRIu64 " %8" PRId32 " %7" PRIu32 "\n", m->start, m->end,
			       m->lkey, m->rkey, kind, m->pages, m->owner_pid, m->sharers);
	}
	return d->next_mr;
}

/* One domain's arenas, table and MRs, page by page. */
static int print_domain_detail(struct conn *c, const char *domain, bool first)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__DomainDumpRequest q = MRD__DOMAIN_DUMP_REQUEST__INIT;
	struct dump_state st = { .first_domain = first };
	int r;

	req.body_case = MRD__REQUEST__BODY_DOMAIN_DUMP;
	req.domain_dump = &q;
	q.domain = (char *)domain;
	r = call_pages(c, "dump", &req, MRD__RESPONSE__BODY_DOMAIN_DUMP, &q.first_mr,
		       print_dump_page, &st);
	if (r < 0)
		return r;
	if (arg_json)
		printf("]}");
	return 0;
}

/* Every domain the caller may see, in detail. */
static int cmd_domains(struct conn *c)
{
	Mrd__Response *resp;
	int r = call_clients(c, "dump", &resp);

	if (r < 0)
		return r;
	if (arg_json)
		printf("[");
	else if (resp->clients->n_domains == 0)
		printf("no domain is open\n");
	for (size_t i = 0; i < resp->clients->n_domains && r >= 0; i++)
		r = print_domain_detail(c, resp->clients->domains[i]->name, i == 0);
	if (arg_json && r >= 0)
		printf("]\n");
	else if (r >= 0)
		print_domains_omitted(resp->clients->domains_omitted);
	mrd__response__free_unpacked(resp, NULL);
	return r;
}

/* Everything mrctl can show, in one go: one JSON object, or the sections one after another. */
static int cmd_dump(struct conn *c)
{
	static int (*const parts[])(struct conn *c) = { cmd_status, cmd_clients, cmd_stats,
							 cmd_pools, cmd_mempools, cmd_domains };
	static const char *const names[] = { "status", "clients", "stats", "pools", "mempools",
					     "domains" };

	for (size_t i = 0; i < ELEMENTSOF(parts); i++) {
		int r;

		if (arg_json)
			printf("%s\"%s\":", i ? "," : "{", names[i]);
		else
			printf("%s== %s ==\n", i ? "\n" : "", names[i]);
		fflush(stdout);
		r = parts[i](c);
		if (r < 0)
			return r;
	}
	if (arg_json)
		printf("}\n");
	return 0;
}

static int cmd_reload(struct conn *c)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ReloadRequest q = MRD__RELOAD_REQUEST__INIT;
	Mrd__Response *resp;
	const char *keys;
	int r;

	req.body_case = MRD__REQUEST__BODY_RELOAD;
	req.reload = &q;
	r = call(c, "reload", &req, MRD__RESPONSE__BODY_RELOAD, &resp);
	if (r < 0)
		return r;
	keys = resp->reload->restart_keys;
	if (arg_json) {
		printf("{\"reloaded\":true,\"restart_keys\":");
		json_write_string(stdout, keys);
		printf("}\n");
	} else if (*keys)
		printf("configuration reloaded; these keys change only at a restart: %s\n", esc(keys));
	else
		printf("configuration reloaded\n");
	mrd__response__free_unpacked(resp, NULL);
	return 0;
}

/* How long shutdown waits for mrd to close its connection: a worker finishing a
 * registration of GiBs, closers giving up on stuck descriptors. */
#define SHUTDOWN_WAIT_MS 60000

static int cmd_shutdown(struct conn *c)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	Mrd__ShutdownRequest q = MRD__SHUTDOWN_REQUEST__INIT;
	Mrd__Response *resp;
	uint32_t pid;
	bool gone = false;
	char buf[64];
	int r;

	req.body_case = MRD__REQUEST__BODY_SHUTDOWN;
	req.shutdown = &q;
	r = call(c, "shutdown", &req, MRD__RESPONSE__BODY_SHUTDOWN, &resp);
	if (r < 0)
		return r;
	pid = resp->shutdown->pid;
	mrd__response__free_unpacked(resp, NULL);
	/* mrd closes every connection as it exits: the end of ours says it has gone. */
	for (int waited = 0; waited < SHUTDOWN_WAIT_MS && !gone; waited += 1000) {
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		int k = poll(&p, 1, 1000);

		if (k > 0)
			gone = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0;
		else if (k < 0 && errno != EINTR)
			break;
	}
	if (arg_json)
		printf("{\"pid\":%" PRIu32 ",\"stopped\":%s}\n", pid, json_bool(gone));
	else if (gone)
		printf("mrd (pid %" PRIu32 ") stopped\n", pid);
	else
		printf("mrd (pid %" PRIu32 ") is stopping; it has not closed its connections after "
		       "%d s\n", pid, SHUTDOWN_WAIT_MS / 1000);
	return gone ? 0 : -ETIMEDOUT;
}

static const struct {
	const char *name;
	int (*run)(struct conn *c);
} commands[] = {
	{ "status", cmd_status },
	{ "clients", cmd_clients },
	{ "stats", cmd_stats },
	{ "pools", cmd_pools },
	{ "pools set", cmd_pools_set },
	{ "mempools", cmd_mempools },
	{ "flush", cmd_flush },
	{ "dump", cmd_dump },
	{ "cdi", cmd_cdi },
	{ "reload", cmd_reload },
	{ "shutdown", cmd_shutdown },
};

/* --json=pretty: the one-line JSON mrctl wrote, indented by two spaces a level. */
static void json_pretty(const char *s, size_t len, FILE *f)
{
	unsigned depth = 0;
	bool in_string = false;

	for (size_t i = 0; i < len; i++) {
		char ch = s[i];

		if (in_string) {
			fputc(ch, f);
			if (ch == '\\' && i + 1 < len)
				fputc(s[++i], f);
			else if (ch == '"')
				in_string = false;
			continue;
		}
		switch (ch) {
		case '"':
			in_string = true;
			fputc(ch, f);
			break;
		case '{': case '[':
			fputc(ch, f);
			if (i + 1 < len && (s[i + 1] == '}' || s[i + 1] == ']')) {
				fputc(s[++i], f); /* {} and [] stay whole */
				break;
			}
			fprintf(f, "\n%*s", 2 * ++depth, "");
			break;
		case '}': case ']':
			depth -= depth > 0;
			fprintf(f, "\n%*s%c", 2 * depth, "", ch);
			break;
		case ',':
			fprintf(f, ",\n%*s", 2 * depth, "");
			break;
		case ':':
			fputs(": ", f);
			break;
		default:
			fputc(ch, f);
		}
	}
}

/* Runs a command, with --json=pretty through a buffer that is indented at the end (glibc's
 * stdout is a variable a program may set: the printing code stays as it is). */
static int run_command(int (*run)(struct conn *c), struct conn *c)
{
	FILE *real = stdout, *mem;
	char *buf = NULL;
	size_t len = 0;
	int r;

	if (!arg_pretty)
		return run(c);
	mem = open_memstream(&buf, &len);
	if (!mem) {
		fprintf(stderr, "mrctl: out of memory\n");
		return -ENOMEM;
	}
	stdout = mem;
	r = run(c);
	fclose(mem);
	stdout = real;
	json_pretty(buf, len, stdout);
	free(buf);
	return r;
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "json", optional_argument, NULL, 'j' },
		{ "human", no_argument, NULL, 'h' },
		{ "wide", no_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'H' },
		{ "version", no_argument, NULL, 'V' },
		{ "aging", required_argument, NULL, 'A' },
		{ "pinned", required_argument, NULL, 'P' },
		{ "domain", required_argument, NULL, 'D' },
		{ "access", required_argument, NULL, 'a' },
		{ "pages", required_argument, NULL, 'n' },
		{ "odp", required_argument, NULL, 'o' },
		{ "internal", required_argument, NULL, 'i' },
		{ "vendor", required_argument, NULL, 'v' },
		{ "uid", required_argument, NULL, 'U' },
		{ "pools", no_argument, NULL, 'p' },
		{ "gc", no_argument, NULL, 'g' },
		{ "openmetrics", no_argument, NULL, 'M' },
		{ "prometheus", no_argument, NULL, 'R' },
		{ "output", required_argument, NULL, 'W' },
		{ "preload", required_argument, NULL, 'L' },
		{}
	};
	char command[32];
	unsigned given = 0; /* COMMAND_OPTION bits */
	_cleanup_(conn_freep) struct conn *c = NULL;
	char error[256];
	int opt, r;

	while ((opt = getopt_long(argc, argv, "s:jhwV", options, NULL)) >= 0) {
		switch (opt) {
		case 's':
			arg_socket = optarg;
			break;
		case 'j':
			arg_json = true;
			if (optarg && strcmp(optarg, "pretty") == 0)
				arg_pretty = true;
			else if (optarg) {
				fprintf(stderr, "mrctl: --json takes no value or 'pretty'\n");
				return 2;
			}
			break;
		case 'h':
			arg_human = true;
			break;
		case 'w':
			arg_wide = true;
			break;
		case 'H':
			help();
			return EXIT_SUCCESS;
		case 'V':
			printf("mrctl %s\n", PACKAGE_VERSION);
			return EXIT_SUCCESS;
		case 'A': case 'P': case 'a': case 'n': case 'o': case 'i': case 'v':
			if (parse_set_option(opt, optarg) < 0)
				return 2;
			given |= OPT_POOLS_SET;
			break;
		case 'D':
			if (!*optarg) {
				fprintf(stderr, "mrctl: --domain needs a name\n");
				return 2;
			}
			arg_set.domain = arg_flush.domain = optarg;
			given |= OPT_DOMAIN;
			break;
		case 'U': {
			uint64_t v;

			if (parse_u64(optarg, UINT32_MAX - 1, &v) < 0) {
				fprintf(stderr, "mrctl: bad value '%s' for --uid\n", optarg);
				return 2;
			}
			arg_flush.by_uid = true;
			arg_flush.uid = (uint32_t)v;
			given |= OPT_FLUSH;
			break;
		}
		case 'p':
			arg_flush.pools = true;
			given |= OPT_FLUSH;
			break;
		case 'g':
			arg_flush.gc = true;
			given |= OPT_FLUSH;
			break;
		case 'M': case 'R': {
			int format = opt == 'M' ? METRICS_OPENMETRICS : METRICS_PROMETHEUS;

			if (arg_metrics >= 0 && arg_metrics != format) {
				fprintf(stderr, "mrctl: give --openmetrics or --prometheus, not both\n");
				return 2;
			}
			arg_metrics = format;
			given |= OPT_STATS;
			break;
		}
		case 'W':
			if (!*optarg) {
				fprintf(stderr, "mrctl: --output needs a file name\n");
				return 2;
			}
			arg_output = optarg;
			given |= OPT_OUTPUT;
			break;
		case 'L':
			if (!*optarg) {
				fprintf(stderr, "mrctl: --preload needs a file name\n");
				return 2;
			}
			arg_preload = optarg;
			given |= OPT_CDI;
			break;
		default:
			fprintf(stderr, "Try 'mrctl --help'.\n");
			return 2;
		}
	}
	/* -h alone: what it meant before it meant --human. */
	if (optind >= argc && arg_human && argc == 2) {
		help();
		return EXIT_SUCCESS;
	}
	/* One word, or two for "pools set". */
	if (optind >= argc || argc - optind > 2 ||
	    (argc - optind == 2 && strcmp(argv[optind + 1], "set") != 0)) {
		fprintf(stderr, "mrctl: expected one command; try 'mrctl --help'\n");
		return 2;
	}
	snprintf(command, sizeof(command), "%s%s%s", argv[optind], argc - optind == 2 ? " " : "",
		 argc - optind == 2 ? argv[optind + 1] : "");
	if ((given & OPT_POOLS_SET) && strcmp(command, "pools set") != 0) {
		fprintf(stderr, "mrctl: --aging, --pinned and the key options belong to 'pools set'\n");
		return 2;
	}
	if ((given & OPT_FLUSH) && strcmp(command, "flush") != 0) {
		fprintf(stderr, "mrctl: --pools, --gc and --uid belong to 'flush'\n");
		return 2;
	}
	if ((given & OPT_STATS) && strcmp(command, "stats") != 0) {
		fprintf(stderr, "mrctl: --openmetrics and --prometheus belong to 'stats'\n");
		return 2;
	}
	if ((given & OPT_CDI) && strcmp(command, "cdi") != 0) {
		fprintf(stderr, "mrctl: --preload belongs to 'cdi'\n");
		return 2;
	}
	if ((given & OPT_OUTPUT) && strcmp(command, "stats") != 0 && strcmp(command, "cdi") != 0) {
		fprintf(stderr, "mrctl: --output belongs to 'stats' and 'cdi'\n");
		return 2;
	}
	if (arg_json && strcmp(command, "cdi") == 0) {
		fprintf(stderr, "mrctl: cdi: the spec is YAML; --json does not apply\n");
		return 2;
	}
	if (arg_output && strcmp(command, "stats") == 0 && arg_metrics < 0) {
		fprintf(stderr, "mrctl: stats: --output writes --openmetrics or --prometheus\n");
		return 2;
	}
	if (arg_json && arg_metrics >= 0) {
		fprintf(stderr, "mrctl: stats: give --json or a metrics format, not both\n");
		return 2;
	}
	if ((given & OPT_DOMAIN) && strcmp(command, "flush") != 0 &&
	    strcmp(command, "pools set") != 0) {
		fprintf(stderr, "mrctl: --domain belongs to 'flush' and 'pools set'\n");
		return 2;
	}
	if (strcmp(command, "pools set") == 0 &&
	    !(arg_set.given & (MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_AGING |
			       MRD__FRMR_POOLS_SET_FIELD__FRMR_SET_PINNED))) {
		fprintf(stderr, "mrctl: pools set: give --aging SEC and/or --pinned N\n");
		return 2;
	}
	if (arg_flush.by_uid && (given & OPT_DOMAIN)) {
		fprintf(stderr, "mrctl: flush: give --domain or --uid, not both\n");
		return 2;
	}

	for (size_t i = 0; i < ELEMENTSOF(commands); i++) {
		if (strcmp(command, commands[i].name) != 0)
			continue;
		r = conn_open(arg_socket, "mrctl", MRD_CAPS_SERVED, &c, error, sizeof(error));
		if (r < 0) {
			fprintf(stderr, "mrctl: %s\n", error);
			return EXIT_FAILURE;
		}
		return run_command(commands[i].run, c) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
	}
	fprintf(stderr, "mrctl: unknown command '%s'; try 'mrctl --help'\n", command);
	return 2;
}
