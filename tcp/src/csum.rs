//! Completing TCP checksums that a virtual peer left partial.
//!
//! A Linux guest behind virtio-net/tap, or a veth peer with transmit
//! checksum offload on, hands out TCP segments in the `CHECKSUM_PARTIAL`
//! state: the checksum field holds only the folded pseudo-header sum and
//! the host is trusted to finish it (virtio's `NEEDS_CSUM`). A socket
//! buffer carries that flag; an AF_XDP frame does not, so such segments
//! look corrupt to a verifying stack and every one is dropped.
//!
//! [`check`] verifies a received segment's TCP checksum in one pass over
//! the segment and recognises exactly that state (the field equals the
//! pseudo-header sum, and the real checksum does not verify): it
//! finishes the checksum in place, as the host's stack would, from the
//! same pass. Any other mismatch marks the segment corrupt. A device that
//! drops corrupt segments by it can tell smoltcp that TCP checksums are
//! verified on receive, so no segment is read for its checksum twice.
//! The payload of a segment whose checksum was partial was never covered
//! by a checksum on the virtual link; the MPA CRC, when negotiated, still
//! is end to end.

use smoltcp::wire::{checksum, EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};

/// Where the TCP segment of an unfragmented Ethernet/IPv4/TCP `frame`
/// lies in it (`start..end`), and its pseudo-header sum; with
/// `verify_ip`, only if the IPv4 header checksum verifies.
fn tcp_segment(frame: &mut [u8], verify_ip: bool) -> Option<(usize, usize, u16)> {
    let mut eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let mut ip = Ipv4Packet::new_checked(eth.payload_mut()).ok()?;
    if ip.next_header() != IpProtocol::Tcp
        || ip.more_frags()
        || ip.frag_offset() != 0
        || (verify_ip && !ip.verify_checksum())
    {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let start = 14 + usize::from(ip.header_len());
    let tcp = TcpPacket::new_checked(ip.payload_mut()).ok()?;
    let len = tcp.as_ref().len();
    let pseudo = checksum::pseudo_header_v4(&src, &dst, IpProtocol::Tcp, u32::try_from(len).ok()?);
    Some((start, start + len, pseudo))
}

/// Prepare an Ethernet/IPv4/TCP `frame` for transmit checksum offload:
/// the checksum field gets the folded pseudo-header sum (the state
/// `CHECKSUM_PARTIAL` leaves it in, which the device or the kernel
/// finishes over the segment), and the return value is where the
/// checksum's coverage starts in the frame and where within that the
/// field lies (`csum_start`, `csum_offset`). `None`, the frame left
/// alone: not an unfragmented TCP segment over IPv4.
pub fn offload(frame: &mut [u8]) -> Option<(u16, u16)> {
    let (start, end, pseudo) = tcp_segment(frame, false)?;
    TcpPacket::new_unchecked(&mut frame[start..end]).set_checksum(pseudo);
    Some((u16::try_from(start).ok()?, 16))
}

/// What [`check`] found of a frame's TCP checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Not an unfragmented TCP segment in an IPv4 packet whose header
    /// verifies (ARP, another protocol, a fragment, a truncated or corrupt
    /// header): left to the stack, which checks what it parses.
    NotTcp,
    /// The TCP checksum verifies.
    Valid,
    /// The checksum field held only the pseudo-header sum (a peer's
    /// transmit offload); the checksum is now finished in place.
    Completed,
    /// The TCP checksum does not verify: drop the segment.
    Corrupt,
}

