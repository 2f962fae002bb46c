/* Connection manager edge cases of libiwarp_compat, run under LD_PRELOAD by
 * tests/c_programs.rs: non-blocking event channels, IDs and QPs destroyed
 * while they connect or are connected, rdma_migrate_id (which waits for
 * the acknowledgement of the ID's events), reject with private data, IRD
 * and ORD in the events, a refused connect, and the synchronous API
 * (rdma_create_ep, rdma_get_request, blocking calls on IDs without an
 * event channel) with the rdma_verbs.h helpers. Prints one line per check;
 * exits non-zero on the first failure. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "common.h"

/* The next event must be `type` for `id`; it is acked. */
static int expect(struct rdma_event_channel *ch, struct rdma_cm_id *id, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev = next_event(ch);
	if (!ev) {
		fprintf(stderr, "no event (wanted %s)\n", rdma_event_str(type));
		return 0;
	}
	int ok = ev->event == type && (!id || ev->id == id);
	if (!ok)
		fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
			rdma_event_str(type));
	rdma_ack_cm_event(ev);
	return ok;
}

/* Nothing is queued on the channel: its fd is not readable, and a
 * non-blocking get fails with EAGAIN. */
static int quiet(struct rdma_event_channel *ch, int wait_ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	if (poll(&p, 1, wait_ms) != 0)
		return 0;
	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	struct rdma_cm_event *ev = NULL;
	int r = rdma_get_cm_event(ch, &ev);
	int e = errno;
	fcntl(ch->fd, F_SETFL, fl);
	if (r == 0) {
		fprintf(stderr, "unexpected %s\n", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
		return 0;
	}
	return e == EAGAIN;
}

static struct sockaddr_in loopback(uint16_t port_be)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = port_be };
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return sin;
}

static struct ibv_pd *pd;
static struct ibv_cq *cq;

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	return qa;
}

/* A listening ID on `ch`, bound to 127.0.0.1 and a port the OS picks. */
static struct rdma_cm_id *listener(struct rdma_event_channel *ch, struct sockaddr_in *at)
{
	struct rdma_cm_id *id;
	*at = loopback(0);
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_bind_addr(id, (struct sockaddr *)at) ||
	    rdma_listen(id, 8))
		return NULL;
	at->sin_port = rdma_get_src_port(id);
	return id;
}

/* A client ID on `ch` with its QP, resolved to `to`, connect started. */
static struct rdma_cm_id *start_connect(struct rdma_event_channel *ch, struct sockaddr_in *to)
{
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr qa = qp_attr();
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)to, 1000) ||
	    !expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED) || rdma_resolve_route(id, 1000) ||
	    !expect(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED) || rdma_create_qp(id, pd, &qa) ||
	    rdma_connect(id, NULL))
		return NULL;
	return id;
}

/* The new ID of the next CONNECT_REQUEST on `ch`. */
static struct rdma_cm_id *request(struct rdma_event_channel *ch, struct rdma_cm_id *listen)
{
	struct rdma_cm_event *ev = next_event(ch);
	if (!ev || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST || ev->listen_id != listen) {
		if (ev)
			fprintf(stderr, "got %s\n", rdma_event_str(ev->event));
		return NULL;
	}
	struct rdma_cm_id *id = ev->id;
	rdma_ack_cm_event(ev);
	return id;
}

/* A marker: an event produced now on `ch`, which must be the next one
 * there (anything queued before it would come first). */
static int marker(struct rdma_event_channel *ch, struct sockaddr_in *to)
{
	struct rdma_cm_id *m;
	if (rdma_create_id(ch, &m, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(m, NULL, (struct sockaddr *)to, 1000))
		return 0;
	int ok = expect(ch, m, RDMA_CM_EVENT_ADDR_RESOLVED);
	return rdma_destroy_id(m) == 0 && ok;
}

/* A connect whose SYNs nobody answers (a plain TCP listener with a full
 * accept queue drops them) ends at the connect's deadline with
 * UNREACHABLE, -ETIMEDOUT: the channel's worker wakes for it although no
 * descriptor does. */
static void unanswered_connect(struct rdma_event_channel *ch)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in at = loopback(0);
	socklen_t len = sizeof at;
	CHECK(l >= 0 && bind(l, (struct sockaddr *)&at, sizeof at) == 0 && listen(l, 0) == 0 &&
		      getsockname(l, (struct sockaddr *)&at, &len) == 0,
	      "a TCP listener with a backlog of 0");
	/* One connection fills the accept queue; it is never accepted. */
	int f = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(f >= 0 && connect(f, (struct sockaddr *)&at, sizeof at) == 0, "its accept queue filled");
	struct rdma_cm_id *id = start_connect(ch, &at);
	CHECK(id, "connect to it");
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev = NULL;
	CHECK(poll(&p, 1, 60000) == 1 && rdma_get_cm_event(ch, &ev) == 0 && ev->id == id &&
		      ev->event == RDMA_CM_EVENT_UNREACHABLE && ev->status == -ETIMEDOUT,
	      "unanswered connect -> UNREACHABLE, -ETIMEDOUT");
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0, "destroy it");
	close(f);
	close(l);
}

