//! Where the time goes: `perf report --stdio` output (self time per
//! symbol, from `perf record -e cpu-clock`) grouped by component of the
//! stack.

/// A component of the stack, as symbols name it.
pub const COMPONENTS: [&str; 14] = [
    "kernel [k]: other (net stack, scheduler, locks, syscalls)",
    "AF_XDP rings (xsk, UMEM)",
    "CRC32c (crc32c, crc-fast)",
    "libc memcpy/memmove",
    "smoltcp (+ iwarp-tcp)",
    "engine poll loop (iwarp-engine)",
    "iwarp core framing/placement",
    "benchmark loop (iwarp-bench)",
    "clock reads (vDSO clock_gettime)",
    "std, hashbrown, other user",
    "unknown",
    "kernel [k]: AF_XDP / XDP / veth",
    "kernel [k]: copies (memcpy, copy_*_user)",
    "kernel [k]: packet path (skb, NAPI, softirq, slab)",
];

/// The component of a symbol; `kernel` for `[k]` samples.
pub fn component(sym: &str, kernel: bool) -> &'static str {
    let s = sym.to_ascii_lowercase();
    let has = |p: &[&str]| p.iter().any(|x| s.contains(x));
    if kernel {
        if has(&["xsk", "xp_", "xdp", "veth", "bpf_prog"]) {
            COMPONENTS[11]
        } else if has(&[
            "skb",
            "napi",
            "softirq",
            "net_rx",
            "kmem_cache",
            "kfree",
            "alloc",
            "netif",
            "dev_direct_xmit",
            "eth_type_trans",
            "sock_wfree",
            "_bh_",
        ]) {
            COMPONENTS[13]
        } else if has(&[
            "memcpy",
            "memmove",
            "copy_user",
            "copy_to_user",
            "copy_from_user",
        ]) {
            COMPONENTS[12]
        } else {
            COMPONENTS[0]
        }
    } else if has(&["xsk", "xdp::umem", "libxdp", "libbpf"]) {
        // The rings and the frame pool; the rest of the engine's `xdp`
        // module (worker, device tokens) is its poll loop.
        COMPONENTS[1]
    } else if has(&["crc32c", "crc_fast", "crc::"]) {
        COMPONENTS[2]
    } else if has(&["memcpy", "memmove", "memset"]) {
        COMPONENTS[3]
    } else if has(&["smoltcp", "iwarp_tcp"]) {
        COMPONENTS[4]
    } else if has(&["iwarp_engine"]) {
        COMPONENTS[5]
    } else if has(&["iwarp::"]) {
        COMPONENTS[6]
    } else if has(&["iwarp_bench"]) {
        COMPONENTS[7]
    } else if has(&["clock_gettime", "vdso"]) {
        COMPONENTS[8]
    } else if s.starts_with("0x") || s.is_empty() {
        COMPONENTS[10]
    } else {
        COMPONENTS[9]
    }
}

/// One line of `perf report --stdio --no-children -g none --sort dso,sym`.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Share of the samples, in percent.
    pub percent: f64,
    /// The shared object (DSO) the symbol lives in, `[kernel.kallsyms]`
    /// for the kernel.
    pub dso: String,
    /// The symbol's name as perf prints it.
    pub symbol: String,
    /// A kernel symbol (`[k]`).
    pub kernel: bool,
}

/// The entries of a `perf report --stdio` text (comment lines and call
/// chains are skipped).
pub fn parse(text: &str) -> Vec<Entry> {
    let mut v = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        let Some((pct, rest)) = t.split_once(char::is_whitespace) else {
            continue;
        };
        let Some(percent) = pct.strip_suffix('%').and_then(|p| p.parse::<f64>().ok()) else {
            continue;
        };
        let rest = rest.trim();
        let (dso, sym, kernel) = if let Some((d, s)) = rest.split_once(" [k] ") {
            (d, s, true)
        } else if let Some((d, s)) = rest.split_once(" [.] ") {
            (d, s, false)
        } else {
            continue;
        };
        v.push(Entry {
            percent,
            dso: dso.trim().to_string(),
            symbol: sym.trim().to_string(),
            kernel,
        });
    }
    v
}

