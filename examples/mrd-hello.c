/* SPDX-License-Identifier: MIT */
/* The smallest libmrd program: connect to mrd, show what was negotiated, ping it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mrd/mrd.h>

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : NULL; /* NULL: $MRD_SOCKET, else the default */
	mrd_client *client = NULL;
	int r;

	r = mrd_client_connect(path, &client);
	if (r < 0) {
		fprintf(stderr, "mrd-hello: cannot connect to mrd: %s\n", strerror(-r));
		return EXIT_FAILURE;
	}
	printf("connected to mrd %s (protocol %d), libmrd %s\n", mrd_client_server_version(client),
	       mrd_client_protocol_version(client), mrd_version());

	for (int i = 0; i < 3; i++) {
		r = mrd_client_ping(client);
		if (r < 0) {
			fprintf(stderr, "mrd-hello: ping: %s\n", strerror(-r));
			break;
		}
	}
	if (r >= 0)
		printf("ping: 3 round trips ok\n");
	mrd_client_close(client);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
