//! The device wrapper a [`Stack`](crate::Stack) puts around the caller's
//! `phy::Device`: it counts frames, lets the stack inject frames into its
//! own ingress (the synthetic ARP replies behind static neighbour
//! entries), and reads the MSS option of every SYN that arrives, because
//! smoltcp keeps the peer's MSS private and the iWARP layer needs the
//! effective MSS to size its FPDUs.

use std::cell::Cell;
use std::collections::VecDeque;

use smoltcp::phy::{self, Device, DeviceCapabilities};
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Address, Ipv4Packet, TcpPacket,
};

/// How many peer MSS values are remembered (oldest evicted first): one
/// per connection being set up or open.
const MSS_TABLE_CAP: usize = 1024;

/// Frame counters, updated by the tokens.
#[derive(Debug, Default)]
pub(crate) struct PortCounters {
    pub rx_frames: Cell<u64>,
    pub rx_bytes: Cell<u64>,
    pub tx_frames: Cell<u64>,
    pub tx_bytes: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get().wrapping_add(n));
}

/// MSS options seen in SYNs: (remote address, remote port, local port) → MSS.
#[derive(Debug, Default)]
pub(crate) struct MssTable {
    entries: VecDeque<((Ipv4Address, u16, u16), u16)>,
}

impl MssTable {
    pub(crate) fn get(
        &self,
        remote: Ipv4Address,
        remote_port: u16,
        local_port: u16,
    ) -> Option<u16> {
        let key = (remote, remote_port, local_port);
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, m)| *m)
    }

    pub(crate) fn forget(&mut self, remote: Ipv4Address, remote_port: u16, local_port: u16) {
        let key = (remote, remote_port, local_port);
        self.entries.retain(|(k, _)| *k != key);
    }

    fn put(&mut self, key: (Ipv4Address, u16, u16), mss: u16) {
        self.entries.retain(|(k, _)| *k != key);
        if self.entries.len() >= MSS_TABLE_CAP {
            self.entries.pop_front();
        }
        self.entries.push_back((key, mss));
    }

    /// Look at one received frame; remember the MSS if it is a valid SYN
    /// carrying one. Never panics on any input.
    fn observe(&mut self, frame: &[u8]) {
        let Ok(eth) = EthernetFrame::new_checked(frame) else {
            return;
        };
        if eth.ethertype() != EthernetProtocol::Ipv4 {
            return;
        }
        let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
            return;
        };
        if ip.next_header() != IpProtocol::Tcp || ip.more_frags() || ip.frag_offset() != 0 {
            return;
        }
        let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else {
            return;
        };
        if !tcp.syn() {
            return;
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        if !tcp.verify_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst)) {
            return;
        }
        if let Ok(summary) = tcp.options_summary() {
            if let Some(mss) = summary.max_segment_size {
                self.put((src, tcp.src_port(), tcp.dst_port()), mss);
            }
        }
    }
}

/// The wrapper device. See the module documentation.
#[derive(Debug)]
pub(crate) struct Port<D> {
    pub inner: D,
    pub inject: VecDeque<Vec<u8>>,
    pub mss: MssTable,
    pub counters: PortCounters,
}

impl<D> Port<D> {
    pub(crate) fn new(inner: D) -> Self {
        Self {
            inner,
            inject: VecDeque::new(),
            mss: MssTable::default(),
            counters: PortCounters::default(),
        }
    }
}

/// Receive token: a frame from the device, or one the stack injected.
pub(crate) enum PortRx<'a, R> {
    Device {
        token: R,
        mss: &'a mut MssTable,
        counters: &'a PortCounters,
    },
    Injected(Vec<u8>),
}

impl<R: phy::RxToken> phy::RxToken for PortRx<'_, R> {
    fn consume<T, F>(self, f: F) -> T
    where
        F: FnOnce(&[u8]) -> T,
    {
        match self {
            Self::Device {
                token,
                mss,
                counters,
            } => token.consume(|buf| {
                bump(&counters.rx_frames, 1);
                bump(&counters.rx_bytes, buf.len() as u64);
                mss.observe(buf);
                f(buf)
            }),
            Self::Injected(frame) => f(&frame),
        }
    }

    fn meta(&self) -> phy::PacketMeta {
        match self {
            Self::Device { token, .. } => token.meta(),
            Self::Injected(_) => phy::PacketMeta::default(),
        }
    }
}