/// Percent per component, largest first (components without samples
/// are left out).
pub fn by_component(entries: &[Entry]) -> Vec<(&'static str, f64)> {
    let mut sums: Vec<(&'static str, f64)> = COMPONENTS.iter().map(|c| (*c, 0.0)).collect();
    for e in entries {
        let c = component(&e.symbol, e.kernel);
        if let Some(x) = sums.iter_mut().find(|x| x.0 == c) {
            x.1 += e.percent;
        }
    }
    sums.retain(|x| x.1 > 0.0);
    sums.sort_by(|a, b| b.1.total_cmp(&a.1));
    sums
}

/// Shorten a symbol for a table: drop a Rust hash suffix (`::h` and
/// 16 hex digits), keep at most `max` characters.
pub fn short_symbol(sym: &str, max: usize) -> String {
    let s = match sym.rfind("::h") {
        Some(i) if sym.len() - i == 19 && sym[i + 3..].chars().all(|c| c.is_ascii_hexdigit()) => {
            &sym[..i]
        }
        _ => sym,
    };
    if s.chars().count() > max {
        let cut: String = s.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# Samples: 10K of event 'cpu-clock'
# Overhead  Shared Object      Symbol
# ........  .................  ......
#
    20.00%  [kernel.kallsyms]  [k] veth_xmit
     6.00%  [kernel.kallsyms]  [k] __pi_memcpy
     4.00%  [kernel.kallsyms]  [k] _raw_spin_unlock_irqrestore
     1.00%  [kernel.kallsyms]  [k] __alloc_skb
    20.50%  iwarp-lat          [.] smoltcp::iface::interface::Interface::poll
    10.00%  iwarp-lat          [.] crc32c::hw_x86_64::crc32c
     9.50%  libc.so.6          [.] __memmove_avx512_unaligned_erms
     8.00%  iwarp-lat          [.] iwarp_engine::device::Device::progress
     7.00%  iwarp-lat          [.] iwarp::qp::Qp::handle_input
     5.00%  iwarp-lat          [.] iwarp_engine::xdp::umem::Frames::rx_burst
     3.00%  iwarp-lat          [.] iwarp_engine::xdp::worker::XdpIo::drive
     4.00%  iwarp-lat          [.] iwarp_bench::rdma::pingpong_a
     1.00%  iwarp-lat          [.] 0x00000000000abcd
     0.50%  iwarp-lat          [.] std::time::Instant::now
     0.25%  [vdso]             [.] __vdso_clock_gettime
            |
            ---some call chain line
";

    #[test]
    fn perf_text_parses_and_groups() {
        let e = parse(SAMPLE);
        assert_eq!(e.len(), 15);
        assert!(e[0].kernel && e[0].symbol == "veth_xmit");
        assert_eq!(e[4].dso, "iwarp-lat");
        let g = by_component(&e);
        assert_eq!(g[0], ("smoltcp (+ iwarp-tcp)", 20.5));
        assert_eq!(g[1], ("kernel [k]: AF_XDP / XDP / veth", 20.0));
        let get = |n: &str| g.iter().find(|x| x.0 == n).map(|x| x.1);
        assert_eq!(get("kernel [k]: copies (memcpy, copy_*_user)"), Some(6.0));
        assert_eq!(
            get("kernel [k]: other (net stack, scheduler, locks, syscalls)"),
            Some(4.0)
        );
        assert_eq!(
            get("kernel [k]: packet path (skb, NAPI, softirq, slab)"),
            Some(1.0)
        );
        assert_eq!(get("CRC32c (crc32c, crc-fast)"), Some(10.0));
        assert_eq!(
            component("crc_fast::arch::x86_64::update", false),
            COMPONENTS[2]
        );
        assert_eq!(get("libc memcpy/memmove"), Some(9.5));
        assert_eq!(get("engine poll loop (iwarp-engine)"), Some(11.0));
        assert_eq!(get("iwarp core framing/placement"), Some(7.0));
        assert_eq!(get("AF_XDP rings (xsk, UMEM)"), Some(5.0));
        assert_eq!(get("benchmark loop (iwarp-bench)"), Some(4.0));
        assert_eq!(get("unknown"), Some(1.0));
        assert_eq!(get("std, hashbrown, other user"), Some(0.5));
        assert_eq!(get("clock reads (vDSO clock_gettime)"), Some(0.25));
        assert!(parse("garbage\n12% x\n").is_empty());
    }

    #[test]
    fn symbols_shorten() {
        assert_eq!(
            short_symbol("iwarp::qp::Qp::handle_input::h0123456789abcdef", 80),
            "iwarp::qp::Qp::handle_input"
        );
        assert_eq!(short_symbol("a::hb", 80), "a::hb");
        assert_eq!(short_symbol("abcdef", 4), "abc…");
    }
}
