//! The zero-copy wire views of `iwarp::wire` (DDP/RDMAP header, RDMA Read
//! Request header, Terminate body, MPA request/reply frame, IRD/ORD words,
//! marker) over arbitrary bytes. Nothing may panic; a view's `new_checked`
//! and its `Repr::parse` agree; what parses re-emits to the same bytes
//! (every bit of these formats is represented) or, for the Terminate body
//! whose reserved bits and length slot are normalised, to bytes that parse
//! back to the same value.
//!
//! Input: the bytes, tried with every view at offset 0; when a DDP header
//! parses, its payload is also tried as a Read Request and a Terminate
//! body (as the receive path does).
#![no_main]

use iwarp::wire::ddp::{self, HeaderRepr};
use iwarp::wire::marker::MarkerRepr;
use iwarp::wire::mpa::{self, FrameRepr, IrdOrd};
use iwarp::wire::rdmap::ReadRequest;
use iwarp::wire::terminate::TerminateRepr;
use libfuzzer_sys::fuzz_target;

fn ddp_header(data: &[u8]) {
    let view = ddp::Packet::new_checked(data);
    let repr = HeaderRepr::parse(data);
    assert_eq!(view.is_ok(), repr.is_ok(), "DDP view and Repr disagree");
    let (Ok(view), Ok(repr)) = (view, repr) else { return };
    let len = repr.buffer_len();
    assert_eq!(len, view.header_len());
    assert_eq!(repr.opcode, view.opcode());
    assert_eq!(repr.last, view.last());
    assert_eq!(view.payload(), &data[len..]);
    let mut out = vec![0xa5; len];
    repr.emit(&mut out);
    assert_eq!(out, data[..len], "DDP header round trip");
    assert_eq!(HeaderRepr::parse(&out), Ok(repr));
    read_request(view.payload());
    terminate(view.payload());
}

fn read_request(data: &[u8]) {
    let Ok(repr) = ReadRequest::parse(data) else {
        assert!(data.len() < ReadRequest::LEN);
        return;
    };
    let mut out = [0xa5; ReadRequest::LEN];
    repr.emit(&mut out);
    assert_eq!(out, data[..ReadRequest::LEN], "Read Request round trip");
}

fn terminate(data: &[u8]) {
    let Ok(repr) = TerminateRepr::parse(data) else { return };
    let len = repr.buffer_len();
    assert!(len <= data.len(), "Terminate longer than its input");
    let mut out = vec![0xa5; len];
    repr.emit(&mut out);
    // Control bits, lengths and copied headers survive; the reserved
    // bits and the length slot without M do not have to.
    assert_eq!(out[..2], data[..2], "Terminate code bits");
    assert_eq!(out[2] & 0xe0, data[2] & 0xe0, "Terminate HdrCt flags");
    assert_eq!(TerminateRepr::parse(&out), Ok(repr), "Terminate re-parse");
}

fn mpa_frame(data: &[u8]) {
    let view = mpa::Packet::new_checked(data);
    let repr = FrameRepr::parse(data);
    match FrameRepr::frame_len(data) {
        Ok(len) => {
            assert!(len <= mpa::HEADER_LEN + mpa::MAX_PRIVATE_DATA);
            // The view checks only lengths: a known key and an acceptable
            // PD_Length parse exactly when the view is complete.
            assert_eq!(repr.is_ok(), view.is_ok(), "MPA view and Repr disagree");
        }
        Err(e) => assert_eq!(repr, Err(e)),
    }
    let Ok(repr) = repr else { return };
    let len = repr.buffer_len();
    let mut out = vec![0xa5; len];
    repr.emit(&mut out);
    assert_eq!(out, data[..len], "MPA frame round trip");
    let view = mpa::Packet::new_checked(&out[..]).expect("emitted frame is complete");
    assert_eq!(view.private_data(), repr.private_data);
    assert_eq!(FrameRepr::parse(&out), Ok(repr));
    ird_ord(repr.private_data);
}

fn ird_ord(data: &[u8]) {
    let Ok(repr) = IrdOrd::parse(data) else {
        assert!(data.len() < IrdOrd::LEN);
        return;
    };
    assert!(repr.ird <= IrdOrd::MAX && repr.ord <= IrdOrd::MAX);
    let mut out = [0xa5; IrdOrd::LEN];
    repr.emit(&mut out);
    assert_eq!(out, data[..IrdOrd::LEN], "IRD/ORD round trip");
}

fn marker(data: &[u8]) {
    let Ok(repr) = MarkerRepr::parse(data) else {
        assert!(data.len() < 4);
        return;
    };
    let mut out = [0xa5; 4];
    repr.emit(&mut out);
    assert_eq!(out, data[..4], "marker round trip");
}

fuzz_target!(|data: &[u8]| {
    ddp_header(data);
    read_request(data);
    terminate(data);
    mpa_frame(data);
    ird_ord(data);
    marker(data);
});
