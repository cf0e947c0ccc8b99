/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <linux/capability.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "base/config.h"
#include "base/pid-file.h"
#include "base/privileges.h"
#include "control/client.h"
#include "control/detach.h"
#include "control/manager.h"

#define DEFAULT_CONFIG_FILE SYSCONFDIR "/mrd/mrd.conf"

static void help(void)
{
	printf("Usage: mrd [OPTION]...\n"
	       "Memory-registration daemon for RDMA.\n\n"
	       "  -c, --config FILE       read FILE instead of " DEFAULT_CONFIG_FILE "\n"
	       "  -s, --socket PATH       listen on PATH (default " MRD_SOCKET_DEFAULT "; made\n"
	       "                          0660, group mrd: [mrd] socket_mode, socket_group)\n"
	       "  -p, --provider NAME     auto, soft or verbs (default auto)\n"
	       "  -d, --device NAME       RDMA device for the verbs provider\n"
	       "  -l, --log-level LEVEL   err, warning, notice, info or debug\n"
	       "  -f, --foreground        stay attached to the terminal\n"
	       "      --pid-file PATH     write mrd's pid to PATH once it serves, remove it at\n"
	       "                          exit; refuse to start while a live mrd holds it\n"
	       "      --log-file PATH     append log lines to PATH (also once detached, instead\n"
	       "                          of syslog; SIGHUP and mrctl reload reopen it)\n"
	       "      --no-bus            stay off the system bus ([mrd] bus = no)\n"
	       "  -h, --help              show this help\n"
	       "  -V, --version           show the version\n\n"
	       "SIGHUP (or mrctl reload) reads the configuration again; SIGTERM (or mrctl\n"
	       "shutdown) stops mrd; SIGUSR2 re-executes mrd, handing its clients' memory over\n"
	       "(as systemctl restart does with systemd's FD store).\n\n"
	       "See mrd(8) and mrd.conf(5).\n");
}

/* Command-line values, applied over the configuration file. */
struct overrides {
	const char *config_file;
	bool config_explicit;
	const char *socket, *provider, *device, *log_level;
	const char *pid_file, *log_file; /* absolute */
	bool no_bus;
	bool foreground;
	char config_abs[PATH_MAX], socket_abs[PATH_MAX], pid_file_abs[PATH_MAX],
		log_file_abs[PATH_MAX];
};

static int absolute(const char *path, char *buf, size_t size)
{
	char cwd[PATH_MAX];

	if (path[0] == '/')
		return snprintf(buf, size, "%s", path) < (int)size ? 0 : -ENAMETOOLONG;
	if (!getcwd(cwd, sizeof(cwd)))
		return -errno;
	return snprintf(buf, size, "%s/%s", cwd, path) < (int)size ? 0 : -ENAMETOOLONG;
}

