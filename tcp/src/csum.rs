//! Completing TCP checksums that a virtual peer left partial.
//!
//! A Linux guest behind virtio-net/tap, or a veth peer with transmit
//! checksum offload on, hands out TCP segments in the `CHECKSUM_PARTIAL`
//! state: the checksum field holds only the folded pseudo-header sum and
//! the host is trusted to finish it (virtio's `NEEDS_CSUM`). A socket
//! buffer carries that flag; an AF_XDP frame does not, so such segments
//! look corrupt to a verifying stack and every one is dropped.
//!
//! [`complete_partial`] recognises exactly that state (the field equals
//! the pseudo-header sum, and the real checksum does not verify) and
//! finishes the checksum in place, as the host's stack would. Any other
//! mismatch is left alone and the segment is dropped later as corrupt.
//! The payload of such a segment was never covered by a checksum on the
//! virtual link; the MPA CRC, when negotiated, still is end to end.

use smoltcp::wire::{
    checksum, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Packet, TcpPacket,
};

/// Finish the TCP checksum of an Ethernet/IPv4/TCP `frame` whose checksum
/// field holds only the pseudo-header sum. Returns true when it did;
/// false for anything else (not TCP/IPv4, truncated, already valid, or
/// corrupt). Never panics on any input.
pub fn complete_partial(frame: &mut [u8]) -> bool {
    let Ok(mut eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return false;
    }
    let Ok(mut ip) = Ipv4Packet::new_checked(eth.payload_mut()) else {
        return false;
    };
    if ip.next_header() != IpProtocol::Tcp
        || ip.more_frags()
        || ip.frag_offset() != 0
        || !ip.verify_checksum()
    {
        return false;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let Ok(mut tcp) = TcpPacket::new_checked(ip.payload_mut()) else {
        return false;
    };
    // The field first: a segment whose field is not the bare
    // pseudo-header sum (every segment of a peer without the offload) is
    // left to smoltcp's own verification, without a second pass over it
    // here.
    let len = tcp.as_ref().len();
    let Ok(len32) = u32::try_from(len) else {
        return false;
    };
    let pseudo = checksum::pseudo_header_v4(&src, &dst, IpProtocol::Tcp, len32);
    if tcp.checksum() != pseudo {
        return false;
    }
    let (s, d) = (IpAddress::Ipv4(src), IpAddress::Ipv4(dst));
    if tcp.verify_checksum(&s, &d) {
        return false;
    }
    tcp.fill_checksum(&s, &d);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetRepr, Ipv4Address, Ipv4Repr, TcpControl, TcpRepr, TcpSeqNumber,
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
    fn partial_checksum_is_completed() {
        let good = segment(b"an FPDU");
        let mut f = partial(b"an FPDU");
        assert_ne!(f, good);
        assert!(complete_partial(&mut f));
        assert_eq!(f, good);
        // Now valid: left alone.
        assert!(!complete_partial(&mut f));
        assert_eq!(f, good);
    }

    #[test]
    fn corrupt_checksum_is_left_alone() {
        let mut f = segment(b"an FPDU");
        tcp_checksum_field(&mut f)[1] ^= 0x40;
        let before = f.clone();
        assert!(!complete_partial(&mut f));
        assert_eq!(f, before);
        // A partial checksum over a corrupted IP header is not trusted.
        let mut f = partial(b"x");
        f[14 + 8] ^= 1; // TTL: the IPv4 header checksum now fails
        assert!(!complete_partial(&mut f));
    }

    #[test]
    fn never_panics_on_short_or_odd_frames() {
        let full = partial(b"payload");
        for n in 0..full.len() {
            let mut f = full[..n].to_vec();
            let _ = complete_partial(&mut f);
        }
        let mut arp = vec![0xff; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(!complete_partial(&mut arp));
    }
}
