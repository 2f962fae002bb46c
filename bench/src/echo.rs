//! The two sides of a byte-stream ping-pong (kernel TCP sockets, bare
//! smoltcp), apart from how bytes are sent and read.

use std::io;
use std::time::Instant;

use crate::rdma::tag;

/// The timing side: per size, `warmup + n` exchanges of a `size`-byte
/// message whose last byte is [`tag`]`(i)`; `exchange(out, echo)` sends
/// `out` and reads as many bytes back into `echo`. Returns the half
/// round trips in µs of the last `n`, per size; fails if an echo ends in
/// another byte.
pub fn time_echoes(
    sizes: &[usize],
    warmup: usize,
    n: usize,
    mut exchange: impl FnMut(&[u8], &mut [u8]) -> io::Result<()>,
) -> io::Result<Vec<Vec<f64>>> {
    let max = sizes.iter().copied().max().unwrap_or(1);
    let mut out_buf = vec![0x5a; max];
    let mut in_buf = vec![0; max];
    let mut out = Vec::new();
    for &size in sizes {
        let mut v = Vec::with_capacity(n);
        for i in 0..warmup + n {
            out_buf[size - 1] = tag(i);
            let t0 = Instant::now();
            exchange(&out_buf[..size], &mut in_buf[..size])?;
            let dt = t0.elapsed();
            if in_buf[size - 1] != out_buf[size - 1] {
                return Err(io::Error::other("the echo differs"));
            }
            if i >= warmup {
                v.push(dt.as_secs_f64() * 1e6 / 2.0);
            }
        }
        out.push(v);
    }
    Ok(out)
}

/// The echoing side: per size, `count` times, `echo(buf)` reads a
/// `size`-byte message into `buf` and sends it back.
pub fn echo_each(
    sizes: &[usize],
    count: usize,
    mut echo: impl FnMut(&mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut buf = vec![0; sizes.iter().copied().max().unwrap_or(1)];
    for &size in sizes {
        for _ in 0..count {
            echo(&mut buf[..size])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_echoes_keeps_the_samples_after_warm_up_and_checks_the_echo() {
        let mut last = Vec::new();
        let v = time_echoes(&[4, 64], 3, 5, |out, echo| {
            last.push(out[out.len() - 1]);
            echo.copy_from_slice(out);
            Ok(())
        })
        .unwrap();
        assert_eq!(v.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5]);
        assert!(v.iter().flatten().all(|&us| us >= 0.0));
        // The last byte changes every exchange and is never 0.
        assert!(last.windows(2).take(7).all(|w| w[0] != w[1] && w[1] != 0));
        let r = time_echoes(&[4], 0, 1, |_, echo| {
            echo.fill(0);
            Ok(())
        });
        assert!(r.is_err(), "a wrong echo is an error");
    }

    #[test]
    fn echo_each_answers_every_message_of_every_size() {
        let mut seen = Vec::new();
        echo_each(&[1, 7], 2, |buf| {
            seen.push(buf.len());
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [1, 1, 7, 7]);
    }
}
