/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "call.h"
#include "log.h"
#include "mrd/mrd.h"

static __thread char last_error[256];

int set_last_error(int error, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	log_error("%s", last_error); /* every failure a call returns, when MRD_LOG_LEVEL asks */
	return error;
}

int set_call_error(int error)
{
	if (error == -ECONNRESET)
		return set_last_error(error, "mrd closed the connection (it exited, restarted, was "
					     "killed, or dropped this handle: see its log): the memory "
					     "it maps stays mapped, with its content, until "
					     "mrd_client_close(); after a warm restart of mrd, "
					     "mrd_client_reconnect() takes it back");
	return set_last_error(error, "no answer from mrd: %s", strerror(-error));
}

MRD_EXPORT const char *mrd_last_error(void)
{
	return last_error;
}

int client_forked_error(const mrd_client *client)
{
	return set_last_error(-ECHILD, "this handle was opened by process %d, which has since "
			      "fork()ed: in the child it cannot be used (its connection and memory "
			      "are the parent's); mrd_client_close() it there (only the child's copy "
			      "goes) and connect anew with mrd_client_connect()", (int)client->pid);
}

int client_usable(const mrd_client *client)
{
	if (client->forked)
		return client_forked_error(client);
	if (__atomic_load_n(&client->gone, __ATOMIC_ACQUIRE))
		return set_call_error(-ECONNRESET);
	return 0;
}

int client_lock(mrd_client *client)
{
	if (client->forked)
		return client_forked_error(client);
	pthread_rwlock_rdlock(&client->lock);
	if (__atomic_load_n(&client->gone, __ATOMIC_ACQUIRE)) {
		pthread_rwlock_unlock(&client->lock);
		return set_call_error(-ECONNRESET);
	}
	return 0;
}

void client_unlock(mrd_client *client)
{
	bool alive = false;

	/* Under the lock, so that a reconnect's new page never goes under the poison; the first
	 * of the calls that found mrd gone poisons it, once. */
	if (__atomic_load_n(&client->conn->broken, __ATOMIC_ACQUIRE) &&
	    __atomic_compare_exchange_n(&client->gone, &alive, true, false, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE))
		client_poison_status(client);
	pthread_rwlock_unlock(&client->lock);
}

void client_poison_status(mrd_client *client)
{
	size_t size = client->status_size;
	struct mrd_status_page *copy;
	int r;

	copy = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (copy == MAP_FAILED) {
		r = -errno;
		goto fail;
	}
	memcpy(copy, client->status, sizeof(*copy));
	/* mrd counts up from 1: no lookup can have cached this one, nor (one less per reconnect)
	 * one that a cache adopted from an earlier poisoning and filled after the reconnect. */
	copy->generation = UINT64_MAX - client->epoch;
	/* One mremap: a reader sees the old page or the filled copy, never an empty one. */
	if (mprotect(copy, size, PROT_READ) < 0 ||
	    mremap(copy, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)client->status) ==
		    MAP_FAILED) {
		r = -errno;
		munmap(copy, size);
		goto fail;
	}
	return;
fail:
	/* Out of memory: calls still fail, but keys already cached can still hit. */
	log_error_errno(r, "cannot poison the status page: %m");
}

int conn_request(struct conn *conn, Mrd__Request *req, Mrd__Response **ret,
		 struct conn_fds *ret_fds)
{
	return conn_request_with_fds(conn, req, NULL, 0, ret, ret_fds);
}

int conn_request_with_fds(struct conn *conn, Mrd__Request *req, const int *send_fds,
			  size_t n_send_fds, Mrd__Response **ret, struct conn_fds *ret_fds)
{
	Mrd__Response *resp = NULL;
	struct conn_fds fds;
	int r;

	r = conn_call_with_fds(conn, req, send_fds, n_send_fds, &resp, &fds);
	if (r < 0)
		return set_call_error(r);
	r = response_error(resp);
	if (r < 0 || !ret_fds)
		for (size_t i = 0; i < fds.n; i++)
			safe_close(fds.fds[i]);
	if (r < 0) {
		set_last_error(r, "%s", resp->message && *resp->message ? resp->message :
									strerror(-r));
		mrd__response__free_unpacked(resp, NULL);
		return r;
	}
	if (ret_fds)
		*ret_fds = fds;
	*ret = resp;
	return 0;
}

int client_call(mrd_client *client, Mrd__Request *req, Mrd__Response **ret,
		struct conn_fds *ret_fds)
{
	int r;

	r = client_lock(client);
	if (r < 0)
		return r;
	r = conn_request(client->conn, req, ret, ret_fds); /* other threads' calls go on */
	client_unlock(client);
	return r;
}

uint64_t client_device_epoch(const mrd_client *client)
{
	const struct mrd_status_page *page = client->status;

	return page->layout_version >= 3 ? __atomic_load_n(&page->pd_epoch, __ATOMIC_ACQUIRE) : 0;
}

int client_pd_stale(mrd_client *client)
{
	if (!__atomic_load_n(&client->pd_imported, __ATOMIC_ACQUIRE))
		return 0;
	/* The new mrd's keys belong to its own PD, not to the one imported from the old mrd,
	 * whose context lives on while its descriptor is open. */
	if (__atomic_load_n(&client->pd_epoch, __ATOMIC_ACQUIRE) !=
	    __atomic_load_n(&client->epoch, __ATOMIC_ACQUIRE))
		return set_last_error(-ESTALE, "mrd restarted since this handle imported its PD "
				      "(mrd_client_get_pd): the imported context is the old mrd's, "
				      "and the new mrd's keys are for another PD; call "
				      "mrd_client_get_pd() (or mrd_verbs_import_pd()) again, move to "
				      "that PD and close the old context's descriptor");
	/* mrd reopened the device: its MRs are on a new context and PD; the imported context
	 * is the failed one's. */
	if (__atomic_load_n(&client->pd_device_epoch, __ATOMIC_ACQUIRE) != client_device_epoch(client))
		return set_last_error(-ESTALE, "the device failed and came back since this handle "
				      "imported its PD (mrd_client_get_pd): mrd's keys are for its new "
				      "PD, the imported context is the failed one; call "
				      "mrd_client_get_pd() (or mrd_verbs_import_pd()) again, move to "
				      "that PD and close the old context's descriptor");
	return 0;
}
