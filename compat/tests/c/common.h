/* Shared by the C programs tests/c_programs.rs builds and runs under
 * LD_PRELOAD: the check macro (one line per check, exit 1 at the first
 * failure) and waits bounded at 10 s. */
#ifndef IWARP_COMPAT_TEST_COMMON_H
#define IWARP_COMPAT_TEST_COMMON_H

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

#endif
