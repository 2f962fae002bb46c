//! Compiles `src/bpf/steer.bpf.c` and generates its libbpf-rs skeleton into
//! `OUT_DIR` (never into `src/`).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/steer.bpf.c";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    SkeletonBuilder::new()
        .source(SRC)
        // Debian keeps asm/types.h (pulled in by linux/bpf.h) under the
        // multiarch directory, which clang -target bpf does not search.
        .clang_args(["-I/usr/include/x86_64-linux-gnu", "-O2", "-g", "-Wall"])
        .build_and_generate(out.join("steer.skel.rs"))
        .expect("building the XDP program and its skeleton");
    println!("cargo:rerun-if-changed={SRC}");
}
