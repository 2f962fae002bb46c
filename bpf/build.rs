//! Compiles the BPF programs under `src/bpf/` and generates their
//! libbpf-rs skeletons into `OUT_DIR` (never into `src/`).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

/// (source, skeleton file) of every BPF object.
const OBJECTS: [(&str, &str); 2] = [
    ("src/bpf/steer.bpf.c", "steer.skel.rs"),
    ("src/bpf/fault.bpf.c", "fault.skel.rs"),
];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    for (src, skel) in OBJECTS {
        SkeletonBuilder::new()
            .source(src)
            // Debian keeps asm/types.h (pulled in by linux/bpf.h) under the
            // multiarch directory, which clang -target bpf does not search.
            .clang_args(["-I/usr/include/x86_64-linux-gnu", "-O2", "-g", "-Wall"])
            .build_and_generate(out.join(skel))
            .unwrap_or_else(|e| panic!("building {src} and its skeleton: {e}"));
        println!("cargo:rerun-if-changed={src}");
    }
}
