/* Completion notification semantics, and objects destroyed or
 * deregistered while in use, of libiwarp_compat, run under LD_PRELOAD by
 * tests/c_programs.rs: two QPs of one process connected through rdma_cm
 * on loopback; the server's CQ is bound to a non-blocking completion
 * channel. Prints one line per check; exits non-zero on the first
 * failure. */
#include <errno.h>
#include <fcntl.h>
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

static struct ibv_comp_channel *cc;
static struct ibv_cq *scq, *ccq;
static struct ibv_qp *sqp, *cqp;
static struct ibv_mr *cmr, *rmr;
static char *cbuf, *rbuf;
static unsigned acked;

static void server_recv(uint64_t id, struct ibv_mr *mr, char *at)
{
	struct ibv_sge sge = { .addr = (uintptr_t)at, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(sqp, &wr, &bad)) {
		fprintf(stderr, "FAIL server post_recv\n");
		exit(1);
	}
}

/* The client sends 8 bytes, solicited or not, and sees its completion. */
static int client_send(uint64_t id, int solicited)
{
	struct ibv_sge sge = { .addr = (uintptr_t)cbuf, .length = 8, .lkey = cmr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED | (solicited ? IBV_SEND_SOLICITED : 0) },
			   *bad;
	struct ibv_wc wc;
	return ibv_post_send(cqp, &wr, &bad) == 0 && poll_one(ccq, &wc) == 1 && wc.wr_id == id &&
	       wc.status == IBV_WC_SUCCESS;
}

/* The server's receive `id` completed with `status`. */
static int server_got(uint64_t id, enum ibv_wc_status status)
{
	struct ibv_wc wc;
	if (poll_one(scq, &wc) != 1)
		return 0;
	if (wc.wr_id != id || wc.status != status) {
		fprintf(stderr, "server completion: wr_id %llu status %d (%s)\n",
			(unsigned long long)wc.wr_id, wc.status, ibv_wc_status_str(wc.status));
		return 0;
	}
	return 1;
}

/* A notification is waiting on the channel now (no wait): 1 and it is
 * taken and acknowledged; 0 with errno EAGAIN if none. */
static int event_now(void)
{
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	if (ibv_get_cq_event(cc, &ev_cq, &ev_ctx))
		return 0;
	if (ev_cq != scq || ev_ctx != (void *)0x77) {
		fprintf(stderr, "event for another CQ\n");
		exit(1);
	}
	ibv_ack_cq_events(scq, 1);
	acked++;
	return 1;
}

