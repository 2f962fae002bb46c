//! The report of a `scripts/bench` run: reads `lat.json`, `bw.json`,
//! `load.json` and `scale.json` (and `profile-*.txt`, perf texts) from a
//! run directory — missing ones are reported as not run — and writes
//! `report.md` (tables in the shape of the seed paper's Table 1 and
//! Figures 2–4, the targets), PNG charts and `results.json` (every raw
//! sample). Needs no root.

use std::path::PathBuf;

use clap::Parser;
use iwarp_bench::paper::{self, Run};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// The run directory (the JSON files of iwarp-lat, -bw, -load, -scale).
    dir: PathBuf,
    /// Where to write report.md, the charts and results.json (default: DIR).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only print the sections whose target is missed (lat, bw, scale),
    /// one per line, and write nothing (scripts/bench profiles them).
    #[arg(long)]
    missed: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if cli.missed {
        for s in paper::missed(&Run::load(&cli.dir)) {
            println!("{s}");
        }
        return std::process::ExitCode::SUCCESS;
    }
    let out = cli.out.clone().unwrap_or_else(|| cli.dir.clone());
    match paper::write(&cli.dir, &out) {
        Ok(p) => {
            println!("report: {}", p.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iwarp-report: {}: {e}", out.display());
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_parses() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["x", "run", "--out", "o"]).unwrap();
        assert_eq!(c.out, Some(PathBuf::from("o")));
        assert!(Cli::try_parse_from(["x"]).is_err());
    }
}
