//! The core's `tracing` events: connection lifecycle, Terminate sent and
//! received with their layer/type/code fields, and attribution to the
//! span the owner set on the QP. A capturing layer, installed for the
//! test's own thread only (`with_default`), records every event with its
//! fields and the spans it belongs to.

use iwarp::mem::Access;
use iwarp::mpa::handshake::Config;
use iwarp::qp::{QpConfig, QpEvent, QpState, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, Pair};
use iwarp_capture::log::{Capture, Record as Rec};
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;

/// The `qp` field of a record's innermost `conn` span.
trait ConnSpan {
    fn conn(&self) -> Option<&str>;
}

impl ConnSpan for Rec {
    fn conn(&self) -> Option<&str> {
        self.span("conn")
            .and_then(|f| f.get("qp"))
            .map(String::as_str)
    }
}

/// Run `f` with the capturing subscriber as this thread's default;
/// return what it recorded.
fn capture(f: impl FnOnce()) -> Vec<Rec> {
    let cap = Capture::default();
    let subscriber = tracing_subscriber::registry().with(cap.clone());
    tracing::subscriber::with_default(subscriber, f);
    cap.records(|_| true)
}

fn find<'a>(recs: &'a [Rec], msg: &str, conn: &str) -> Vec<&'a Rec> {
    recs.iter()
        .filter(|r| r.message() == msg && r.conn() == Some(conn))
        .collect()
}

/// A pair whose QPs carry the spans `conn{qp=a}` and `conn{qp=b}`.
fn pair_with_spans() -> Pair {
    let mut p = Pair::new(QpConfig::default(), Chunking::whole(65536));
    let (sa, sb) = (
        tracing::info_span!("conn", qp = "a"),
        tracing::info_span!("conn", qp = "b"),
    );
    p.a.ctx.set_qp_span(p.a.qp, sa).unwrap();
    p.b.ctx.set_qp_span(p.b.qp, sb).unwrap();
    p
}

#[test]
fn lifecycle_events_of_a_connection_carry_its_span() {
    let recs = capture(|| {
        let mut p = pair_with_spans();
        assert_eq!(
            p.a.ctx
                .qp(p.a.qp)
                .unwrap()
                .span()
                .metadata()
                .unwrap()
                .name(),
            "conn"
        );
        p.start(Config::default(), b"hello", Config::default());
        p.drive();
        assert_eq!(p.a.state(), QpState::Rts);
        p.a.ctx.disconnect(p.a.qp);
        p.drive();
        assert_eq!(p.b.state(), QpState::Error);
    });
    for (msg, side) in [
        ("connect: MPA request queued", "a"),
        ("accept: awaiting the MPA request", "b"),
        ("MPA request received", "b"),
        ("connection accepted: MPA reply queued", "b"),
        ("MPA reply received", "a"),
        ("connection established (RTS)", "a"),
        ("connection established (RTS)", "b"),
        ("disconnect", "a"),
        ("connection closed by the peer", "b"),
        ("QP to Error: outstanding work requests flushed", "a"),
        ("QP to Error: outstanding work requests flushed", "b"),
    ] {
        assert_eq!(
            find(&recs, msg, side).len(),
            1,
            "{msg:?} on {side}: {recs:#?}"
        );
    }
    let sent: Vec<(&str, &str)> = recs
        .iter()
        .filter(|r| r.message() == "MPA frame sent")
        .map(|r| (r.field("frame"), r.conn().unwrap_or("")))
        .collect();
    assert_eq!(sent, [("request", "a"), ("reply", "b")]);
    let req = find(&recs, "connect: MPA request queued", "a")[0];
    assert_eq!(req.field("private_data_len"), "5");
    assert_eq!(req.level, Level::DEBUG);
    let est = find(&recs, "connection established (RTS)", "b")[0];
    assert_eq!(est.level, Level::INFO);
    assert_eq!(est.field("role"), "responder");
    // Nothing of a normal connection warns.
    assert!(recs.iter().all(|r| r.level > Level::WARN), "{recs:#?}");
}

