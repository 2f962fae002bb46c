//! Whole lines on stdout and stderr, each in one `write`.
//!
//! `println!` and `eprintln!` write a line piece by piece when it has
//! arguments: stderr is unbuffered, and stdout writes a piece longer
//! than its buffer at once. When two threads print at once into the same
//! file (`2>&1`), a line of one lands inside a line of the other, and a
//! script that reads the output by line no longer finds either. The
//! tools that print from several threads (rping's persistent server,
//! iwarp-soak) print through [`outln!`](crate::outln) and
//! [`errln!`](crate::errln), which format the line first.

use std::io::{self, Write};

/// Write `line` and a newline to `w` in one `write_all`, then flush.
/// Errors (a closed pipe) are ignored: a tool's report is best effort.
pub fn write_line(mut w: impl Write, line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = w.write_all(buf.as_bytes());
    let _ = w.flush();
}

/// Write `line` to stdout as one write (see the module documentation).
pub fn out(line: &str) {
    write_line(io::stdout().lock(), line);
}

/// Write `line` to stderr as one write (see the module documentation).
pub fn err(line: &str) {
    write_line(io::stderr().lock(), line);
}

/// `println!`, as one write per line: see [`crate::lines`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::lines::out(&::std::format!($($arg)*))
    };
}

/// `eprintln!`, as one write per line: see [`crate::lines`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::lines::err(&::std::format!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each `write` call.
    #[derive(Default)]
    struct Calls(Vec<Vec<u8>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_one_write() {
        let mut w = Calls::default();
        let (tag, op) = ("rping[3]", "READ");
        write_line(&mut w, &format!("{tag}: completion {op} {:?}", Some(64)));
        assert_eq!(w.0, vec![b"rping[3]: completion READ Some(64)\n".to_vec()]);
        // What eprintln! does with the same arguments: one write per piece.
        let mut p = Calls::default();
        writeln!(p, "{tag}: completion {op} {:?}", Some(64)).unwrap();
        assert!(p.0.len() > 1, "{:?}", p.0);
    }
}
