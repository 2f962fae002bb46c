#!/usr/bin/env bash
# MPA private-data interop: our iwarp-cm (apps/src/bin/iwarp-cm.rs)
# against cm_peer (scripts/interop/cm_peer.c, librdmacm + libibverbs, built
# here on the host and copied into the siw VM), through scripts/siw-interop.
# Prints one `PASS name` / `FAIL name: why` line per scenario; always exits
# 0 (scripts/interop/run counts the lines).
#
# Both tools print `PDATA-RECV <len> <hex>` / `REJECTED <len> <hex>` with
# exactly the bytes their CM delivered; every scenario compares them with
# what the other side sent, byte for byte.
#
# siw (Linux 6.1) limits, found with these tools (docs/interop-protocols.md):
#   * siw receives at most 256 bytes of MPA private data, i.e. 252 ULP
#     bytes behind the 4 IRD/ORD bytes (MPA_MAX_PRIVDATA = 256); a request
#     with more is answered by closing the TCP connection (RST).
#   * siw sends the length as a u8 plus the 4 IRD/ORD bytes: with 252 or
#     more ULP bytes its MPA header's PD_Length wraps (252 -> 0) while all
#     bytes follow, a malformed frame. So 251 bytes is the most siw sends.
#   * MPA itself allows 508 ULP bytes (512 - 4); our side refuses 509
#     before anything is sent.
#   * A siw initiator that is rejected reports RDMA_CM_EVENT_REJECTED with
#     no private data although the reject frame carries it: the
#     our-server-reject scenario checks our bytes in a capture instead.
#
#   CM_KEEP_LOGS=DIR   keep every scenario's output (and captures) in DIR
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SIWI="$ROOT/scripts/siw-interop"
CM="$ROOT/target/release/iwarp-cm"
PORT=7471

TMP="$(mktemp -d -t interop-cm.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

if ! cargo build --release -q -p iwarp-apps --bin iwarp-cm >"$TMP/build.log" 2>&1; then
    echo "FAIL cm-build: cargo build --release -p iwarp-apps --bin iwarp-cm failed: $(grep -m1 '^error' "$TMP/build.log")"
    exit 0
fi
PEER="$TMP/cm_peer"
if ! gcc -O2 -Wall -Wextra -Werror -o "$PEER" scripts/interop/cm_peer.c -lrdmacm -libverbs >"$TMP/gcc.log" 2>&1; then
    echo "FAIL cm-peer-build: gcc scripts/interop/cm_peer.c -lrdmacm -libverbs failed (scripts/setup installs librdmacm-dev libibverbs-dev): $(head -n 1 "$TMP/gcc.log")"
    exit 0
fi

# pat N SEED: N bytes of a pattern as hex ("-" for none).
pat() {
    local n="$1" s="$2" i out=""
    for ((i = 0; i < n; i++)); do out+="$(printf '%02x' $(((i * s + n + s) & 255)))"; done
    echo "${out:--}"
}

LOG="" HOSTLOG="" VMLOG=""
# run NAME siw-interop-args...: output in $LOG, split into the host part
# ($HOSTLOG) and the VM console part ($VMLOG).
run() {
    local name="$1"
    shift
    LOG="$TMP/$name.log" HOSTLOG="$TMP/$name.host" VMLOG="$TMP/$name.vm"
    "$SIWI" -q -T 30 -f "$PEER" "$@" >"$LOG" 2>&1
    sed '/^---- VM console (tail) ----$/,$d' "$LOG" >"$HOSTLOG"
    sed -n '/^---- VM console (tail) ----$/,$p' "$LOG" >"$VMLOG"
    if [[ -n "${CM_KEEP_LOGS:-}" ]]; then
        mkdir -p "$CM_KEEP_LOGS"
        cp "$LOG" "$CM_KEEP_LOGS/"
    fi
}
rc_of() { sed -n "s/^$1 rc=//p" "$LOG" | tail -n 1; }
# line FILE TAG: the "TAG <len> <hex>" line's "<len> <hex>" (first one).
line() { sed -n "s/^$2 //p" "$1" | head -n 1; }
# expect N HEX: the "<len> <hex>" a side prints for N bytes HEX.
expect() { echo "$1 $2"; }
pass() { echo "PASS $1"; }
fail() {
    local name="$1"
    shift
    echo "FAIL $name: $* (host rc=$(rc_of host), vm rc=$(rc_of vm); $(grep -m1 -E '^iwarp-cm: (connect|accept|reject|waiting|[0-9]+ bytes|[0-9.]+:)' "$HOSTLOG" || true))"
    # Both sides' last words, for a failure that does not come back.
    tail -n 70 "$LOG" | sed 's/^/    | /'
}
# same WHAT GOT WANT: compare, with a short diagnosis.
same() {
    [[ "$2" == "$3" ]] && return 0
    WHY="$1: got '${2:0:40}…' (len ${2%% *}), want '${3:0:40}…' (len ${3%% *})"
    return 1
}

