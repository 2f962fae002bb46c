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

# vm_stall_counters: reads samples of the tap's counters, one line each,
# "time rx_packets tx_packets" (rx: frames from the VM, tx: frames to
# it), and prints "SECS N" when the VM, having sent something during the
# samples, sent nothing more in the last SECS >= 5 seconds while frames
# went to it in N >= 3 of the samples since (a host waiting for an
# answer resends with growing gaps; a side closing sends its last frames
# at once); else nothing. For runs whose frames the capture cannot see
# (an AF_XDP engine takes them first).
vm_stall_counters() {
    awk '
        NR == 1 { rx = $2; tx = $3; t = $1; next }
        $2 != rx { seen = 1; t = $1; n = 0 }
        $2 == rx && $3 != tx { n++ }
        { rx = $2; tx = $3; last = $1 }
        END { if (seen && last - t >= 5 && n >= 3) printf "%.1f %d\n", last - t, n }'
}
