/* librdmacm's and libibverbs' helpers that middleware (libfabric, rsockets,
 * MPI transports) relies on, run under LD_PRELOAD by tests/c_programs.rs:
 * the string helpers against the real libraries' own (reached with
 * dlsym on their handles), device lists and indices, the fork status,
 * rdma_getaddrinfo with the addresses in the hints, rdma_notify, and
 * listeners on the IPv6 wildcard. Prints one line per check; exits
 * non-zero on the first failure. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "common.h"

typedef const char *(*str_fn)(int);

/* Every value from 0 to `last` + 4 (past the end: the "unknown" text)
 * gives the same text from `name` as preloaded and in `lib` itself. */
static int same_strings(void *lib, const char *name, str_fn ours, int last)
{
	str_fn theirs = (str_fn)dlsym(lib, name);
	if (!theirs || theirs == ours) {
		fprintf(stderr, "%s: the real library's symbol is not reachable\n", name);
		return 0;
	}
	for (int v = 0; v <= last + 4; v++) {
		if (strcmp(ours(v), theirs(v))) {
			fprintf(stderr, "%s(%d): \"%s\", libibverbs/librdmacm say \"%s\"\n", name, v, ours(v),
				theirs(v));
			return 0;
		}
	}
	return 1;
}

static struct sockaddr_in sin_of(const char *ip, int port)
{
	struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

static int same_sin(const struct sockaddr *a, socklen_t len, const struct sockaddr_in *b)
{
	const struct sockaddr_in *s = (const struct sockaddr_in *)a;
	return a && len == sizeof(*b) && s->sin_family == AF_INET && s->sin_port == b->sin_port &&
	       s->sin_addr.s_addr == b->sin_addr.s_addr;
}

int main(void)
{
	/* The real libraries, already loaded as the program's dependencies. */
	void *verbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
	void *cma = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_NOLOAD);
	CHECK(verbs && cma, "the real libibverbs and librdmacm are loaded");
	CHECK(same_strings(verbs, "ibv_wc_status_str", (str_fn)ibv_wc_status_str, IBV_WC_TM_RNDV_INCOMPLETE),
	      "ibv_wc_status_str: libibverbs' texts");
	CHECK(same_strings(verbs, "ibv_event_type_str", (str_fn)ibv_event_type_str, IBV_EVENT_WQ_FATAL),
	      "ibv_event_type_str: libibverbs' texts");
	CHECK(same_strings(verbs, "ibv_node_type_str", (str_fn)ibv_node_type_str, IBV_NODE_UNSPECIFIED),
	      "ibv_node_type_str: libibverbs' texts");
	CHECK(same_strings(verbs, "ibv_port_state_str", (str_fn)ibv_port_state_str, IBV_PORT_ACTIVE_DEFER),
	      "ibv_port_state_str: libibverbs' texts");
	CHECK(same_strings(cma, "rdma_event_str", (str_fn)rdma_event_str, RDMA_CM_EVENT_TIMEWAIT_EXIT),
	      "rdma_event_str: librdmacm's texts");

	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1 && ibv_get_device_index(list[0]) == 0, "ibv_get_device_index: 0");
	int bogus[64] = { 0 };
	CHECK(ibv_get_device_index((struct ibv_device *)bogus) == -1, "ibv_get_device_index, not a device: -1");
	ibv_free_device_list(list);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized: UNNEEDED");

	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 1 && devs[0] && !devs[1] && !strcmp(ibv_get_device_name(devs[0]->device), "iwarp0"),
	      "rdma_get_devices: iwarp0's context, NULL-terminated");
	struct ibv_device_attr da;
	CHECK(ibv_query_device(devs[0], &da) == 0, "query_device on rdma_get_devices' context");

	/* rdma_getaddrinfo with NULL node and service: the hints' addresses,
	 * as libfabric's verbs provider asks for them. */
	struct rdma_addrinfo *res = NULL;
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL,
	      "getaddrinfo without node, service or hints -> EINVAL");
	struct sockaddr_in src = sin_of("127.0.0.1", 0), dst = sin_of("127.0.0.1", 7471);
	struct rdma_addrinfo hints = {
		.ai_flags = 0,
		.ai_family = AF_INET,
		.ai_port_space = RDMA_PS_TCP,
		.ai_src_addr = (struct sockaddr *)&src,
		.ai_src_len = sizeof(src),
		.ai_dst_addr = (struct sockaddr *)&dst,
		.ai_dst_len = sizeof(dst),
	};
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res && res->ai_family == AF_INET &&
	      res->ai_port_space == RDMA_PS_TCP && same_sin(res->ai_src_addr, res->ai_src_len, &src) &&
	      same_sin(res->ai_dst_addr, res->ai_dst_len, &dst) && res->ai_src_addr != hints.ai_src_addr &&
	      res->ai_dst_addr != hints.ai_dst_addr,
	      "getaddrinfo(NULL, NULL, hints): copies of both addresses");
	rdma_freeaddrinfo(res);
	struct sockaddr_in from = sin_of("127.0.0.1", 0);
	struct rdma_addrinfo src_only = { .ai_src_addr = (struct sockaddr *)&from, .ai_src_len = sizeof(from) };
	CHECK(rdma_getaddrinfo("127.0.0.2", "7472", &src_only, &res) == 0 &&
	      same_sin(res->ai_dst_addr, res->ai_dst_len, &(struct sockaddr_in){ .sin_family = AF_INET,
									      .sin_port = htons(7472),
									      .sin_addr.s_addr = htonl(0x7f000002) }) &&
	      same_sin(res->ai_src_addr, res->ai_src_len, &from),
	      "getaddrinfo(node, service, hints): the destination resolved, the hints' source");
	rdma_freeaddrinfo(res);
	struct rdma_addrinfo passive = { .ai_flags = RAI_PASSIVE, .ai_src_addr = (struct sockaddr *)&src,
					 .ai_src_len = sizeof(src) };
	CHECK(rdma_getaddrinfo(NULL, NULL, &passive, &res) == 0 && (res->ai_flags & RAI_PASSIVE) &&
	      !res->ai_dst_addr && same_sin(res->ai_src_addr, res->ai_src_len, &src),
	      "getaddrinfo(NULL, NULL, passive hints): the source only");

	/* A connection made from those results, notified after it is up. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *srv, *cli;
	CHECK(ch && rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0,
	      "IDs");
	errno = 0;
	CHECK(rdma_notify(cli, IBV_EVENT_COMM_EST) == -1 && errno == EINVAL, "rdma_notify before a connection -> EINVAL");
	CHECK(rdma_bind_addr(srv, res->ai_src_addr) == 0 && rdma_listen(srv, 4) == 0, "listen on the passive result");
	struct sockaddr_in to = src;
	to.sin_port = rdma_get_src_port(srv);
	rdma_freeaddrinfo(res);
	struct rdma_addrinfo active = { .ai_dst_addr = (struct sockaddr *)&to, .ai_dst_len = sizeof(to) };
	CHECK(rdma_getaddrinfo(NULL, NULL, &active, &res) == 0, "getaddrinfo for the client");
	CHECK(rdma_resolve_addr(cli, res->ai_src_addr, res->ai_dst_addr, 1000) == 0 &&
	      take_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == cli && cli->verbs == devs[0],
	      "resolve_addr on the result: the context rdma_get_devices listed");
	rdma_freeaddrinfo(res);
	CHECK(rdma_resolve_route(cli, 1000) == 0 && take_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == cli, "route");
	struct ibv_pd *pd = ibv_alloc_pd(cli->verbs);
	struct ibv_cq *cq = ibv_create_cq(cli->verbs, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	CHECK(pd && cq && rdma_create_qp(cli, pd, &qa) == 0, "client QP");
	errno = 0;
	CHECK(!ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) && errno == EOPNOTSUPP,
	      "reg_dmabuf_mr -> EOPNOTSUPP");
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1 };
	CHECK(rdma_connect(cli, &cp) == 0, "connect");
	struct rdma_cm_id *conn = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(conn && rdma_create_qp(conn, pd, &qa) == 0 && rdma_accept(conn, &cp) == 0, "accept");
	CHECK(established_both(ch), "both ESTABLISHED");
	CHECK(rdma_notify(cli, IBV_EVENT_COMM_EST) == 0 && rdma_notify(conn, IBV_EVENT_COMM_EST) == 0,
	      "rdma_notify COMM_EST on both ends: 0");
	close_all(ch, cli, conn, srv);

	/* The IPv6 wildcard: without AFONLY it serves IPv4 on its port and
	 * shows [::]:port; with AFONLY it binds and listens beside an IPv4
	 * listener on the same port. */
	struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
	CHECK(rdma_create_id(ch, &srv, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(srv, (struct sockaddr *)&any6) == 0 &&
	      rdma_listen(srv, 4) == 0,
	      "bind and listen on [::]");
	struct sockaddr_in6 *l6 = (struct sockaddr_in6 *)rdma_get_local_addr(srv);
	CHECK(l6->sin6_family == AF_INET6 && ntohs(l6->sin6_port) != 0 && l6->sin6_port == rdma_get_src_port(srv) &&
	      !memcmp(&l6->sin6_addr, &in6addr_any, sizeof(in6addr_any)),
	      "[::] listener shows [::] and the port it took");
	to = sin_of("127.0.0.1", 0);
	to.sin_port = l6->sin6_port;
	CHECK(rdma_create_id(ch, &cli, NULL, RDMA_PS_TCP) == 0, "client ID");
	resolve(ch, cli, &to);
	CHECK(rdma_create_qp(cli, pd, &qa) == 0 && rdma_connect(cli, &cp) == 0, "connect to 127.0.0.1 on its port");
	conn = take_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(conn && rdma_get_local_addr(conn)->sa_family == AF_INET, "CONNECT_REQUEST: an IPv4 connection");
	CHECK(rdma_create_qp(conn, pd, &qa) == 0 && rdma_accept(conn, &cp) == 0 && established_both(ch),
	      "[::] listener: established over IPv4");
	close_all(ch, cli, conn, srv);

	struct rdma_cm_id *v6only, *v4;
	int one = 1;
	struct sockaddr_in any4 = sin_of("0.0.0.0", 0);
	CHECK(rdma_create_id(ch, &v4, NULL, RDMA_PS_TCP) == 0 && rdma_bind_addr(v4, (struct sockaddr *)&any4) == 0 &&
	      rdma_listen(v4, 4) == 0,
	      "IPv4 wildcard listener");
	any6.sin6_port = rdma_get_src_port(v4);
	CHECK(rdma_create_id(ch, &v6only, NULL, RDMA_PS_TCP) == 0 &&
	      rdma_set_option(v6only, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof(one)) == 0 &&
	      rdma_bind_addr(v6only, (struct sockaddr *)&any6) == 0 && rdma_listen(v6only, 4) == 0,
	      "AFONLY [::] listener on the IPv4 listener's port");
	rdma_destroy_id(v6only);
	rdma_destroy_id(v4);

	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_free_devices(devs);
	rdma_destroy_event_channel(ch);
	printf("all ok\n");
	return 0;
}
