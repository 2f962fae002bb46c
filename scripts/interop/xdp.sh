#!/usr/bin/env bash
# The AF_XDP engine against the Linux siw driver: our rping and iwarp-perf
# run over the kernel-bypass path (`--xdp $TAP --xdp-ip $XDP_IP/24`: an
# XDP program on the namespace's tap steers the engine's address to an
# AF_XDP socket; smoltcp is the TCP) against librdmacm's rping and
# perftest in the siw VM. Both roles, MPA CRC off and on.
#
# Prints one `PASS name` / `FAIL name: why` line per scenario; always
# exits 0 (scripts/interop/run counts the lines).
#
# rping is judged by the client (-V verifies every ping's data; the VM
# rping server may exit 255 after a complete exchange, see rping.sh). A
# perftest run passes when both sides exit 0 and the result row for the
# size is printed. The rping client with CRC runs once more at MTU 9000
# (the tap and the VM's eth0), 16000-byte pings: multi-buffer frames
# both ways, FPDUs of up to the MULPDU of a 9000-byte MTU.
#
#   XDP_FILTER=REGEX   run only the scenarios whose name matches
#   XDP_LOGS=DIR       keep every scenario's output in DIR
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../lib/perftest.sh
source scripts/lib/perftest.sh
if ! cargo build --release -q -p iwarp-apps --bin rping --bin iwarp-perf >/dev/null 2>&1; then
    echo "FAIL xdp-build: cargo build --release -p iwarp-apps failed"
    exit 0
fi
RPING="$ROOT/target/release/rping"
PERF="$ROOT/target/release/iwarp-perf"
TMP="$(mktemp -d -t xdp-interop.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
XDP='--xdp $TAP --xdp-ip $XDP_IP/24'

declare -A ARGS=([write_bw]="4096 100" [read_lat]="64 50" [send_bw]="4096 100")
# siw-interop options of every scenario (the MTU scenario adds --mtu).
SIW_EXTRA=()

# run NAME ROLE CRC: siw-interop with the arguments in HOST/VMC; judged by
# JUDGE (a function of the log).
run() {
    local name="xdp-$1" role="$2" crc="$3" out rc why siw=() start=$SECONDS
    if [[ -n "${XDP_FILTER:-}" && ! "$name" =~ $XDP_FILTER ]]; then
        return
    fi
    # CRC: as client our side asks for it (--crc; stock siw echoes the C
    # bit); as server the VM's tunable siw asks (mpa_crc_required=1).
    if [[ "$crc" == crc && "$role" == server ]]; then
        siw=(--siw tunable --siw-param mpa_crc_required=1)
    fi
    siw+=("${SIW_EXTRA[@]}")
    out="$TMP/$name.log"
    if [[ "$role" == client ]]; then
        perftest_run "$name" "$out" scripts/siw-interop -q -T 90 "${siw[@]}" vm-server "$PORT" "$VMC" "$HOST"
    else
        perftest_run "$name" "$out" scripts/siw-interop -q -T 90 "${siw[@]}" vm-client "$PORT" "$HOST" "$VMC"
    fi
    rc=$?
    [[ -n "${XDP_LOGS:-}" ]] && mkdir -p "$XDP_LOGS" && cp "$out" "$XDP_LOGS/"
    why="$("$JUDGE" "$out" "$rc")"
    if [[ -z "$why" ]]; then
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name: $why"
        # Both sides' last words, for a failure that does not come back.
        tail -n 70 "$out" | sed 's/^/    | /'
    fi
}

# Our rping client verified 3 pings; or the VM client did, and our
# server saw its disconnect.
judge_rping() {
    local log="$1"
    if [[ "$(host_rc "$log")" != 0 ]]; then
        echo "host rc=$(host_rc "$log") $(grep -m1 '^rping: ' "$log")"
    elif [[ "$ROLE" == client ]] && (($(grep -c '^ping data: rdma-ping-' "$log") != 3)); then
        echo "our client printed $(grep -c '^ping data: rdma-ping-' "$log") of 3 pings"
    elif [[ "$ROLE" == server && "$(vm_rc "$log")" != 0 ]]; then
        echo "VM rping client rc=$(vm_rc "$log")"
    fi
}

judge_perf() {
    local log="$1" rc="$2" size
    read -r size _ <<<"${ARGS[$T]}"
    if ((rc != 0)); then
        echo "host rc=$(host_rc "$log") vm rc=$(vm_rc "$log") $(grep -m1 '^iwarp-perf: ' "$log")"
    elif [[ ! ("$T" == read_lat && "$ROLE" == server) ]] && ! grep -Eq "^ $size +[0-9]+ " "$log"; then
        echo "no result row for $size bytes"
    fi
}

# pick HOST-CMD VM-CMD (our client's run) HOST-CMD VM-CMD (our server's):
# HOST and VMC for $ROLE.
pick() {
    if [[ "$ROLE" == client ]]; then HOST="$1" VMC="$2"; else HOST="$3" VMC="$4"; fi
}

# Clients first, then servers: the VM of the CRC servers runs the tunable
# siw, so a siw-interop session boots twice.
for crc in nocrc crc; do
    ours=""
    [[ "$crc" == crc ]] && ours="--crc"
    sfx=""
    [[ "$crc" == crc ]] && sfx="-crc"
    for ROLE in client server; do
        PORT=7174 JUDGE=judge_rping
        pick "$RPING -c -a @VM@ -C 3 -v -V --timeout 20 $ours $XDP" 'rping -s -a @VM@ -v -C 3' \
            "$RPING -s -C 3 --timeout 60 $XDP" 'rping -c -a @XDP@ -v -V -C 3'
        run "rping-$ROLE$sfx" "$ROLE" "$crc"
        PORT=18515 JUDGE=judge_perf
        for T in write_bw read_lat send_bw; do
            read -r size iters <<<"${ARGS[$T]}"
            common="-s $size -n $iters"
            pick "$PERF $T @VM@ -p $PORT $common $ours $XDP" "ib_$T -R -d siw0 $common" \
                "$PERF $T -p $PORT $common $XDP" "ib_$T -R -d siw0 $common @XDP@"
            run "$T-$ROLE$sfx" "$ROLE" "$crc"
        done
    done
done
# Jumbo frames: our AF_XDP rping client, CRC on, against siw's rping.
ROLE=client PORT=7174 JUDGE=judge_rping SIW_EXTRA=(--mtu 9000)
pick "$RPING -c -a @VM@ -C 3 -S 16000 -v -V --timeout 40 --crc $XDP" 'rping -s -a @VM@ -v -C 3 -S 16000' "" ""
run "rping-client-crc-mtu9000" client crc
SIW_EXTRA=()
exit 0
