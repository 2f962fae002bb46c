/* The extended post API (ibv_qp_ex, ibv_wr_*) and inline data of
 * libiwarp_compat, run under LD_PRELOAD by tests/c_programs.rs: two QPs of
 * one process connected through rdma_cm on loopback, one created with
 * ibv_create_qp_ex, the other with rdma_create_qp_ex. Prints one line per
 * check; exits non-zero on the first failure. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common.h"

#define BUF 4096

/* Nothing arrives within 100 ms. */
static int quiet(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (int i = 0; i < 100; i++) {
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			return 0;
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	return 1;
}

static char *sbuf, *cbuf, *rbuf;
static struct ibv_mr *smr, *cmr, *rmr;
static struct ibv_qp *sqp;
static struct ibv_cq *scq, *ccq;

/* The server's posted receives' wr_ids, in order. */
static uint64_t posted[64];
static unsigned posted_head, posted_tail;

/* Post one receive of the server, into its own 256 bytes of rbuf. */
static void server_recv(uint64_t id)
{
	char *at = rbuf + 256 * (posted_tail % 64);
	posted[posted_tail++ % 64] = id;
	struct ibv_sge sge = { .addr = (uintptr_t)at, .length = 256, .lkey = rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(sqp, &wr, &bad)) {
		fprintf(stderr, "FAIL server post_recv\n");
		exit(1);
	}
}

/* The server's next receive: the oldest posted, with `len` bytes equal
 * to `data`. */
static int server_got(uint32_t len, const void *data)
{
	struct ibv_wc wc;
	if (poll_one(scq, &wc) != 1)
		return 0;
	char *at = rbuf + 256 * (posted_head % 64);
	uint64_t id = posted[posted_head++ % 64];
	return wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == id &&
	       wc.byte_len == len && !memcmp(at, data, len);
}

/* The client's next send completion. */
static int client_done(uint64_t id, enum ibv_wc_opcode op)
{
	struct ibv_wc wc;
	if (poll_one(ccq, &wc) != 1)
		return 0;
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id || wc.opcode != op) {
		fprintf(stderr, "completion: wr_id %llu status %d opcode %d\n",
			(unsigned long long)wc.wr_id, wc.status, wc.opcode);
		return 0;
	}
	return 1;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	sbuf = aligned_alloc(64, BUF);
	cbuf = aligned_alloc(64, BUF);
	memset(sbuf, 0, BUF);
	memset(cbuf, 0, BUF);
	smr = ibv_reg_mr(pd, sbuf, BUF, acc);
	cmr = ibv_reg_mr(pd, cbuf, BUF, acc);
	rbuf = malloc(256 * 64);
	rmr = ibv_reg_mr(pd, rbuf, 256 * 64, IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr && cmr && rmr, "reg_mr");
	scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	ccq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(scq && ccq, "create_cq");

	/* Creation. */
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 4, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM,
	};
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &xa) && errno == EOPNOTSUPP,
	      "create_qp_ex with SEND_WITH_IMM -> EOPNOTSUPP");
	xa.send_ops_flags = IBV_QP_EX_WITH_SEND;
	xa.cap.max_inline_data = 1024;
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &xa) && errno == EINVAL, "create_qp_ex inline 1024 -> EINVAL");
	xa.cap.max_inline_data = 64;
	xa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
			    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
	struct ibv_qp *cqp = ibv_create_qp_ex(ctx, &xa);
	CHECK(cqp && cqp->qp_num != 0, "create_qp_ex (verbs.h inline, extended context op)");
	CHECK(xa.cap.max_inline_data == 256, "cap.max_inline_data is the device's 256");
	struct ibv_qp_ex *cx = ibv_qp_to_qp_ex(cqp);
	CHECK(cx && &cx->qp_base == cqp, "qp_to_qp_ex: the ibv_qp_ex around the QP");
	CHECK(ibv_wr_complete(cx) == EINVAL, "wr_complete without wr_start -> EINVAL");
	ibv_wr_start(cx);
	cx->wr_id = 1;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, 8);
	CHECK(ibv_wr_complete(cx) == EINVAL, "wr_complete before the connection -> EINVAL");

	/* Connection: the client's QP by its number, the server's by
	 * rdma_create_qp_ex with fewer operations. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli;
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 &&
	      rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "create ids");
	struct sockaddr_in sin;
	listen_loopback(srv, 1, &sin);
	resolve(ch, cli, &sin);
	struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4,
				      .qp_num = cqp->qp_num };
	CHECK(rdma_connect(cli, &cp) == 0, "connect with the QP's number");
	struct rdma_cm_id *child = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(child, "CONNECT_REQUEST");
	struct ibv_qp_init_attr_ex sa = {
		.send_cq = scq, .recv_cq = scq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_PD, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
	};
	CHECK(rdma_create_qp_ex(child, &sa) == 0 && child->qp && child->qp->pd == pd &&
	      sa.cap.max_inline_data == 256, "rdma_create_qp_ex with send_ops_flags");
	sqp = child->qp;
	struct ibv_qp_ex *sx = ibv_qp_to_qp_ex(sqp);
	CHECK(sx, "server qp_to_qp_ex");
	for (int i = 0; i < 8; i++)
		server_recv(100 + i);
	struct rdma_conn_param ap = { .responder_resources = 4, .initiator_depth = 4 };
	CHECK(rdma_accept(child, &ap) == 0, "accept");
	CHECK(established_both(ch) && cqp->state == IBV_QPS_RTS, "ESTABLISHED on both sides");

	/* A send from registered memory. */
	for (int i = 0; i < 32; i++)
		cbuf[i] = (char)('a' + i % 26);
	ibv_wr_start(cx);
	cx->wr_id = 10;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, 32);
	CHECK(ibv_wr_complete(cx) == 0, "wr_send + wr_set_sge posted");
	CHECK(client_done(10, IBV_WC_SEND), "send completion with wr_id");
	CHECK(server_got(32, cbuf), "server received the 32 bytes");

	/* Inline data is copied when it is set. */
	char stack[200];
	char want[200];
	for (int i = 0; i < 200; i++)
		stack[i] = want[i] = (char)(i * 7);
	ibv_wr_start(cx);
	cx->wr_id = 11;
	cx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_send(cx);
	ibv_wr_set_inline_data(cx, stack, 200);
	memset(stack, 0, sizeof stack);
	CHECK(ibv_wr_complete(cx) == 0, "wr_set_inline_data 200 bytes posted");
	CHECK(client_done(11, IBV_WC_SEND), "inline send completion");
	CHECK(server_got(200, want), "server received the inline bytes as they were when set");

	struct ibv_data_buf parts[2] = { { .addr = want, .length = 50 }, { .addr = want + 50, .length = 70 } };
	ibv_wr_start(cx);
	cx->wr_id = 12;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_inline_data_list(cx, 2, parts);
	CHECK(ibv_wr_complete(cx) == 0, "wr_set_inline_data_list posted");
	CHECK(client_done(12, IBV_WC_SEND), "inline list completion");
	CHECK(server_got(120, want), "server received both buffers in order");

	/* One batch: inline Write, Write from memory, Read, FetchAdd,
	 * CompareSwap, then a Send that the server receives after the
	 * Writes are placed. */
	uint64_t *sword = (uint64_t *)(sbuf + 2048);
	*sword = 40;
	for (int i = 0; i < 64; i++)
		sbuf[3000 + i] = (char)(0x40 + i);
	for (int i = 0; i < 16; i++)
		cbuf[256 + i] = (char)(0x70 + i);
	ibv_wr_start(cx);
	cx->wr_id = 20;
	cx->wr_flags = 0;
	ibv_wr_rdma_write(cx, smr->rkey, (uintptr_t)sbuf + 1024);
	ibv_wr_set_inline_data(cx, want, 64);
	cx->wr_id = 21;
	ibv_wr_rdma_write(cx, smr->rkey, (uintptr_t)sbuf + 1200);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf + 256, 16);
	cx->wr_id = 22;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(cx, smr->rkey, (uintptr_t)sbuf + 3000);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf + 512, 64);
	cx->wr_id = 23;
	ibv_wr_atomic_fetch_add(cx, smr->rkey, (uintptr_t)sword, 2);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf + 1024, 8);
	cx->wr_id = 24;
	ibv_wr_atomic_cmp_swp(cx, smr->rkey, (uintptr_t)sword, 42, 1000);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf + 1032, 8);
	cx->wr_id = 25;
	ibv_wr_send(cx);
	ibv_wr_set_inline_data(cx, "done", 4);
	CHECK(ibv_wr_complete(cx) == 0, "batch of six posted");
	CHECK(client_done(22, IBV_WC_RDMA_READ), "read completion (unsignaled writes before it)");
	CHECK(client_done(23, IBV_WC_FETCH_ADD), "fetch_add completion");
	CHECK(client_done(24, IBV_WC_COMP_SWAP), "cmp_swp completion");
	CHECK(client_done(25, IBV_WC_SEND), "send completion");
	CHECK(server_got(4, "done"), "server received the send after the writes");
	CHECK(!memcmp(sbuf + 1024, want, 64), "inline write placed");
	CHECK(!memcmp(sbuf + 1200, cbuf + 256, 16), "write from memory placed");
	CHECK(!memcmp(cbuf + 512, sbuf + 3000, 64), "read data arrived");
	uint64_t old_add, old_swap;
	memcpy(&old_add, cbuf + 1024, 8);
	memcpy(&old_swap, cbuf + 1032, 8);
	CHECK(old_add == 40 && old_swap == 42 && *sword == 1000, "atomics: 40 + 2, then 42 -> 1000");

	/* Legacy post with IBV_SEND_INLINE: the bytes are copied at post. */
	char leg[100];
	for (int i = 0; i < 100; i++)
		leg[i] = want[i] = (char)(255 - i);
	struct ibv_sge lsge[2] = { { .addr = (uintptr_t)leg, .length = 60, .lkey = 0 },
				   { .addr = (uintptr_t)leg + 60, .length = 40, .lkey = 0 } };
	struct ibv_send_wr lw = { .wr_id = 30, .sg_list = lsge, .num_sge = 2, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE },
			   *bad = NULL;
	CHECK(ibv_post_send(cqp, &lw, &bad) == 0, "post_send IBV_SEND_INLINE, two SGEs without lkeys");
	memset(leg, 0, sizeof leg);
	CHECK(client_done(30, IBV_WC_SEND), "legacy inline completion");
	CHECK(server_got(100, want), "server received the legacy inline bytes");
	char big[300] = { 0 };
	struct ibv_sge bsge = { .addr = (uintptr_t)big, .length = 300 };
	lw.sg_list = &bsge;
	lw.num_sge = 1;
	CHECK(ibv_post_send(cqp, &lw, &bad) == EINVAL && bad == &lw, "post_send inline 300 bytes -> EINVAL");
	struct ibv_sge rsge = { .addr = (uintptr_t)cbuf, .length = 8, .lkey = cmr->lkey };
	struct ibv_send_wr rw = { .wr_id = 31, .sg_list = &rsge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				  .send_flags = IBV_SEND_INLINE,
				  .wr.rdma = { .remote_addr = (uintptr_t)sbuf, .rkey = smr->rkey } };
	CHECK(ibv_post_send(cqp, &rw, &bad) == EINVAL && bad == &rw, "post_send inline read -> EINVAL");

	/* Refused batches post nothing. */
	ibv_wr_start(cx);
	cx->wr_id = 40;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, 8);
	ibv_wr_send(cx);
	ibv_wr_set_inline_data(cx, big, 300);
	CHECK(ibv_wr_complete(cx) == EINVAL, "wr_set_inline_data 300 bytes -> EINVAL");
	ibv_wr_start(cx);
	ibv_wr_rdma_read(cx, smr->rkey, (uintptr_t)sbuf);
	ibv_wr_set_inline_data(cx, big, 8);
	CHECK(ibv_wr_complete(cx) == EINVAL, "inline data on a read -> EINVAL");
	ibv_wr_start(cx);
	ibv_wr_send_imm(cx, htonl(7));
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, 8);
	CHECK(ibv_wr_complete(cx) == EOPNOTSUPP, "wr_send_imm -> EOPNOTSUPP");
	struct ibv_sge five[5];
	for (int i = 0; i < 5; i++)
		five[i] = (struct ibv_sge){ .addr = (uintptr_t)cbuf, .length = 1, .lkey = cmr->lkey };
	ibv_wr_start(cx);
	ibv_wr_send(cx);
	ibv_wr_set_sge_list(cx, 5, five);
	CHECK(ibv_wr_complete(cx) == EINVAL, "wr_set_sge_list 5 SGEs -> EINVAL");
	ibv_wr_start(cx);
	ibv_wr_rdma_read(cx, smr->rkey, (uintptr_t)sbuf);
	ibv_wr_set_sge_list(cx, 2, five);
	CHECK(ibv_wr_complete(cx) == EINVAL, "read into 2 SGEs -> EINVAL");
	ibv_wr_start(cx);
	cx->wr_flags = 1u << 20;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, 8);
	CHECK(ibv_wr_complete(cx) == EINVAL, "unknown wr_flags -> EINVAL");
	ibv_wr_start(cx);
	cx->wr_id = 41;
	cx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(cx);
	ibv_wr_set_sge(cx, cmr->lkey, (uintptr_t)cbuf, 8);
	ibv_wr_abort(cx);
	CHECK(quiet(ccq) && quiet(scq), "refused and aborted batches posted nothing");
	ibv_wr_start(sx);
	ibv_wr_rdma_read(sx, cmr->rkey, (uintptr_t)cbuf);
	ibv_wr_set_sge(sx, smr->lkey, (uintptr_t)sbuf, 8);
	CHECK(ibv_wr_complete(sx) == EOPNOTSUPP, "read on a QP created without it -> EOPNOTSUPP");

	/* The server's extended QP sends back. */
	struct ibv_sge csge = { .addr = (uintptr_t)cbuf + 2048, .length = 64, .lkey = cmr->lkey };
	struct ibv_recv_wr crw = { .wr_id = 50, .sg_list = &csge, .num_sge = 1 }, *cbad;
	CHECK(ibv_post_recv(cqp, &crw, &cbad) == 0, "client post_recv");
	ibv_wr_start(sx);
	sx->wr_id = 51;
	sx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(sx);
	ibv_wr_set_inline_data(sx, "pong", 4);
	CHECK(ibv_wr_complete(sx) == 0, "server wr_send inline");
	struct ibv_wc wc;
	CHECK(poll_one(scq, &wc) == 1 && wc.wr_id == 51 && wc.status == IBV_WC_SUCCESS, "server send completion");
	CHECK(poll_one(ccq, &wc) == 1 && wc.wr_id == 50 && wc.byte_len == 4 && wc.qp_num == cqp->qp_num &&
	      !memcmp(cbuf + 2048, "pong", 4), "client received, qp_num in the completion");

	/* Many inline sends: the inline slots are reused in order. */
	int sent = 0, got = 0;
	for (int i = 0; i < 8; i++)
		server_recv(300 + i);
	for (int round = 0; round < 5; round++) {
		for (int i = 0; i < 8; i++) {
			char msg[16];
			snprintf(msg, sizeof msg, "m%03d", sent);
			ibv_wr_start(cx);
			cx->wr_id = 1000 + sent;
			cx->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_send(cx);
			ibv_wr_set_inline_data(cx, msg, 5);
			if (ibv_wr_complete(cx))
				break;
			sent++;
		}
		for (; got < sent; got++) {
			char msg[16];
			snprintf(msg, sizeof msg, "m%03d", got);
			if (!server_got(5, msg))
				break;
			server_recv(200 + got);
		}
		while (poll_one(ccq, &wc) == 1 && wc.wr_id != 1000u + sent - 1)
			;
	}
	CHECK(sent == 40 && got == 40, "40 inline sends through a 16-deep queue arrive in order");

	/* Destroyed handles are refused on the data path. */
	rdma_disconnect(cli);
	rdma_destroy_qp(child);
	CHECK(ibv_destroy_qp(cqp) == 0, "destroy_qp");
	CHECK(ibv_post_send(cqp, &lw, &bad) == EINVAL, "post_send on a destroyed QP -> EINVAL");
	CHECK(ibv_post_recv(cqp, &crw, &cbad) == EINVAL, "post_recv on a destroyed QP -> EINVAL");
	CHECK(ibv_destroy_cq(ccq) == 0, "destroy_cq");
	CHECK(ibv_poll_cq(ccq, 1, &wc) < 0, "poll_cq on a destroyed CQ -> error");
	CHECK(ibv_req_notify_cq(ccq, 0) == EINVAL, "req_notify_cq on a destroyed CQ -> EINVAL");
	rdma_destroy_id(child);
	rdma_destroy_id(cli);
	rdma_destroy_id(srv);
	rdma_destroy_event_channel(ch);
	printf("all ok\n");
	return 0;
}
