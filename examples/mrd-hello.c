/* SPDX-License-Identifier: MIT */
/* The smallest libmrd program: connect to mrd, show what was negotiated, ping it, and use a
 * buffer of mrd's shared memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mrd/mrd.h>

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : NULL; /* NULL: $MRD_SOCKET, else the default */
	mrd_client *client = NULL;
	int r;

	r = mrd_client_connect(path, &client);
	if (r < 0) {
		fprintf(stderr, "mrd-hello: cannot connect to mrd: %s\n", mrd_last_error());
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
	if (r >= 0) {
		char *buf;

		/* Memory from mrd: the same address in mrd and in every client of the domain. */
		r = mrd_mem_alloc(client, 1 << 20, 0, 0, (void **)&buf);
		if (r < 0)
			fprintf(stderr, "mrd-hello: alloc: %s\n", mrd_last_error());
		else {
			snprintf(buf, 64, "hello from pid %d", (int)getpid());
			printf("domain %s: 1 MiB at %p says \"%s\" (generation %llu)\n",
			       mrd_client_domain(client), (void *)buf, buf,
			       (unsigned long long)mrd_client_generation(client));
			r = mrd_mem_free(client, buf);
			/* Never registered: no cache can hold a key of it, so nothing to flush. */
			printf("freed: generation still %llu\n",
			       (unsigned long long)mrd_client_generation(client));
		}
	}
	mrd_client_close(client);
	return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
