/* Error paths of libiwarp_compat, run under LD_PRELOAD by tests/c_programs.rs.
 * Linked against the real libibverbs and librdmacm: every call below must
 * reach the preloaded library. Prints one line per check; exits non-zero
 * on the first failure. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common.h"

int main(void)
{
	int n = 0, flags;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	CHECK(!strcmp(ibv_get_device_name(list[0]), "iwarp0"), "named iwarp0");
	CHECK(list[0]->transport_type == IBV_TRANSPORT_IWARP && list[0]->node_type == IBV_NODE_RNIC,
	      "iWARP transport, RNIC node");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open");
	ibv_free_device_list(list);

	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0 && da.max_sge == 4 && da.max_sge_rd == 1,
	      "query_device limits");
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	      pa.link_layer == IBV_LINK_LAYER_ETHERNET, "query_port (inline, extended op)");
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "query_port bad port -> EINVAL");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	int bogus[64] = { 0 };
	CHECK(ibv_dealloc_pd((struct ibv_pd *)bogus) == EINVAL, "dealloc_pd bad handle -> EINVAL");
	CHECK(ibv_alloc_pd((struct ibv_context *)bogus) == NULL && errno == EINVAL,
	      "alloc_pd bad context -> EINVAL");

	char *buf = malloc(4096);
	errno = 0;
	CHECK(!ibv_reg_mr((struct ibv_pd *)bogus, buf, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "reg_mr bad pd -> EINVAL");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	      "reg_mr remote write without local write -> EINVAL");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND) && errno == EINVAL,
	      "reg_mr unsupported flag -> EINVAL");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr && mr->addr == buf && mr->length == 4096 && mr->lkey == mr->rkey, "reg_mr on own memory");

	struct ibv_comp_channel *cc = ibv_create_comp_channel(ctx);
	CHECK(cc && cc->fd >= 0, "create_comp_channel");
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 0, NULL, cc, 0) && errno == EINVAL, "create_cq 0 entries -> EINVAL");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, cc, 0);
	CHECK(cq, "create_cq");
	CHECK(ibv_destroy_comp_channel(cc) == EBUSY, "destroy busy comp channel -> EBUSY");
	CHECK(ibv_req_notify_cq(cq, 0) == 0 && ibv_req_notify_cq(cq, 1) == 0, "req_notify_cq (inline)");
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "poll_cq empty (inline)");
	CHECK(ibv_poll_cq(cq, -1, &wc) < 0, "poll_cq negative count -> error");
	flags = fcntl(cc->fd, F_GETFL);
	fcntl(cc->fd, F_SETFL, flags | O_NONBLOCK);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(cc, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "get_cq_event non-blocking, nothing -> EAGAIN");
	CHECK(ibv_resize_cq(cq, 32) == EOPNOTSUPP, "resize_cq -> EOPNOTSUPP");
	CHECK(ibv_destroy_cq((struct ibv_cq *)bogus) == EINVAL, "destroy_cq bad handle -> EINVAL");

	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 0, .max_sge = 1 } };
	errno = 0;
	CHECK(!ibv_create_srq(pd, &sa) && errno == EINVAL, "create_srq of 0 receives -> EINVAL");
	struct ibv_srq_init_attr_ex sx = { .attr = { .max_wr = 4, .max_sge = 1 },
					   .comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE,
					   .srq_type = IBV_SRQT_XRC, .pd = pd };
	errno = 0;
	CHECK(!ibv_create_srq_ex(ctx, &sx) && errno == EOPNOTSUPP, "create_srq_ex XRC -> EOPNOTSUPP");

	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	errno = 0;
	CHECK(!ibv_create_qp(pd, &qa) && errno == EOPNOTSUPP, "create_qp UD -> EOPNOTSUPP");
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_sge = 5;
	errno = 0;
	CHECK(!ibv_create_qp(pd, &qa) && errno == EINVAL, "create_qp 5 SGEs -> EINVAL");
	qa.cap.max_send_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	CHECK(qp && qp->qp_num != 0 && qp->state == IBV_QPS_RESET, "create_qp RC");
	errno = 0;
	CHECK(!ibv_qp_to_qp_ex(qp) && errno == EOPNOTSUPP, "qp_to_qp_ex -> EOPNOTSUPP");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND },
			   *bad_s = NULL;
	CHECK(ibv_post_send(qp, &swr, &bad_s) == EINVAL && bad_s == &swr,
	      "post_send unconnected -> EINVAL, bad_wr set (inline)");
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 5 }, *bad_r = NULL;
	CHECK(ibv_post_recv(qp, &rwr, &bad_r) == EINVAL && bad_r == &rwr, "post_recv 5 SGEs -> EINVAL");
	rwr.num_sge = 1;
	CHECK(ibv_post_recv(qp, &rwr, &bad_r) == 0, "post_recv before connect is kept");
	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT };
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0, "modify_qp INIT");
	CHECK(ibv_modify_qp((struct ibv_qp *)bogus, &at, IBV_QP_STATE) == EINVAL, "modify_qp bad handle -> EINVAL");
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(qp, &at, IBV_QP_STATE, &qi) == 0 && at.qp_state == IBV_QPS_INIT, "query_qp");
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_qp(qp) == EINVAL, "destroy_qp twice -> EINVAL");

	/* The connection manager. */
	struct rdma_cm_id *bad_id = NULL;
	errno = 0;
	CHECK(rdma_create_id(NULL, &bad_id, NULL, RDMA_PS_TCP) == 0 && rdma_destroy_id(bad_id) == 0,
	      "create_id without a channel (synchronous), destroy_id");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch && ch->fd >= 0, "create_event_channel");
	flags = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	struct rdma_cm_event *ev = NULL;
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "get_cm_event non-blocking, empty -> EAGAIN");
	errno = 0;
	CHECK(rdma_get_cm_event((struct rdma_event_channel *)bogus, &ev) == -1 && errno == EINVAL,
	      "get_cm_event bad channel -> EINVAL");
	errno = 0;
	CHECK(rdma_destroy_id((struct rdma_cm_id *)bogus) == -1 && errno == EINVAL, "destroy_id bad handle -> EINVAL");
	errno = 0;
	CHECK(rdma_create_id(ch, &bad_id, NULL, RDMA_PS_UDP) == -1 && errno == EOPNOTSUPP,
	      "create_id UDP port space -> EOPNOTSUPP");

	struct rdma_cm_id *srv, *cli;
	CHECK(rdma_create_id(ch, &srv, (void *)0x5, RDMA_PS_TCP) == 0, "create_id server");
	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "create_id client");
	errno = 0;
	uint8_t tos = 0x10;
	int one = 1;
	CHECK(rdma_set_option(cli, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) == 0 &&
	      rdma_set_option(cli, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof one) == 0 &&
	      rdma_set_option(cli, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one) == 0,
	      "set_option TOS, REUSEADDR, AFONLY accepted");
	errno = 0;
	CHECK(rdma_set_option(cli, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof one) == -1 && errno == EINVAL,
	      "set_option TOS with an int -> EINVAL");
	errno = 0;
	CHECK(rdma_set_option(cli, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &one, sizeof one) == -1 && errno == EINVAL,
	      "set_option IB path -> EINVAL");
	errno = 0;
	CHECK(rdma_set_option(cli, RDMA_OPTION_ID, 99, &one, sizeof one) == -1 && errno == ENOSYS,
	      "set_option unknown -> ENOSYS");
	errno = 0;
	CHECK(rdma_resolve_route(cli, 1000) == -1 && errno == EINVAL, "resolve_route before addr -> EINVAL");
	errno = 0;
	CHECK(rdma_listen(srv, 1) == -1 && errno == EINVAL, "listen unbound -> EINVAL");
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_bind_addr(srv, (struct sockaddr *)&sin) == 0 && rdma_listen(srv, 1) == 0, "bind, listen port 0");
	sin.sin_port = rdma_get_src_port(srv);
	CHECK(sin.sin_port != 0, "listener port known");

	CHECK(rdma_resolve_addr(cli, NULL, (struct sockaddr *)&sin, 1000) == 0, "resolve_addr");
	ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && ev->id == cli && ev->status == 0,
	      "ADDR_RESOLVED");
	CHECK(rdma_ack_cm_event(ev) == 0, "ack");
	CHECK(rdma_resolve_route(cli, 1000) == 0, "resolve_route");
	ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_ROUTE_RESOLVED, "ROUTE_RESOLVED");
	rdma_ack_cm_event(ev);
	errno = 0;
	CHECK(rdma_connect(cli, NULL) == -1 && errno == EINVAL, "connect without a QP -> EINVAL");
	qa.send_cq = qa.recv_cq = cq;
	CHECK(rdma_create_qp(cli, pd, &qa) == 0 && cli->qp && cli->qp->state == IBV_QPS_INIT, "rdma_create_qp");
	const char hello[] = "hello";
	struct rdma_conn_param cp = { .private_data = hello, .private_data_len = sizeof hello,
				      .responder_resources = 1, .initiator_depth = 1 };
	CHECK(rdma_connect(cli, &cp) == 0, "connect started");
	ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id == srv &&
	      ev->id->context == (void *)0x5 && ev->param.conn.private_data_len == sizeof hello &&
	      !memcmp(ev->param.conn.private_data, hello, sizeof hello), "CONNECT_REQUEST with private data");
	struct rdma_cm_id *child = ev->id;
	rdma_ack_cm_event(ev);
	const char no[] = "no thanks";
	CHECK(rdma_reject(child, no, sizeof no) == 0, "reject");
	errno = 0;
	CHECK(rdma_accept(child, NULL) == -1 && errno == EINVAL, "accept after reject -> EINVAL");
	ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_REJECTED && ev->id == cli && ev->status != 0 &&
	      ev->param.conn.private_data_len == sizeof no && !memcmp(ev->param.conn.private_data, no, sizeof no),
	      "REJECTED with the reject's private data");
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(child) == 0, "destroy child");
	rdma_destroy_qp(cli);
	CHECK(rdma_destroy_id(cli) == 0 && rdma_destroy_id(srv) == 0, "destroy ids");

	/* Nobody listens: REJECTED (connection refused), as librdmacm reports
	 * a refused iWARP connect. */
	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_resolve_addr(cli, NULL, (struct sockaddr *)&sin, 1000) == 0, "resolve_addr");
	ev = next_event(ch);
	rdma_ack_cm_event(ev);
	rdma_resolve_route(cli, 1000);
	ev = next_event(ch);
	rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(cli, pd, &qa) == 0, "rdma_create_qp");
	CHECK(rdma_connect(cli, NULL) == 0, "connect to a closed port");
	ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_REJECTED && ev->status == -ECONNREFUSED, "REJECTED, -ECONNREFUSED");
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(cli);
	rdma_destroy_id(cli);
	rdma_destroy_event_channel(ch);

	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7174", &hints, &res) == 0 && res->ai_src_addr &&
	      ((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7174), "getaddrinfo passive");
	rdma_freeaddrinfo(res);
	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED"), "event_str");

	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(mr) == EINVAL, "dereg_mr twice -> EINVAL");
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_comp_channel(cc) == 0, "destroy cq, channel");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	printf("all ok\n");
	return 0;
}
