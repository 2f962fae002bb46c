#!/usr/bin/env bash
# shellcheck shell=bash
# Two network namespaces joined by one veth pair, for the AF_XDP engine's
# tests and demos. Run it, or source it and call the functions.
#
#   topology.sh up TAG [MTU] [ADDR_A] [ADDR_B] [QUEUES]
#   topology.sh up3 TAG [MTU] [ADDR_A] [ADDR_B]
#   topology.sh down TAG
#
# `up` creates namespaces "iwx-TAG-a" and "iwx-TAG-b" and the veth pair
# "xa" (in a) <-> "xb" (in b); names inside a namespace are private, so
# only the namespace names need TAG to be unique (use the pid). MTU is
# 1500 (default) up to 65535 (the steering program is frags-aware, so
# native XDP on veth takes MTUs above 3506 too).
# ADDR_A / ADDR_B (CIDR, from 198.18.0.0/15) are kernel addresses for the
# ends; leave them empty ("") for an end whose address only the AF_XDP
# engine owns. QUEUES (default 1) gives both veth ends that many rx and
# tx queues (multi-core engines: one AF_XDP socket per queue; veth
# delivers a frame on the receiver's rx queue numbered like the sender's
# tx queue). Offloads follow docs/platform notes: TX checksum, TSO and
# GSO off on both ends, so AF_XDP sees whole, checksummed frames and a
# kernel TCP peer never sends frames larger than the MTU. IPv6 is off in
# both namespaces (no router solicitations in the counters).
#
# `up3` puts a middle namespace "iwx-TAG-m" between them, for fault
# injection (iwarp_bpf::FaultInjector) on interfaces the engines do not
# use: "xa" (in a) <-> "ma" (in m) and "xb" (in b) <-> "mb" (in m), "ma"
# and "mb" bridged by "br0" in m; plus two detour veth pairs in m,
# "da0" <-> "da1" and "db0" <-> "db1", for the injector's delayed frames.
# Offloads are off on every interface (GRO too on the middle ones, so the
# injector sees and forwards single segments).
#
# `down` deletes the namespaces (and the veth pair with them); it only
# ever touches the two names derived from TAG and is safe to run twice.

set -u

topo_ns_a() { printf 'iwx-%s-a' "$1"; }
topo_ns_b() { printf 'iwx-%s-b' "$1"; }
topo_ns_m() { printf 'iwx-%s-m' "$1"; }

# topo_mtu_ok MTU: whether veth and IPv4 take MTU (68..65535), saying why not.
topo_mtu_ok() {
    if (($1 < 68 || $1 > 65535)); then
        echo "topology: MTU $1 outside 68..65535 (the veth and IPv4 limits)" >&2
        return 1
    fi
}

topo_up() {
    local tag="$1" mtu="${2:-1500}" addr_a="${3:-}" addr_b="${4:-}" queues="${5:-1}"
    local a b
    a=$(topo_ns_a "$tag")
    b=$(topo_ns_b "$tag")
    topo_mtu_ok "$mtu" || return 1
    if ! [[ "$queues" =~ ^[0-9]+$ ]] || ((queues < 1 || queues > 64)); then
        echo "topology: queue count $queues outside 1..64" >&2
        return 1
    fi
    for ns in "$a" "$b"; do
        if ip netns list | awk '{print $1}' | grep -qx -- "$ns"; then
            echo "topology: $ns already exists" >&2
            return 1
        fi
    done
    ip netns add "$a" || return 1
    ip netns add "$b" || { ip netns del "$a"; return 1; }
    {
        for ns in "$a" "$b"; do
            ip netns exec "$ns" sh -c \
                'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;
                 echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' &&
                ip -n "$ns" link set lo up
        done &&
            ip -n "$a" link add xa numtxqueues "$queues" numrxqueues "$queues" \
                type veth peer name xb netns "$b" \
                numtxqueues "$queues" numrxqueues "$queues" &&
            ip -n "$a" link set xa mtu "$mtu" &&
            ip -n "$b" link set xb mtu "$mtu" &&
            ip netns exec "$a" ethtool -K xa tx off tso off gso off >/dev/null &&
            ip netns exec "$b" ethtool -K xb tx off tso off gso off >/dev/null &&
            { [ -z "$addr_a" ] || ip -n "$a" addr add "$addr_a" dev xa; } &&
            { [ -z "$addr_b" ] || ip -n "$b" addr add "$addr_b" dev xb; } &&
            ip -n "$a" link set xa up &&
            ip -n "$b" link set xb up
    } || {
        topo_down "$tag"
        return 1
    }
}

