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

# vm_kernel_broken KERN: whether the VM kernel's lines KERN report a
# panic, an oops or a lockup: a VM that stopped answering for that is no
# stall of its NIC.
vm_kernel_broken() {
    grep -qE 'Kernel panic|BUG:|Oops|soft lockup|hung_task|blocked for more than' <<<"$1"
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
# "time rx_packets tx_packets xdp" (rx: frames from the VM; tx: frames
# the VM's NIC took from the tap; xdp: 1 while an XDP program is attached
# to the tap), and prints "SECS N" when an XDP program was attached
# during the samples and the VM, having sent something, sent nothing
# more in the last SECS >= 5 seconds while it took frames in N >= 3 of
# the samples since (a host waiting for an answer resends with growing
# gaps; a side closing sends its last frames at once); else nothing.
# For an AF_XDP engine's frames, which the capture cannot see (XDP takes
# them first); a run of kernel TCP has the capture's rule.
vm_stall_counters() {
    awk '
        $4 == 1 { xdp = 1 }
        NR == 1 { rx = $2; tx = $3; t = $1; next }
        $2 != rx { seen = 1; t = $1; n = 0 }
        $2 == rx && $3 != tx { n++ }
        { rx = $2; tx = $3; last = $1 }
        END { if (xdp && seen && last - t >= 5 && n >= 3) printf "%.1f %d\n", last - t, n }'
}

# vm_stall_unanswered NETNS VM_IP: whether VM_IP, a VM known to be
# running, answers none of the pings NETNS sends it over 3 s (one every
# half second; the first answer ends the wait): its kernel takes them but
# its NIC sends nothing, not even the address resolution's reply. For
# the shape no capture shows: both sides wait for each other in silence
# (the VM's last message never left, so nobody has anything to resend).
vm_stall_unanswered() {
    ! ip netns exec "$1" ping -n -q -c 1 -i 0.5 -w 3 "$2" >/dev/null 2>&1
}

# vm_stall_view VIEW RX_BEFORE RX_AFTER: the VM's own view of its network
# after a failed run (scripts/siw-interop's vm_net_view: VIEW is what the
# VM printed, RX_BEFORE and RX_AFTER the tap's count of frames from the
# VM before and after it). Prints N when the VM pinged the host N times
# with no answer (ping's summary, "N packets transmitted, 0 [packets]
# received") and no frame of it reached the tap meanwhile: its kernel
# sends, its NIC delivers nothing, not even the address resolution's
# request. Else nothing (the VM did not answer, or something got out).
vm_stall_view() {
    [[ -n "$2" && "$2" == "$3" ]] || return 0
    sed -nE 's/^([0-9]+) packets transmitted, 0 (packets )?received.*/\1/p' <<<"$1" | awk '$1 > 0 { print; exit }'
}
