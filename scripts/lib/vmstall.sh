# shellcheck shell=bash
# Whether the siw VM's network transmit stalled during a run: an
# environment fault of the emulated NIC (under host load it stops sending
# for seconds), not a verdict on either side. Used by scripts/siw-interop;
# checked by scripts/interop/harness.sh.

# vm_stall_kernel KERN: whether the VM kernel's lines KERN report that a
# transmit queue timed out (the network device watchdog).
vm_stall_kernel() {
    grep -qE 'NETDEV WATCHDOG|TX timeout on queue' <<<"$1"
}

# vm_stall_silence VM_IP HOST_IP: reads one line per IPv4 frame, "time
# source destination retransmission" (tshark's fields frame.time_relative,
# ip.src, ip.dst, tcp.analysis.retransmission), and prints "SECS N" when
# the VM, having sent HOST_IP something, sent it nothing more in the last
# SECS >= 2 seconds while HOST_IP retransmitted to it N >= 2 times (a
# live VM acknowledges every retransmission it receives); else nothing.
vm_stall_silence() {
    awk -v vm="$1" -v host="$2" '
        $2 == vm && $3 == host { seen = 1; tv = $1; n = 0 }
        $2 == host && $3 == vm && $4 != "" { n++ }
        { last = $1 }
        END { if (seen && last - tv >= 2 && n >= 2) printf "%.1f %d\n", last - tv, n }'
}
