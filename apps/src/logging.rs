//! The tools' `tracing` subscriber: human-readable lines on stderr.
//!
//! The filter comes from `RUST_LOG` when it is set (`tracing-subscriber`'s
//! `EnvFilter` syntax, e.g. `RUST_LOG=iwarp=debug` or
//! `RUST_LOG=iwarp::qp=trace,iwarp_engine=info`). Without it, `-d`
//! (`debug`) shows the project's crates at debug level and the rest at
//! warn; with neither, warnings and errors only, which a run without
//! failures never prints.

use tracing_subscriber::EnvFilter;

/// The filter of a run without `RUST_LOG`.
pub const DEFAULT_FILTER: &str = "warn";

/// The filter of `-d` without `RUST_LOG`: every crate of the project
/// (`iwarp`, `iwarp_engine`, `iwarp_tcp`, the `iwarp-*` tools: a target
/// matches by prefix) and rping at debug level.
pub const DEBUG_FILTER: &str = "warn,iwarp=debug,rping=debug";

/// The filter for a run with `-d` as `debug` and `rust_log` as the
/// value of `RUST_LOG` (`None` or empty: unset). An invalid `RUST_LOG`
/// is an error, with the message of the parser.
pub fn filter(debug: bool, rust_log: Option<&str>) -> Result<EnvFilter, String> {
    match rust_log.filter(|s| !s.trim().is_empty()) {
        Some(spec) => {
            EnvFilter::try_new(spec).map_err(|e| format!("invalid RUST_LOG {spec:?}: {e}"))
        }
        None => Ok(EnvFilter::new(if debug {
            DEBUG_FILTER
        } else {
            DEFAULT_FILTER
        })),
    }
}

/// Install the subscriber for the whole process (once; later calls do
/// nothing). `tool` names the program in the message about an invalid
/// `RUST_LOG`, after which the default filter applies.
pub fn init(tool: &str, debug: bool) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = filter(debug, rust_log.as_deref()).unwrap_or_else(|e| {
        eprintln!("{tool}: {e}; logging with {DEFAULT_FILTER:?}");
        EnvFilter::new(DEFAULT_FILTER)
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_wins_and_bad_values_are_errors() {
        assert_eq!(filter(false, None).unwrap().to_string(), DEFAULT_FILTER);
        assert_eq!(
            filter(false, Some(" ")).unwrap().to_string(),
            DEFAULT_FILTER
        );
        let d = filter(true, None).unwrap().to_string();
        assert!(
            d.contains("iwarp=debug") && d.contains("rping=debug"),
            "{d}"
        );
        let r = filter(true, Some("iwarp_engine=trace"))
            .unwrap()
            .to_string();
        assert_eq!(r, "iwarp_engine=trace");
        assert!(filter(false, Some("iwarp=loud")).is_err());
    }
}
