/* SPDX-License-Identifier: MIT */
/* Runs a fuzz target over every file of a corpus without libFuzzer, so `make check` replays
 * the seeds (and any crash reproducer added to the corpus) under the normal build. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern const char fuzz_corpus[]; /* the target's corpus, a folder of $FUZZ_DIR */

static int replay_file(const char *path)
{
	static uint8_t buf[1 << 20];
	FILE *f = fopen(path, "rb");
	size_t n;

	if (!f) {
		fprintf(stderr, "replay: cannot open %s\n", path);
		return -1;
	}
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	LLVMFuzzerTestOneInput(buf, n);
	return 0;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : NULL;
	struct dirent *de;
	unsigned count = 0;
	char corpus[4096], path[sizeof(corpus) + 258];
	DIR *d;

	if (!dir && getenv("FUZZ_DIR")) {
		snprintf(corpus, sizeof(corpus), "%s/%s", getenv("FUZZ_DIR"), fuzz_corpus);
		dir = corpus;
	}
	if (!dir) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	d = opendir(dir);
	if (!d) {
		fprintf(stderr, "replay: cannot open %s\n", dir);
		return 1;
	}
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		if (replay_file(path) < 0) {
			closedir(d);
			return 1;
		}
		count++;
	}
	closedir(d);
	printf("replayed %u inputs from %s\n", count, dir);
	return count > 0 ? 0 : 1;
}
