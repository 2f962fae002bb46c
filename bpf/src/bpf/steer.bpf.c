// SPDX-License-Identifier: MIT OR Apache-2.0
//
// XDP program of the iWARP stack: redirects the engine's traffic to its
// AF_XDP sockets and passes everything else to the kernel.
//
// A frame is the engine's when it is
//   * IPv4/TCP to one of the configured local addresses, and either the
//     "all TCP" flag is set or its destination (local) port lies in one of
//     the configured port ranges (an explicit port is a range lo == hi);
//   * or, only with STEER_F_ARP, an Ethernet/IPv4 ARP packet whose target
//     protocol address is one of the configured local addresses (requests
//     for the engine's address and replies to it), so a user-space stack can
//     answer and learn. Off by default: ARP then goes to the kernel.
// IP fragments cannot be matched by port: they are the engine's only in
// "all TCP" mode. 802.1Q-tagged and IPv6 frames always go to the kernel.
//
// A matching frame goes to the XSKMAP slot of the receive queue it arrived
// on. An empty slot passes the frame to the kernel (counted as `no_xsk`), or
// drops it with STEER_F_DROP_NO_XSK (counted as `dropped`) so the kernel does
// not answer the engine's peers with RSTs while the engine restarts.
//
// Map layout (mirrored in src/lib.rs):
//   xsks       XSKMAP, u32 queue -> AF_XDP socket fd, STEER_MAX_QUEUES entries
//   steer_cfg  ARRAY, 1 entry, struct steer_config
//   counters   PERCPU_ARRAY, STEER_CNT_MAX entries of u64

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define STEER_MAX_QUEUES 64
#define STEER_MAX_ADDRS 4
#define STEER_MAX_RANGES 16

#define STEER_F_ALL_TCP (1u << 0)
#define STEER_F_ARP (1u << 1)
#define STEER_F_DROP_NO_XSK (1u << 2)

enum steer_counter {
	STEER_CNT_REDIRECTED = 0, /* handed to an AF_XDP socket */
	STEER_CNT_PASSED = 1,     /* not the engine's: to the kernel */
	STEER_CNT_NO_XSK = 2,     /* the engine's, empty slot: to the kernel */
	STEER_CNT_DROPPED = 3,    /* the engine's, empty slot, drop mode */
	STEER_CNT_MALFORMED = 4,  /* truncated IPv4/TCP/ARP: to the kernel */
	STEER_CNT_MAX = 5,
};

struct port_range {
	__u16 lo; /* host byte order, inclusive */
	__u16 hi; /* host byte order, inclusive */
};

struct steer_config {
	__u32 flags;
	__u32 n_addrs;
	__u32 addrs[STEER_MAX_ADDRS]; /* network byte order */
	__u32 n_ranges;
	struct port_range ranges[STEER_MAX_RANGES];
};

/* Ethernet/IPv4 ARP body after struct arphdr's fixed part. */
struct arp_eth_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 oper;
	__u8 sha[ETH_ALEN];
	__u8 spa[4];
	__u8 tha[ETH_ALEN];
	__u8 tpa[4];
} __attribute__((packed));

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, STEER_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_config);
} steer_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STEER_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline int count(__u32 which, int action)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);

	if (c)
		*c += 1;
	return action;
}

static __always_inline int is_local_addr(const struct steer_config *cfg, __u32 addr)
{
	for (__u32 i = 0; i < STEER_MAX_ADDRS; i++) {
		if (i >= cfg->n_addrs)
			break;
		if (cfg->addrs[i] == addr)
			return 1;
	}
	return 0;
}

static __always_inline int is_engine_port(const struct steer_config *cfg, __u16 port)
{
	for (__u32 i = 0; i < STEER_MAX_RANGES; i++) {
		if (i >= cfg->n_ranges)
			break;
		if (port >= cfg->ranges[i].lo && port <= cfg->ranges[i].hi)
			return 1;
	}
	return 0;
}

static __always_inline int to_engine(struct xdp_md *ctx, const struct steer_config *cfg)
{
	int fallback = (cfg->flags & STEER_F_DROP_NO_XSK) ? XDP_DROP : XDP_PASS;
	int action = bpf_redirect_map(&xsks, ctx->rx_queue_index, fallback);

	if (action == XDP_REDIRECT)
		return count(STEER_CNT_REDIRECTED, action);
	if (action == XDP_DROP)
		return count(STEER_CNT_DROPPED, action);
	return count(STEER_CNT_NO_XSK, action);
}

static __always_inline int steer_arp(struct xdp_md *ctx, const struct steer_config *cfg,
				     void *l3, void *data_end)
{
	struct arp_eth_ipv4 *arp = l3;
	__u32 tpa;

	if (!(cfg->flags & STEER_F_ARP))
		return count(STEER_CNT_PASSED, XDP_PASS);
	if ((void *)(arp + 1) > data_end)
		return count(STEER_CNT_MALFORMED, XDP_PASS);
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) ||
	    arp->hlen != ETH_ALEN || arp->plen != 4)
		return count(STEER_CNT_PASSED, XDP_PASS);
	__builtin_memcpy(&tpa, arp->tpa, sizeof(tpa));
	if (!is_local_addr(cfg, tpa))
		return count(STEER_CNT_PASSED, XDP_PASS);
	return to_engine(ctx, cfg);
}

static __always_inline int steer_ipv4(struct xdp_md *ctx, const struct steer_config *cfg,
				      void *l3, void *data_end)
{
	struct iphdr *ip = l3;
	struct tcphdr *tcp;
	__u32 ihl;

	if ((void *)(ip + 1) > data_end)
		return count(STEER_CNT_MALFORMED, XDP_PASS);
	if (ip->version != 4 || ip->ihl < 5)
		return count(STEER_CNT_MALFORMED, XDP_PASS);
	if (ip->protocol != IPPROTO_TCP || !is_local_addr(cfg, ip->daddr))
		return count(STEER_CNT_PASSED, XDP_PASS);
	if (cfg->flags & STEER_F_ALL_TCP)
		return to_engine(ctx, cfg);
	/* Fragments carry no (or not only) a TCP header: kernel's. */
	if (ip->frag_off & bpf_htons(0x3fff))
		return count(STEER_CNT_PASSED, XDP_PASS);

	ihl = ip->ihl * 4;
	tcp = l3 + ihl;
	if ((void *)(tcp + 1) > data_end)
		return count(STEER_CNT_MALFORMED, XDP_PASS);
	if (!is_engine_port(cfg, bpf_ntohs(tcp->dest)))
		return count(STEER_CNT_PASSED, XDP_PASS);
	return to_engine(ctx, cfg);
}

/* frags: the program reads only headers, which lie in the linear part,
 * so it takes multi-buffer frames as they are; a veth end then accepts
 * MTUs above a page in native mode too. */
SEC("xdp.frags")
int iwarp_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	const struct steer_config *cfg;
	__u32 zero = 0;

	cfg = bpf_map_lookup_elem(&steer_cfg, &zero);
	if (!cfg)
		return count(STEER_CNT_PASSED, XDP_PASS);
	if ((void *)(eth + 1) > data_end)
		return count(STEER_CNT_MALFORMED, XDP_PASS);
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return steer_ipv4(ctx, cfg, eth + 1, data_end);
	if (eth->h_proto == bpf_htons(ETH_P_ARP))
		return steer_arp(ctx, cfg, eth + 1, data_end);
	return count(STEER_CNT_PASSED, XDP_PASS);
}

/* No GPL-only helper is used, so the project licence is stated as is. */
char LICENSE[] SEC("license") = "MIT OR Apache-2.0";
