// SPDX-License-Identifier: MIT OR Apache-2.0
//
// Fault injector for the iWARP stack's tests: drops, corrupts, duplicates
// and delays (reorders) IPv4/TCP segments on one interface, seeded and
// configured through a map.
//
// Three programs:
//   iwarp_fault_xdp     XDP on the interface (frames it receives): drop and
//                       corrupt. XDP can neither clone nor hold a frame.
//   iwarp_fault_tc      tc clsact egress on the interface (frames it sends):
//                       duplicate (bpf_clone_redirect to the same egress) and
//                       delay (bpf_redirect into a detour veth pair).
//   iwarp_fault_detour  tc clsact ingress on the detour pair's far end:
//                       sends a detoured frame round the detour again or
//                       back to the egress it came from.
//
// Delay without holding a frame: the kernel used for the tests has neither
// the fq (EDT) nor the netem qdisc, so a delayed frame is redirected into a
// veth pair (detour0 -> detour1) whose receive side queues it on the CPU's
// backlog; the detour program on detour1 sends it back out of the original
// interface. Every pass puts the frame behind the frames already queued in
// that softirq round (the rest of a NAPI batch, the backlog), so later
// segments of the same flow overtake it: reordering, by a few frames per
// pass, not by a fixed time. `delay_passes` sends it round several times.
//
// The frame's journey is tracked in skb->mark (kept by redirects within a
// namespace):
//   MARK_DETOUR | passes left << 20 | return ifindex   in the detour
//   MARK_RETURNED                                      back from the detour
//   MARK_CLONE                                         a duplicate
// Frames with MARK_RETURNED or MARK_CLONE pass the egress program untouched
// (mark cleared), so a fault is never applied twice to one frame.
//
// Corruption flips one byte (random offset, random non-zero mask) of the
// TCP payload and fixes up the TCP checksum incrementally (RFC 1624,
// eqn. 3: HC' = ~(~HC + ~m + m')), so the receiver's TCP accepts the
// segment and only an end-to-end check above TCP (the MPA CRC) can tell.
// This needs a complete checksum in the frame (no CHECKSUM_PARTIAL), which
// is what arrives on the receive side of a veth whose peer has tx
// checksumming off, or from an AF_XDP sender.
//
// Randomness: a per-CPU xorshift64* state per hook (XDP, tc), seeded from
// the config's seed, the CPU number and the hook, and reseeded whenever the
// loader writes a new config generation. A seed of 0 seeds from
// bpf_get_prandom_u32. With a fixed seed, a run is reproducible as far as
// the order of frames per CPU is.
//
// Map layout (mirrored in src/fault.rs):
//   fault_cfg     ARRAY, 1 entry, struct fault_config
//   fault_rng     PERCPU_ARRAY, 2 entries (XDP, tc), struct fault_rng
//   fault_state   ARRAY, 1 entry, struct fault_state (global, atomics)
//   fault_counters PERCPU_ARRAY, FAULT_CNT_MAX entries of u64

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define PPM 1000000u

#define MARK_KIND 0xff000000u
#define MARK_DETOUR 0x1f000000u
#define MARK_RETURNED 0x2f000000u
#define MARK_CLONE 0x3f000000u
#define MARK_PASSES_SHIFT 20
#define MARK_PASSES 0x00f00000u
#define MARK_IFINDEX 0x000fffffu

enum fault_counter {
	FAULT_CNT_XDP_SEEN = 0,   /* TCP frames matching the filter, XDP */
	FAULT_CNT_DROPPED = 1,    /* dropped (XDP) */
	FAULT_CNT_CORRUPTED = 2,  /* payload byte flipped, checksum fixed (XDP) */
	FAULT_CNT_TC_SEEN = 3,    /* TCP frames matching the filter, tc egress */
	FAULT_CNT_DUPLICATED = 4, /* a clone sent as well (tc) */
	FAULT_CNT_DELAYED = 5,    /* sent into the detour (tc) */
	FAULT_CNT_DETOUR_PASSES = 6, /* passes through the detour */
	FAULT_CNT_ERRORS = 7,     /* a clone or redirect helper failed */
	FAULT_CNT_MAX = 8,
};

