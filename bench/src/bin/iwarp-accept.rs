//! Connection setup rate of one server (MPA exchange included) for the
//! RDMA engine on kernel sockets and on AF_XDP, beside kernel TCP's
//! accept rate in the same run. Prints connections per second and the
//! ratio of each RDMA server's rate to kernel TCP's. Needs root.

use clap::Parser;
use iwarp_bench::accept::{self, Server};
use iwarp_bench::report::{self, Ratio, Record, Report};
use iwarp_bench::{next_port, Common};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// Connections per run (default 2000; --quick: 200).
    #[arg(long)]
    conns: Option<usize>,
    /// Client threads on side a, each opening its share in turn.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Servers to measure (default all, kernel TCP first).
    #[arg(long, value_enum, value_delimiter = ',')]
    servers: Option<Vec<Server>>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-accept", c.veth()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let n = cli.conns.unwrap_or(if c.quick { 200 } else { 2000 });
    let servers = cli
        .servers
        .clone()
        .unwrap_or_else(|| vec![Server::KernelTcp, Server::Kernel, Server::Afxdp]);
    let reps = c.n.unwrap_or(1).max(1);
    let cpus = c.cpus();
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {cpus:?}, {n} connections from {} client threads per run, {reps} run(s) each",
        topo.veth, cli.clients
    );
    let mut recs: Vec<Record> = Vec::new();
    for _ in 0..reps {
        for &s in &servers {
            eprintln!("accept: {}", s.name());
            let xdp = topo.veth.xdp(true);
            let r = accept::run(&topo, cpus, s, n, cli.clients, next_port(), xdp);
            let rec = match r {
                Ok(rate) => Record::new(s.name(), 0, "setup_rate", "conn/s", vec![rate]),
                Err(e) => {
                    eprintln!("accept: {}: {e}", s.name());
                    Record::failed(s.name(), 0, "setup_rate", "conn/s", &e)
                }
            };
            report::merge(&mut recs, vec![rec]);
        }
    }
    drop(topo);
    let rate = |name: &str| recs.iter().find(|r| r.config == name).and_then(Record::p50);
    let base = rate(Server::KernelTcp.name());
    let mut rows = vec![["server", "conn/s (median)", "/ kernel TCP"]
        .map(String::from)
        .to_vec()];
    let mut ratios = Vec::new();
    for &s in &servers {
        let v = rate(s.name());
        let ratio = match (v, base) {
            (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
            _ => "n/a".into(),
        };
        rows.push(vec![
            s.name().into(),
            v.map_or("FAILED".into(), |v| format!("{v:.0}")),
            ratio,
        ]);
        if s != Server::KernelTcp {
            ratios.push(Ratio::new(
                &format!("setup rate {} / kernel TCP accept", s.name()),
                v,
                base,
                ">=",
                0.0,
            ));
        }
    }
    println!();
    print!("{}", report::render(&rows));
    println!("(kernel TCP: connect/accept only; RDMA servers: TCP and the MPA exchange, a QP per connection; clients: one kernel-socket RDMA device, its progress thread, the threads opening their connections in turn)");
    let rep = Report {
        notes: vec![format!(
            "accept: side b's server accepts {n} connections from {} client threads on side a; rate = connections / time from the clients' start to the last connection; all stay open until then",
            cli.clients
        )],
        ratios,
        ..Report::new("iwarp-accept", c.veth(), cpus, recs)
    };
    report::finish(c.json.as_deref(), &rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_parses() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["x", "--conns", "10", "--servers", "kernel,afxdp"]).unwrap();
        assert_eq!(c.conns, Some(10));
        assert_eq!(c.servers, Some(vec![Server::Kernel, Server::Afxdp]));
        assert!(Cli::try_parse_from(["x", "--servers", "siw"]).is_err());
    }
}
