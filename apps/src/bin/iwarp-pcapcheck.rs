//! `iwarp-pcapcheck FILE [--expect-crc]`: decode a capture with tshark's
//! iWARP dissectors ([`iwarp_capture::tshark::analyze`]), print the report, and
//! exit non-zero unless it holds at least one FPDU, no bad CRC, nothing
//! malformed and no expert error (and, with `--expect-crc`, every FPDU has
//! a CRC tshark verified as good).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Check an iWARP capture with tshark.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Capture file (pcap or pcapng).
    file: PathBuf,
    /// Require a good CRC32c on every FPDU.
    #[arg(long)]
    expect_crc: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let r = match iwarp_capture::tshark::analyze(&args.file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("iwarp-pcapcheck: {e}");
            return ExitCode::from(2);
        }
    };
    println!("file:            {}", args.file.display());
    println!("mpa frames:      {}", r.mpa_frames);
    println!("fpdus:           {}", r.fpdus);
    println!("good crc:        {}", r.good_crc);
    println!("bad crc:         {}", r.bad_crc);
    println!("crc absent:      {}", r.crc_absent);
    println!("malformed:       {}", r.malformed);
    println!("expert errors:   {}", r.expert_errors.len());
    for e in &r.expert_errors {
        println!("  error: {e}");
    }
    println!("expert warnings: {}", r.expert_warnings.len());
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for op in &r.opcodes {
        match counts.iter_mut().find(|(o, _)| *o == op.as_str()) {
            Some((_, n)) => *n += 1,
            None => counts.push((op, 1)),
        }
    }
    let ops: Vec<String> = counts.iter().map(|(o, n)| format!("{o} x{n}")).collect();
    println!("opcodes:         {}", ops.join(", "));

    let mut problems = Vec::new();
    if r.fpdus == 0 {
        problems.push("no FPDUs decoded".to_string());
    }
    if r.bad_crc > 0 {
        problems.push(format!("{} FPDUs with a bad CRC", r.bad_crc));
    }
    if r.malformed > 0 {
        problems.push(format!("{} malformed packets", r.malformed));
    }
    if !r.expert_errors.is_empty() {
        problems.push(format!("{} expert errors", r.expert_errors.len()));
    }
    if args.expect_crc && r.good_crc != r.fpdus {
        problems.push(format!(
            "only {} of {} FPDUs have a good CRC",
            r.good_crc, r.fpdus
        ));
    }
    if problems.is_empty() {
        println!("OK");
        ExitCode::SUCCESS
    } else {
        println!("FAILED: {}", problems.join("; "));
        ExitCode::FAILURE
    }
}
