/* SPDX-License-Identifier: MIT */
/* Test helper: listens on a NOTIFY_SOCKET path, as systemd does, until a notification holds
 * WANT, and prints it. Usage: notify-wait PATH SECONDS WANT; exit 0 when seen, 1 on timeout. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char buf[4096];
	int fd, ms;

	if (argc != 4 || strlen(argv[1]) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "usage: notify-wait PATH SECONDS WANT\n");
		return 2;
	}
	strcpy(sa.sun_path, argv[1]);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("notify-wait: bind");
		return 2;
	}
	for (ms = atoi(argv[2]) * 1000; ms > 0; ms -= 100) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recv(fd, buf, sizeof(buf) - 1, 0);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		if (strstr(buf, argv[3])) {
			printf("%s\n", buf);
			return 0;
		}
	}
	fprintf(stderr, "notify-wait: no %s within %s s\n", argv[3], argv[2]);
	return 1;
}
