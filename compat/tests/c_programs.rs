//! C programs built against the real rdma-core headers and libraries
//! (`-libverbs -lrdmacm`) and run with the library preloaded, as
//! applications use it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>/`, where cargo puts `libiwarp_compat.so`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Compile `tests/c/<name>.c` into the target directory.
fn build(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = target_dir().join(format!("compat-{name}"));
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-pthread", "-libverbs", "-lrdmacm"])
        .status()
        .expect("run cc");
    assert!(st.success(), "cc {}", src.display());
    out
}

/// Run `bin` with the library preloaded; kill it after `limit`.
fn run_preloaded(bin: &Path, limit: Duration) -> (bool, String, String) {
    // `cargo test` builds the library next to the test binaries
    // (target/<profile>/deps/); `cargo build` puts it one level up.
    let deps = std::env::current_exe().expect("the test's path");
    let lib = deps
        .parent()
        .map(|d| d.join("libiwarp_compat.so"))
        .filter(|l| l.exists())
        .unwrap_or_else(|| target_dir().join("libiwarp_compat.so"));
    assert!(lib.exists(), "{} is built", lib.display());
    let mut child = Command::new(bin)
        .env("LD_PRELOAD", &lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the C program");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("collect the output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Build `tests/c/<name>.c`, run it preloaded within `limit`: it must
/// exit 0 and print every line of `lines`.
fn run_checked(name: &str, limit: Duration, lines: &[&str]) {
    let bin = build(name);
    let (ok, out, err) = run_preloaded(&bin, limit);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    for line in lines {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn error_paths_fail_the_rdma_core_way() {
    run_checked(
        "errors",
        Duration::from_secs(60),
        &[
            "ok dealloc_pd bad handle -> EINVAL",
            "ok create_srq of 0 receives -> EINVAL",
            "ok create_srq_ex XRC -> EOPNOTSUPP",
            "ok get_cm_event non-blocking, empty -> EAGAIN",
            "ok REJECTED with the reject's private data",
            "ok set_option TOS, REUSEADDR, AFONLY accepted",
            "ok set_option unknown -> ENOSYS",
            "all ok",
        ],
    );
}

#[test]
fn extended_post_api_and_inline_data() {
    run_checked(
        "wr_api",
        Duration::from_secs(60),
        &[
            "ok create_qp_ex with SEND_WITH_IMM -> EOPNOTSUPP",
            "ok qp_to_qp_ex: the ibv_qp_ex around the QP",
            "ok server received the inline bytes as they were when set",
            "ok atomics: 40 + 2, then 42 -> 1000",
            "ok server received the legacy inline bytes",
            "ok refused and aborted batches posted nothing",
            "ok 40 inline sends through a 16-deep queue arrive in order",
            "ok post_send on a destroyed QP -> EINVAL",
            "all ok",
        ],
    );
}

#[test]
fn connection_manager_edge_cases_and_the_synchronous_api() {
    run_checked(
        "cm",
        Duration::from_secs(120),
        &[
            "ok empty channel: not readable, non-blocking get -> EAGAIN",
            "ok REJECTED, -ECONNREFUSED, the reject's private data",
            "ok destroy_id while connecting",
            "ok no event for the destroyed ID",
            "ok destroy_qp while connecting -> CONNECT_ERROR, -ECONNABORTED",
            "ok CONNECT_REQUEST on b, not a",
            "ok one DISCONNECTED each, none on a",
            "ok destroy_id while connected",
            "ok migrate a synchronous ID to NULL -> EINVAL",
            "ok unanswered connect -> UNREACHABLE, -ETIMEDOUT",
            "ok sync: rdma_connect blocks until established",
            "ok sync: rdma_disconnect waits for DISCONNECTED",
            "ok sync: server (rdma_get_request, accept, receive, send, disconnect)",
            "ok sync: refused connect -> ECONNREFUSED, REJECTED kept",
            "ok get_cm_event after the blocking channel was destroyed waits",
            "all ok",
        ],
    );
}

#[test]
fn notification_semantics_and_objects_in_use() {
    run_checked(
        "busy",
        Duration::from_secs(60),
        &[
            "ok solicited-only: an unsolicited receive raises nothing",
            "ok solicited-only: a solicited Send raises one",
            "ok an arm fires once",
            "ok any: an unsolicited Send raises one",
            "ok dealloc_pd with regions and QPs -> EBUSY",
            "ok destroy_cq used by a QP -> EBUSY",
            "ok the receive fails with a local protection error",
            "ok a receive posted in Error completes flushed",
            "all ok",
        ],
    );
}

#[test]
fn shared_receive_queue_and_async_events() {
    run_checked(
        "srq",
        Duration::from_secs(60),
        &[
            "ok query_device: SRQ limits",
            "ok dealloc_pd with an SRQ in it -> EBUSY",
            "ok modify_srq MAX_WR -> EOPNOTSUPP",
            "ok get_async_event non-blocking, none -> EAGAIN",
            "ok rdma_create_qp on the SRQ: no receive queue of its own",
            "ok ibv_create_qp_ex on the SRQ",
            "ok rdma_create_qp without an SRQ takes the ID's",
            "ok rdma_create_srq_ex XRC -> EOPNOTSUPP",
            "ok post_recv on a QP of the SRQ -> EINVAL",
            "ok destroy_srq while QPs use it -> EBUSY",
            "ok the oldest receive, on the consuming QP's CQ with its qp_num",
            "ok 4 left: no event",
            "ok async_fd readable with the limit event",
            "ok get_async_event: SRQ_LIMIT_REACHED with the SRQ",
            "ok one event only",
            "ok the Terminate moved client 0's QP to Error: its Sends are flushed",
            "ok QP_FATAL then QP_LAST_WQE_REACHED on server QP 0, QP_FATAL on client 0",
            "ok no other QP event",
            "ok the other QPs go on",
            "ok destroy_srq with receives outstanding",
            "ok post_srq_recv on a destroyed SRQ -> EINVAL",
            "all ok",
        ],
    );
}

#[test]
fn qp_async_events_and_the_ack_contract() {
    run_checked(
        "qp_events",
        Duration::from_secs(90),
        &[
            "ok connected: no event, non-blocking get -> EAGAIN",
            "ok get_async_event non-blocking",
            "ok get_async_event blocking",
            "ok QP_ACCESS_ERR on the server's QP (the responder)",
            "ok QP_FATAL on the client's QP (the peer's Terminate)",
            "ok one event per QP",
            "ok destroy_qp after the ack",
            "ok destroy_qp waits while an event is not acked",
            "ok destroy_qp returns once the event is acked",
            "ok QP_LAST_WQE_REACHED on the SRQ's QP (blocking get)",
            "ok DISCONNECTED on both sides",
            "ok orderly disconnect: no QP_FATAL, no other event",
            "all ok",
        ],
    );
}

#[test]
fn middleware_helpers_addrinfo_hints_and_the_ipv6_wildcard() {
    run_checked(
        "helpers",
        Duration::from_secs(60),
        &[
            "ok ibv_wc_status_str: libibverbs' texts",
            "ok ibv_event_type_str: libibverbs' texts",
            "ok ibv_node_type_str: libibverbs' texts",
            "ok ibv_port_state_str: libibverbs' texts",
            "ok rdma_event_str: librdmacm's texts",
            "ok ibv_get_device_index: 0",
            "ok ibv_is_fork_initialized: UNNEEDED",
            "ok rdma_get_devices: iwarp0's context, NULL-terminated",
            "ok getaddrinfo(NULL, NULL, hints): copies of both addresses",
            "ok getaddrinfo(node, service, hints): the destination resolved, the hints' source",
            "ok resolve_addr on the result: the context rdma_get_devices listed",
            "ok rdma_notify COMM_EST on both ends: 0",
            "ok [::] listener: established over IPv4",
            "ok AFONLY [::] listener on the IPv4 listener's port",
            "all ok",
        ],
    );
}

#[test]
fn ord_and_ird_of_one_with_many_reads_and_atomics_posted() {
    run_checked(
        "ord",
        Duration::from_secs(60),
        &[
            "ok 24 Reads and 16 fetch-and-adds posted at once",
            "ok every Read and atomic completes successfully, in order",
            "ok the Reads brought the server's bytes",
            "ok the adds fetched 1000, 1003, ... and left 1048",
            "ok the connection is still up",
            "all ok",
        ],
    );
}

#[test]
fn connection_manager_over_ipv6_loopback() {
    run_checked(
        "ipv6",
        Duration::from_secs(60),
        &[
            "ok getaddrinfo ::1 numeric, passive: an AF_INET6 source",
            "ok listener shows [::1] and the port it took",
            "ok resolved: source and destination [::1]",
            "ok CONNECT_REQUEST with the private data",
            "ok the request's addresses: the listener's and the client's",
            "ok established: the client's port is the one the server sees",
            "ok the Send's and the Write's bytes arrived",
            "ok AFONLY listener: established over IPv6",
            "ok AFONLY listener: the IPv4 client is refused",
            "all ok",
        ],
    );
}