/// Verify the TCP checksum of an Ethernet/IPv4/TCP `frame`, reading the
/// segment once, and finish it in place if it holds only the
/// pseudo-header sum. Never panics on any input.
pub fn check(frame: &mut [u8]) -> Checked {
    let Some((start, end, pseudo)) = tcp_segment(frame, true) else {
        return Checked::NotTcp;
    };
    let mut tcp = TcpPacket::new_unchecked(&mut frame[start..end]);
    // The one pass over the segment, its checksum field included.
    let sum = checksum::data(tcp.as_ref());
    if checksum::combine(&[pseudo, sum]) == !0 {
        return Checked::Valid;
    }
    let field = tcp.checksum();
    if field != pseudo {
        return Checked::Corrupt;
    }
    // The sum without the field (adding a one's complement subtracts),
    // and the checksum over it and the pseudo header.
    let rest = checksum::combine(&[sum, !field]);
    tcp.set_checksum(!checksum::combine(&[pseudo, rest]));
    Checked::Completed
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetRepr, IpAddress, Ipv4Address, Ipv4Repr, TcpControl, TcpRepr,
        TcpSeqNumber,
    };

    const A: Ipv4Address = Ipv4Address::new(198, 18, 0, 1);
    const B: Ipv4Address = Ipv4Address::new(198, 18, 0, 2);

    fn segment(payload: &[u8]) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 7174,
            dst_port: 40000,
            control: TcpControl::Psh,
            seq_number: TcpSeqNumber(1000),
            ack_number: Some(TcpSeqNumber(2000)),
            window_len: 512,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let ip = Ipv4Repr {
            src_addr: A,
            dst_addr: B,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.header_len() + payload.len(),
            hop_limit: 64,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EthernetProtocol::Ipv4,
        };
        let mut buf = vec![0; 14 + 20 + tcp.header_len() + payload.len()];
        let caps = ChecksumCapabilities::default();
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.emit(&mut f);
        let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
        ip.emit(&mut p, &caps);
        let mut t = TcpPacket::new_unchecked(p.payload_mut());
        tcp.emit(&mut t, &IpAddress::Ipv4(A), &IpAddress::Ipv4(B), &caps);
        buf
    }

    fn tcp_checksum_field(frame: &mut [u8]) -> &mut [u8] {
        &mut frame[14 + 20 + 16..14 + 20 + 18]
    }

    fn partial(payload: &[u8]) -> Vec<u8> {
        let mut f = segment(payload);
        let len = (f.len() - 34) as u32;
        let pseudo = checksum::pseudo_header_v4(&A, &B, IpProtocol::Tcp, len);
        tcp_checksum_field(&mut f).copy_from_slice(&pseudo.to_be_bytes());
        f
    }

    #[test]
    fn an_offloaded_segment_is_finished_by_check() {
        let seg = segment(b"offloaded payload");
        let mut f = seg.clone();
        assert_eq!(offload(&mut f), Some((34, 16)));
        // What a device leaves: the pseudo-header sum in the field, which
        // `check` recognises and finishes into the real checksum.
        assert_ne!(f, seg);
        assert_eq!(check(&mut f), Checked::Completed);
        assert_eq!(f, seg);
        // Not TCP over IPv4: left alone.
        let mut arp = seg.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let before = arp.clone();
        assert_eq!(offload(&mut arp), None);
        assert_eq!(arp, before);
        assert_eq!(offload(&mut f[..20]), None);
    }

    #[test]
    fn partial_checksum_is_completed() {
        // Odd and even lengths, and payloads whose sums carry.
        for payload in [&b"an FPDU"[..], b"an FPDU!", &[0xff; 1447], &[0; 1448]] {
            let good = segment(payload);
            let mut f = partial(payload);
            assert_ne!(f, good);
            assert_eq!(check(&mut f), Checked::Completed);
            assert_eq!(f, good);
            // Now valid: left alone.
            assert_eq!(check(&mut f), Checked::Valid);
            assert_eq!(f, good);
        }
    }

    #[test]
    fn corrupt_segments_are_found_and_left_alone() {
        let mut f = segment(b"an FPDU");
        tcp_checksum_field(&mut f)[1] ^= 0x40;
        let before = f.clone();
        assert_eq!(check(&mut f), Checked::Corrupt);
        assert_eq!(f, before);
        // A flipped payload bit under a full checksum.
        let mut f = segment(b"an FPDU");
        let last = f.len() - 1;
        f[last] ^= 0x10;
        assert_eq!(check(&mut f), Checked::Corrupt);
        // A partial checksum over a corrupted IP header is not trusted:
        // the stack drops the packet by its header checksum.
        let mut f = partial(b"x");
        f[14 + 8] ^= 1; // TTL: the IPv4 header checksum now fails
        let before = f.clone();
        assert_eq!(check(&mut f), Checked::NotTcp);
        assert_eq!(f, before);
    }

    #[test]
    fn never_panics_on_short_or_odd_frames() {
        let full = partial(b"payload");
        for n in 0..full.len() {
            let mut f = full[..n].to_vec();
            let _ = check(&mut f);
        }
        let mut arp = vec![0xff; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(check(&mut arp), Checked::NotTcp);
    }
}
