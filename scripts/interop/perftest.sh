#!/usr/bin/env bash
# perftest interop: iwarp-perf against the real perftest tools (`ib_* -R`)
# in the siw VM, for write_bw write_lat read_bw read_lat send_bw send_lat,
# each in both roles and with CRC off (stock siw) and on:
#   <test>-client       our client  -> VM `ib_<test> -R` server (stock siw)
#   <test>-server       VM `ib_<test> -R` client -> our server (stock siw)
#   <test>-client-crc   our client with --crc (stock siw echoes C=1)
#   <test>-server-crc   VM siw requires CRC (tunable, mpa_crc_required=1)
# A scenario passes when both sides exit 0 and our side printed its result
# row (the read_lat server, passive like perftest's, prints none).
# Prints `PASS perftest-<name>` / `FAIL perftest-<name>: why`; always exits 0.
#   PERFTEST_FILTER=REGEX   run only scenarios whose name matches
#   PERFTEST_LOGS=DIR       keep every scenario's output in DIR
# Pitfalls handled: perftest servers are single-shot (one run per
# scenario); the VM server is started with -L 18515 and our client only
# then; our server listens before the VM client starts (siw-interop
# waits for the port) and keeps listening for the data connection.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
# shellcheck source=../lib/perftest.sh
source scripts/lib/perftest.sh
if ! cargo build --release -q -p iwarp-apps --bin iwarp-perf >/dev/null 2>&1; then
    echo "FAIL perftest-build: cargo build --release -p iwarp-apps --bin iwarp-perf failed"
    exit 0
fi
BIN="$ROOT/target/release/iwarp-perf"
LOGS="${PERFTEST_LOGS:-}"
TMP="$(mktemp -d -t perftest-interop.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
PORT=18515

# test -> "size iterations"
declare -A ARGS=(
    [write_bw]="4096 100" [read_bw]="4096 100" [send_bw]="4096 100"
    [write_lat]="2 50" [read_lat]="64 50" [send_lat]="64 50"
)

# run NAME TEST ROLE CRC
run() {
    local name="perftest-$1" t="$2" role="$3" crc="$4" size iters out rc why
    if [[ -n "${PERFTEST_FILTER:-}" && ! "$name" =~ $PERFTEST_FILTER ]]; then
        return
    fi
    read -r size iters <<<"${ARGS[$t]}"
    local common="-s $size -n $iters" siw=() ours_crc=""
    if [[ "$crc" == crc && "$role" == server ]]; then
        siw=(--siw tunable --siw-param mpa_crc_required=1)
    elif [[ "$crc" == crc ]]; then
        ours_crc="--crc"
    fi
    out="$TMP/$name.log"
    local start=$SECONDS
    if [[ "$role" == client ]]; then
        perftest_run "$name" "$out" scripts/siw-interop -q -T 90 "${siw[@]}" vm-server "$PORT" \
            "ib_$t -R -d siw0 $common" "$BIN $t @VM@ -p $PORT $common $ours_crc"
    else
        perftest_run "$name" "$out" scripts/siw-interop -q -T 90 "${siw[@]}" vm-client "$PORT" \
            "$BIN $t -p $PORT $common $ours_crc" "ib_$t -R -d siw0 $common @HOST@"
    fi
    rc=$?
    [[ -n "$LOGS" ]] && mkdir -p "$LOGS" && cp "$out" "$LOGS/"
    why=""
    if ((rc != 0)); then
        why="$(grep -E '^(host|vm) rc=' "$out" | tr '\n' ' ')$(grep -m1 '^iwarp-perf: ' "$out")"
        [[ -n "$why" ]] || why="siw-interop exit $rc: $(tail -n 1 "$out")"
    elif [[ ! ("$t" == read_lat && "$role" == server) ]] &&
        ! grep -Eq "^ $size +[0-9]+ " "$out"; then
        why="no result row for $size bytes"
    fi
    if [[ -z "$why" ]]; then
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name: $why"
        # Both sides' last words, for a failure that does not come back.
        tail -n 70 "$out" | sed 's/^/    | /'
    fi
}

# Grouped by the VM's siw (stock, then tunable for the CRC servers), so a
# siw-interop session boots it twice.
for crc in nocrc crc; do
    for role in client server; do
        for t in write_bw write_lat read_bw read_lat send_bw send_lat; do
            suffix=""
            [[ "$crc" == crc ]] && suffix="-crc"
            run "$t-$role$suffix" "$t" "$role" "$crc"
        done
    done
done

# Our --persistent server against VM perftest clients one after another
# (write_bw twice: perftest's protocol does not name the test, so one
# server runs one); every run prints its own row and releases its
# connections before the next.
persistent() {
    local name="perftest-write_bw-persistent-server" out rc why=""
    if [[ -n "${PERFTEST_FILTER:-}" && ! "$name" =~ $PERFTEST_FILTER ]]; then
        return
    fi
    local common="-s 4096 -n 100"
    out="$TMP/$name.log"
    local start=$SECONDS
    perftest_run "$name" "$out" scripts/siw-interop -q -T 120 vm-client "$PORT" \
        "$BIN write_bw -p $PORT --persistent 2 $common" \
        "ib_write_bw -R -d siw0 $common @HOST@ && sleep 1 && ib_write_bw -R -d siw0 $common @HOST@"
    rc=$?
    [[ -n "$LOGS" ]] && mkdir -p "$LOGS" && cp "$out" "$LOGS/"
    if ((rc != 0)); then
        why="$(grep -E '^(host|vm) rc=' "$out" | tr '\n' ' ')$(grep -m1 '^iwarp-perf: ' "$out")"
    elif [[ "$(grep -cE '^iwarp-perf: run [12] from .*: done, 0 connections open$' "$out")" != 2 ]]; then
        why="our server did not report two released runs"
    elif [[ "$(grep -cE '^ 4096 +100 ' "$out")" -lt 2 ]]; then
        why="fewer than two result rows for 4096 bytes"
    fi
    if [[ -z "$why" ]]; then
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name: $why"
        tail -n 70 "$out" | sed 's/^/    | /'
    fi
}
persistent
exit 0
