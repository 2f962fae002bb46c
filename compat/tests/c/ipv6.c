/* The connection manager over IPv6 on loopback (::1), run under
 * LD_PRELOAD by tests/c_programs.rs: rdma_getaddrinfo with a numeric
 * IPv6 host, bind, listen, resolve and connect with AF_INET6 addresses,
 * the addresses every ID and event shows, a Send and an RDMA Write with
 * their bytes checked, and a listener on [::] with AFONLY taking IPv6
 * clients and no IPv4 one. Prints one line per check; exits non-zero on
 * the first failure. */
#include "common.h"

static int is_loopback6(const struct sockaddr *sa)
{
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
	return sa->sa_family == AF_INET6 && !memcmp(&s6->sin6_addr, &in6addr_loopback, sizeof(in6addr_loopback));
}

static uint16_t port_of(const struct sockaddr *sa)
{
	return ((const struct sockaddr_in6 *)sa)->sin6_port;
}

/* Resolve the address and route of `cli` to `to` (any family). */
static void resolve_any(struct rdma_event_channel *ch, struct rdma_cm_id *cli, struct sockaddr *to)
{
	CHECK(rdma_resolve_addr(cli, NULL, to, 1000) == 0, "resolve_addr");
	CHECK(take_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == cli, "ADDR_RESOLVED");
	CHECK(rdma_resolve_route(cli, 1000) == 0, "resolve_route");
	CHECK(take_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == cli, "ROUTE_RESOLVED");
}