/* A notification arrives within 10 s (the channel's fd becomes readable). */
static int event_within(void)
{
	struct pollfd p = { .fd = cc->fd, .events = POLLIN };
	return poll(&p, 1, 10000) == 1 && event_now();
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cbuf = calloc(1, 4096);
	rbuf = calloc(1, 4096);
	char *spare = calloc(1, 4096);
	cmr = ibv_reg_mr(pd, cbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	rmr = ibv_reg_mr(pd, rbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(pd, spare, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cmr && rmr && smr, "alloc_pd, reg_mr");
	cc = ibv_create_comp_channel(ctx);
	int flags = fcntl(cc->fd, F_GETFL);
	fcntl(cc->fd, F_SETFL, flags | O_NONBLOCK);
	scq = ibv_create_cq(ctx, 64, (void *)0x77, cc, 0);
	ccq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cc && scq && ccq, "completion channel (non-blocking), CQs");

	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli;
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 &&
	      rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "create ids");
	struct sockaddr_in sin;
	listen_loopback(srv, 1, &sin);
	resolve(ch, cli, &sin);
	struct ibv_qp_init_attr qa = {
		.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(rdma_create_qp(cli, pd, &qa) == 0, "client QP");
	cqp = cli->qp;
	CHECK(rdma_connect(cli, NULL) == 0, "connect");
	struct rdma_cm_id *child = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(child, "CONNECT_REQUEST");
	qa.send_cq = qa.recv_cq = scq;
	CHECK(rdma_create_qp(child, pd, &qa) == 0, "server QP");
	sqp = child->qp;
	for (int i = 0; i < 4; i++)
		server_recv(i, rmr, rbuf + 64 * i);
	CHECK(rdma_accept(child, NULL) == 0, "accept");
	CHECK(established_both(ch), "ESTABLISHED on both sides");

	/* Notification semantics. The engine counts a notification before
	 * the completion that raised it becomes visible to ibv_poll_cq, so
	 * once the completion is polled, a notification that was raised is
	 * already on the channel. */
	CHECK(!event_now() && errno == EAGAIN, "nothing armed, nothing raised: EAGAIN");
	CHECK(ibv_req_notify_cq(scq, 1) == 0, "arm solicited-only");
	CHECK(client_send(10, 0) && server_got(0, IBV_WC_SUCCESS), "an unsolicited Send arrives");
	CHECK(!event_now() && errno == EAGAIN, "solicited-only: an unsolicited receive raises nothing");
	CHECK(client_send(11, 1) && event_within(), "solicited-only: a solicited Send raises one");
	CHECK(server_got(1, IBV_WC_SUCCESS), "its completion follows the notification");
	CHECK(client_send(12, 1) && server_got(2, IBV_WC_SUCCESS), "another solicited Send arrives");
	CHECK(!event_now() && errno == EAGAIN, "an arm fires once");
	CHECK(ibv_req_notify_cq(scq, 0) == 0, "arm for any completion");
	CHECK(client_send(13, 0) && event_within(), "any: an unsolicited Send raises one");
	CHECK(server_got(3, IBV_WC_SUCCESS), "its completion");
	CHECK(ibv_req_notify_cq(scq, 0) == 0 && ibv_req_notify_cq(scq, 1) == 0 &&
	      client_send(14, 0) && !event_now() && errno == EAGAIN,
	      "arming again before it fires changes the mode only");
	/* That Send found no posted receive: a Terminate, the server's QP
	 * goes to Error. Start over on a new connection below. */

	/* Objects in use. */
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with regions and QPs -> EBUSY");
	CHECK(ibv_destroy_cq(scq) == EBUSY, "destroy_cq used by a QP -> EBUSY");
	CHECK(ibv_destroy_comp_channel(cc) == EBUSY, "destroy_comp_channel with a CQ -> EBUSY");

	rdma_destroy_qp(child);
	rdma_destroy_qp(cli);
	rdma_destroy_id(child);
	rdma_destroy_id(cli);
	struct ibv_wc wc;
	while (ibv_poll_cq(scq, 1, &wc) > 0 || ibv_poll_cq(ccq, 1, &wc) > 0)
		;
	while (event_now())
		;

	/* A second connection: a receive whose region is deregistered
	 * while it is posted, then the peer's QP destroyed while receives
	 * are posted. */
	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "second client id");
	resolve(ch, cli, &sin);
	qa.send_cq = qa.recv_cq = ccq;
	CHECK(rdma_create_qp(cli, pd, &qa) == 0, "client QP");
	cqp = cli->qp;
	CHECK(rdma_connect(cli, NULL) == 0, "connect");
	child = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(child, "CONNECT_REQUEST");
	qa.send_cq = qa.recv_cq = scq;
	CHECK(rdma_create_qp(child, pd, &qa) == 0, "server QP");
	sqp = child->qp;
	server_recv(20, smr, spare);
	server_recv(21, rmr, rbuf);
	server_recv(22, rmr, rbuf + 64);
	CHECK(rdma_accept(child, NULL) == 0, "accept");
	CHECK(established_both(ch), "ESTABLISHED on both sides");
	CHECK(ibv_dereg_mr(smr) == 0, "dereg_mr of a region a posted receive uses");
	CHECK(ibv_req_notify_cq(scq, 1) == 0, "arm solicited-only");
	struct ibv_sge sge = { .addr = (uintptr_t)cbuf, .length = 8, .lkey = cmr->lkey };
	struct ibv_send_wr wr = { .wr_id = 30, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	CHECK(ibv_post_send(cqp, &wr, &bad) == 0, "a Send into it");
	CHECK(event_within(), "solicited-only: an unsuccessful completion raises one");
	CHECK(server_got(20, IBV_WC_LOC_PROT_ERR), "the receive fails with a local protection error");
	CHECK(server_got(21, IBV_WC_WR_FLUSH_ERR) && server_got(22, IBV_WC_WR_FLUSH_ERR),
	      "the QP is in Error: the other receives are flushed");
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(sqp, &at, IBV_QP_STATE, &qi) == 0 && at.qp_state == IBV_QPS_ERR,
	      "server QP in Error");

	/* Tear down with the peer's work outstanding. */
	server_recv(40, rmr, rbuf);
	CHECK(server_got(40, IBV_WC_WR_FLUSH_ERR), "a receive posted in Error completes flushed");
	rdma_destroy_qp(cli);
	rdma_destroy_qp(child);
	CHECK(rdma_destroy_id(child) == 0 && rdma_destroy_id(cli) == 0 && rdma_destroy_id(srv) == 0,
	      "destroy ids");
	while (ibv_poll_cq(scq, 1, &wc) > 0 || ibv_poll_cq(ccq, 1, &wc) > 0)
		;
	CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(ccq) == 0, "destroy_cq once its QPs are gone");
	CHECK(ibv_destroy_comp_channel(cc) == 0, "destroy_comp_channel once its CQ is gone");
	CHECK(ibv_dereg_mr(cmr) == 0 && ibv_dereg_mr(rmr) == 0 && ibv_dealloc_pd(pd) == 0,
	      "dereg_mr, dealloc_pd once nothing uses them");
	rdma_destroy_event_channel(ch);
	printf("events acknowledged: %u\nall ok\n", acked);
	return 0;
}
