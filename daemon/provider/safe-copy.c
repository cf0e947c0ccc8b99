/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "macro.h"
#include "provider/safe-copy.h"

/* The calling thread's copy in progress. Thread-local, initial-exec: the handler reads it
 * without taking anything. */
struct guard {
	sigjmp_buf jmp;
	uintptr_t lo[2], hi[2]; /* the pages of both ranges */
	uintptr_t fault;
	volatile sig_atomic_t armed;
};
static __thread struct guard guard __attribute__((tls_model("initial-exec")));

static struct sigaction previous;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int installed; /* 1, or the -errno of sigaction */

static bool inside(const struct guard *g, uintptr_t a)
{
	return (a >= g->lo[0] && a < g->hi[0]) || (a >= g->lo[1] && a < g->hi[1]);
}

static void on_sigbus(int sig, siginfo_t *si, void *ucontext)
{
	struct guard *g = &guard;

	(void)ucontext;
	/* A fault (si_code > 0, not a kill) on the pages this thread is copying. */
	if (g->armed && si->si_code > 0 && inside(g, (uintptr_t)si->si_addr)) {
		g->fault = (uintptr_t)si->si_addr;
		g->armed = 0;
		siglongjmp(g->jmp, 1);
	}
	/* Not ours: the action before us takes it (by default, mrd dies with a core). A fault
	 * comes back when the instruction runs again; a sent signal is sent again. */
	sigaction(SIGBUS, &previous, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

static void install(void)
{
	/* NODEFER: leaving through siglongjmp, with no signal mask saved or restored, must not
	 * leave SIGBUS blocked in the thread. */
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER };

	sigemptyset(&sa.sa_mask);
	installed = sigaction(SIGBUS, &sa, &previous) < 0 ? negative_errno() : 1;
}

int safe_memmove(void *dst, const void *src, size_t n, uintptr_t *ret_fault)
{
	struct guard *g = &guard;
	uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);

	pthread_once(&once, install);
	if (installed < 0)
		return installed;
	if (n == 0)
		return 0;
	g->lo[0] = (uintptr_t)dst & ~(ps - 1);
	g->hi[0] = ((uintptr_t)dst + n + ps - 1) & ~(ps - 1);
	g->lo[1] = (uintptr_t)src & ~(ps - 1);
	g->hi[1] = ((uintptr_t)src + n + ps - 1) & ~(ps - 1);
	if (sigsetjmp(g->jmp, 0)) {
		if (ret_fault)
			*ret_fault = g->fault;
		return -EFAULT;
	}
	g->armed = 1;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	memmove(dst, src, n);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	g->armed = 0;
	return 0;
}
