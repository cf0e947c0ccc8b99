/*
 * mpi-check: an ordinary MPI program (no libmrd) for make check-rdma's two-host middleware case:
 * two ranks ping-pong 1 MiB messages, new data each round, each byte checked by the receiver,
 * then an allreduce (sum) of 256 Ki integers that each rank checks. Prints "mpi-check: ..."
 * lines from rank 0; every rank exits 0 only when all its data was right.
 *
 * mpi-check [rounds]
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (1 << 20)
#define INTS (256 * 1024)

static unsigned char want(size_t i, int round)
{
	return (unsigned char)(i * 11 + (size_t)round * 97 + (i >> 12));
}

int main(int argc, char **argv)
{
	int rank, size, rounds = argc > 1 ? atoi(argv[1]) : 10, bad = 0, all_bad;
	unsigned char *buf = malloc(LEN);
	int *in = malloc(INTS * sizeof(int)), *out = malloc(INTS * sizeof(int));
	char host[MPI_MAX_PROCESSOR_NAME];
	int host_len;
	double t0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Get_processor_name(host, &host_len);
	printf("mpi-check: rank %d of %d on %s\n", rank, size, host);
	if (size != 2 || !buf || !in || !out) {
		printf("mpi-check: FAIL needs 2 ranks and memory\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	t0 = MPI_Wtime();
	for (int r = 0; r < rounds; r++) {
		/* rank 0 sends round r's bytes, rank 1 checks and sends back round r + 1000's. */
		int me = rank == 0 ? r : r + 1000, peer = rank == 0 ? r + 1000 : r;
		if (rank == 0) {
			for (size_t i = 0; i < LEN; i++)
				buf[i] = want(i, me);
			MPI_Send(buf, LEN, MPI_BYTE, 1, r, MPI_COMM_WORLD);
			memset(buf, 0, LEN);
			MPI_Recv(buf, LEN, MPI_BYTE, 1, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else {
			memset(buf, 0, LEN);
			MPI_Recv(buf, LEN, MPI_BYTE, 0, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		}
		for (size_t i = 0; i < LEN; i++)
			if (buf[i] != want(i, peer)) {
				printf("mpi-check: FAIL rank %d round %d: byte %zu is %#x, sent %#x\n",
				       rank, r, i, buf[i], want(i, peer));
				bad = 1;
				break;
			}
		if (rank == 1) {
			for (size_t i = 0; i < LEN; i++)
				buf[i] = want(i, me);
			MPI_Send(buf, LEN, MPI_BYTE, 0, r, MPI_COMM_WORLD);
		}
	}
	double pp = MPI_Wtime() - t0;
	for (int i = 0; i < INTS; i++)
		in[i] = i * (rank + 1) + rank;
	MPI_Allreduce(in, out, INTS, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	for (int i = 0; i < INTS; i++)
		if (out[i] != i * 3 + 1) { /* i * 1 + 0 + i * 2 + 1 */
			printf("mpi-check: FAIL rank %d allreduce [%d] = %d, want %d\n", rank, i,
			       out[i], i * 3 + 1);
			bad = 1;
			break;
		}
	MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi-check: %d ping-pong rounds of %d bytes (%.1f ms each) and an allreduce of %d "
		       "ints: %s\n",
		       rounds, LEN, pp * 1e3 / rounds, INTS, all_bad ? "DATA WRONG" : "data checked");
	MPI_Finalize();
	free(buf);
	free(in);
	free(out);
	return all_bad;
}
