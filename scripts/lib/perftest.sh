# Shared by the interop scripts that run perftest (`ib_*`) in the siw VM.

# host_rc LOG, vm_rc LOG: the exit status of the host's and of the VM's
# command in a scripts/siw-interop log (its last `host rc=` / `vm rc=`
# line).
host_rc() { sed -n 's/^host rc=//p' "$1" | tail -n 1; }
vm_rc() { sed -n 's/^vm rc=//p' "$1" | tail -n 1; }

# perftest_clock_failed LOG: whether the VM's perftest gave up on its own
# clock. Before it reports, perftest measures the CPU's cycle rate and
# refuses to report when the samples do not fit a line (r^2 < 0.9), which
# happens on the VM's emulated CPU when the host is busy: the tool exits 1
# ("Can't produce a report") and the exchange with it ends unjudged.
perftest_clock_failed() {
    grep -q 'Correlation coefficient r^2' "$1" && grep -q "Can't produce a report" "$1"
}

# perftest_close_race LOG SIZE: whether the siw-interop run in LOG
# failed only in perftest's closing handshake on the VM's side, after
# its result row for SIZE bytes: the host side exited 0, the VM's 1, and
# the VM's console says it failed to close the connection. perftest
# ends with a handshake on its first connection, then each side
# disconnects; siw sometimes fails the VM's last work request when the
# other side disconnects right after that handshake ("Bad wc status").
# One pass of awk over the whole file: a reader that stops at its first
# match (grep -q) at the end of a pipe ends the pipeline with SIGPIPE
# under pipefail once the log outgrows the pipe's buffer.
perftest_close_race() {
    awk -v size="$2" '
        /^---- VM console \(tail\) ----$/ { vm = 1 }
        vm && /^Failed to close connection between server and client/ { closed = 1 }
        $1 == size && $2 ~ /^[0-9]+$/ { row = 1 }
        /^host rc=/ { host = substr($0, 9) }
        /^vm rc=/ { vmrc = substr($0, 7) }
        END { exit !(closed && row && host == "0" && vmrc == "1") }
    ' "$1"
}

# perftest_retry_why LOG: why the failed run in LOG is run again (the
# VM's perftest could not measure its clock, or scripts/siw-interop found
# that the VM's network transmit stalled: see vm_transmit_stalled there);
# fails when it is not.
perftest_retry_why() {
    local stalled
    if perftest_clock_failed "$1"; then
        echo "the VM's perftest could not measure its clock (r^2 < 0.9)"
    elif stalled="$(grep -m1 '^siw-interop: VM transmit stalled: ' "$1")"; then
        echo "${stalled#siw-interop: }"
    else
        return 1
    fi
}

# perftest_run NAME LOG CMD...: run CMD with its output in LOG, the host
# side at nice 19 (SIW_INTEROP_HOST_NICE, scripts/siw-interop, unless
# set): a host side that polls without yielding, as an AF_XDP engine and
# perftest do, otherwise starves the VM's emulated CPU, which measures
# its clock and drives its NIC, on a two-core host. When it failed for a
# reason perftest_retry_why gives, say so with the failed attempt's
# evidence and run it again, up to PERFTEST_ATTEMPTS times in all
# (default 4), PERFTEST_RETRY_PAUSE seconds apart (default 5) so that a
# burst of load on the host has passed. Every other failure stands at
# once. Returns CMD's last exit status.
perftest_run() {
    local name="$1" log="$2" rc attempt=0 why=""
    shift 2
    while :; do
        attempt=$((attempt + 1))
        if ((attempt > 1)); then
            echo "  note $name: $why; attempt $attempt"
            # The evidence: the failed attempt's VM kernel messages, tap
            # counters and last packets.
            sed -n '/^---- VM kernel messages/,/^host rc=/p' "$log" | sed 's/^/    | /'
            sleep "${PERFTEST_RETRY_PAUSE:-5}"
        fi
        SIW_INTEROP_HOST_NICE="${SIW_INTEROP_HOST_NICE:-19}" "$@" >"$log" 2>&1
        rc=$?
        ((rc != 0 && attempt < ${PERFTEST_ATTEMPTS:-4})) || return "$rc"
        why="$(perftest_retry_why "$log")" || return "$rc"
    done
}
