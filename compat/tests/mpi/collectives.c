/* Collectives of Open MPI over libfabric's verbs;ofi_rxm on the library
 * (pml cm, mtl ofi), built with mpicc and run by scripts/compat with two
 * or more ranks, each preloaded. Each rank checks every element it
 * receives and prints one line per collective; a wrong element aborts
 * the job. The buffers are 1 MiB, beyond ofi_rxm's eager size, so the
 * rendezvous path (RDMA Read of the sender's buffer) carries them. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1 << 18)

static int rank, size;

static void expect(int ok, const char *what, long i, long got, long want)
{
	if (!ok) {
		fprintf(stderr, "rank %d: %s: element %ld is %ld, not %ld\n", rank, what, i, got, want);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int *a = malloc(N * sizeof(int)), *b = malloc(N * sizeof(int));
	int *all = malloc((size_t)size * N * sizeof(int));
	if (!a || !b || !all)
		MPI_Abort(MPI_COMM_WORLD, 2);

	for (long i = 0; i < N; i++)
		a[i] = rank * 7 + (int)i;
	MPI_Allreduce(a, b, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	for (long i = 0; i < N; i++) {
		long want = 7L * size * (size - 1) / 2 + (long)size * i;
		expect(b[i] == want, "allreduce sum", i, b[i], want);
	}
	printf("rank %d of %d: allreduce ok\n", rank, size);

	int root = size - 1;
	for (long i = 0; i < N; i++)
		a[i] = rank == root ? (int)(i ^ 0x5a5a5) : -1;
	MPI_Bcast(a, N, MPI_INT, root, MPI_COMM_WORLD);
	for (long i = 0; i < N; i++)
		expect(a[i] == (int)(i ^ 0x5a5a5), "bcast", i, a[i], i ^ 0x5a5a5);
	printf("rank %d of %d: bcast ok\n", rank, size);

	/* Rank r's block for rank d holds r * 1000003 + d * 31 + j. */
	int blk = N / size;
	for (int d = 0; d < size; d++)
		for (int j = 0; j < blk; j++)
			a[d * blk + j] = rank * 1000003 + d * 31 + j;
	MPI_Alltoall(a, blk, MPI_INT, b, blk, MPI_INT, MPI_COMM_WORLD);
	for (int s = 0; s < size; s++)
		for (int j = 0; j < blk; j++) {
			long want = (long)s * 1000003 + rank * 31 + j;
			expect(b[s * blk + j] == want, "alltoall", (long)s * blk + j, b[s * blk + j], want);
		}
	printf("rank %d of %d: alltoall ok\n", rank, size);

	for (long i = 0; i < N; i++)
		a[i] = rank + (int)i * size;
	MPI_Allgather(a, N, MPI_INT, all, N, MPI_INT, MPI_COMM_WORLD);
	for (int s = 0; s < size; s++)
		for (long i = 0; i < N; i++) {
			long want = s + i * size;
			expect(all[(long)s * N + i] == want, "allgather", (long)s * N + i, all[(long)s * N + i], want);
		}
	printf("rank %d of %d: allgather ok\n", rank, size);

	MPI_Barrier(MPI_COMM_WORLD);
	free(all);
	free(b);
	free(a);
	MPI_Finalize();
	return 0;
}
