//! A progress bar over the series of a run (indicatif, on stderr): drawn
//! only when stderr is a terminal and `--quiet` is not given; otherwise
//! each step is a plain line on stderr (none with `--quiet`).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress over `len` series (configurations × sizes).
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
    lines: bool,
}

impl Progress {
    /// A bar of `len` steps; hidden with `quiet` or off a terminal.
    pub fn new(len: usize, quiet: bool) -> Self {
        let target = if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(Some(len as u64), target);
        if let Ok(style) =
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} series  {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        let lines = !quiet && bar.is_hidden();
        Self { bar, lines }
    }

    /// Starting `what` (a configuration); `steps` series follow.
    pub fn start(&self, what: &str) {
        if self.lines {
            eprintln!("{what}");
        }
        self.bar.set_message(what.to_string());
    }

    /// `steps` series done.
    pub fn done(&self, steps: usize) {
        self.bar.inc(steps as u64);
    }

    /// Remove the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_bar_counts_silently() {
        let p = Progress::new(4, true);
        assert!(!p.lines);
        p.start("x");
        p.done(3);
        assert_eq!(p.bar.position(), 3);
        p.finish();
    }
}
