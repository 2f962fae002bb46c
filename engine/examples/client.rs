//! An iWARP client on the kernel-socket backend: connects to the `server`
//! example, RDMA-Writes a message into the region the server advertised
//! in its MPA private data, Sends the same message, RDMA-Reads the region
//! back and receives the server's echo, checking every byte.
//!
//! `cargo run -p iwarp-engine --example client [ADDR:PORT]` (default
//! 127.0.0.1:7470).

use std::error::Error;
use std::time::Duration;

use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, QpInit, RecvWr, SendOp, SendWr,
    WcStatus, WorkCompletion, EMPTY_WC,
};

const MESSAGE: &[u8] = b"hello over iWARP";

fn main() -> Result<(), Box<dyn Error>> {
    let addr = std::env::args().nth(1).unwrap_or("127.0.0.1:7470".into());
    let dev = Device::open(Backend::Kernel, DeviceConfig::default())?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(16);
    // Bytes 0.. go out; the RDMA Read lands at 1024, the echo at 2048.
    let mr = dev.reg_mr(&pd, 4096, Access::LOCAL_WRITE)?;

    let params = ConnParams {
        private_data: b"iwarp client".to_vec(),
        ..ConnParams::default()
    };
    let qp = dev.connect(addr.parse()?, QpInit::new(&pd, &cq, 16), params)?;
    // The server's private data: its region's address and rkey.
    let pdata = qp.peer_private_data();
    let remote_addr = u64::from_be_bytes(pdata.get(..8).ok_or("short private data")?.try_into()?);
    let rkey = u32::from_be_bytes(pdata.get(8..12).ok_or("short private data")?.try_into()?);
    println!("client: connected; region {remote_addr:#x}, rkey {rkey:#x}");

    mr.write(0, MESSAGE);
    qp.post_recv(&RecvWr {
        wr_id: 1,
        sgl: &[mr.sge(2048, 2048)],
    })?;
    let send = SendOp::Send {
        solicited: false,
        invalidate: None,
    };
    // Write into the server's region, Send the same bytes, Read them back.
    let ops = [
        (SendOp::Write { remote_addr, rkey }, 0),
        (send, 0),
        (SendOp::Read { remote_addr, rkey }, 1024),
    ];
    for (wr_id, (op, offset)) in (2..).zip(ops) {
        let sgl = &[mr.sge(offset, MESSAGE.len())];
        qp.post_send(&SendWr {
            wr_id,
            op,
            sgl,
            signaled: true,
        })?;
    }
    for _ in 0..4 {
        let wc = wait(&cq)?;
        println!("client: {:?} done, {} bytes", wc.opcode, wc.byte_len);
    }

    let (mut read, mut echo) = ([0; MESSAGE.len()], [0; MESSAGE.len()]);
    mr.read(1024, &mut read);
    mr.read(2048, &mut echo);
    qp.disconnect();
    if read != MESSAGE || echo != MESSAGE {
        return Err(format!("read back {read:?}, echo {echo:?}").into());
    }
    println!("client: the RDMA Read and the echo match what was written");
    Ok(())
}

/// The next completion, which must be a success.
fn wait(cq: &Cq) -> Result<WorkCompletion, Box<dyn Error>> {
    let mut wc = [EMPTY_WC];
    match cq.wait(&mut wc, Some(Duration::from_secs(10))) {
        0 => Err("no completion".into()),
        _ if wc[0].status != WcStatus::Success => Err(format!("failed: {:?}", wc[0]).into()),
        _ => Ok(wc[0]),
    }
}
