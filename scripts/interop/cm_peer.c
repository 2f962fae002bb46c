/*
 * cm_peer: a small librdmacm program for the siw peer VM that sends and
 * prints MPA private data, the VM side of scripts/interop/cm.sh.
 *
 *   cm_peer server PORT accept|reject HEX [SECS]
 *       Listen on PORT, take one connection request, print its private
 *       data, then accept or reject it with HEX as private data. After an
 *       accept, wait (at most SECS, default 10) for the peer to disconnect.
 *   cm_peer client ADDR PORT HEX [SECS]
 *       Connect to ADDR:PORT with HEX as private data and print the private
 *       data of the reply (ESTABLISHED) or of the reject (REJECTED); after
 *       an accept, disconnect.
 *
 * HEX is the ULP private data in hex, "-" for none. Output on stdout, one
 * line each:
 *   PDATA-RECV <len> <hex>    a connection request (server) or the accept
 *                             reply (client) carried <len> bytes <hex>
 *   REJECTED <len> <hex>      the peer rejected (client)
 *   ESTABLISHED               the connection is up
 *   DISCONNECTED              the peer disconnected (server)
 * <len> and <hex> are exactly what rdma_cm reports in the event
 * (private_data_len bytes at private_data; "-" when there are none).
 *
 * Exit status: 0 success (also after sending a reject), 1 setup or local
 * error (including rdma_connect/rdma_accept refusing the private data),
 * 2 bad command line, 3 rejected by the peer, 4 connection error event
 * (CONNECT_ERROR, UNREACHABLE, ADDR/ROUTE_ERROR), 5 timeout.
 *
 * On iWARP rdma_cm adds no header: the private data goes into the MPA
 * frame right behind siw's 4 MPA v2 IRD/ORD bytes.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

enum { EX_OK = 0, EX_LOCAL = 1, EX_USAGE = 2, EX_REJECTED = 3, EX_CONNERR = 4, EX_TIMEOUT = 5 };

/* Parsing room; librdmacm itself takes at most 255 bytes (see main). */
#define PDATA_MAX 1024

static struct rdma_event_channel *chan;
static int timeout_ms = 10000;

static void print_pdata(const char *tag, const void *data, unsigned len)
{
	const unsigned char *p = data;
	unsigned i;

	printf("%s %u ", tag, len);
	if (!len || !p)
		printf("-");
	else
		for (i = 0; i < len; i++)
			printf("%02x", p[i]);
	printf("\n");
	fflush(stdout);
}

static int parse_hex(const char *s, unsigned char *out, size_t *len)
{
	size_t n = strlen(s), i;

	*len = 0;
	if (!strcmp(s, "-"))
		return 0;
	if (n % 2 || n / 2 > PDATA_MAX)
		return -1;
	for (i = 0; i < n / 2; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (unsigned char)v;
	}
	*len = n / 2;
	return 0;
}

/* The next CM event within the timeout: 0, or EX_TIMEOUT / EX_LOCAL. */
static int next_event(struct rdma_cm_event **ev)
{
	struct pollfd pfd = { .fd = chan->fd, .events = POLLIN };
	int r = poll(&pfd, 1, timeout_ms);

	if (r == 0) {
		fprintf(stderr, "cm_peer: timeout waiting for a CM event\n");
		return EX_TIMEOUT;
	}
	if (r < 0) {
		perror("cm_peer: poll");
		return EX_LOCAL;
	}
	if (rdma_get_cm_event(chan, ev)) {
		perror("cm_peer: rdma_get_cm_event");
		return EX_LOCAL;
	}
	if (getenv("CM_PEER_DEBUG"))
		fprintf(stderr, "cm_peer: event %s status %d\n", rdma_event_str((*ev)->event),
			(*ev)->status);
	return 0;
}

