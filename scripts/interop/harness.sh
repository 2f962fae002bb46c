#!/usr/bin/env bash
# Checks of the interop harness itself, no VM needed: the rules by which
# scripts/siw-interop calls a failed run a stall of the VM's network
# transmit (scripts/lib/vmstall.sh), on the VM kernel's own lines, on
# frame lists shaped as tshark prints them (time, source, destination,
# retransmission flag) and on samples of the tap's counters (time, rx,
# tx, XDP program attached), on the VM's own view of its network (its
# pings of the host and the tap's count meanwhile), and on pings between
# two namespaces of its own (a VM that answers none); and that perftest_run
# (scripts/lib/perftest.sh) runs a scenario again for a stall or a
# failed clock measurement only, and which runs perftest_close_race
# leaves unjudged; and which exits of the VM's rping vm_rping
# (scripts/lib/vmrping.sh) counts as its teardown race. A scenario the
# rules wrongly call a stall would be run again instead of failing; one
# they miss fails.
# Prints `PASS harness-<name>` / `FAIL harness-<name>: why`; exits 0.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=../lib/vmstall.sh
source "$ROOT/scripts/lib/vmstall.sh"

VM=198.18.7.2 HOST=198.18.7.1 XDP=198.18.7.3

# check NAME WANT GOT: WANT and GOT equal.
check() {
    if [[ "$2" == "$3" ]]; then
        echo "PASS harness-$1"
    else
        echo "FAIL harness-$1: want '$2', got '$3'"
    fi
}

kernel() { if vm_stall_kernel "$1"; then echo stalled; else echo fine; fi; }
check vm-stall-kernel-watchdog stalled "$(kernel "[   11.012748] virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 5004 ms
[   11.179650] reboot: Power down")"
check vm-stall-kernel-quiet fine "$(kernel "[    3.100000] siw: device siw0 speed is unknown
[   11.179650] reboot: Power down")"

# Frames: the VM talks until 6.5 s, then the host retransmits thrice
# over 4.6 s and hears nothing.
silent="1.0 $VM $HOST
6.5 $VM $HOST
6.6 $HOST $VM
6.8 $HOST $VM 1
7.8 $HOST $VM
8.0 $HOST $VM 1
11.1 $HOST $VM 1"
check vm-stall-silence "4.6 3" "$(vm_stall_silence "$VM" "$HOST" <<<"$silent")"
# The same, but the VM answers the last retransmission.
check vm-stall-answered "" "$(vm_stall_silence "$VM" "$HOST" <<<"$silent
11.2 $VM $HOST")"
# One retransmission is not enough, nor is a short silence.
check vm-stall-one-retransmission "" "$(vm_stall_silence "$VM" "$HOST" <<<"1.0 $VM $HOST
2.0 $HOST $VM 1
5.0 $HOST $VM")"
check vm-stall-short-silence "" "$(vm_stall_silence "$VM" "$HOST" <<<"1.0 $VM $HOST
1.4 $HOST $VM 1
1.9 $HOST $VM 1")"
# A VM that never sent the host anything is another failure.
check vm-stall-never-heard "" "$(vm_stall_silence "$VM" "$HOST" <<<"0.1 $HOST $VM
1.1 $HOST $VM 1
3.1 $HOST $VM 1")"
# Frames between the VM and the AF_XDP address are not judged (XDP takes
# the VM's before the capture sees them).
check vm-stall-xdp-not-judged "" "$(vm_stall_silence "$VM" "$HOST" <<<"1.0 $VM $HOST
1.1 $XDP $VM
4.0 $XDP $VM 1
7.0 $XDP $VM 1")"