# --- our client -> cm_peer server in the VM ----------------------------------

# $1 name, $2 our bytes, $3 VM reply bytes, $4 extra client flags
client_accept() {
    local name="$1" ours theirs
    ours="$(pat "$2" 7)" theirs="$(pat "$3" 13)"
    run "$name" vm-server "$PORT" "./cm_peer server $PORT accept $theirs 20" \
        "$CM client -a @VM@ -p $PORT --pdata $ours $4"
    WHY=""
    if [[ "$(rc_of host)" != 0 ]]; then
        fail "$name" "our client failed"
    elif [[ "$(rc_of vm)" != 0 ]]; then
        fail "$name" "the VM server failed"
    elif ! same "siw received" "$(line "$VMLOG" PDATA-RECV)" "$(expect "$2" "$ours")" ||
        ! same "we received" "$(line "$HOSTLOG" PDATA-RECV)" "$(expect "$3" "$theirs")"; then
        fail "$name" "$WHY"
    elif ! grep -q '^DISCONNECTED$' "$VMLOG"; then
        fail "$name" "the VM server saw no disconnect"
    else
        pass "$name"
    fi
}

client_accept cm-client-accept-pdata-0 0 0 ""
client_accept cm-client-accept-pdata-1-crc 1 1 "--crc"
# siw's maxima: it receives 252 ULP bytes and sends 251.
client_accept cm-client-accept-pdata-siw-max 252 251 ""

# The VM server rejects with siw's maximum: our client gets
# CmError::Rejected { private_data } and prints it, exit 4.
name=cm-client-vm-reject-pdata
ours="$(pat 16 7)" theirs="$(pat 251 13)"
run "$name" vm-server "$PORT" "./cm_peer server $PORT reject $theirs 20" \
    "$CM client -a @VM@ -p $PORT --pdata $ours"
WHY=""
if [[ "$(rc_of host)" != 4 ]]; then
    fail "$name" "expected our client to exit 4 (rejected)"
elif [[ "$(rc_of vm)" != 0 ]]; then
    fail "$name" "the VM server failed"
elif ! same "siw received" "$(line "$VMLOG" PDATA-RECV)" "$(expect 16 "$ours")" ||
    ! same "our reject carried" "$(line "$HOSTLOG" REJECTED)" "$(expect 251 "$theirs")"; then
    fail "$name" "$WHY"
else
    pass "$name"
fi

# Over the limits: 509 bytes are refused by our client before anything is
# sent (exit 7); 253 bytes (MPA-legal) are refused by siw, which resets the
# TCP connection without telling its application (our client: exit 6). The
# VM server never sees a connection request and times out (exit 5).
name=cm-client-pdata-over-limits
run "$name" vm-server "$PORT" "./cm_peer server $PORT accept - 4" \
    "$CM client -a @VM@ -p $PORT --pdata $(pat 509 7); echo \"rc509=\$?\";
     $CM client -a @VM@ -p $PORT --pdata $(pat 253 7); echo \"rc253=\$?\""
if ! grep -q '^rc509=7$' "$HOSTLOG" ||
    ! grep -q '^iwarp-cm: 509 bytes of private data: MPA allows at most 508 .*nothing sent$' "$HOSTLOG"; then
    fail "$name" "509 bytes: expected exit 7 and the 'MPA allows at most 508' error"
elif ! grep -q '^rc253=6$' "$HOSTLOG"; then
    fail "$name" "253 bytes: expected exit 6 (siw closes the connection)"
elif grep -q '^PDATA-RECV' "$VMLOG" || [[ "$(rc_of vm)" != 5 ]]; then
    fail "$name" "the VM server should have seen no request and timed out (exit 5)"
