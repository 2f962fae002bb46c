//! Generates the Rust view of the rdma-core headers installed on the
//! machine (`infiniband/verbs.h`, `rdma/rdma_cma.h`), so that every struct
//! handed to or from applications has the exact layout they were compiled
//! against.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_type("ibv_.*|verbs_.*|rdma_.*")
        .allowlist_var("IBV_.*|RDMA_.*|RAI_.*")
        .allowlist_function("ibv_.*|rdma_.*")
        .blocklist_function("ibv_.*|rdma_.*|_ibv_.*|__ibv_.*|verbs_.*")
        // The inline functions of verbs.h are not symbols; only the types
        // and constants are used.
        .generate_inline_functions(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate()
        .expect("bindgen: infiniband/verbs.h and rdma/rdma_cma.h (libibverbs-dev, librdmacm-dev, libclang-dev)");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("rdma.rs"))
        .expect("write the bindings");
}