# Tap counters every half second, "time rx tx xdp", an AF_XDP engine on
# the tap: the VM answers until 1.5 s, then the host resends at 2, 4 and
# 8 s and closes at 9 s.
samples="0.0 10 10 1
0.5 20 40 1
1.0 30 70 1
1.5 31 72 1
2.0 31 72 1
2.5 31 73 1
3.0 31 73 1
4.0 31 74 1
6.0 31 74 1
8.0 31 75 1
9.0 31 77 0"
check vm-stall-counters "7.5 4" "$(vm_stall_counters <<<"$samples")"
# The VM answers the last resend.
check vm-stall-counters-answered "" "$(vm_stall_counters <<<"$samples
9.5 32 77 0")"
# The same frames with no XDP program on the tap: kernel TCP's frames
# are in the capture, judged by its rule.
check vm-stall-counters-kernel-tcp "" "$(sed 's/ 1$/ 0/' <<<"$samples" | vm_stall_counters)"
# A side that waits silently and closes at the end: its last frames go
# out at once (one sample), which is no stall.
check vm-stall-counters-closing "" "$(vm_stall_counters <<<"0.0 10 10 1
1.0 30 70 1
4.0 30 70 1
8.0 30 70 1
9.0 30 73 1")"
# A VM that sent nothing during the samples is another failure.
check vm-stall-counters-never-heard "" "$(vm_stall_counters <<<"0.0 10 10 1
2.0 10 11 1
4.0 10 12 1
8.0 10 13 1")"
# A VM whose kernel panicked or locked up has no stalled NIC; the
# watchdog line is no such report.
broken() { if vm_kernel_broken "$1"; then echo broken; else echo fine; fi; }
check vm-stall-kernel-panic broken "$(broken "[   12.300000] Kernel panic - not syncing: Fatal exception")"
check vm-stall-kernel-lockup broken "$(broken "[   30.100000] watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [ib_write_bw:160]")"
check vm-stall-kernel-watchdog-not-broken fine "$(broken "[   11.012748] virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 5004 ms")"

# The VM's own view: its pings unanswered and none of its frames at the
# tap is a stall (busybox's and iputils' summaries); a ping that got out
# (the tap's count moved) or got an answer, or no view at all, is not.
view="-- uptime 43.04
--- 198.18.7.1 ping statistics ---
3 packets transmitted, 0 packets received, 100% packet loss"
check vm-stall-view "3" "$(vm_stall_view "$view" 4548 4548)"
check vm-stall-view-iputils "3" "$(vm_stall_view "3 packets transmitted, 0 received, 100% packet loss, time 2003ms" 7 7)"
check vm-stall-view-frames-out "" "$(vm_stall_view "$view" 4548 4551)"
check vm-stall-view-answered "" "$(vm_stall_view "3 packets transmitted, 1 packets received, 66% packet loss" 7 7)"
check vm-stall-view-no-answer "" "$(vm_stall_view "(no answer in 15 s)" 7 7)"
check vm-stall-view-no-counts "" "$(vm_stall_view "$view" "" "")"

# perftest_run runs a scenario again for those reasons only, up to its
# attempts. The fake scenario fails its first FAILS runs with the line
# given, then passes; each run appends to the count file.
# shellcheck source=../lib/perftest.sh
source "$ROOT/scripts/lib/perftest.sh"
RUNS="$(mktemp -t harness-runs.XXXXXX)"
LOG="$(mktemp -t harness-log.XXXXXX)"
# The ping rule's namespaces (below) go too.
NS_A="iwh$$a" NS_B="iwh$$b"
cleanup() {
    rm -f "$RUNS" "$LOG"
    [[ -z "${FAKE:-}" ]] || rm -rf "$FAKE"
    ip netns del "$NS_A" 2>/dev/null
    ip netns del "$NS_B" 2>/dev/null
}
trap cleanup EXIT
fake() {
    echo run >>"$RUNS"
    (($(grep -c . "$RUNS") > $1)) && return 0
    printf '%s\nhost rc=1\n' "$2"
    return 1
}
attempts() {
    : >"$RUNS"
    local rc=0
    PERFTEST_RETRY_PAUSE=0 perftest_run fake "$LOG" fake "$@" >/dev/null || rc=$?
    echo "$(grep -c . "$RUNS") rc=$rc"
}
clock="Correlation coefficient r^2: 0.70 < 0.9
Can't produce a report"
check perftest-retry-clock "2 rc=0" "$(attempts 1 "$clock")"
check perftest-retry-stalled "3 rc=0" "$(attempts 2 "siw-interop: VM transmit stalled: the VM answered none")"
check perftest-retry-gives-up "4 rc=1" "$(attempts 5 "$clock")"
check perftest-retry-other-failure "1 rc=1" "$(attempts 1 "iwarp-perf: timed out waiting for completions")"
check perftest-retry-passes "1 rc=0" "$(attempts 0 "")"

# perftest_close_race: a run whose VM's perftest failed only its
# closing handshake after the result row, on a log longer than a pipe's
# buffer (the VM's view of its network follows the console's tail).
# closing HOST-LINES VM-LINES HOST-RC VM-RC: such a log.
closing() {
    printf '%s\n' "$1" '---- VM console (tail) ----' "$2"
    for i in $(seq 2000); do echo "   $i: 0A00A8C6:4A3B 0200A8C6:C2A6 01 00000000:00000000"; done
    printf 'host rc=%s\nvm rc=%s\n' "$3" "$4"
}
race() {
    closing "$@" >"$LOG"
    if perftest_close_race "$LOG" 64; then echo race; else echo other; fi
}
row=" 64      50          92.50          797.40       117.93"
failed="Failed to close connection between server and client"
check perftest-close-race race "$(race "" "$row
 Bad wc status 2