int main(void)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE | RAI_NUMERICHOST, .ai_port_space = RDMA_PS_TCP };
	struct rdma_addrinfo *res = NULL;
	CHECK(rdma_getaddrinfo("::1", "0", &hints, &res) == 0 && res->ai_family == AF_INET6 &&
		      res->ai_src_len == sizeof(struct sockaddr_in6) && is_loopback6(res->ai_src_addr),
	      "getaddrinfo ::1 numeric, passive: an AF_INET6 source");

	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli;
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0, "server ID");
	CHECK(rdma_bind_addr(srv, res->ai_src_addr) == 0 && rdma_listen(srv, 4) == 0, "bind and listen on [::1]");
	rdma_freeaddrinfo(res);
	struct sockaddr *l = rdma_get_local_addr(srv);
	CHECK(is_loopback6(l) && port_of(l) != 0 && port_of(l) == rdma_get_src_port(srv),
	      "listener shows [::1] and the port it took");
	struct sockaddr_in6 to = *(struct sockaddr_in6 *)l;

	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "client ID");
	resolve_any(ch, cli, (struct sockaddr *)&to);
	CHECK(is_loopback6(rdma_get_local_addr(cli)) && is_loopback6(rdma_get_peer_addr(cli)) &&
		      rdma_get_dst_port(cli) == to.sin6_port,
	      "resolved: source and destination [::1]");

	struct ibv_pd *pd = ibv_alloc_pd(cli->verbs);
	struct ibv_cq *ccq = ibv_create_cq(cli->verbs, 8, NULL, NULL, 0);
	struct ibv_cq *scq = ibv_create_cq(cli->verbs, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = { .send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK(pd && ccq && scq && rdma_create_qp(cli, pd, &qa) == 0, "client QP");
	const char hello[] = "hello over IPv6";
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .private_data = hello,
				      .private_data_len = sizeof(hello) };
	CHECK(rdma_connect(cli, &cp) == 0, "connect");
	struct rdma_cm_event *ev = next_event(ch);
	CHECK(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->param.conn.private_data_len >= sizeof(hello) &&
		      !memcmp(ev->param.conn.private_data, hello, sizeof(hello)),
	      "CONNECT_REQUEST with the private data");
	struct rdma_cm_id *conn = ev->id;
	rdma_ack_cm_event(ev);
	CHECK(is_loopback6(rdma_get_local_addr(conn)) && port_of(rdma_get_local_addr(conn)) == to.sin6_port &&
		      is_loopback6(rdma_get_peer_addr(conn)),
	      "the request's addresses: the listener's and the client's");
	qa.send_cq = qa.recv_cq = scq;
	struct rdma_conn_param sp = { .responder_resources = 1, .initiator_depth = 1 };
	CHECK(rdma_create_qp(conn, pd, &qa) == 0 && rdma_accept(conn, &sp) == 0, "accept");
	CHECK(established_both(ch), "both ESTABLISHED");
	CHECK(port_of(rdma_get_peer_addr(conn)) == port_of(rdma_get_local_addr(cli)) &&
		      rdma_get_src_port(cli) == port_of(rdma_get_local_addr(cli)) && rdma_get_src_port(cli) != 0,
	      "established: the client's port is the one the server sees");

	/* An RDMA Write of 4 KiB, then a Send: the Send's receive completes
	 * after the Write is placed. */
	enum { N = 4096 };
	char *src = malloc(N), *dst = calloc(1, N), msg[64] = "the Send after the Write", got[64] = { 0 };
	for (int i = 0; i < N; i++)
		src[i] = (char)(i * 7 + 3);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, N, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, N, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *mmr = ibv_reg_mr(pd, msg, sizeof(msg), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *gmr = ibv_reg_mr(pd, got, sizeof(got), IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr && dmr && mmr && gmr, "memory registered");
	struct ibv_sge rs = { .addr = (uintptr_t)got, .length = sizeof(got), .lkey = gmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(conn->qp, &rwr, &rbad) == 0, "post_recv");
	struct ibv_sge ws = { .addr = (uintptr_t)src, .length = N, .lkey = smr->lkey };
	struct ibv_sge ss = { .addr = (uintptr_t)msg, .length = sizeof(msg), .lkey = mmr->lkey };
	struct ibv_send_wr send = { .wr_id = 3, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				    .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr write = { .wr_id = 2, .next = &send, .sg_list = &ws, .num_sge = 1,
				     .opcode = IBV_WR_RDMA_WRITE,
				     .wr.rdma = { .remote_addr = (uintptr_t)dst, .rkey = dmr->rkey } },
			   *sbad;
	CHECK(ibv_post_send(cli->qp, &write, &sbad) == 0, "post Write and Send");
	struct ibv_wc wc;
	CHECK(poll_one(scq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.byte_len == sizeof(msg),
	      "the Send received");
	CHECK(poll_one(ccq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 3, "the Send completed");
	CHECK(!memcmp(got, msg, sizeof(msg)) && !memcmp(src, dst, N), "the Send's and the Write's bytes arrived");
	close_all(ch, cli, conn, srv);

	/* [::] with AFONLY: IPv6 clients connect, an IPv4 one is refused. */
	int one = 1;
	struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	CHECK(rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_set_option(srv, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)) == 0 &&
		      rdma_bind_addr(srv, (struct sockaddr *)&any6) == 0 && rdma_listen(srv, 4) == 0,
	      "AFONLY listener on [::]");
	to.sin6_port = rdma_get_src_port(srv);
	qa.send_cq = qa.recv_cq = ccq;
	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "IPv6 client ID");
	resolve_any(ch, cli, (struct sockaddr *)&to);
	CHECK(rdma_create_qp(cli, pd, &qa) == 0 && rdma_connect(cli, &sp) == 0, "connect to [::1] on its port");
	conn = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	qa.send_cq = qa.recv_cq = scq;
	CHECK(conn && is_loopback6(rdma_get_peer_addr(conn)) && rdma_create_qp(conn, pd, &qa) == 0 &&
		      rdma_accept(conn, &sp) == 0 && established_both(ch),
	      "AFONLY listener: established over IPv6");
	close_all(ch, cli, conn, srv);

	CHECK(rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_set_option(srv, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)) == 0 &&
		      rdma_bind_addr(srv, (struct sockaddr *)&any6) == 0 && rdma_listen(srv, 4) == 0,
	      "AFONLY listener on [::] again");
	struct sockaddr_in to4 = { .sin_family = AF_INET, .sin_port = rdma_get_src_port(srv),
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	qa.send_cq = qa.recv_cq = ccq;
	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "IPv4 client ID");
	resolve_any(ch, cli, (struct sockaddr *)&to4);
	CHECK(rdma_create_qp(cli, pd, &qa) == 0 && rdma_connect(cli, &sp) == 0, "connect to 127.0.0.1 on its port");
	ev = next_event(ch);
	CHECK(ev && ev->id == cli && (ev->event == RDMA_CM_EVENT_REJECTED || ev->event == RDMA_CM_EVENT_UNREACHABLE),
	      "AFONLY listener: the IPv4 client is refused");
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(cli);
	rdma_destroy_id(cli);
	rdma_destroy_id(srv);

	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_dereg_mr(mmr);
	ibv_dereg_mr(gmr);
	ibv_destroy_cq(ccq);
	ibv_destroy_cq(scq);
	ibv_dealloc_pd(pd);
	rdma_destroy_event_channel(ch);
	free(src);
	free(dst);
	printf("all ok\n");
	return 0;
}
