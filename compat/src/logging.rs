//! The engine's log, on the application's stderr.
//!
//! The engine and the protocol core log through `tracing`; the library
//! installs a subscriber when the device is first opened, filtered by
//! `RUST_LOG` (`EnvFilter` syntax, e.g. `RUST_LOG=iwarp=debug`), with
//! warnings and errors (a Terminate sent or received, a connection
//! dropped) when it is unset. An application that installed its own
//! subscriber keeps it. An invalid `RUST_LOG` prints one line and logs
//! with the default filter.

use tracing_subscriber::EnvFilter;

/// The filter without `RUST_LOG`.
const DEFAULT_FILTER: &str = "warn";

/// The filter `RUST_LOG` asks for, or the default one.
fn filter(rust_log: Option<&str>) -> Result<EnvFilter, String> {
    match rust_log.filter(|s| !s.trim().is_empty()) {
        Some(spec) => {
            EnvFilter::try_new(spec).map_err(|e| format!("invalid RUST_LOG {spec:?}: {e}"))
        }
        None => Ok(EnvFilter::new(DEFAULT_FILTER)),
    }
}

/// Install the subscriber for the process (once; later calls, or an
/// application's own subscriber, leave it as it is).
pub(crate) fn init() {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = filter(rust_log.as_deref()).unwrap_or_else(|e| {
        eprintln!("libiwarp_compat: {e}; logging with {DEFAULT_FILTER:?}");
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
    fn rust_log_sets_the_filter() {
        assert_eq!(
            filter(Some("iwarp=debug")).unwrap().to_string(),
            "iwarp=debug"
        );
        assert_eq!(filter(None).unwrap().to_string(), DEFAULT_FILTER);
        assert_eq!(filter(Some(" ")).unwrap().to_string(), DEFAULT_FILTER);
        assert!(filter(Some("iwarp=nonsense[")).is_err());
    }
}
