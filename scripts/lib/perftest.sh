# Shared by the interop scripts that run perftest (`ib_*`) in the siw VM.

# perftest_clock_failed LOG: whether the VM's perftest gave up on its own
# clock. Before it reports, perftest measures the CPU's cycle rate and
# refuses to report when the samples do not fit a line (r^2 < 0.9), which
# happens on the VM's emulated CPU when the host is busy: the tool exits 1
# ("Can't produce a report") and the exchange with it ends unjudged.
perftest_clock_failed() {
    grep -q 'Correlation coefficient r^2' "$1" && grep -q "Can't produce a report" "$1"
}