/* Wait for one event of type `want`; anything else is reported. */
static int expect_event(enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	int r = next_event(&ev);

	if (r)
		return r;
	if (ev->event != want) {
		fprintf(stderr, "cm_peer: expected %s, got %s (status %d)\n",
			rdma_event_str(want), rdma_event_str(ev->event), ev->status);
		r = EX_CONNERR;
	}
	rdma_ack_cm_event(ev);
	return r;
}

struct res {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
};

/* A PD, a CQ and an RC QP on `id` (rdma_cm needs a QP to connect/accept). */
static int make_qp(struct rdma_cm_id *id, struct res *res)
{
	struct ibv_qp_init_attr attr;

	res->pd = ibv_alloc_pd(id->verbs);
	if (!res->pd) {
		perror("cm_peer: ibv_alloc_pd");
		return -1;
	}
	res->cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	if (!res->cq) {
		perror("cm_peer: ibv_create_cq");
		return -1;
	}
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = res->cq;
	attr.recv_cq = res->cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = 4;
	attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, res->pd, &attr)) {
		perror("cm_peer: rdma_create_qp");
		return -1;
	}
	return 0;
}

static void free_qp(struct rdma_cm_id *id, struct res *res)
{
	if (id->qp)
		rdma_destroy_qp(id);
	if (res->cq)
		ibv_destroy_cq(res->cq);
	if (res->pd)
		ibv_dealloc_pd(res->pd);
}

static void conn_param(struct rdma_conn_param *p, const unsigned char *pd, size_t len)
{
	memset(p, 0, sizeof(*p));
	p->responder_resources = 1;
	p->initiator_depth = 1;
	p->private_data = len ? pd : NULL;
	p->private_data_len = (uint8_t)len;
}

static int run_server(int port, int accept, const unsigned char *pd, size_t len)
{
	struct rdma_cm_id *listen_id, *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param param;
	struct sockaddr_in sin;
	struct res res = { 0 };
	int r;

	if (rdma_create_id(chan, &listen_id, NULL, RDMA_PS_TCP)) {
		perror("cm_peer: rdma_create_id");
		return EX_LOCAL;
	}
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(INADDR_ANY);
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&sin) || rdma_listen(listen_id, 1)) {
		perror("cm_peer: bind/listen");
		return EX_LOCAL;
	}
	fprintf(stderr, "cm_peer: listening on port %d\n", port);

	r = next_event(&ev);
	if (r)
		return r;
	if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
		fprintf(stderr, "cm_peer: unexpected %s\n", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
		return EX_CONNERR;
	}
	id = ev->id;
	print_pdata("PDATA-RECV", ev->param.conn.private_data, ev->param.conn.private_data_len);
	rdma_ack_cm_event(ev);

	if (!accept) {
		if (rdma_reject(id, len ? pd : NULL, (uint8_t)len)) {
			perror("cm_peer: rdma_reject");
			return EX_LOCAL;
		}
		fprintf(stderr, "cm_peer: rejected with %zu bytes\n", len);
		rdma_destroy_id(id);
		rdma_destroy_id(listen_id);
		return EX_OK;
	}

	if (make_qp(id, &res))
		return EX_LOCAL;
	conn_param(&param, pd, len);
	if (rdma_accept(id, &param)) {
		perror("cm_peer: rdma_accept");
		return EX_LOCAL;
	}
	r = expect_event(RDMA_CM_EVENT_ESTABLISHED);
	if (r)
		return r;
	printf("ESTABLISHED\n");
	fflush(stdout);
	r = expect_event(RDMA_CM_EVENT_DISCONNECTED);
	if (r)
		return r;
	printf("DISCONNECTED\n");
	fflush(stdout);
	rdma_disconnect(id);
	free_qp(id, &res);
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	return EX_OK;
}

