/* Asynchronous events of QPs in libiwarp_compat, run under LD_PRELOAD by
 * tests/c_programs.rs: two connections through rdma_cm on loopback in one
 * process (one context). On the first, an RDMA Write to an rkey that
 * names nothing: the server's QP raises IBV_EVENT_QP_ACCESS_ERR, the
 * client's IBV_EVENT_QP_FATAL (the server's Terminate), taken with the
 * async fd non-blocking and then blocking, and both IDs get
 * RDMA_CM_EVENT_DISCONNECTED; ibv_destroy_qp waits for the
 * ack of an event handed out. On the second, whose server QP is on an
 * SRQ, an orderly disconnect: IBV_EVENT_QP_LAST_WQE_REACHED on the
 * server's QP and nothing else. Prints one line per check; exits non-zero
 * on the first failure (a watchdog ends a hang). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common.h"

static struct rdma_event_channel *ch;
static struct ibv_pd *pd;
static struct sockaddr_in sin;

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

static void set_nonblocking(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK) == 0,
	      on ? "async_fd non-blocking" : "async_fd blocking");
}

/* Connect a new client ID to the listener; the server's QP takes its
 * receives from `srq` when given. */
static void connect_pair(struct rdma_cm_id **cli, struct rdma_cm_id **child, struct ibv_srq *srq)
{
	CHECK(rdma_create_id(ch, cli, NULL, RDMA_PS_TCP) == 0, "create client id");
	resolve(ch, *cli, &sin);
	struct ibv_qp_init_attr ca = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(rdma_create_qp(*cli, pd, &ca) == 0, "client rdma_create_qp");
	struct rdma_conn_param cp = { .responder_resources = 4, .initiator_depth = 4 };
	CHECK(rdma_connect(*cli, &cp) == 0, "connect");
	*child = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(*child, "CONNECT_REQUEST");
	struct ibv_qp_init_attr sa = {
		.srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	CHECK(rdma_create_qp(*child, pd, &sa) == 0, "server rdma_create_qp");
	CHECK(rdma_accept(*child, &cp) == 0, "accept");
	CHECK(established_both(ch), "ESTABLISHED on both sides");
}

struct destroy_arg {
	struct rdma_cm_id *id;
	volatile int done;
};

static void *destroy_thread(void *p)
{
	struct destroy_arg *a = p;
	rdma_destroy_qp(a->id);
	a->done = 1;
	return NULL;
}

int main(void)
{
	/* A hang (an event that never comes, a destroy that never returns)
	 * fails the test. */
	alarm(60);
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_srq_init_attr sra = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sra);
	CHECK(srq, "create_srq");
	int afd = ctx->async_fd;
	struct ibv_async_event aev;

	ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli_a, *child_a, *cli_b, *child_b;
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0, "create listening id");
	listen_loopback(srv, 4, &sin);
	connect_pair(&cli_a, &child_a, NULL);
	connect_pair(&cli_b, &child_b, srq);
	struct ibv_qp *cqp_a = cli_a->qp, *sqp_a = child_a->qp, *sqp_b = child_b->qp;

	set_nonblocking(afd, 1);
	errno = 0;
	CHECK(!readable(afd, 0) && ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN,
	      "connected: no event, non-blocking get -> EAGAIN");

	/* An RDMA Write to an rkey that names nothing: the server terminates
	 * the connection. */
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = { .remote_addr = 0, .rkey = 0x7fffff00 } },
			   *bad = NULL;
	CHECK(ibv_post_send(cqp_a, &wr, &bad) == 0, "RDMA Write to an invalid rkey posted");

	/* Two events: one taken non-blocking, one blocking, in either
	 * order. */
	struct ibv_async_event got[2];
	CHECK(readable(afd, 10000), "async_fd readable");
	CHECK(ibv_get_async_event(ctx, &got[0]) == 0, "get_async_event non-blocking");
	set_nonblocking(afd, 0);
	CHECK(ibv_get_async_event(ctx, &got[1]) == 0, "get_async_event blocking");
	int access = -1, fatal = -1;
	for (int k = 0; k < 2; k++) {
		if (got[k].event_type == IBV_EVENT_QP_ACCESS_ERR && got[k].element.qp == sqp_a)
			access = k;
		if (got[k].event_type == IBV_EVENT_QP_FATAL && got[k].element.qp == cqp_a)
			fatal = k;
	}
	CHECK(access >= 0, "QP_ACCESS_ERR on the server's QP (the responder)");
	CHECK(fatal >= 0, "QP_FATAL on the client's QP (the peer's Terminate)");
	set_nonblocking(afd, 1);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN, "one event per QP");
	/* The Terminate ends the connection: DISCONNECTED on both IDs. */
	CHECK(disconnected_both(ch, cli_a, child_a), "terminated: DISCONNECTED on both sides");

	/* The server's QP: acked, then destroyed. */
	ibv_ack_async_event(&got[access]);
	rdma_destroy_qp(child_a);
	CHECK(child_a->qp == NULL, "destroy_qp after the ack");
	/* The client's QP: its destroy waits for the ack. */
	struct destroy_arg da = { .id = cli_a, .done = 0 };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, destroy_thread, &da) == 0, "destroy_qp in a thread");
	struct timespec ts = { 0, 200000000 };
	nanosleep(&ts, NULL);
	CHECK(!da.done, "destroy_qp waits while an event is not acked");
	ibv_ack_async_event(&got[fatal]);
	CHECK(pthread_join(t, NULL) == 0 && da.done && cli_a->qp == NULL,
	      "destroy_qp returns once the event is acked");

	/* The second connection: an orderly disconnect. The server's QP is
	 * on the SRQ: LAST_WQE_REACHED (taken blocking), nothing else. */
	CHECK(rdma_disconnect(cli_b) == 0, "disconnect");
	set_nonblocking(afd, 0);
	CHECK(ibv_get_async_event(ctx, &aev) == 0 && aev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
	      aev.element.qp == sqp_b, "QP_LAST_WQE_REACHED on the SRQ's QP (blocking get)");
	ibv_ack_async_event(&aev);
	CHECK(disconnected_both(ch, cli_b, child_b), "DISCONNECTED on both sides");
	set_nonblocking(afd, 1);
	errno = 0;
	CHECK(!readable(afd, 0) && ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN,
	      "orderly disconnect: no QP_FATAL, no other event");

	rdma_destroy_qp(child_b);
	rdma_destroy_qp(cli_b);
	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	rdma_destroy_id(cli_a);
	rdma_destroy_id(child_a);
	rdma_destroy_id(cli_b);
	rdma_destroy_id(child_b);
	rdma_destroy_id(srv);
	rdma_destroy_event_channel(ch);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	printf("all ok\n");
	return 0;
}
