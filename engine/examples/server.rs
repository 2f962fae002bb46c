//! An iWARP server on the kernel-socket backend: accepts one connection,
//! advertises a region in its MPA private data, checks that the client's
//! RDMA Write placed the bytes its Send carries, and echoes the Send.
//!
//! `cargo run -p iwarp-engine --example server [ADDR:PORT]` (default
//! 127.0.0.1:7470), then the `client` example.

use std::error::Error;
use std::time::Duration;

use iwarp_engine::{
    Access, Backend, CmEvent, ConnParams, Cq, Device, DeviceConfig, QpInit, RecvWr, SendOp, SendWr,
    WcStatus, WorkCompletion, EMPTY_WC,
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn Error>> {
    let addr = std::env::args().nth(1).unwrap_or("127.0.0.1:7470".into());
    let dev = Device::open(Backend::Kernel, DeviceConfig::default())?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16);
    // The region the client writes and reads, and a buffer for its Send.
    let target = dev.reg_mr(&pd, 4096, Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let inbox = dev.reg_mr(&pd, 4096, Access::LOCAL_WRITE)?;

    let listener = dev.listen(addr.parse()?)?;
    println!("server: listening on {}", listener.local_addr());
    let req = listener.get_request(None)?;
    let hello = String::from_utf8_lossy(req.private_data()).into_owned();
    println!("server: request from {}: {hello:?}", req.peer_addr());
    // The private data of the reply: the target's address and rkey.
    let mut private_data = target.addr().to_be_bytes().to_vec();
    private_data.extend(target.rkey().to_be_bytes());
    let params = ConnParams {
        private_data,
        ..ConnParams::default()
    };
    // Posted before the reply leaves: the client may send at once.
    let recv = RecvWr {
        wr_id: 1,
        sgl: &[inbox.sge(0, inbox.len())],
    };
    let qp = req.accept_with_recvs(QpInit::new(&pd, &cq, 16), params, &[recv])?;

    // RDMA ordering: when the Send arrives, the Write before it is placed.
    let len = wait(&cq)?.byte_len as usize;
    let (mut sent, mut written) = (vec![0; len], vec![0; len]);
    inbox.read(0, &mut sent);
    target.read(0, &mut written);
    if written != sent {
        return Err(format!("Write placed {written:?}, the Send carries {sent:?}").into());
    }
    println!(
        "server: RDMA Write placed {:?}",
        String::from_utf8_lossy(&written)
    );

    let op = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    qp.post_send(&SendWr {
        wr_id: 2,
        op,
        sgl: &[inbox.sge(0, len)],
        signaled: true,
    })?;
    wait(&cq)?;
    println!("server: echoed the Send");
    match qp.wait_event(TIMEOUT) {
        Some(CmEvent::Disconnected) => println!("server: client disconnected"),
        other => return Err(format!("expected a disconnect, got {other:?}").into()),
    }
    Ok(())
}

/// The next completion, which must be a success.
fn wait(cq: &Cq) -> Result<WorkCompletion, Box<dyn Error>> {
    let mut wc = [EMPTY_WC];
    match cq.wait(&mut wc, Some(TIMEOUT)) {
        0 => Err("no completion".into()),
        _ if wc[0].status != WcStatus::Success => Err(format!("failed: {:?}", wc[0]).into()),
        _ => Ok(wc[0]),
    }
}