static int run_client(const char *addr, int port, const unsigned char *pd, size_t len)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param param;
	struct sockaddr_in sin;
	struct res res = { 0 };
	int r;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1) {
		fprintf(stderr, "cm_peer: bad IPv4 address %s\n", addr);
		return EX_USAGE;
	}
	if (rdma_create_id(chan, &id, NULL, RDMA_PS_TCP)) {
		perror("cm_peer: rdma_create_id");
		return EX_LOCAL;
	}
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000)) {
		perror("cm_peer: rdma_resolve_addr");
		return EX_LOCAL;
	}
	r = expect_event(RDMA_CM_EVENT_ADDR_RESOLVED);
	if (r)
		return r;
	if (rdma_resolve_route(id, 2000)) {
		perror("cm_peer: rdma_resolve_route");
		return EX_LOCAL;
	}
	r = expect_event(RDMA_CM_EVENT_ROUTE_RESOLVED);
	if (r)
		return r;
	if (make_qp(id, &res))
		return EX_LOCAL;
	conn_param(&param, pd, len);
	if (rdma_connect(id, &param)) {
		perror("cm_peer: rdma_connect");
		return EX_LOCAL;
	}
	r = next_event(&ev);
	if (r)
		return r;
	switch (ev->event) {
	case RDMA_CM_EVENT_ESTABLISHED:
		print_pdata("PDATA-RECV", ev->param.conn.private_data,
			    ev->param.conn.private_data_len);
		printf("ESTABLISHED\n");
		fflush(stdout);
		r = EX_OK;
		break;
	case RDMA_CM_EVENT_REJECTED:
		fprintf(stderr, "cm_peer: rejected (status %d)\n", ev->status);
		print_pdata("REJECTED", ev->param.conn.private_data,
			    ev->param.conn.private_data_len);
		r = EX_REJECTED;
		break;
	default:
		fprintf(stderr, "cm_peer: connect failed: %s (status %d)\n",
			rdma_event_str(ev->event), ev->status);
		r = EX_CONNERR;
	}
	rdma_ack_cm_event(ev);
	if (r == EX_OK) {
		rdma_disconnect(id);
		/* Our own DISCONNECTED; not waiting for it is harmless. */
		if (expect_event(RDMA_CM_EVENT_DISCONNECTED) == 0)
			fprintf(stderr, "cm_peer: disconnected\n");
	}
	free_qp(id, &res);
	rdma_destroy_id(id);
	return r;
}

static int usage(void)
{
	fprintf(stderr, "usage: cm_peer server PORT accept|reject HEX [SECS]\n"
			"       cm_peer client ADDR PORT HEX [SECS]\n"
			"HEX: private data in hex, - for none\n");
	return EX_USAGE;
}

int main(int argc, char **argv)
{
	static unsigned char pd[PDATA_MAX];
	size_t len;
	int r;

	if (argc < 5 || argc > 6)
		return usage();
	if (argc == 6)
		timeout_ms = atoi(argv[5]) * 1000;
	if (parse_hex(argv[4], pd, &len)) {
		fprintf(stderr, "cm_peer: bad HEX (an even number of hex digits)\n");
		return EX_USAGE;
	}
	/* rdma_conn_param.private_data_len and rdma_reject's length are
	 * uint8_t: librdmacm cannot express more than 255 bytes. */
	if (len > UINT8_MAX) {
		fprintf(stderr, "cm_peer: %zu bytes of private data: librdmacm takes at most %d\n",
			len, UINT8_MAX);
		return EX_LOCAL;
	}
	chan = rdma_create_event_channel();
	if (!chan) {
		perror("cm_peer: rdma_create_event_channel");
		return EX_LOCAL;
	}
	if (!strcmp(argv[1], "server")) {
		int accept = !strcmp(argv[3], "accept");

		if (!accept && strcmp(argv[3], "reject"))
			return usage();
		r = run_server(atoi(argv[2]), accept, pd, len);
	} else if (!strcmp(argv[1], "client")) {
		r = run_client(argv[2], atoi(argv[3]), pd, len);
	} else {
		return usage();
	}
	fprintf(stderr, "cm_peer: exit %d\n", r);
	return r;
}