static int parse_argv(int argc, char **argv, struct overrides *o)
{
	static const struct option options[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "socket", required_argument, NULL, 's' },
		{ "provider", required_argument, NULL, 'p' },
		{ "device", required_argument, NULL, 'd' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "no-bus", no_argument, NULL, 'B' },
		{ "pid-file", required_argument, NULL, 'P' },
		{ "log-file", required_argument, NULL, 'L' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{}
	};
	int c;

	o->config_file = DEFAULT_CONFIG_FILE;
	while ((c = getopt_long(argc, argv, "c:s:p:d:l:fhV", options, NULL)) >= 0) {
		switch (c) {
		case 'c':
			o->config_file = optarg;
			o->config_explicit = true;
			break;
		case 's':
			o->socket = optarg;
			break;
		case 'p':
			o->provider = optarg;
			break;
		case 'd':
			o->device = optarg;
			break;
		case 'l':
			o->log_level = optarg;
			break;
		case 'B':
			o->no_bus = true;
			break;
		case 'P':
			o->pid_file = optarg;
			break;
		case 'L':
			o->log_file = optarg;
			break;
		case 'f':
			o->foreground = true;
			break;
		case 'h':
			help();
			return 0;
		case 'V':
			printf("mrd %s\n", PACKAGE_VERSION);
			return 0;
		default:
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "mrd: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	/* From where mrd started: a detached mrd works from /, and SIGHUP and a re-exec read
	 * them again. */
	if (absolute(o->config_file, o->config_abs, sizeof(o->config_abs)) < 0 ||
	    (o->socket && absolute(o->socket, o->socket_abs, sizeof(o->socket_abs)) < 0) ||
	    (o->pid_file && absolute(o->pid_file, o->pid_file_abs, sizeof(o->pid_file_abs)) < 0) ||
	    (o->log_file && absolute(o->log_file, o->log_file_abs, sizeof(o->log_file_abs)) < 0)) {
		fprintf(stderr, "mrd: path too long, or the current folder unknown\n");
		return -EINVAL;
	}
	o->config_file = o->config_abs;
	if (o->socket)
		o->socket = o->socket_abs;
	if (o->pid_file)
		o->pid_file = o->pid_file_abs;
	if (o->log_file)
		o->log_file = o->log_file_abs;
	return 1;
}

static int apply_override(struct config *cfg, const char *section, const char *key,
			  const char *value, const char *option)
{
	int r;

	if (!value)
		return 0;
	r = config_set(cfg, section, key, value);
	if (r < 0)
		return log_error_errno(r, "invalid value for %s: '%s'", option, value);
	return 0;
}

static int load_config(const struct overrides *o, struct config *cfg)
{
	int r;

	/* Without --config a missing file means the defaults. */
	r = config_load(cfg, o->config_file, o->config_explicit);
	if (r == -ENOENT)
		return log_error_errno(r, "cannot read %s: %m", o->config_file);
	if (r < 0)
		return r; /* config_load named the file and line */

	if (apply_override(cfg, "mrd", "socket", o->socket, "--socket") < 0 ||
	    apply_override(cfg, "mrd", "provider", o->provider, "--provider") < 0 ||
	    apply_override(cfg, "mrd", "device", o->device, "--device") < 0 ||
	    apply_override(cfg, "mrd", "log_level", o->log_level, "--log-level") < 0 ||
	    apply_override(cfg, "mrd", "bus", o->no_bus ? "no" : NULL, "--no-bus") < 0)
		return -EINVAL;
	return config_finish(cfg);
}

/* Replies a client does not read wait in malloc'd frames of up to [limits] frame_bytes. Past
 * this size glibc maps each of its own and unmaps it when it is freed, so what a client made
 * mrd hold goes back to the system with it; below it, heap chunks are reused, never returned.
 * A fixed threshold also stops glibc from raising it after such a free. */
#define MALLOC_MMAP_THRESHOLD (32 * 1024)

/* Each client costs a descriptor, and up to CLIENT_FDS_IN_FLIGHT more in unread replies (the
 * kernel counts those against our limit too): lift the soft limit to the hard one, and say so
 * when even that cannot hold limits.clients. */
static void raise_fd_limit(unsigned max_clients)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < (rlim_t)max_clients * (1 + CLIENT_FDS_IN_FLIGHT) + 64)
		log_warning("open-file limit %llu is too low for limits.clients = %u; "
			    "clients beyond it will be refused",
			    (unsigned long long)rl.rlim_cur, max_clients);
}

/* Without CAP_IPC_LOCK every page mrd pins counts against its own RLIMIT_MEMLOCK: say so at
 * start when that is less than the pinning its limits allow, rather than at the first
 * registration that fails. */
static void check_memlock(const struct config *cfg)
{
	struct __user_cap_header_struct head = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3] = {};
	uint64_t need = cfg->max_pinned_bytes;
	struct rlimit rl;

	if (syscall(SYS_capget, &head, caps) == 0 &&
	    (caps[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK)))
		return;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
	    (uint64_t)rl.rlim_cur >= need)
		return;
	log_warning("mrd lacks CAP_IPC_LOCK and may lock only %llu bytes (RLIMIT_MEMLOCK), less "
		    "than the %" PRIu64 " its limits let clients pin ([limits] pinned_bytes): "
		    "registrations past it will fail; run mrd as root (the unit keeps CAP_IPC_LOCK), "
		    "raise ulimit -l (LimitMEMLOCK=) or lower the limit",
		    (unsigned long long)rl.rlim_cur, need);
}

/* systemd runs us in the foreground: it tracks the main process itself. */
static bool under_systemd(void)
{
	return getenv("NOTIFY_SOCKET") || getenv("LISTEN_FDS");
}

/* SIGHUP's reload: the same files and the same command line as at start. */
static int reload_config(void *data, struct config *ret)
{
	const struct overrides *o = data;
	int r;

	/* After logrotate moved it: a new file. */
	if (o->log_file && (r = log_open_file(o->log_file)) < 0)
		log_warning_errno(r, "cannot open %s again: %m; logging on to the old file",
				  o->log_file);
	return load_config(data, ret);
}

