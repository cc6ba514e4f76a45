/* XDP drop offload for a Pod's host-side veth: packets of a flow the agent has
 * already judged Drop (and logged) are dropped here, before OVS, and counted;
 * a token bucket per flow still lets a few through so OVS keeps deciding and
 * the audit log keeps real samples. DESIGN.md §4, tier 3.
 *
 * Map layout: the one description. meters/ebpf/maps.py mirrors it byte for
 * byte (native byte order, no implicit padding) and an integration test checks
 * both against the ctypes types bcc generates from this file.
 *
 *   key    struct offload_key, 40 bytes, used by both maps
 *     0  u32 ifindex      ingress ifindex (the host-side veth, in its own netns)
 *     4  u8  family       4 or 6
 *     5  u8  proto        IP protocol: TCP, UDP, SCTP, ICMP or ICMPv6
 *     6  u8  port[2]      network order: L4 destination port, or ICMP type then code
 *     8  u8  src[16]      source address; IPv4 in the first 4 bytes, the rest zero
 *    24  u8  dst[16]      destination address, same rule
 *
 *   offload_rules  LRU hash, key -> struct offload_rule, 24 bytes; written only
 *                  by the agent, read here
 *     0  u64 expires_ns   bpf_ktime_get_ns() (CLOCK_MONOTONIC) after which the entry is ignored
 *     8  u32 rule_id      the Drop rule that judged this flow
 *    12  u32 rate_pps     token bucket: packets per second passed on to OVS
 *    16  u32 burst        token bucket: capacity, in packets
 *    20  u32 reserved     zero
 *
 *   offload_state  hash (not LRU: a counted flow is never evicted silently),
 *                  key -> struct offload_state, 48 bytes; written only here,
 *                  deleted by the agent once it has read the final counts
 *     0  u64 tokens       bucket fill in nano-packets (NS_PER_TOKEN = one packet)
 *     8  u64 last_ns      when the bucket was last refilled
 *    16  u64 dropped_packets, 24 dropped_bytes, 32 passed_packets, 40 passed_bytes
 *
 *   offload_stats  per-CPU array of u64, indexed by OFFLOAD_STAT_*
 *
 * The rule and the counters live in two maps so that the agent refreshing an
 * entry (a whole-value write) can never overwrite counts the program added.
 * Counters use atomic adds. The bucket itself is updated without a lock: all
 * packets of one key enter through one veth, whose single receive queue runs
 * on one CPU at a time, and an occasional lost refill only passes fewer.
 * Bytes are whole frames (as OVS counts n_bytes).
 */
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#ifndef OFFLOAD_MAX_ENTRIES
#define OFFLOAD_MAX_ENTRIES 65536
#endif

#define NS_PER_TOKEN 1000000000ULL
/* Refill over at most 10 s: with rate_pps <= 1e6 (checked by the agent) the
 * product stays far below 2^64; a longer idle gap refills no further. */
#define MAX_REFILL_NS 10000000000ULL

#define OFFLOAD_STAT_EXPIRED 0   /* key found but expired: passed */
#define OFFLOAD_STAT_NO_STATE 1  /* state map full: passed, never dropped uncounted */
#define OFFLOAD_STAT_COUNT 2

#define IP_FRAGMENTED 0x3FFF     /* MF flag or a fragment offset: no L4 header to key on */

struct offload_key {
    u32 ifindex;
    u8 family;
    u8 proto;
    u8 port[2];
    u8 src[16];
    u8 dst[16];
};

struct offload_rule {
    u64 expires_ns;
    u32 rule_id;
    u32 rate_pps;
    u32 burst;
    u32 reserved;
};

struct offload_state {
    u64 tokens;
    u64 last_ns;
    u64 dropped_packets;
    u64 dropped_bytes;
    u64 passed_packets;
    u64 passed_bytes;
};

struct vlan_tag {
    __be16 tci;
    __be16 proto;
};

BPF_TABLE("lru_hash", struct offload_key, struct offload_rule, offload_rules, OFFLOAD_MAX_ENTRIES);
BPF_HASH(offload_state, struct offload_key, struct offload_state, OFFLOAD_MAX_ENTRIES);
BPF_PERCPU_ARRAY(offload_stats, u64, OFFLOAD_STAT_COUNT);

static __always_inline void count_stat(u32 index)
{
    u64 *value = offload_stats.lookup(&index);
    if (value)
        *value += 1;
}

