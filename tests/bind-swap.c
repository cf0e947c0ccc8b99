/* SPDX-License-Identifier: MIT */
/* LD_PRELOAD shim for test-defaults: right after mrd's first successful bind() of a Unix
 * socket, $MRD_TEST_SWAP_PATH becomes a symbolic link to $MRD_TEST_SWAP_TARGET, as a user who
 * owns the socket's folder can make it at that moment. The race's worst moment, every time. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

__attribute__((visibility("default"))) int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
	static bool swapped;
	int (*real)(int, const struct sockaddr *, socklen_t) =
		(int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
	const char *path = getenv("MRD_TEST_SWAP_PATH"), *target = getenv("MRD_TEST_SWAP_TARGET");
	int r = real(fd, sa, len);

	if (r == 0 && sa->sa_family == AF_UNIX && path && target && !swapped) {
		swapped = true;
		(void)unlink(path);
		(void)!symlink(target, path);
	}
	return r;
}