/* rdma_migrate_id in a thread of its own. */
struct migrate_arg {
	struct rdma_cm_id *id;
	struct rdma_event_channel *to;
	int result;
	int done;
};

static void *migrate_thread(void *p)
{
	struct migrate_arg *m = p;
	m->result = rdma_migrate_id(m->id, m->to);
	__atomic_store_n(&m->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* rdma_get_cm_event on a blocking channel another thread has destroyed
 * (rping's CM thread asks for the next event while the main thread tears
 * down): the call waits, as a call already waiting when the channel went
 * does, instead of failing. */
struct late_arg {
	struct rdma_event_channel *ch;
	int go, calling, returned;
};

static void *late_get(void *p)
{
	struct late_arg *l = p;
	struct rdma_cm_event *ev;
	while (!__atomic_load_n(&l->go, __ATOMIC_SEQ_CST))
		usleep(1000);
	__atomic_store_n(&l->calling, 1, __ATOMIC_SEQ_CST);
	rdma_get_cm_event(l->ch, &ev);
	__atomic_store_n(&l->returned, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void get_after_destroy(void)
{
	static struct late_arg l;
	pthread_t t;
	l.ch = rdma_create_event_channel();
	CHECK(l.ch && pthread_create(&t, NULL, late_get, &l) == 0, "a blocking channel, a thread for it");
	rdma_destroy_event_channel(l.ch);
	__atomic_store_n(&l.go, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 10000 && !__atomic_load_n(&l.calling, __ATOMIC_SEQ_CST); i++)
		usleep(1000);
	usleep(200000);
	CHECK(__atomic_load_n(&l.calling, __ATOMIC_SEQ_CST) && !__atomic_load_n(&l.returned, __ATOMIC_SEQ_CST),
	      "get_cm_event after the blocking channel was destroyed waits");
	/* The thread stays in the call; the process ends with it there. */
	pthread_detach(t);
}

/* ------------------------------------------------ the synchronous API */

static const char *server_msg = "server says hi", *client_msg = "client says hi";
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int sync_port = -1; /* network order once listening, 0 on failure */
static int server_result = -1;

/* rdma_server's sequence: a passive endpoint with QP attributes and no PD
 * or CQs, rdma_get_request, the rdma_verbs.h helpers. */
static void *sync_server(void *arg)
{
	(void)arg;
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
	struct rdma_cm_id *listen_id = NULL, *id = NULL;
	struct ibv_qp_init_attr init = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .sq_sig_all = 1 };
	char recv_msg[32] = { 0 }, send_msg[32] = { 0 };
	struct ibv_wc wc;
	int port = 0, ret = 1;
	strcpy(send_msg, server_msg);
	if (rdma_getaddrinfo("127.0.0.1", "0", &hints, &res) == 0) {
		if (rdma_create_ep(&listen_id, res, NULL, &init) == 0 && rdma_listen(listen_id, 1) == 0)
			port = rdma_get_src_port(listen_id);
		rdma_freeaddrinfo(res);
	}
	pthread_mutex_lock(&mu);
	sync_port = port;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	if (!port)
		goto out;
	if (rdma_get_request(listen_id, &id)) {
		perror("rdma_get_request");
		goto out;
	}
	if (!id->qp || !id->send_cq || !id->recv_cq || !id->send_cq_channel || !id->pd ||
	    !id->event || id->event->event != RDMA_CM_EVENT_CONNECT_REQUEST ||
	    id->event->param.conn.private_data_len < 4 ||
	    memcmp(id->event->param.conn.private_data, "ping", 4)) {
		fprintf(stderr, "rdma_get_request: the new ID lacks its QP, CQs, PD or event\n");
		goto out;
	}
	struct ibv_mr *rmr = rdma_reg_msgs(id, recv_msg, sizeof recv_msg);
	struct ibv_mr *smr = rdma_reg_msgs(id, send_msg, sizeof send_msg);
	if (!rmr || !smr || rdma_post_recv(id, NULL, recv_msg, sizeof recv_msg, rmr)) {
		perror("server: reg_msgs/post_recv");
		goto out;
	}
	struct rdma_conn_param cp = { .private_data = "pong", .private_data_len = 4 };
	if (rdma_accept(id, &cp)) {
		perror("rdma_accept");
		goto out;
	}
	if (!id->event || id->event->event != RDMA_CM_EVENT_ESTABLISHED) {
		fprintf(stderr, "rdma_accept: no ESTABLISHED kept\n");
		goto out;
	}
	int n;
	while ((n = rdma_get_recv_comp(id, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS || strcmp(recv_msg, client_msg)) {
		fprintf(stderr, "server: receive %d status %d '%s'\n", n, wc.status, recv_msg);
		goto out;
	}
	if (rdma_post_send(id, NULL, send_msg, sizeof send_msg, smr, 0)) {
		perror("server: rdma_post_send");
		goto out;
	}
	while ((n = rdma_get_send_comp(id, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "server: send %d status %d\n", n, wc.status);
		goto out;
	}
	/* Waits for DISCONNECTED. */
	if (rdma_disconnect(id) || !id->event || id->event->event != RDMA_CM_EVENT_DISCONNECTED) {
		perror("server: rdma_disconnect");
		goto out;
	}
	rdma_dereg_mr(rmr);
	rdma_dereg_mr(smr);
	ret = 0;
out:
	if (id)
		rdma_destroy_ep(id);
	if (listen_id)
		rdma_destroy_ep(listen_id);
	server_result = ret;
	return NULL;
}

static void sync_mode(void)
{
	pthread_t t;
	CHECK(pthread_create(&t, NULL, sync_server, NULL) == 0, "sync: server thread");
	pthread_mutex_lock(&mu);
	while (sync_port < 0)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	CHECK(sync_port > 0, "sync: rdma_create_ep passive, rdma_listen");

	char port[8];
	snprintf(port, sizeof port, "%u", ntohs(sync_port));
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	CHECK(rdma_getaddrinfo("127.0.0.1", port, &hints, &res) == 0, "sync: getaddrinfo");
	struct ibv_qp_init_attr init = { .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						  .max_send_sge = 1, .max_recv_sge = 1 },
					 .sq_sig_all = 1 };
	struct rdma_cm_id *id;
	CHECK(rdma_create_ep(&id, res, NULL, &init) == 0 && id->qp && id->pd && id->send_cq &&
		      id->recv_cq && init.send_cq == id->send_cq && id->channel,
	      "sync: rdma_create_ep active resolves and creates the QP with CQs of its own");
	rdma_freeaddrinfo(res);
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED, "sync: the event is kept in id->event");

	char recv_msg[32] = { 0 }, send_msg[32] = { 0 };
	strcpy(send_msg, client_msg);
	struct ibv_mr *rmr = rdma_reg_msgs(id, recv_msg, sizeof recv_msg);
	struct ibv_mr *smr = rdma_reg_msgs(id, send_msg, sizeof send_msg);
	CHECK(rmr && smr && rdma_post_recv(id, NULL, recv_msg, sizeof recv_msg, rmr) == 0,
	      "sync: rdma_reg_msgs, rdma_post_recv");
	struct rdma_conn_param cp = { .private_data = "ping", .private_data_len = 4 };
	CHECK(rdma_connect(id, &cp) == 0, "sync: rdma_connect blocks until established");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED &&
		      id->event->param.conn.private_data_len >= 4 &&
		      !memcmp(id->event->param.conn.private_data, "pong", 4),
	      "sync: ESTABLISHED with the server's private data in id->event");
	struct ibv_wc wc;
	CHECK(rdma_post_send(id, NULL, send_msg, sizeof send_msg, smr, 0) == 0, "sync: rdma_post_send");
	int n;
	while ((n = rdma_get_send_comp(id, &wc)) == 0)
		;
	CHECK(n > 0 && wc.status == IBV_WC_SUCCESS, "sync: rdma_get_send_comp");
	while ((n = rdma_get_recv_comp(id, &wc)) == 0)
		;
	CHECK(n > 0 && wc.status == IBV_WC_SUCCESS && !strcmp(recv_msg, server_msg),
	      "sync: rdma_get_recv_comp with the server's message");
	CHECK(rdma_disconnect(id) == 0 && id->event && id->event->event == RDMA_CM_EVENT_DISCONNECTED,
	      "sync: rdma_disconnect waits for DISCONNECTED");
	rdma_dereg_mr(rmr);
	rdma_dereg_mr(smr);
	rdma_destroy_ep(id);
	pthread_join(t, NULL);
	CHECK(server_result == 0, "sync: server (rdma_get_request, accept, receive, send, disconnect)");

	/* A synchronous connect nobody listens for fails with ECONNREFUSED. */
	struct rdma_cm_id *s;
	struct sockaddr_in at;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l = listener(ch, &at); /* a free port, closed below */
	CHECK(l && rdma_destroy_id(l) == 0, "sync: a port nobody listens on");
	rdma_destroy_event_channel(ch);
	struct ibv_qp_init_attr qa = qp_attr();
	CHECK(rdma_create_id(NULL, &s, NULL, RDMA_PS_TCP) == 0 &&
		      rdma_resolve_addr(s, NULL, (struct sockaddr *)&at, 1000) == 0 &&
		      rdma_resolve_route(s, 1000) == 0 && rdma_create_qp(s, pd, &qa) == 0,
	      "sync: create_id without a channel, resolve");
	struct rdma_cm_event *sev;
	struct pollfd sp = { .fd = s->channel->fd, .events = POLLIN };
	errno = 0;
	CHECK(s->channel && poll(&sp, 1, 0) == 0 && rdma_get_cm_event(s->channel, &sev) == -1 &&
		      errno == EINVAL,
	      "sync: its channel polls, rdma_get_cm_event refuses it");
	errno = 0;
	CHECK(rdma_connect(s, NULL) == -1 && errno == ECONNREFUSED && s->event &&
		      s->event->event == RDMA_CM_EVENT_REJECTED && s->event->status == -ECONNREFUSED,
	      "sync: refused connect -> ECONNREFUSED, REJECTED kept");
	rdma_destroy_qp(s);
	CHECK(rdma_destroy_id(s) == 0, "sync: destroy");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && cq, "pd, cq");

	/* Non-blocking channel. */
	struct rdma_event_channel *a = rdma_create_event_channel(), *b = rdma_create_event_channel();
	CHECK(a && b, "two channels");
	CHECK(quiet(a, 0), "empty channel: not readable, non-blocking get -> EAGAIN");

	/* Reject with private data; the client sees it with -ECONNREFUSED. */
	struct sockaddr_in at;
	struct rdma_cm_id *srv = listener(a, &at);
	CHECK(srv, "listen on channel a");
	struct rdma_cm_id *cli = start_connect(b, &at);
	CHECK(cli, "connect from channel b");
	struct rdma_cm_id *child = request(a, srv);
	CHECK(child && child->channel == a, "CONNECT_REQUEST on a, new ID on a");
	CHECK(rdma_reject(child, "nope", 4) == 0, "reject with private data");
	struct rdma_cm_event *ev = next_event(b);
	CHECK(ev && ev->event == RDMA_CM_EVENT_REJECTED && ev->status == -ECONNREFUSED &&
		      ev->param.conn.private_data_len >= 4 && !memcmp(ev->param.conn.private_data, "nope", 4),
	      "REJECTED, -ECONNREFUSED, the reject's private data");
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(child) == 0, "destroy the rejected ID");
	rdma_destroy_qp(cli);
	CHECK(rdma_destroy_id(cli) == 0, "destroy the rejected client");

	/* IRD and ORD in the events, as the kernel's iWARP connection manager
	 * gives them: CONNECT_REQUEST carries the peer's ORD as
	 * responder_resources and its IRD as initiator_depth; ESTABLISHED
	 * carries the QP's own IRD as initiator_depth and its ORD as
	 * responder_resources. The client asks for IRD 3, ORD 2. */
	{
		struct rdma_cm_id *c;
		struct ibv_qp_init_attr cqa = qp_attr();
		struct rdma_conn_param cp = { .responder_resources = 3, .initiator_depth = 2 };
		CHECK(rdma_create_id(b, &c, NULL, RDMA_PS_TCP) == 0 &&
			      rdma_resolve_addr(c, NULL, (struct sockaddr *)&at, 1000) == 0 &&
			      expect(b, c, RDMA_CM_EVENT_ADDR_RESOLVED) && rdma_resolve_route(c, 1000) == 0 &&
			      expect(b, c, RDMA_CM_EVENT_ROUTE_RESOLVED) && rdma_create_qp(c, pd, &cqa) == 0 &&
			      rdma_connect(c, &cp) == 0,
		      "connect with IRD 3, ORD 2");
		ev = next_event(a);
		CHECK(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST, "CONNECT_REQUEST");
		CHECK(ev->param.conn.responder_resources == 2 && ev->param.conn.initiator_depth == 3,
		      "request: responder_resources = the peer's ORD, initiator_depth = its IRD");
		struct rdma_cm_id *s = ev->id;
		rdma_ack_cm_event(ev);
		struct ibv_qp_init_attr sqa = qp_attr();
		struct rdma_conn_param ap = { .responder_resources = 2, .initiator_depth = 3 };
		CHECK(rdma_create_qp(s, pd, &sqa) == 0 && rdma_accept(s, &ap) == 0, "accept with IRD 2, ORD 3");
		ev = next_event(a);
		CHECK(ev && ev->id == s && ev->event == RDMA_CM_EVENT_ESTABLISHED, "server ESTABLISHED");
		CHECK(ev->param.conn.initiator_depth == 2 && ev->param.conn.responder_resources == 3,
		      "server: initiator_depth = its IRD, responder_resources = its ORD");
		rdma_ack_cm_event(ev);
		ev = next_event(b);
		CHECK(ev && ev->id == c && ev->event == RDMA_CM_EVENT_ESTABLISHED, "client ESTABLISHED");
		CHECK(ev->param.conn.initiator_depth == 3 && ev->param.conn.responder_resources == 2,
		      "client: initiator_depth = its IRD, responder_resources = its ORD");
		rdma_ack_cm_event(ev);
		CHECK(rdma_disconnect(c) == 0 && expect(b, c, RDMA_CM_EVENT_DISCONNECTED) &&
			      expect(a, s, RDMA_CM_EVENT_DISCONNECTED),
		      "disconnect");
		rdma_destroy_qp(c);
		rdma_destroy_qp(s);
		CHECK(rdma_destroy_id(c) == 0 && rdma_destroy_id(s) == 0, "destroy both");
	}

	/* Destroy an ID while it connects: the server has the request, the
	 * client waits for the MPA reply. No event for it afterwards. */
	cli = start_connect(b, &at);
	CHECK(cli, "connect again");
	child = request(a, srv);
	CHECK(child, "CONNECT_REQUEST");
	struct ibv_qp *cqp = cli->qp;
	CHECK(rdma_destroy_id(cli) == 0, "destroy_id while connecting");
	/* The server answers after the destroy: the connect is abandoned,
	 * so nothing reaches the destroyed ID. */
	rdma_reject(child, NULL, 0);
	CHECK(marker(b, &at) && quiet(b, 200), "no event for the destroyed ID");
	CHECK(ibv_destroy_qp(cqp) == 0, "its QP is destroyed after");
	CHECK(rdma_destroy_id(child) == 0, "destroy the answered request");

	/* Destroy the QP while its ID connects: CONNECT_ERROR, -ECONNABORTED. */
	cli = start_connect(b, &at);
	CHECK(cli, "connect a third time");
	child = request(a, srv);
	CHECK(child, "CONNECT_REQUEST");
	rdma_destroy_qp(cli);
	ev = next_event(b);
	CHECK(ev && ev->id == cli && ev->event == RDMA_CM_EVENT_CONNECT_ERROR && ev->status == -ECONNABORTED,
	      "destroy_qp while connecting -> CONNECT_ERROR, -ECONNABORTED");
	rdma_ack_cm_event(ev);
	CHECK(rdma_destroy_id(cli) == 0 && rdma_destroy_id(child) == 0 && quiet(b, 100), "destroy both");

	errno = 0;
	CHECK(rdma_create_srq(srv, NULL, NULL) == -1 && errno == EINVAL,
	      "rdma_create_srq without attributes -> EINVAL");
	struct rdma_cm_id *none;
	errno = 0;
	CHECK(rdma_get_request(srv, &none) == -1 && errno == EINVAL, "get_request on an ID with a channel -> EINVAL");

	/* Migrate the listening ID from a to b: requests arrive on b, with
	 * new IDs on b. */
	CHECK(rdma_migrate_id(srv, b) == 0 && srv->channel == b, "migrate the listening ID to b");
	cli = start_connect(a, &at);
	CHECK(cli, "connect from channel a");
	child = request(b, srv);
	CHECK(child && child->channel == b && quiet(a, 0), "CONNECT_REQUEST on b, not a");
	struct ibv_qp_init_attr qa = qp_attr();
	CHECK(rdma_create_qp(child, pd, &qa) == 0 && rdma_accept(child, NULL) == 0, "accept");
	CHECK(expect(b, child, RDMA_CM_EVENT_ESTABLISHED), "server ESTABLISHED on b");

	/* Migrate the connected client to b while its ESTABLISHED is not
	 * acknowledged: the call returns once it is. Its DISCONNECTED arrives
	 * on b. */
	ev = next_event(a);
	CHECK(ev && ev->id == cli && ev->event == RDMA_CM_EVENT_ESTABLISHED, "client ESTABLISHED on a");
	struct migrate_arg m = { .id = cli, .to = b };
	pthread_t mt;
	CHECK(pthread_create(&mt, NULL, migrate_thread, &m) == 0, "migrate the client in a thread");
	struct timespec pause = { 0, 200000000 };
	nanosleep(&pause, NULL);
	CHECK(!__atomic_load_n(&m.done, __ATOMIC_SEQ_CST), "migrate waits while the ID's event is not acked");
	rdma_ack_cm_event(ev);
	CHECK(pthread_join(mt, NULL) == 0 && m.result == 0 && cli->channel == b,
	      "migrate returns once it is acked: the client is on b");
	CHECK(rdma_disconnect(child) == 0, "server disconnects");
	int got_c = 0, got_s = 0;
	for (int i = 0; i < 2; i++) {
		ev = next_event(b);
		CHECK(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && (ev->id == cli || ev->id == child),
		      "DISCONNECTED on b");
		got_c += ev->id == cli;
		got_s += ev->id == child;
		rdma_ack_cm_event(ev);
	}
	CHECK(got_c == 1 && got_s == 1 && quiet(a, 0), "one DISCONNECTED each, none on a");
	rdma_destroy_qp(cli);
	rdma_destroy_qp(child);
	CHECK(rdma_destroy_id(cli) == 0 && rdma_destroy_id(child) == 0, "destroy both");

	/* Destroy an ID while connected; its QP keeps the connection until it
	 * is destroyed too, and the peer sees DISCONNECTED. No event for the
	 * destroyed ID. */
	cli = start_connect(a, &at);
	CHECK(cli, "connect once more");
	child = request(b, srv);
	qa = qp_attr();
	CHECK(child && rdma_create_qp(child, pd, &qa) == 0 && rdma_accept(child, NULL) == 0, "accept");
	CHECK(expect(b, child, RDMA_CM_EVENT_ESTABLISHED) && expect(a, cli, RDMA_CM_EVENT_ESTABLISHED),
	      "established");
	cqp = cli->qp;
	CHECK(rdma_destroy_id(cli) == 0, "destroy_id while connected");
	CHECK(ibv_destroy_qp(cqp) == 0, "then its QP");
	CHECK(expect(b, child, RDMA_CM_EVENT_DISCONNECTED), "the peer: DISCONNECTED");
	CHECK(marker(a, &at) && quiet(a, 200), "no event for the destroyed ID");
	rdma_destroy_qp(child);
	CHECK(rdma_destroy_id(child) == 0, "destroy the server's ID");

	/* Migrate to NULL: the ID becomes synchronous. */
	errno = 0;
	CHECK(rdma_migrate_id(srv, NULL) == 0 && srv->channel && srv->channel != a && srv->channel != b,
	      "migrate to NULL: a channel of its own");
	errno = 0;
	CHECK(rdma_migrate_id(srv, NULL) == -1 && errno == EINVAL, "migrate a synchronous ID to NULL -> EINVAL");
	CHECK(rdma_migrate_id(srv, a) == 0 && srv->channel == a, "and back to a channel");
	CHECK(rdma_destroy_id(srv) == 0, "destroy the listener");
	CHECK(quiet(a, 0) && quiet(b, 0), "both channels empty");
	unanswered_connect(b);
	rdma_destroy_event_channel(a);
	rdma_destroy_event_channel(b);

	sync_mode();
	get_after_destroy();

	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	printf("all ok\n");
	return 0;
}
