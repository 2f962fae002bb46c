#!/usr/bin/env bash
# perftest interop with perftest's -b (bidirectional) and -D (duration):
# iwarp-perf against the real `ib_* -R` tools in the siw VM (stock siw),
# each scenario in both roles:
#   <test>-b-client / -server   write_bw, read_bw, send_bw with -b: both
#       sides send; our JSON row must show -n messages per QP done by each
#       side (local_iterations: ours, remote_iterations: perftest's, from
#       its report), and perftest must print its (summed) row
#   <test>-D-client / -server   write_bw, send_bw -b, send_lat, write_lat
#       with -D 4 (margin 1): a row with a nonzero count on our side
#       (the write_bw server prints the client's report), and perftest's
#       row in the VM
#   <...>-xdp-client / -server  some of them with our side on the AF_XDP
#       engine (`--xdp $TAP --xdp-ip $XDP_IP/24`, see xdp.sh)
# Prints `PASS perftest-<name>` / `FAIL perftest-<name>: why`; always exits 0.
#   PERFTEST_FILTER=REGEX   run only scenarios whose name matches
#   PERFTEST_LOGS=DIR       keep every scenario's output in DIR, and the
#                           AF_XDP engine's capture of each -xdp- one
#                           (its frames are in no capture of the tap)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../lib/perftest.sh
source scripts/lib/perftest.sh
if ! cargo build --release -q -p iwarp-apps --bin iwarp-perf >/dev/null 2>&1; then
    echo "FAIL perftest-opts-build: cargo build --release -p iwarp-apps --bin iwarp-perf failed"
    exit 0
fi
BIN="$ROOT/target/release/iwarp-perf"
LOGS="${PERFTEST_LOGS:-}"
TMP="$(mktemp -d -t perftest-opts-interop.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
PORT=18515

# json_num LOG KEY: KEY's number in our JSON row in LOG (first row).
json_num() {
    grep -m1 -o "\"$2\":[0-9.]*" "$1" | cut -d: -f2
}

# run NAME TEST ROLE KIND 'ARGS' [xdp]: KIND is b (check both directions)
# or D (check a nonzero count); ARGS are given to both sides; with xdp our
# side runs on the AF_XDP engine.
run() {
    local name="perftest-$1" t="$2" role="$3" kind="$4" args="$5" out rc why="" size
    local ours="" addr="@HOST@"
    if [[ "${6:-}" == xdp ]]; then
        # shellcheck disable=SC2016 # expanded by siw-interop in the namespace
        ours='--xdp $TAP --xdp-ip $XDP_IP/24'
        addr="@XDP@"
        if [[ -n "$LOGS" ]]; then
            mkdir -p "$LOGS"
            ours="$ours --xdp-pcap $(printf %q "$(cd "$LOGS" && pwd)/$name.pcap")"
        fi
    fi
    if [[ -n "${PERFTEST_FILTER:-}" && ! "$name" =~ $PERFTEST_FILTER ]]; then
        return
    fi
    size="$(sed -n 's/.*-s \([0-9]*\).*/\1/p' <<<"$args")"
    out="$TMP/$name.log"
    local start=$SECONDS
    if [[ "$role" == client ]]; then
        perftest_run "$name" "$out" scripts/siw-interop -q -T 90 vm-server "$PORT" \
            "ib_$t -R -d siw0 $args" "$BIN $t @VM@ -p $PORT $args --json $ours"
    else
        perftest_run "$name" "$out" scripts/siw-interop -q -T 90 vm-client "$PORT" \
            "$BIN $t -p $PORT $args --json $ours" "ib_$t -R -d siw0 $args $addr"
    fi
    rc=$?
    [[ -n "$LOGS" ]] && mkdir -p "$LOGS" && cp "$out" "$LOGS/"
    if ((rc != 0)); then
        why="$(grep -E '^(host|vm) rc=' "$out" | tr '\n' ' ')$(grep -m1 '^iwarp-perf: ' "$out")"
        [[ -n "$why" ]] || why="siw-interop exit $rc: $(tail -n 1 "$out")"
    elif ! grep -q "^{\"test\":\"$t\",\"side\":\"$role\",\"bytes\":$size," "$out"; then
        why="no JSON row of ours for $size bytes"
    elif ! grep -Eq "(^|[^{])\s$size +[0-9]+ " "$out"; then
        why="no perftest row for $size bytes"
    elif [[ "$kind" == b ]]; then
        local n local remote
        n="$(sed -n 's/.*-n \([0-9]*\).*/\1/p' <<<"$args")"
        local="$(json_num "$out" local_iterations)"
        remote="$(json_num "$out" remote_iterations)"
        [[ "$local" == "$n" && "$remote" == "$n" ]] ||
            why="iterations: ours ${local:-none}, perftest's ${remote:-none}, want $n each"
    else
        local iters
        iters="$(json_num "$out" iterations)"
        [[ -n "$iters" && "$iters" != 0 ]] || why="no messages counted in the duration"
        [[ "$(json_num "$out" duration_s)" == 4 ]] || why="${why:-JSON row without the duration}"
    fi
    if [[ -z "$why" ]]; then
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name: $why"
        tail -n 70 "$out" | sed 's/^/    | /'
    fi
}

for role in client server; do
    run "write_bw-b-$role" write_bw "$role" b "-b -s 4096 -n 100"
    run "read_bw-b-$role" read_bw "$role" b "-b -s 4096 -n 100"
    run "send_bw-b-$role" send_bw "$role" b "-b -s 4096 -n 600"
    run "write_bw-D-$role" write_bw "$role" D "-D 4 -f 1 -s 4096"
    run "send_bw-b-D-$role" send_bw "$role" D "-b -D 4 -f 1 -s 4096"
    run "send_lat-D-$role" send_lat "$role" D "-D 4 -f 1 -s 64"
    run "write_lat-D-$role" write_lat "$role" D "-D 4 -f 1 -s 2"
    run "send_bw-b-xdp-$role" send_bw "$role" b "-b -s 4096 -n 600" xdp
    run "write_bw-D-xdp-$role" write_bw "$role" D "-D 4 -f 1 -s 4096" xdp
    run "send_lat-D-xdp-$role" send_lat "$role" D "-D 4 -f 1 -s 64" xdp
done
exit 0
