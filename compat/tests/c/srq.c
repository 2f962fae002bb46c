/* Shared receive queues and asynchronous events of libiwarp_compat, run
 * under LD_PRELOAD by tests/c_programs.rs: three server QPs of one process
 * on one SRQ (two by rdma_create_qp, one by ibv_create_qp_ex and
 * rdma_accept with its number), each with its own CQ, connected through
 * rdma_cm on loopback to three clients; the SRQ's limit event, then its
 * exhaustion and the QP events it raises. Prints one line per check;
 * exits non-zero on the first failure. */
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
#include <rdma/rdma_verbs.h>

#include "common.h"

#define QPS 3
#define SLOT 256
#define SLOTS 16

static struct ibv_srq *srq;
static char *rbuf, *cbuf;
static struct ibv_mr *rmr, *cmr;
static struct ibv_qp *cqp[QPS], *sqp[QPS];
static struct ibv_cq *ccq[QPS], *rcq[QPS];
/* Receives posted on the SRQ and taken so far. */
static unsigned posted, taken;

static int srq_recv(void)
{
	unsigned k = posted % SLOTS;
	struct ibv_sge sge = { .addr = (uintptr_t)rbuf + SLOT * k, .length = SLOT,
			       .lkey = rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1000 + posted, .sg_list = &sge, .num_sge = 1 }, *bad;
	int r = ibv_post_srq_recv(srq, &wr, &bad);
	if (r == 0)
		posted++;
	return r;
}

