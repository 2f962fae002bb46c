#!/usr/bin/env bash
# rping interop scenarios: our apps/src/bin/rping against librdmacm's rping
# in the siw peer VM, through scripts/siw-interop (one VM at a time).
# Prints one `PASS name` / `FAIL name: why` line per scenario; always
# exits 0 (the runner, scripts/interop/run, counts the lines).
#
# rping is judged by the client: its exit status and -V. The VM's rping
# sometimes exits 255 after a complete exchange (its CM-thread teardown
# race, scripts/lib/vmrping.sh): as server its status is not checked when
# our client verified the data; as client it runs through vm_rping, which
# counts that exit as 0 when rping reported nothing else.
#
# Exit statuses of our rping (apps/src/bin/rping.rs): 3 connection failed,
# 4 MPA failed (reject, timeout), 5 validation, 6 peer disconnected mid-run.
#
#   RPING_KEEP_LOGS=DIR   keep every scenario's output (and the capture) in DIR
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SIWI="$ROOT/scripts/siw-interop"
RPING="$ROOT/target/release/rping"
PCAPCHECK="$ROOT/target/release/iwarp-pcapcheck"
# shellcheck source=../lib/vmrping.sh
source "$ROOT/scripts/lib/vmrping.sh"

TMP="$(mktemp -d -t interop-rping.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

if ! cargo build --release -p iwarp-apps >"$TMP/build.log" 2>&1; then
    echo "FAIL rping-build: cargo build --release -p iwarp-apps failed: $(grep -m1 '^error' "$TMP/build.log")"
    exit 0
fi

LOG=""
# run NAME siw-interop-args...: the output goes to $TMP/NAME.log ($LOG).
run() {
    local name="$1"
    shift
    LOG="$TMP/$name.log"
    "$SIWI" -q -T 60 "$@" >"$LOG" 2>&1
    if [[ -n "${RPING_KEEP_LOGS:-}" ]]; then
        mkdir -p "$RPING_KEEP_LOGS"
        cp "$LOG" "$RPING_KEEP_LOGS/"
    fi
}
rc_of() { sed -n "s/^$1 rc=//p" "$LOG" | tail -n 1; }
has() { grep -qE -- "$1" "$LOG"; }
count() { grep -cE -- "$1" "$LOG"; }
pass() { echo "PASS $1"; }
fail() {
    local name="$1"
    shift
    echo "FAIL $name: $* (host rc=$(rc_of host), vm rc=$(rc_of vm); last host error: $(grep -m1 '^rping: ' "$LOG" | grep -v 'listening\|connect\|completion\|cm event' || true))"
    # Both sides' last words, for a failure that does not come back.
    tail -n 70 "$LOG" | sed 's/^/    | /'
}

# --- our client <-> VM rping server --------------------------------------

# $1 name, $2 size, $3 extra client flags, $4 expected "crc on|off",
# $5.. extra siw-interop options (capture); the VM's address is
# ${vm:-@VM@} (@VM6@: over IPv6).
client_case() {
    local name="$1" size="$2" flags="$3" crc="$4" at="${vm:-@VM@}"
    shift 4
    run "$name" "$@" vm-server 7174 "rping -s -a $at -v -S $size" \
        "$RPING -c -a $at -v -V -C 5 -S $size -d --timeout 30 $flags"
    local pings
    pings="$(count '^ping data: rdma-ping-[0-4]: ')"
    if [[ "$(rc_of host)" != 0 ]]; then
        fail "$name" "our client failed"
    elif ! has "^rping: connected .* crc $crc "; then
        fail "$name" "CRC not negotiated as '$crc'"
    elif [[ "$pings" != 5 ]]; then
        fail "$name" "expected 5 verified pings, saw $pings"
    elif [[ "$(count '^server ping data: rdma-ping-')" != 5 ]]; then
        fail "$name" "the VM server did not print 5 pings"
    else
        pass "$name"
    fi
}

client_case rping-client-vm-server-crc-off 64 "" off
vm=@VM6@ client_case rping-client-vm-server-ipv6 1024 "--crc" on
CAP="$TMP/rping-crc.pcapng"
client_case rping-client-vm-server-crc-on 1024 "--crc" on -c "$CAP"

# The CRC-on exchange above, decoded by tshark: every FPDU has a good CRC.
name=rping-capture-crc
if [[ ! -s "$CAP" ]]; then
    echo "FAIL $name: no capture written"
elif ! command -v tshark >/dev/null; then
    echo "FAIL $name: tshark not installed"
elif "$PCAPCHECK" "$CAP" --expect-crc >"$TMP/$name.log" 2>&1; then
    fpdus="$(sed -n 's/^fpdus: *//p' "$TMP/$name.log")"
    # 5 pings x (2 adverts + read req + read resp + 2 go-aheads + write)
    if ((fpdus >= 35)); then
        pass "$name"
    else
        echo "FAIL $name: only $fpdus FPDUs decoded (expected >= 35)"
    fi
else
    echo "FAIL $name: $(grep -m1 'FAILED\|iwarp-pcapcheck' "$TMP/$name.log")"
fi
[[ -n "${RPING_KEEP_LOGS:-}" && -s "$CAP" ]] && cp "$CAP" "$TMP/$name.log" "$RPING_KEEP_LOGS/"

# --- VM rping client <-> our server ----------------------------------------