/* The command line a re-exec runs: the same options, with absolute paths. */
static char **reexec_argv(const struct overrides *o)
{
	static char *args[24];
	size_t n = 0;

	args[n++] = (char *)"mrd";
	if (o->config_explicit) {
		args[n++] = (char *)"--config";
		args[n++] = (char *)o->config_file;
	}
#define ARG(option, value)                      \
	do {                                    \
		if (value) {                    \
			args[n++] = (char *)option; \
			args[n++] = (char *)value;  \
		}                               \
	} while (0)
	ARG("--socket", o->socket);
	ARG("--provider", o->provider);
	ARG("--device", o->device);
	ARG("--log-level", o->log_level);
	ARG("--pid-file", o->pid_file);
	ARG("--log-file", o->log_file);
#undef ARG
	if (o->no_bus)
		args[n++] = (char *)"--no-bus";
	if (o->foreground)
		args[n++] = (char *)"--foreground";
	args[n] = NULL;
	return args;
}

/* What SIGUSR2 re-executes: the binary mrd was started from, as its path reads now (an
 * upgrade that replaced it is what a re-exec is for). */
static const char *exe_path(void)
{
	static char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);

	if (n <= 0)
		return NULL;
	path[n] = '\0';
	return path;
}

int main(int argc, char **argv)
{
	_cleanup_(manager_freep) struct manager *m = NULL;
	struct overrides o = {};
	struct config cfg;
	bool detach, detached = false;
	int pid_fd = -1, r;

	log_set_ident("mrd");
	/* Before any libibverbs call, which reads it once (rdma-core libibverbs/init.c): a destroy
	 * on a context the kernel disassociated (the device failed or went) succeeds instead of
	 * EIO (cmd.c, verbs_is_destroy_err), so mrd can let go of everything and close it. */
	setenv("RDMAV_ALLOW_DISASSOC_DESTROY", "1", 0);
	/* The signals the loop reads from its signalfd, blocked from here on (threads inherit the
	 * mask): one that comes while mrd (or its re-executed image, which inherits the mask)
	 * starts waits for the loop, not fatal. */
	manager_block_signals(true);
	r = parse_argv(argc, argv, &o);
	if (r <= 0)
		return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
	/* Where mrd detaches, what stops its start goes to the terminal: the file from the
	 * moment it detaches (below). */
	if (o.log_file && (o.foreground || under_systemd() || getenv(MANAGER_DETACHED_ENV)) &&
	    (r = log_open_file(o.log_file)) < 0)
		return log_error_errno(r, "cannot open %s: %m", o.log_file), EXIT_FAILURE;
	if (o.pid_file && pid_file_check(o.pid_file) < 0)
		return EXIT_FAILURE;

	config_init(&cfg);
	r = load_config(&o, &cfg);
	if (r < 0) {
		config_done(&cfg);
		return EXIT_FAILURE;
	}
	log_set_level(cfg.log_level);
	raise_fd_limit(cfg.max_clients);
	(void)mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD);
	check_memlock(&cfg);
	if (privileges_drop_raw() < 0) { /* before manager_new opens the device */
		config_done(&cfg);
		return EXIT_FAILURE;
	}

	/* A re-executed detached mrd is detached already: its lines still go to syslog. */
	if (getenv(MANAGER_DETACHED_ENV)) {
		unsetenv(MANAGER_DETACHED_ENV);
		log_open_syslog();
		detached = true;
	}
	detach = !o.foreground && !under_systemd();
	if (detach && detach_begin() < 0) {
		config_done(&cfg);
		return log_error_errno(-errno, "fork: %m"), EXIT_FAILURE;
	}

	r = manager_new(&cfg, &m);
	config_done(&cfg);
	if (r < 0)
		log_error_errno(r, "cannot start: %m");
	else {
		m->load_config = reload_config;
		m->load_config_data = &o;
		m->exe_path = exe_path();
		m->argv = reexec_argv(&o);
		m->detached = detach || detached;
		r = manager_listen(m);
	}
	/* Once it serves, before a detaching parent returns: whoever started mrd finds it. */
	if (r >= 0 && o.pid_file)
		r = pid_file_write(o.pid_file, &pid_fd);
	if (r >= 0 && detach && o.log_file && (r = log_open_file(o.log_file)) < 0)
		log_error_errno(r, "cannot open %s: %m", o.log_file);
	if (detach)
		detach_finish(r);
	if (r < 0)
		return EXIT_FAILURE;

	r = manager_run(m);
	m = manager_free(m); /* its socket gone before its pid file */
	pid_file_remove(o.pid_file, pid_fd);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