/* Client `i` sends its message `m` (16 bytes); 0 if posting failed. */
static int client_send(int i, int m, uint64_t wr_id)
{
	char *at = cbuf + SLOT * i;
	snprintf(at, 16, "client %d msg %d", i, m);
	struct ibv_sge sge = { .addr = (uintptr_t)at, .length = 16, .lkey = cmr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	return ibv_post_send(cqp[i], &wr, &bad) == 0;
}

/* Client `i`'s message `m` arrived in the oldest receive of the SRQ, on
 * the CQ of server QP `i` with its qp_num, and on no other CQ. */
static int arrived(int i, int m)
{
	struct ibv_wc wc;
	if (poll_one(rcq[i], &wc) != 1)
		return 0;
	char want[16];
	snprintf(want, 16, "client %d msg %d", i, m);
	unsigned k = taken % SLOTS;
	uint64_t id = 1000 + taken++;
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.wr_id != id ||
	    wc.qp_num != sqp[i]->qp_num || wc.byte_len != 16 ||
	    memcmp(rbuf + SLOT * k, want, 16)) {
		fprintf(stderr, "completion: wr_id %llu (want %llu) status %d qp_num %u (want %u)\n",
			(unsigned long long)wc.wr_id, (unsigned long long)id, wc.status,
			wc.qp_num, sqp[i]->qp_num);
		return 0;
	}
	for (int j = 0; j < QPS; j++)
		if (j != i && ibv_poll_cq(rcq[j], 1, &wc) != 0)
			return 0;
	struct ibv_wc cw;
	return poll_one(ccq[i], &cw) == 1 && cw.status == IBV_WC_SUCCESS;
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0 && da.max_srq > 0 && da.max_srq_wr > 0 &&
	      da.max_srq_sge == 4, "query_device: SRQ limits");
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd && pd2, "alloc_pd");
	rbuf = calloc(SLOTS, SLOT);
	cbuf = calloc(QPS, SLOT);
	rmr = ibv_reg_mr(pd, rbuf, SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
	cmr = ibv_reg_mr(pd, cbuf, QPS * SLOT, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr && cmr, "reg_mr");

	/* Creation, attributes and bad arguments. */
	char bogus[256] = { 0 };
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 5 } };
	errno = 0;
	CHECK(!ibv_create_srq((struct ibv_pd *)bogus, &sa) && errno == EINVAL,
	      "create_srq bad PD -> EINVAL");
	errno = 0;
	CHECK(!ibv_create_srq(pd, &sa) && errno == EINVAL, "create_srq 5 SGEs -> EINVAL");
	sa.attr.max_sge = 1;
	sa.attr.srq_limit = 3;
	srq = ibv_create_srq(pd, &sa);
	CHECK(srq && srq->pd == pd && srq->context == ctx, "create_srq");
	struct ibv_srq_attr qa;
	struct ibv_srq *other = ibv_create_srq(pd2, &sa);
	CHECK(other && ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with an SRQ in it -> EBUSY");
	CHECK(ibv_destroy_srq(other) == 0, "destroy_srq");
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.max_wr == 16 && qa.max_sge == 1 &&
	      qa.srq_limit == 0, "query_srq: 16 x 1, limit disarmed at creation");
	qa.max_wr = 32;
	CHECK(ibv_modify_srq(srq, &qa, IBV_SRQ_MAX_WR) == EOPNOTSUPP,
	      "modify_srq MAX_WR -> EOPNOTSUPP");
	qa.srq_limit = 17;
	CHECK(ibv_modify_srq(srq, &qa, IBV_SRQ_LIMIT) == EINVAL,
	      "modify_srq limit above max_wr -> EINVAL");
	CHECK(ibv_modify_srq((struct ibv_srq *)bogus, &qa, IBV_SRQ_LIMIT) == EINVAL &&
	      ibv_query_srq((struct ibv_srq *)bogus, &qa) == EINVAL &&
	      ibv_destroy_srq((struct ibv_srq *)bogus) == EINVAL,
	      "modify/query/destroy_srq bad handle -> EINVAL");
	struct ibv_sge big[2] = { { (uintptr_t)rbuf, 8, rmr->lkey }, { (uintptr_t)rbuf + 8, 8, rmr->lkey } };
	struct ibv_recv_wr two = { .wr_id = 1, .sg_list = big, .num_sge = 2 }, *bad = NULL;
	CHECK(ibv_post_srq_recv(srq, &two, &bad) == EINVAL && bad == &two,
	      "post_srq_recv beyond max_sge -> EINVAL, bad_wr set");

	/* No event yet: the async fd is not readable, a non-blocking get
	 * fails with EAGAIN. */
	int afd = ctx->async_fd;
	CHECK(fcntl(afd, F_SETFL, fcntl(afd, F_GETFL) | O_NONBLOCK) == 0, "async_fd non-blocking");
	struct ibv_async_event aev;
	errno = 0;
	CHECK(!readable(afd, 0) && ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN,
	      "get_async_event non-blocking, none -> EAGAIN");
	errno = 0;
	CHECK(ibv_get_async_event((struct ibv_context *)bogus, &aev) == -1 && errno == EINVAL,
	      "get_async_event bad context -> EINVAL");

	for (int i = 0; i < QPS; i++) {
		ccq[i] = ibv_create_cq(ctx, 32, NULL, NULL, 0);
		rcq[i] = ibv_create_cq(ctx, 32, NULL, NULL, 0);
		CHECK(ccq[i] && rcq[i], "create_cq");
	}
	struct ibv_qp_init_attr wrong = {
		.send_cq = rcq[0], .recv_cq = rcq[0], .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
	};
	errno = 0;
	CHECK(!ibv_create_qp(pd2, &wrong) && errno == EINVAL, "create_qp with an SRQ of another PD -> EINVAL");
	wrong.srq = (struct ibv_srq *)bogus;
	errno = 0;
	CHECK(!ibv_create_qp(pd, &wrong) && errno == EINVAL, "create_qp with a bad SRQ -> EINVAL");

	/* Three connections; the server's QPs take their receives from the
	 * SRQ. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli[QPS], *child[QPS];
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0, "create listening id");

	/* An ID's own SRQ (rdma_create_srq): its QPs take it. */
	struct rdma_cm_id *tmp;
	CHECK(rdma_create_id(ch, &tmp, NULL, RDMA_PS_TCP) == 0, "create id");
	struct ibv_srq_init_attr ia = { .attr = { .max_wr = 4, .max_sge = 1 } };
	CHECK(rdma_create_srq(tmp, pd, &ia) == 0 && tmp->srq && tmp->srq->pd == pd,
	      "rdma_create_srq sets id->srq");
	errno = 0;
	CHECK(rdma_create_srq(tmp, pd, &ia) == -1 && errno == EINVAL, "a second rdma_create_srq -> EINVAL");
	struct ibv_qp_init_attr ta = {
		.send_cq = rcq[0], .recv_cq = rcq[0], .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(rdma_create_qp(tmp, pd, &ta) == 0 && tmp->qp->srq == tmp->srq,
	      "rdma_create_qp without an SRQ takes the ID's");
	rdma_destroy_qp(tmp);
	rdma_destroy_srq(tmp);
	CHECK(!tmp->srq, "rdma_destroy_srq");
	struct ibv_srq_init_attr_ex ix = { .attr = { .max_wr = 4, .max_sge = 1 },
					   .comp_mask = IBV_SRQ_INIT_ATTR_TYPE, .srq_type = IBV_SRQT_XRC };
	errno = 0;
	CHECK(rdma_create_srq_ex(tmp, &ix) == -1 && errno == EOPNOTSUPP && !tmp->srq,
	      "rdma_create_srq_ex XRC -> EOPNOTSUPP");
	rdma_destroy_id(tmp);
	struct sockaddr_in sin;
	listen_loopback(srv, QPS, &sin);
	for (int i = 0; i < QPS; i++) {
		CHECK(rdma_create_id(ch, &cli[i], NULL, RDMA_PS_TCP) == 0, "create client id");
		resolve(ch, cli[i], &sin);
		struct ibv_qp_init_attr ca = {
			.send_cq = ccq[i], .recv_cq = ccq[i], .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		CHECK(rdma_create_qp(cli[i], pd, &ca) == 0, "client rdma_create_qp");
		cqp[i] = cli[i]->qp;
		struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4 };
		CHECK(rdma_connect(cli[i], &cp) == 0, "connect");
		child[i] = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		CHECK(child[i], "CONNECT_REQUEST");
		struct rdma_conn_param ap = { .responder_resources = 4, .initiator_depth = 4 };
		if (i < 2) {
			struct ibv_qp_init_attr a = {
				.send_cq = rcq[i], .recv_cq = rcq[i], .srq = srq, .qp_type = IBV_QPT_RC,
				.cap = { .max_send_wr = 4, .max_recv_wr = 64, .max_send_sge = 1,
					 .max_recv_sge = 1 },
			};
			CHECK(rdma_create_qp(child[i], pd, &a) == 0 && child[i]->qp->srq == srq &&
			      a.cap.max_recv_wr == 0, "rdma_create_qp on the SRQ: no receive queue of its own");
			sqp[i] = child[i]->qp;
		} else {
			struct ibv_qp_init_attr_ex a = {
				.send_cq = rcq[i], .recv_cq = rcq[i], .srq = srq, .qp_type = IBV_QPT_RC,
				.cap = { .max_send_wr = 4, .max_send_sge = 1 },
				.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd,
			};
			sqp[i] = ibv_create_qp_ex(ctx, &a);
			CHECK(sqp[i] && sqp[i]->srq == srq, "ibv_create_qp_ex on the SRQ");
			ap.qp_num = sqp[i]->qp_num;
		}
		struct ibv_qp_attr attr;
		struct ibv_qp_init_attr init;
		CHECK(ibv_query_qp(sqp[i], &attr, 0, &init) == 0 && init.srq == srq, "query_qp names the SRQ");
		struct ibv_sge s = { (uintptr_t)rbuf, 16, rmr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 7, .sg_list = &s, .num_sge = 1 }, *rbad = NULL;
		CHECK(ibv_post_recv(sqp[i], &rw, &rbad) == EINVAL && rbad == &rw,
		      "post_recv on a QP of the SRQ -> EINVAL");
		CHECK(rdma_accept(child[i], &ap) == 0, "accept");
		CHECK(established_both(ch), "ESTABLISHED on both sides");
	}
	errno = 0;
	CHECK(ibv_destroy_srq(srq) == EBUSY, "destroy_srq while QPs use it -> EBUSY");

	/* Nine receives, limit 4; each client sends in turn. */
	for (int k = 0; k < 9; k++)
		CHECK(srq_recv() == 0, "post_srq_recv");
	qa.srq_limit = 4;
	CHECK(ibv_modify_srq(srq, &qa, IBV_SRQ_LIMIT) == 0, "modify_srq arms the limit at 4");
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 4, "query_srq: limit 4");
	for (int m = 0; m < 2; m++)
		for (int i = 0; i < QPS; i++) {
			CHECK(client_send(i, m, 10 * i + m), "client send");
			CHECK(arrived(i, m), "the oldest receive, on the consuming QP's CQ with its qp_num");
			if (taken == 5) {
				errno = 0;
				CHECK(!readable(afd, 0) && ibv_get_async_event(ctx, &aev) == -1 &&
				      errno == EAGAIN, "4 left: no event");
			}
		}

	/* The sixth receive taken left 3: the limit event. */
	CHECK(readable(afd, 10000), "async_fd readable with the limit event");
	CHECK(ibv_get_async_event(ctx, &aev) == 0 && aev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
	      aev.element.srq == srq, "get_async_event: SRQ_LIMIT_REACHED with the SRQ");
	ibv_ack_async_event(&aev);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN, "one event only");
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 0, "the limit disarmed");

	/* Exhaustion: the three left are taken, then client 0's Send finds
	 * the SRQ empty: the server terminates its connection. */
	for (int i = 0; i < QPS; i++) {
		CHECK(client_send(i, 2, 100 + i), "client send");
		CHECK(arrived(i, 2), "the last receives");
	}
	CHECK(client_send(0, 3, 200), "client 0 sends into an empty SRQ");
	/* The Send completes locally once handed to TCP (iWARP); the
	 * server's Terminate moves client 0's QP to Error, after which its
	 * Sends complete with a flush status. */
	struct ibv_wc wc;
	CHECK(poll_one(ccq[0], &wc) == 1 && wc.wr_id == 200, "client 0's Send completes");
	int flushed = 0;
	for (int k = 0; k < 1000 && !flushed; k++) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
		if (!client_send(0, 4, 300 + k) || poll_one(ccq[0], &wc) != 1)
			break;
		flushed = wc.status == IBV_WC_WR_FLUSH_ERR;
	}
	CHECK(flushed, "the Terminate moved client 0's QP to Error: its Sends are flushed");
	/* The QP events: server QP 0 found no receive (QP_FATAL, then
	 * LAST_WQE_REACHED: it takes nothing more from the SRQ), client 0
	 * got the Terminate (QP_FATAL); all acked. */
	int fatal_s = 0, last = 0, fatal_c = 0;
	for (int k = 0; k < 3; k++) {
		CHECK(readable(afd, 10000) && ibv_get_async_event(ctx, &aev) == 0, "get_async_event");
		if (aev.event_type == IBV_EVENT_QP_FATAL && aev.element.qp == sqp[0])
			fatal_s += !last;
		else if (aev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && aev.element.qp == sqp[0])
			last++;
		else if (aev.event_type == IBV_EVENT_QP_FATAL && aev.element.qp == cqp[0])
			fatal_c++;
		ibv_ack_async_event(&aev);
	}
	CHECK(fatal_s == 1 && last == 1 && fatal_c == 1,
	      "QP_FATAL then QP_LAST_WQE_REACHED on server QP 0, QP_FATAL on client 0");
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN, "no other QP event");
	CHECK(ibv_poll_cq(rcq[0], 1, &wc) == 0, "server QP 0 held no receive: nothing flushed");
	CHECK(srq_recv() == 0, "post_srq_recv again");
	CHECK(client_send(1, 3, 201) && arrived(1, 3), "the other QPs go on");

	/* Teardown: the SRQ goes with receives outstanding once its QPs are
	 * gone. */
	for (int i = 0; i < QPS; i++)
		rdma_disconnect(cli[i]);
	for (int i = 0; i < QPS; i++) {
		if (i < 2)
			rdma_destroy_qp(child[i]);
		else
			CHECK(ibv_destroy_qp(sqp[i]) == 0, "destroy_qp");
		if (i < QPS - 1)
			CHECK(ibv_destroy_srq(srq) == EBUSY, "EBUSY while a QP is left");
	}
	CHECK(srq_recv() == 0 && srq_recv() == 0, "two receives outstanding");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq with receives outstanding");
	bad = NULL;
	CHECK(srq_recv() == EINVAL, "post_srq_recv on a destroyed SRQ -> EINVAL");
	CHECK(ibv_query_srq(srq, &qa) == EINVAL && ibv_destroy_srq(srq) == EINVAL,
	      "query/destroy of a destroyed SRQ -> EINVAL");
	for (int i = 0; i < QPS; i++) {
		rdma_destroy_qp(cli[i]);
		rdma_destroy_id(cli[i]);
		rdma_destroy_id(child[i]);
	}
	rdma_destroy_id(srv);
	rdma_destroy_event_channel(ch);
	printf("all ok\n");
	return 0;
}