# $1 name, $2 size, $3 expected "crc on|off", $4.. extra siw-interop
# options; our server's address is ${host:-@HOST@} (@HOST6@: over IPv6).
server_case() {
    local name="$1" size="$2" crc="$3" at="${host:-@HOST@}"
    shift 3
    run "$name" "$@" vm-client 7174 \
        "$RPING -s -a $at -v -C 5 -S $size -d --timeout 60" \
        "$VM_RPING
vm_rping -c -a $at -v -V -C 5 -S $size"
    if [[ "$(rc_of vm)" != 0 ]]; then
        fail "$name" "the VM rping client failed"
    elif [[ "$(count '^ping data: rdma-ping-[0-4]: ')" != 5 ]]; then
        fail "$name" "the VM client did not verify 5 pings"
    elif [[ "$(rc_of host)" != 0 ]]; then
        fail "$name" "our server failed"
    elif ! has "^rping: connected .* crc $crc "; then
        fail "$name" "CRC not negotiated as '$crc'"
    elif [[ "$(count '^server ping data: rdma-ping-')" != 5 ]]; then
        fail "$name" "our server did not print 5 pings"
    else
        pass "$name"
    fi
}

server_case rping-vm-client-server-crc-off 64 off
host=@HOST6@ server_case rping-vm-client-server-ipv6 64 off
server_case rping-vm-client-server-crc-required 512 on --siw tunable --siw-param mpa_crc_required=1

# Our persistent server (-P) against the VM's rping clients: three one after
# another, then two at once, each verifying its pings (-V; without -v, the
# log keeps only the VM console's last lines); the server prints all 25
# and exits 0 after its 5 connections.
name=rping-persistent-server
run "$name" vm-client 7174 \
    "$RPING -s -P --max-conns 5 -a @HOST@ -v -C 5 -d --timeout 60" \
    "$VM_RPING
for s in 64 1000 4096; do vm_rping -c -a @HOST@ -V -C 5 -S \$s || exit 1; done
vm_rping -c -a @HOST@ -V -C 5 -S 512 & a=\$!
vm_rping -c -a @HOST@ -V -C 5 -S 65535 & b=\$!
wait \$a || exit 1
wait \$b"
if [[ "$(rc_of vm)" != 0 ]] || has 'data mismatch'; then
    fail "$name" "a VM rping client failed"
elif [[ "$(rc_of host)" != 0 ]]; then
    fail "$name" "our server failed"
elif ! has '^rping: persistent server done: 5 connections, 0 failed$'; then
    fail "$name" "our server did not serve 5 connections"
elif [[ "$(count '^rping\[[1-5]\]: server DISCONNECT EVENT\.\.\. 5 pings')" != 5 ]]; then
    fail "$name" "not every connection ended after 5 pings"
elif [[ "$(count '^server ping data: rdma-ping-')" != 25 ]]; then
    fail "$name" "our server did not print 25 pings"
else
    pass "$name"
fi

# --- failures ----------------------------------------------------------------

# Nobody listens on 7174 (the VM's only listener is an rping on 9999).
name=rping-connection-refused
run "$name" vm-server 9999 "timeout 4 rping -s -a @VM@ -p 9999" \
    "$RPING -c -a @VM@ -C 1 --timeout 10"
if [[ "$(rc_of host)" == 3 ]] && has '^rping: connect to [0-9.]+:7174: connection refused$'; then
    pass "$name"
else
    fail "$name" "expected exit 3 and 'connection refused'"
fi

# siw rejects an MPA request with M=1: its reply has R=1 (flags 0x30, rev 2,
# IRD/ORD words 00 00 00 00, no ULP private data).
name=rping-mpa-reject-markers
run "$name" vm-server 7174 "timeout 4 rping -s -a @VM@" \
    "$RPING -c -a @VM@ -C 1 --markers --timeout 10"
if [[ "$(rc_of host)" == 4 ]] && has '^rping: connect to [0-9.]+:7174: MPA reject from the peer \(private data: none\)$'; then
    pass "$name"
else
    fail "$name" "expected exit 4 and 'MPA reject from the peer (private data: none)'"
fi

# The VM client is killed (SIGKILL) after 3 s in the middle of a long run:
# our server (expecting 100000 pings) must see the QP go to Error, every
# outstanding work request flushed, and exit 6. When the kill lands while
# the VM serves our RDMA Read, its siw may answer that Read with a
# Terminate as it tears the QP down (seen once in about ten runs): the
# Read then fails with the remote error the Terminate names, exit 1.
name=rping-peer-killed-mid-run
run "$name" vm-client 7174 "$RPING -s -a @HOST@ -C 100000 -S 256 --timeout 60" \
    "timeout -s KILL 3 rping -c -a @HOST@ -C 100000 -S 256"
re='^rping: .* mid-run after ([0-9]+) of 100000 pings: QP Error, ([0-9]+) of ([0-9]+) outstanding work requests completed with a flush status$'
line="$(grep -E -m1 "$re" "$LOG" || true)"
if [[ "$(rc_of host)" == 1 && "$(rc_of vm)" == 137 ]] &&
    has '^rping: RDMA read work request failed: Remote(Operation|Access)Error'; then
    echo "  note $name: the killed peer terminated our outstanding Read ($(grep -m1 -o 'Remote[A-Za-z]*Error' "$LOG"))" >&2
    pass "$name"
elif [[ "$(rc_of host)" != 6 || -z "$line" ]]; then
    fail "$name" "expected exit 6 and the mid-run report"
elif [[ "$(rc_of vm)" != 137 ]]; then
    fail "$name" "the VM client was not killed (it should run longer than 3 s)"
else
    [[ "$line" =~ $re ]]
    done_pings="${BASH_REMATCH[1]}" flushed="${BASH_REMATCH[2]}" outstanding="${BASH_REMATCH[3]}"
    if ((done_pings < 1)); then
        fail "$name" "no ping completed before the kill"
    elif ((flushed != outstanding || outstanding < 1)); then
        fail "$name" "$flushed of $outstanding outstanding work requests flushed"
    else
        pass "$name"
    fi
fi
exit 0