else
    pass "$name"
fi

# siw replying with 252 ULP bytes writes PD_Length 0 (u8 wrap) and then
# 256 bytes: our client must call the reply invalid (exit 6), not hang or
# misparse.
name=cm-client-siw-reply-pd-length-wrap
run "$name" vm-server "$PORT" "./cm_peer server $PORT accept $(pat 252 13) 20" \
    "$CM client -a @VM@ -p $PORT --pdata $(pat 4 7)"
if [[ "$(rc_of host)" != 6 ]] || ! grep -q 'invalid MPA request/reply frame' "$HOSTLOG"; then
    fail "$name" "expected our client to exit 6 with 'invalid MPA request/reply frame'"
elif ! same "siw received" "$(line "$VMLOG" PDATA-RECV)" "$(expect 4 "$(pat 4 7)")"; then
    fail "$name" "$WHY"
else
    pass "$name"
fi

# --- cm_peer client in the VM -> our server ----------------------------------

# Both directions at siw's maxima: siw sends 251, receives 252.
name=cm-server-accept-pdata-siw-max
ours="$(pat 252 7)" theirs="$(pat 251 13)"
run "$name" vm-client "$PORT" "$CM server -p $PORT --pdata $ours --timeout 25" \
    "./cm_peer client @HOST@ $PORT $theirs 20"
WHY=""
if [[ "$(rc_of host)" != 0 ]]; then
    fail "$name" "our server failed"
elif [[ "$(rc_of vm)" != 0 ]]; then
    fail "$name" "the VM client failed"
elif ! same "we received" "$(line "$HOSTLOG" PDATA-RECV)" "$(expect 251 "$theirs")" ||
    ! same "siw received" "$(line "$VMLOG" PDATA-RECV)" "$(expect 252 "$ours")"; then
    fail "$name" "$WHY"
elif ! grep -q '^DISCONNECTED$' "$HOSTLOG"; then
    fail "$name" "our server saw no disconnect"
else
    pass "$name"
fi

# Our server rejects with private data. siw's client reports REJECTED
# (exit 3) but rdma_cm hands it no private data, so our bytes are checked
# on the wire: the reply frame (R=1) must carry exactly them behind the
# IRD/ORD words.
name=cm-server-reject-pdata
ours="$(pat 32 7)" theirs="$(pat 16 13)"
CAP="$TMP/$name.pcapng"
run "$name" -c "$CAP" vm-client "$PORT" "$CM server -p $PORT --reject --pdata $ours --timeout 25" \
    "./cm_peer client @HOST@ $PORT $theirs 20"
[[ -n "${CM_KEEP_LOGS:-}" && -s "$CAP" ]] && cp "$CAP" "$CM_KEEP_LOGS/"
reply=""
if [[ -s "$CAP" ]] && command -v tshark >/dev/null; then
    reply="$(tshark -r "$CAP" -Y "tcp.srcport == $PORT && tcp.len > 0" -T fields -e tcp.payload 2>/dev/null |
        tr -d ':\n')"
fi
# "MPA ID Rep Frame", flags R|enhanced (0x30), rev 2, PD_Length 4 + 32
want_head="4d504120494420526570204672616d6530020024"
WHY=""
if [[ "$(rc_of host)" != 0 ]]; then
    fail "$name" "our server failed"
elif [[ "$(rc_of vm)" != 3 ]] || ! grep -q '^REJECTED ' "$VMLOG"; then
    fail "$name" "the VM client did not report REJECTED (exit 3)"
elif ! same "we received" "$(line "$HOSTLOG" PDATA-RECV)" "$(expect 16 "$theirs")"; then
    fail "$name" "$WHY"
elif [[ -z "$reply" ]]; then
    fail "$name" "no reply frame in the capture (tshark)"
elif [[ "${reply:0:40}" != "$want_head" || "${reply:48}" != "$ours" || ${#reply} != $((48 + 64)) ]]; then
    fail "$name" "reply frame on the wire is '$reply', want $want_head + IRD/ORD + $ours"
else
    vm_sees="$(line "$VMLOG" REJECTED)"
    if [[ "$vm_sees" != "0 -" && "$vm_sees" != "$(expect 32 "$ours")" ]]; then
        fail "$name" "the VM client reports REJECTED $vm_sees"
    else
        pass "$name"
    fi
fi
exit 0
