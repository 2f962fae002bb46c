# shellcheck shell=bash
# The siw VM's rping, judged by what it did rather than by an exit status
# it sometimes gives without cause. The VM's rping (Debian bookworm's
# rdma-core) ends by destroying the CM event channel under its CM-event
# thread: when that thread goes back to rdma_get_cm_event before the
# process exits, it prints "rdma_get_cm_event: Bad file descriptor" and
# exits 255, after a complete exchange and with nothing amiss on the wire
# (rdma-core fixed it in 2025, "rping: Fix spurious failure return codes").
# Used by scripts/interop/rping.sh, scripts/interop/compat.sh and
# scripts/demo; checked by scripts/interop/harness.sh.

# VM_RPING: a POSIX-sh function to put in front of a VM command (the VM's
# shell is busybox sh). `vm_rping ARGS...` runs the rping client
# `rping ARGS...`, passes its output on (stdout as it comes, stderr after
# it: stdout into a pipe is block-buffered, and stderr kept apart cannot
# land inside a ping's line), and returns its exit status, except that it
# returns 0, and says so, when rping exited 255 and printed nothing but
# the race's line, its disconnect event and (with -v) its ping data.
# rping reports every failure of the exchange on a line of its own ("data
# mismatch!", "cq completion failed status 5", "wait for RDMA_WRITE_ADV
# state 10", "rping client failed: -1", ...), so such a run is never taken
# for the race; whether every ping was made is the other side's to count.
# (An rping server always ends with "wait for RDMA_READ_ADV state 10":
# this is for clients.)
# shellcheck disable=SC2016 # expanded by the VM's shell
VM_RPING='vm_rping() {
    o=$(mktemp) || return 1
    { rping "$@" 2>"$o.err"; echo $? >"$o.rc"; } | tee "$o"
    cat "$o.err"
    r=$(cat "$o.rc" 2>/dev/null) || r=1
    if [ "$r" = 255 ] && grep -q "^rdma_get_cm_event: Bad file descriptor$" "$o.err" &&
        ! cat "$o" "$o.err" | grep -vqE "^(ping data: |client DISCONNECT EVENT\.\.\.$|rdma_get_cm_event: Bad file descriptor$)"; then
        echo "vm_rping: rping exited 255 from its CM-thread teardown race after the exchange; counted as 0"
        r=0
    fi
    rm -f "$o" "$o.err" "$o.rc"
    return "$r"
}'