$failed" 0 1)"
check perftest-close-race-host-failed other "$(race "" "$row
$failed" 1 1)"
check perftest-close-race-no-row other "$(race "" " Bad wc status 2
$failed" 0 1)"
check perftest-close-race-host-side other "$(race "$failed" "$row" 0 1)"

# vm_rping (scripts/lib/vmrping.sh) in a POSIX sh (busybox's, as the VM
# runs it, where there is one), around a stand-in rping that prints OUT
# on stdout and ERR on stderr, keeps its arguments and exits RC.
# vm_rping_status RC OUT ERR: vm_rping's status, and "race" when it
# counted the race as 0.
# shellcheck source=../lib/vmrping.sh
source "$ROOT/scripts/lib/vmrping.sh"
FAKE="$(mktemp -d -t harness-rping.XXXXXX)"
cat >"$FAKE/rping" <<'STANDIN'
#!/bin/sh
printf '%s\n' "$*" >"$(dirname "$0")/args"
[ -z "$OUT" ] || printf '%s\n' "$OUT"
[ -z "$ERR" ] || printf '%s\n' "$ERR" >&2
exit "$RC"
STANDIN
chmod +x "$FAKE/rping"
POSIX_SH=(sh)
command -v busybox >/dev/null && POSIX_SH=(busybox sh)
vm_rping_status() {
    local out
    out="$(RC="$1" OUT="$2" ERR="$3" PATH="$FAKE:$PATH" "${POSIX_SH[@]}" -c "$VM_RPING
vm_rping -c -a $HOST -V -C 5 -S 64; echo \"rc=\$?\"" 2>&1)"
    if grep -q 'teardown race' <<<"$out"; then
        echo "${out##*rc=} race"
    else
        echo "${out##*rc=}"
    fi
}
disc="client DISCONNECT EVENT..."
ebadf="rdma_get_cm_event: Bad file descriptor"
check vm-rping-race "0 race" "$(vm_rping_status 255 "" "$disc
$ebadf")"
check vm-rping-args "-c -a $HOST -V -C 5 -S 64" "$(cat "$FAKE/args")"
check vm-rping-race-verbose "0 race" "$(vm_rping_status 255 "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_\`abcdefghijklmnopqr
ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_\`abcdefghijklmnopqrs" "$disc
$ebadf")"
check vm-rping-race-mismatch 255 "$(vm_rping_status 255 "" "data mismatch!
rping client failed: -1
$disc
$ebadf")"
check vm-rping-race-flushed 255 "$(vm_rping_status 255 "" "cq completion failed status 5
wait for RDMA_WRITE_ADV state 10
$ebadf")"
check vm-rping-race-line-on-stdout 255 "$(vm_rping_status 255 "$ebadf" "$disc")"
check vm-rping-255-without-race-line 255 "$(vm_rping_status 255 "" "$disc")"
check vm-rping-connect-failed 255 "$(vm_rping_status 255 "" "rdma_resolve_addr: No such device")"
check vm-rping-race-line-other-status 1 "$(vm_rping_status 1 "" "$ebadf")"
check vm-rping-passes 0 "$(vm_rping_status 0 "" "")"
check vm-rping-fails 1 "$(vm_rping_status 1 "" "$disc")"

# The ping rule, between two namespaces of this run joined by a veth
# pair: an address that answers, and one in the same subnet that nobody
# holds (its resolution goes unanswered, as a VM's whose NIC sends
# nothing).
if ip netns add "$NS_A" && ip netns add "$NS_B" &&
    ip -n "$NS_A" link add v0 type veth peer name v1 netns "$NS_B" &&
    ip -n "$NS_A" addr add "$HOST/24" dev v0 && ip -n "$NS_B" addr add "$VM/24" dev v1 &&
    ip -n "$NS_A" link set v0 up && ip -n "$NS_B" link set v1 up; then
    unanswered() { if vm_stall_unanswered "$NS_A" "$1"; then echo unanswered; else echo answered; fi; }
    check vm-stall-ping-answered answered "$(unanswered "$VM")"
    check vm-stall-ping-unanswered unanswered "$(unanswered 198.18.7.9)"
else
    echo "FAIL harness-vm-stall-ping: could not set up namespaces $NS_A and $NS_B (root needed)"
fi
exit 0
