/* SPDX-License-Identifier: MIT */
/* What every file of libmrd shares: the client handle, and the mark of an exported function. */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "connection.h"
#include "moved-range.h"
#include "status-page.h"

#define MRD_EXPORT __attribute__((visibility("default")))

struct mrd_client;
/* libmrd's once-per-process start (its fork handlers among it), else done at the first
 * connect. libmrd-preload.so calls it before registering its own fork handlers: prepare
 * handlers run last-registered first, so fork() then takes the shim's lock before libmrd's,
 * the order a registration takes them in. */
void libmrd_init_once(void);

struct mrd_client {
	struct conn *conn;
	/* Calls hold it shared (many in flight at once: conn sorts out their replies); a
	 * reconnect holds it alone while it settles lost Frees and swaps the connection. */
	pthread_rwlock_t lock;
	int fd;		      /* conn's descriptor, one number for the handle's life (a reconnect
			       * moves the new connection onto it): what mrd_client_fd() gives */
	bool gone;   /* conn is dead (atomic): calls fail at once, the status page is poisoned */
	bool forked; /* this process is a fork() child of the one that opened the handle */
	pid_t pid;   /* the one that opened it */
	struct mrd_client *prev, *next; /* the process's open handles, which fork() marks */
	char domain[64];
	const struct mrd_status_page *status; /* the domain's, read-only */
	uint32_t status_size;
	bool holds_window;
	uint64_t session; /* mrd's id for this connection: what a reconnect resumes */
	unsigned epoch;   /* reconnects so far: what was registered before one is gone */
	/* mrd_client_get_pd() succeeded at epoch pd_epoch (atomic, both): after a reconnect,
	 * keys are the new mrd's, for a PD the caller has not imported (client_pd_stale). */
	bool pd_imported;
	unsigned pd_epoch;
	uint64_t pd_device_epoch; /* the status page's pd_epoch before that ExportPd (atomic) */
	/* mrd_client_bind_pd(): a copy of the program's command fd (-1: not bound) and the PD,
	 * bound again on a reconnect's new connection before any lookup can use it. */
	int bound_fd;
	uint32_t bound_pd;
	unsigned long n_held; /* allocations and attachments mrd holds for it: a reconnect must
			       * get them all back */
	pthread_mutex_t reconnect_lock; /* one mrd_client_reconnect() at a time */
	/* Free and ExtmemDetach that got no answer (mrd went away): done or not, the next mrd
	 * tells (memory_settle_lost_frees). */
	pthread_mutex_t lost_lock; /* guards lost_frees */
	struct lost_free {
		uint64_t address;
		int body_case;
	} lost_frees[64];
	size_t n_lost_frees;
	bool lost_frees_dropped; /* more than lost_frees holds */
	uint32_t *arenas; /* ids of arenas this handle mapped */
	size_t n_arenas, arenas_cap;
	/* mrd_mem_adopt(): the program's buffers moved onto mrd's memory (adopt.c) */
	pthread_mutex_t adopt_lock;
	struct moved_ranges adopted;
	/* Adopted buffers given back so far (atomic): their keys in a cache are at the program's
	 * addresses, which mrd's ring of freed ranges does not name, so a cache that sees it
	 * move forgets everything (lookup.c catch_up). */
	unsigned long adopt_gone;
	/* Windows bound on the program's own QPs (own-windows.c), made at the first grant
	 * (atomic pointer). */
	struct own_windows *own_windows;
	/* mrd_window_track(): the windows mrd deallocates when the connection ends, told again
	 * after a reconnect (window-track.c). */
	pthread_mutex_t track_lock;
	uint32_t *tracked;
	size_t n_tracked;
};

/* adopt.c: a lookup's address in an adopted buffer becomes its address in mrd's memory, what
 * mrd knows (*ret_delta added; 0 elsewhere). */
uintptr_t adopt_window_delta(struct mrd_client *client, uintptr_t addr);
/* At close: every adopted buffer back onto private memory. */
void adopt_leave(struct mrd_client *client);
/* Around fork(): the locks, and in the child the adopted pages copied to its own memory. */
void adopt_fork_lock(struct mrd_client *client, bool lock);
void adopt_fork_child(struct mrd_client *client);