struct fault_config {
	__u64 seed;           /* 0: seed from bpf_get_prandom_u32 */
	__u32 generation;     /* bumped by the loader: reseed */
	__u32 drop_ppm;       /* XDP */
	__u32 corrupt_ppm;    /* XDP, segments with payload only */
	__u32 dup_ppm;        /* tc egress */
	__u32 delay_ppm;      /* tc egress, needs detour_ifindex */
	__u32 delay_passes;   /* 1..15 passes through the detour */
	__u32 detour_ifindex; /* near end of the detour pair; 0: no delay */
	__u32 corrupt_limit;  /* most corruptions per generation; 0: no limit */
	__u16 port;           /* host order; 0: any, else source or destination */
	__u16 pad0;
	__u32 pad1;
};

struct fault_rng {
	__u64 state;
	__u32 generation;
	__u32 seeded;
};

struct fault_state {
	__u64 corrupt_claims; /* corruptions granted this generation */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fault_config);
} fault_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct fault_rng);
} fault_rng SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fault_state);
} fault_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FAULT_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} fault_counters SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&fault_counters, &which);

	if (c)
		*c += 1;
}

static __always_inline __u64 splitmix64(__u64 x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static __always_inline __u64 prandom64(void)
{
	return ((__u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32();
}

/* Next number of hook `hook`'s per-CPU xorshift64* generator. */
static __always_inline __u64 next_rand(const struct fault_config *cfg, __u32 hook)
{
	struct fault_rng *r = bpf_map_lookup_elem(&fault_rng, &hook);
	__u64 x;

	if (!r)
		return prandom64();
	if (!r->seeded || r->generation != cfg->generation) {
		__u64 seed = cfg->seed ? cfg->seed : prandom64();

		seed ^= ((__u64)bpf_get_smp_processor_id() << 32) | hook;
		x = splitmix64(seed);
		r->state = x ? x : 0x9e3779b97f4a7c15ULL;
		r->generation = cfg->generation;
		r->seeded = 1;
	}
	x = r->state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	r->state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

static __always_inline int chance(__u32 r, __u32 ppm)
{
	return ppm && (r % PPM) < ppm;
}

static __always_inline int port_matches(const struct fault_config *cfg, __be16 sport,
					__be16 dport)
{
	__be16 p = bpf_htons(cfg->port);

	return !cfg->port || sport == p || dport == p;
}

/* Flips one payload byte of the segment and fixes the TCP checksum. */
static __always_inline void corrupt(struct xdp_md *ctx, const struct fault_config *cfg,
				    struct iphdr *ip, struct tcphdr *tcp, __u32 ihl)
{
	__u32 thl = tcp->doff * 4;
	__u32 tot = bpf_ntohs(ip->tot_len);
	__u32 plen, off, pos, sum, zero = 0;
	__u16 m_old, m_new;
	__u8 old, mask;
	__u64 r;

	if (thl < sizeof(*tcp) || tot <= ihl + thl)
		return; /* no payload: nothing an FPDU could lose */
	plen = tot - ihl - thl;
	if (cfg->corrupt_limit) {
		struct fault_state *st = bpf_map_lookup_elem(&fault_state, &zero);

		if (!st || __sync_fetch_and_add(&st->corrupt_claims, 1) >= cfg->corrupt_limit)
			return;
	}
	r = next_rand(cfg, 0);
	off = (__u32)r % plen;
	mask = (__u8)(r >> 32);
	if (!mask)
		mask = 0x5a;
	pos = sizeof(struct ethhdr) + ihl + thl + off;
	/* The byte may lie in a fragment of a multi-buffer frame, beyond
	 * the linear part: read and write it through the helpers, which
	 * reach every fragment. The header fields are in the linear part. */
	if (bpf_xdp_load_bytes(ctx, pos, &old, 1))
		return;
	/* Checksum words start at the TCP header, whose length is a multiple
	 * of four: an even payload offset is a word's high byte. */
	if (off & 1) {
		m_old = old;
		m_new = (__u8)(old ^ mask);
	} else {
		m_old = (__u16)old << 8;
		m_new = (__u16)(__u8)(old ^ mask) << 8;
	}
	sum = (__u16)~bpf_ntohs(tcp->check);
	sum += (__u16)~m_old;
	sum += m_new;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	tcp->check = bpf_htons((__u16)~sum);
	old ^= mask;
	if (bpf_xdp_store_bytes(ctx, pos, &old, 1))
		return;
	count(FAULT_CNT_CORRUPTED);
}

/* frags: attaches at any MTU, and sees multi-buffer frames whole. */
SEC("xdp.frags")
int iwarp_fault_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	const struct fault_config *cfg;
	struct iphdr *ip;
	struct tcphdr *tcp;
	__u32 zero = 0, ihl;
	__u64 r;

	cfg = bpf_map_lookup_elem(&fault_cfg, &zero);
	if (!cfg)
		return XDP_PASS;
	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->version != 4 || ip->ihl < 5 ||
	    ip->protocol != IPPROTO_TCP || (ip->frag_off & bpf_htons(0x3fff)))
		return XDP_PASS;
	ihl = ip->ihl * 4;
	tcp = (void *)ip + ihl;
	if ((void *)(tcp + 1) > data_end)
		return XDP_PASS;
	if (!port_matches(cfg, tcp->source, tcp->dest))
		return XDP_PASS;
	count(FAULT_CNT_XDP_SEEN);

	r = next_rand(cfg, 0);
	if (chance((__u32)(r >> 32), cfg->drop_ppm)) {
		count(FAULT_CNT_DROPPED);
		return XDP_DROP;
	}
	if (chance((__u32)r, cfg->corrupt_ppm))
		corrupt(ctx, cfg, ip, tcp, ihl);
	return XDP_PASS;
}

SEC("tc")
int iwarp_fault_tc(struct __sk_buff *skb)
{
	const struct fault_config *cfg;
	__u32 zero = 0, mark = skb->mark, kind = mark & MARK_KIND;
	struct iphdr ip;
	__be16 proto, ports[2];
	__u32 passes;
	__u64 r;

	if (kind == MARK_RETURNED || kind == MARK_CLONE) {
		skb->mark = 0;
		return TC_ACT_OK;
	}
	cfg = bpf_map_lookup_elem(&fault_cfg, &zero);
	if (!cfg)
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, 12, &proto, sizeof(proto)) || proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr), &ip, sizeof(ip)))
		return TC_ACT_OK;
	if (ip.version != 4 || ip.ihl < 5 || ip.protocol != IPPROTO_TCP ||
	    (ip.frag_off & bpf_htons(0x3fff)))
		return TC_ACT_OK;
	if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr) + ip.ihl * 4, ports, sizeof(ports)))
		return TC_ACT_OK;
	if (!port_matches(cfg, ports[0], ports[1]))
		return TC_ACT_OK;
	count(FAULT_CNT_TC_SEEN);

	r = next_rand(cfg, 1);
	if (chance((__u32)(r >> 32), cfg->dup_ppm)) {
		skb->mark = MARK_CLONE;
		if (bpf_clone_redirect(skb, skb->ifindex, 0))
			count(FAULT_CNT_ERRORS);
		else
			count(FAULT_CNT_DUPLICATED);
		skb->mark = mark;
	}
	if (cfg->detour_ifindex && chance((__u32)r, cfg->delay_ppm)) {
		passes = cfg->delay_passes;
		if (passes < 1)
			passes = 1;
		if (passes > 15)
			passes = 15;
		skb->mark = MARK_DETOUR | (passes << MARK_PASSES_SHIFT) |
			    (skb->ifindex & MARK_IFINDEX);
		count(FAULT_CNT_DELAYED);
		return bpf_redirect(cfg->detour_ifindex, 0);
	}
	return TC_ACT_OK;
}

SEC("tc")
int iwarp_fault_detour(struct __sk_buff *skb)
{
	const struct fault_config *cfg;
	__u32 zero = 0, mark = skb->mark, passes;

	if ((mark & MARK_KIND) != MARK_DETOUR)
		return TC_ACT_OK;
	count(FAULT_CNT_DETOUR_PASSES);
	passes = (mark & MARK_PASSES) >> MARK_PASSES_SHIFT;
	cfg = bpf_map_lookup_elem(&fault_cfg, &zero);
	if (passes > 1 && cfg && cfg->detour_ifindex) {
		skb->mark = mark - (1u << MARK_PASSES_SHIFT);
		return bpf_redirect(cfg->detour_ifindex, 0);
	}
	skb->mark = MARK_RETURNED;
	return bpf_redirect(mark & MARK_IFINDEX, 0);
}

/* No GPL-only helper is used, so the project licence is stated as is. */
char LICENSE[] SEC("license") = "MIT OR Apache-2.0";