/// Transmit token: counts what goes out. An injected frame comes with a
/// token that discards (smoltcp answers no ARP reply, so it stays unused).
pub(crate) enum PortTx<'a, T> {
    Device {
        token: T,
        counters: &'a PortCounters,
    },
    Discard,
}

impl<T: phy::TxToken> phy::TxToken for PortTx<'_, T> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        match self {
            Self::Device { token, counters } => {
                bump(&counters.tx_frames, 1);
                bump(&counters.tx_bytes, len as u64);
                token.consume(len, f)
            }
            Self::Discard => f(&mut vec![0; len]),
        }
    }

    fn set_meta(&mut self, meta: phy::PacketMeta) {
        if let Self::Device { token, .. } = self {
            token.set_meta(meta)
        }
    }
}

impl<D: Device> Device for Port<D> {
    type RxToken<'a>
        = PortRx<'a, D::RxToken<'a>>
    where
        Self: 'a;
    type TxToken<'a>
        = PortTx<'a, D::TxToken<'a>>
    where
        Self: 'a;

    fn receive(&mut self, timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let counters = &self.counters;
        if let Some(frame) = self.inject.pop_front() {
            return Some((PortRx::Injected(frame), PortTx::Discard));
        }
        let (rx, tx) = self.inner.receive(timestamp)?;
        Some((
            PortRx::Device {
                token: rx,
                mss: &mut self.mss,
                counters,
            },
            PortTx::Device {
                token: tx,
                counters,
            },
        ))
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<Self::TxToken<'_>> {
        let counters = &self.counters;
        self.inner
            .transmit(timestamp)
            .map(|token| PortTx::Device { token, counters })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.inner.capabilities()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetRepr, IpAddress, Ipv4Repr, TcpControl, TcpRepr, TcpSeqNumber,
    };

    fn syn(mss: Option<u16>, corrupt: bool) -> Vec<u8> {
        let src = Ipv4Address::new(198, 18, 0, 1);
        let dst = Ipv4Address::new(198, 18, 0, 2);
        let tcp = TcpRepr {
            src_port: 40000,
            dst_port: 7174,
            control: TcpControl::Syn,
            seq_number: TcpSeqNumber(1),
            ack_number: None,
            window_len: 1000,
            window_scale: Some(3),
            max_seg_size: mss,
            sack_permitted: true,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        let ip = Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EthernetProtocol::Ipv4,
        };
        let mut buf = vec![0xa5; eth.buffer_len() + ip.buffer_len() + tcp.buffer_len()];
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.emit(&mut f);
        let caps = ChecksumCapabilities::default();
        let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
        ip.emit(&mut p, &caps);
        let mut t = TcpPacket::new_unchecked(p.payload_mut());
        tcp.emit(&mut t, &IpAddress::Ipv4(src), &IpAddress::Ipv4(dst), &caps);
        if corrupt {
            let n = buf.len();
            buf[n - 1] ^= 0x10;
        }
        buf
    }

    #[test]
    fn snoops_mss_of_valid_syns_only() {
        let mut t = MssTable::default();
        let peer = Ipv4Address::new(198, 18, 0, 1);
        t.observe(&syn(Some(1400), false));
        assert_eq!(t.get(peer, 40000, 7174), Some(1400));
        t.observe(&syn(Some(500), true));
        assert_eq!(t.get(peer, 40000, 7174), Some(1400), "bad checksum ignored");
        t.observe(&syn(None, false));
        assert_eq!(t.get(peer, 40000, 7174), Some(1400));
        t.forget(peer, 40000, 7174);
        assert_eq!(t.get(peer, 40000, 7174), None);
    }

    #[test]
    fn never_panics_on_garbage() {
        let mut t = MssTable::default();
        let good = syn(Some(1400), false);
        for cut in 0..good.len() {
            t.observe(&good[..cut]);
        }
        let mut x = 0x1234_5678u32;
        for len in 0..200 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            t.observe(&junk);
        }
    }
}