# MTU, offloads off and up for the middle namespace's interfaces.
topo_middle_devs() {
    local m="$1" mtu="$2" dev
    for dev in ma mb da0 da1 db0 db1 br0; do
        ip -n "$m" link set dev "$dev" mtu "$mtu" || return 1
        # The bridge has no GRO switch of its own: ignore what it refuses.
        ip netns exec "$m" ethtool -K "$dev" tx off tso off gso off gro off \
            >/dev/null 2>&1
        ip -n "$m" link set dev "$dev" up || return 1
    done
}

topo_up3() {
    local tag="$1" mtu="${2:-1500}" addr_a="${3:-}" addr_b="${4:-}"
    local a b m
    a=$(topo_ns_a "$tag")
    b=$(topo_ns_b "$tag")
    m=$(topo_ns_m "$tag")
    topo_mtu_ok "$mtu" || return 1
    for ns in "$a" "$b" "$m"; do
        if ip netns list | awk '{print $1}' | grep -qx -- "$ns"; then
            echo "topology: $ns already exists" >&2
            return 1
        fi
    done
    ip netns add "$a" || return 1
    ip netns add "$b" || { ip netns del "$a"; return 1; }
    ip netns add "$m" || { ip netns del "$a"; ip netns del "$b"; return 1; }
    {
        for ns in "$a" "$b" "$m"; do
            ip netns exec "$ns" sh -c \
                'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;
                 echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' &&
                ip -n "$ns" link set lo up
        done &&
            ip -n "$m" link add name ma type veth peer name xa netns "$a" &&
            ip -n "$m" link add name mb type veth peer name xb netns "$b" &&
            ip -n "$m" link add name da0 type veth peer name da1 &&
            ip -n "$m" link add name db0 type veth peer name db1 &&
            ip -n "$m" link add name br0 type bridge stp_state 0 &&
            ip -n "$m" link set dev ma master br0 &&
            ip -n "$m" link set dev mb master br0 &&
            ip -n "$a" link set xa mtu "$mtu" &&
            ip -n "$b" link set xb mtu "$mtu" &&
            topo_middle_devs "$m" "$mtu" &&
            ip netns exec "$a" ethtool -K xa tx off tso off gso off >/dev/null &&
            ip netns exec "$b" ethtool -K xb tx off tso off gso off >/dev/null &&
            { [ -z "$addr_a" ] || ip -n "$a" addr add "$addr_a" dev xa; } &&
            { [ -z "$addr_b" ] || ip -n "$b" addr add "$addr_b" dev xb; } &&
            ip -n "$a" link set xa up &&
            ip -n "$b" link set xb up
    } || {
        topo_down "$tag"
        return 1
    }
}

topo_down() {
    local tag="$1"
    ip netns del "$(topo_ns_m "$tag")" 2>/dev/null
    ip netns del "$(topo_ns_a "$tag")" 2>/dev/null
    ip netns del "$(topo_ns_b "$tag")" 2>/dev/null
    return 0
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    case "${1:-}" in
    up)
        shift
        topo_up "$@"
        ;;
    up3)
        shift
        topo_up3 "$@"
        ;;
    down)
        shift
        topo_down "$@"
        ;;
    *)
        echo "usage: $0 up TAG [MTU] [ADDR_A] [ADDR_B] [QUEUES] | up3 TAG [MTU] [ADDR_A] [ADDR_B] | down TAG" >&2
        exit 2
        ;;
    esac
fi
