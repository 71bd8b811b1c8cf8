//! Generates the bindings over the headers that build.sh installed and links
//! libmlxc. Where to look: `MLXC_DIR` (holding include/ and lib/), else the
//! workspace's `vendor/mlxc`.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=MLXC_DIR");
    println!("cargo:rerun-if-changed=wrapper.h");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let mlxc = env::var_os("MLXC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../vendor/mlxc"));
    let include = mlxc.join("include");
    let lib = mlxc.join("lib");
    if !include.join("mlx/c/mlx.h").exists() {
        panic!(
            "mlx-c headers not found under {}: run ./build.sh first (or set MLXC_DIR)",
            include.display()
        );
    }
    println!("cargo:rerun-if-changed={}", include.join("mlx_serve_ext.h").display());
    println!("cargo:rerun-if-changed={}", lib.display());
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlxc");
    // Dependents read DEP_MLXC_LIB_DIR, e.g. to copy the library beside a binary.
    println!("cargo:lib_dir={}", lib.display());

    let bindings = bindgen::Builder::default()
        .header(manifest.join("wrapper.h").to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function("mlx_.*|mlxs_.*")
        .allowlist_type("mlx_.*")
        .allowlist_var("MLX_.*|MLXS_.*")
        .prepend_enum_name(false)
        .layout_tests(false)
        .derive_default(true)
        .generate()
        .expect("bindgen failed on the mlx-c headers");
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
