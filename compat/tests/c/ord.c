/* An ORD and IRD of 1 with many Reads and atomics posted at once, run
 * under LD_PRELOAD by tests/c_programs.rs: the client posts 24 Reads and
 * 16 fetch-and-adds in one go on a connection whose both ends accepted
 * one outstanding Read or atomic. The send queue must hold each until
 * the one before it completed (the responder's IRD of 1 is never
 * overrun: a responder that is would end the connection with a
 * Terminate), so every work request completes, in order, with the right
 * data, and the connection stays up. Prints one line per check; exits
 * non-zero on the first failure. */
#include "common.h"

#define READS 24
#define ADDS 16
#define CHUNK 512

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli;
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0,
	      "IDs");
	struct sockaddr_in sin;
	listen_loopback(srv, 1, &sin);
	resolve(ch, cli, &sin);

	struct ibv_pd *pd = ibv_alloc_pd(cli->verbs);
	struct ibv_cq *ccq = ibv_create_cq(cli->verbs, 64, NULL, NULL, 0);
	struct ibv_cq *scq = ibv_create_cq(cli->verbs, 64, NULL, NULL, 0);
	CHECK(pd && ccq && scq, "PD and CQs");
	/* The server's region: READS chunks of distinct bytes, then the
	 * counter the adds go to. */
	uint8_t *remote = calloc(1, READS * CHUNK + 8);
	uint8_t *local = calloc(1, READS * CHUNK + ADDS * 8);
	for (int i = 0; i < READS * CHUNK; i++)
		remote[i] = (uint8_t)(i * 7 + i / CHUNK);
	uint64_t *counter = (uint64_t *)(remote + READS * CHUNK);
	*counter = 1000;
	struct ibv_mr *rmr = ibv_reg_mr(pd, remote, READS * CHUNK + 8,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, READS * CHUNK + ADDS * 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr && lmr, "regions");

	struct ibv_qp_init_attr qa = { .send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 64, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK(rdma_create_qp(cli, pd, &qa) == 0, "client QP, 64 send slots");
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	CHECK(rdma_connect(cli, &cp) == 0, "connect with ORD 1, IRD 1");
	struct rdma_cm_id *conn = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	qa.send_cq = qa.recv_cq = scq;
	CHECK(conn && rdma_create_qp(conn, pd, &qa) == 0 && rdma_accept(conn, &cp) == 0, "accept with ORD 1, IRD 1");
	CHECK(established_both(ch), "both ESTABLISHED");

	struct ibv_send_wr wr[READS + ADDS], *bad = NULL;
	struct ibv_sge sge[READS + ADDS];
	memset(wr, 0, sizeof(wr));
	for (int i = 0; i < READS + ADDS; i++) {
		int read = i < READS;
		sge[i] = (struct ibv_sge){
			.addr = (uintptr_t)(read ? local + i * CHUNK : local + READS * CHUNK + (i - READS) * 8),
			.length = read ? CHUNK : 8,
			.lkey = lmr->lkey,
		};
		wr[i].wr_id = i;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].send_flags = IBV_SEND_SIGNALED;
		wr[i].next = i + 1 < READS + ADDS ? &wr[i + 1] : NULL;
		if (read) {
			wr[i].opcode = IBV_WR_RDMA_READ;
			wr[i].wr.rdma.remote_addr = (uintptr_t)(remote + i * CHUNK);
			wr[i].wr.rdma.rkey = rmr->rkey;
		} else {
			wr[i].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
			wr[i].wr.atomic.remote_addr = (uintptr_t)counter;
			wr[i].wr.atomic.rkey = rmr->rkey;
			wr[i].wr.atomic.compare_add = 3;
		}
	}
	CHECK(ibv_post_send(cli->qp, wr, &bad) == 0, "24 Reads and 16 fetch-and-adds posted at once");

	int in_order = 1;
	for (int i = 0; i < READS + ADDS; i++) {
		struct ibv_wc wc;
		int n = poll_one(ccq, &wc);
		if (n != 1 || wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "work request %d: %s\n", i, n == 1 ? ibv_wc_status_str(wc.status) : "no completion");
			CHECK(0, "every Read and atomic completes");
		}
		in_order &= wc.wr_id == (uint64_t)i;
	}
	CHECK(in_order, "every Read and atomic completes successfully, in order");
	CHECK(!memcmp(local, remote, READS * CHUNK), "the Reads brought the server's bytes");
	int fetched = 1;
	for (int i = 0; i < ADDS; i++)
		fetched &= ((uint64_t *)(local + READS * CHUNK))[i] == 1000 + 3 * (uint64_t)i;
	CHECK(fetched && *counter == 1000 + 3 * ADDS, "the adds fetched 1000, 1003, ... and left 1048");

	/* The connection is still up: one more Read completes. */
	wr[0].next = NULL;
	CHECK(ibv_post_send(cli->qp, wr, &bad) == 0, "one more Read");
	struct ibv_wc wc;
	CHECK(poll_one(ccq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the connection is still up");

	close_all(ch, cli, conn, srv);
	printf("all ok\n");
	return 0;
}