#[test]
fn a_violation_logs_terminate_sent_and_received_with_its_code() {
    let recs = capture(|| {
        let mut p = pair_with_spans();
        p.start(Config::default(), &[], Config::default());
        p.drive();
        let src = p.a.reg_with(&[0xab; 64], Access::NONE);
        // A Write to an STag the responder never registered: DDP tagged
        // buffer error, invalid STag (layer 1, type 1, code 0).
        p.a.ctx
            .post_send(
                p.a.qp,
                &SendWr {
                    wr_id: 1,
                    op: SendOp::Write {
                        remote_addr: 0,
                        rkey: 0x1234_5600,
                    },
                    sgl: &[Sge {
                        addr: src.iova,
                        len: 64,
                        lkey: src.lkey,
                    }],
                    signaled: true,
                },
            )
            .unwrap();
        p.drive();
        assert!(p
            .a
            .events
            .iter()
            .any(|e| matches!(e, QpEvent::RemoteTerminate(_))));
    });
    let sent = find(&recs, "Terminate sent", "b");
    let got = find(&recs, "Terminate received", "a");
    assert_eq!((sent.len(), got.len()), (1, 1), "{recs:#?}");
    for r in [sent[0], got[0]] {
        assert_eq!(r.level, Level::WARN);
        assert_eq!(r.field("layer"), "1", "{r:?}");
        assert_eq!(r.field("layer_name"), "DDP");
        assert_eq!(r.field("etype"), "1");
        assert_eq!(r.field("code"), "0");
        assert_eq!(r.field("name"), "DDP: tagged buffer, invalid STag");
    }
    assert_eq!(got[0].field("malformed"), "false");
    // Neither side's Terminate is attributed to the other connection.
    assert!(find(&recs, "Terminate sent", "a").is_empty());
    assert!(find(&recs, "Terminate received", "b").is_empty());
}

#[test]
fn a_rejected_connection_logs_the_reason_on_both_sides() {
    let recs = capture(|| {
        let mut p = pair_with_spans();
        p.auto_accept = false;
        p.start(Config::default(), &[], Config::default());
        p.drive();
        p.b.ctx.reject(p.b.qp, b"no").unwrap();
        p.drive();
        assert_eq!(p.a.state(), QpState::Error);
    });
    let local = find(
        &recs,
        "connection rejected: MPA reply with Reject queued",
        "b",
    );
    let remote = find(
        &recs,
        "connection rejected: MPA reply with Reject received",
        "a",
    );
    assert_eq!((local.len(), remote.len()), (1, 1), "{recs:#?}");
    assert_eq!(local[0].field("reason"), "rejected by the application");
    assert_eq!(remote[0].field("reason"), "rejected by the peer");
    assert_eq!(remote[0].field("private_data_len"), "2");
    let sent: Vec<(&str, &str)> = recs
        .iter()
        .filter(|r| r.message() == "MPA frame sent")
        .map(|r| (r.field("frame"), r.field("reject")))
        .collect();
    assert_eq!(sent, [("request", "false"), ("reply", "true")]);
}

#[test]
fn without_a_span_set_events_belong_to_the_current_span() {
    let recs = capture(|| {
        let outer = tracing::info_span!("outer");
        let _g = outer.enter();
        let mut p = Pair::new(QpConfig::default(), Chunking::whole(65536));
        assert!(p.a.ctx.qp(p.a.qp).unwrap().span().is_none());
        p.start(Config::default(), &[], Config::default());
        p.drive();
    });
    let est: Vec<&Rec> = recs
        .iter()
        .filter(|r| r.message() == "connection established (RTS)")
        .collect();
    assert_eq!(est.len(), 2, "{recs:#?}");
    for r in est {
        assert_eq!(r.conn(), None);
        assert_eq!(r.spans.len(), 1);
        assert_eq!(r.spans[0].0, "outer");
    }
}
