/* Shared by the C programs tests/c_programs.rs builds and runs under
 * LD_PRELOAD: the check macro (one line per check, exit 1 at the first
 * failure), waits bounded at 10 s, and the connection manager steps the
 * programs share (listen on loopback, resolve, both ESTABLISHED). */
#ifndef IWARP_COMPAT_TEST_COMMON_H
#define IWARP_COMPAT_TEST_COMMON_H

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define CHECK(cond, what)                                                    \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "FAIL %s (errno %d %s) at line %d\n", \
				what, errno, strerror(errno), __LINE__);     \
			exit(1);                                             \
		}                                                            \
		printf("ok %s\n", what);                                     \
		fflush(stdout);                                              \
	} while (0)

/* The next event of a channel, waiting up to 10 s in poll(2); NULL if
 * none came. */
static inline struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev = NULL;
	if (poll(&p, 1, 10000) != 1)
		return NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* One completion within 10 s; 0 if none came. */
static inline int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 100000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		struct timespec ts = { 0, 100000 };
		nanosleep(&ts, NULL);
	}
	return 0;
}

/* The next event of a channel must be `type`; it is acked. Returns its ID
 * (the new ID of a CONNECT_REQUEST), NULL if another or none came. */
static inline struct rdma_cm_id *take_event(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev = next_event(ch);
	if (!ev)
		return NULL;
	struct rdma_cm_id *id = ev->event == type ? ev->id : NULL;
	if (!id)
		fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
			rdma_event_str(type));
	rdma_ack_cm_event(ev);
	return id;
}

/* Bind `srv` to 127.0.0.1 on a port the OS picks and listen; `sin` gets
 * the address clients connect to. */
static inline void listen_loopback(struct rdma_cm_id *srv, int backlog, struct sockaddr_in *sin)
{
	*sin = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(rdma_bind_addr(srv, (struct sockaddr *)sin) == 0 && rdma_listen(srv, backlog) == 0, "listen");
	sin->sin_port = rdma_get_src_port(srv);
}

/* Resolve the address and route of `cli` to `to`, with their events from
 * `ch`. */
static inline void resolve(struct rdma_event_channel *ch, struct rdma_cm_id *cli, struct sockaddr_in *to)
{
	CHECK(rdma_resolve_addr(cli, NULL, (struct sockaddr *)to, 1000) == 0, "resolve_addr");
	CHECK(take_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED) == cli, "ADDR_RESOLVED");
	CHECK(rdma_resolve_route(cli, 1000) == 0, "resolve_route");
	CHECK(take_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED) == cli, "ROUTE_RESOLVED");
}

/* The next two events of `ch` are both sides' ESTABLISHED (acked). */
static inline int established_both(struct rdma_event_channel *ch)
{
	return take_event(ch, RDMA_CM_EVENT_ESTABLISHED) && take_event(ch, RDMA_CM_EVENT_ESTABLISHED);
}

/* The next two events of `ch` are DISCONNECTED, one for `a` and one for
 * `b` (acked). */
static inline int disconnected_both(struct rdma_event_channel *ch, struct rdma_cm_id *a, struct rdma_cm_id *b)
{
	int got_a = 0, got_b = 0;
	for (int k = 0; k < 2; k++) {
		struct rdma_cm_event *ev = next_event(ch);
		if (!ev)
			return 0;
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
			got_a += ev->id == a;
			got_b += ev->id == b;
		}
		rdma_ack_cm_event(ev);
	}
	return got_a == 1 && got_b == 1;
}

/* Disconnect `cli` from `conn` (both see DISCONNECTED), then destroy
 * their QPs and the three IDs. */
static inline void close_all(struct rdma_event_channel *ch, struct rdma_cm_id *cli, struct rdma_cm_id *conn,
				     struct rdma_cm_id *srv)
{
	CHECK(rdma_disconnect(cli) == 0 && disconnected_both(ch, cli, conn), "disconnect");
	rdma_destroy_qp(cli);
	rdma_destroy_qp(conn);
	rdma_destroy_id(conn);
	rdma_destroy_id(cli);
	rdma_destroy_id(srv);
}

#endif