/* Fill `key` from the frame; 0 if it is a flow we can key on. */
static __always_inline int parse(struct xdp_md *ctx, struct offload_key *key)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return -1;
    __be16 eth_type = eth->h_proto;
    void *l3 = eth + 1;
    if (eth_type == htons(ETH_P_8021Q) || eth_type == htons(ETH_P_8021AD)) {
        struct vlan_tag *tag = l3;
        if ((void *)(tag + 1) > data_end)
            return -1;
        eth_type = tag->proto;
        l3 = tag + 1;
    }
    u8 *l4;
    if (eth_type == htons(ETH_P_IP)) {
        struct iphdr *ip = l3;
        if ((void *)(ip + 1) > data_end || ip->ihl < 5)
            return -1;
        if (ip->frag_off & htons(IP_FRAGMENTED))
            return -1;
        key->family = 4;
        key->proto = ip->protocol;
        __builtin_memcpy(key->src, &ip->saddr, 4);
        __builtin_memcpy(key->dst, &ip->daddr, 4);
        l4 = (u8 *)ip + ip->ihl * 4;
    } else if (eth_type == htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = l3;
        if ((void *)(ip6 + 1) > data_end)
            return -1;
        key->family = 6;
        key->proto = ip6->nexthdr;  /* extension headers are not keyed: passed below */
        __builtin_memcpy(key->src, &ip6->saddr, 16);
        __builtin_memcpy(key->dst, &ip6->daddr, 16);
        l4 = (u8 *)(ip6 + 1);
    } else {
        return -1;
    }
    switch (key->proto) {
    case IPPROTO_TCP:
    case IPPROTO_UDP:
    case IPPROTO_SCTP:
        /* all three carry the destination port in bytes 2..3 */
        if ((void *)(l4 + 4) > data_end)
            return -1;
        key->port[0] = l4[2];
        key->port[1] = l4[3];
        return 0;
    case IPPROTO_ICMP:
    case 58: /* ICMPv6 */
        if ((void *)(l4 + 2) > data_end)
            return -1;
        key->port[0] = l4[0];
        key->port[1] = l4[1];
        return 0;
    }
    return -1;
}

/* Take one token if there is one; refills from the time since the last refill. */
static __always_inline int take_token(struct offload_state *st, struct offload_rule *rule, u64 now)
{
    u64 tokens = st->tokens;
    u64 cap = (u64)rule->burst * NS_PER_TOKEN;
    if (now > st->last_ns) {
        u64 elapsed = now - st->last_ns;
        if (elapsed > MAX_REFILL_NS)
            elapsed = MAX_REFILL_NS;
        tokens += elapsed * rule->rate_pps;
        st->last_ns = now;
    }
    if (tokens > cap)
        tokens = cap;
    if (tokens >= NS_PER_TOKEN) {
        st->tokens = tokens - NS_PER_TOKEN;
        return 1;
    }
    st->tokens = tokens;
    return 0;
}

int xdp_offload(struct xdp_md *ctx)
{
    struct offload_key key = {};
    if (parse(ctx, &key) != 0)
        return XDP_PASS;
    key.ifindex = ctx->ingress_ifindex;
    struct offload_rule *rule = offload_rules.lookup(&key);
    if (!rule)
        return XDP_PASS;
    u64 now = bpf_ktime_get_ns();
    if (now >= rule->expires_ns) {
        count_stat(OFFLOAD_STAT_EXPIRED);
        return XDP_PASS;
    }
    struct offload_state *st = offload_state.lookup(&key);
    if (!st) {
        struct offload_state fresh = {};
        fresh.tokens = (u64)rule->burst * NS_PER_TOKEN;
        fresh.last_ns = now;
        offload_state.insert(&key, &fresh);  /* BPF_NOEXIST: another CPU may have won */
        st = offload_state.lookup(&key);
        if (!st) {
            count_stat(OFFLOAD_STAT_NO_STATE);
            return XDP_PASS;
        }
    }
    u64 len = (u64)((long)ctx->data_end - (long)ctx->data);
    if (take_token(st, rule, now)) {
        __sync_fetch_and_add(&st->passed_packets, 1);
        __sync_fetch_and_add(&st->passed_bytes, len);
        return XDP_PASS;
    }
    __sync_fetch_and_add(&st->dropped_packets, 1);
    __sync_fetch_and_add(&st->dropped_bytes, len);
    return XDP_DROP;
}
