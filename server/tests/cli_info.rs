//! The mlx-serve binary starts, links MLX and reports it.

use std::process::Command;

/// The binary under test; MLX_SERVE_BIN overrides it where the test executable was
/// moved (the GPU machine runs a packed copy).
fn mlx_serve() -> Command {
    Command::new(std::env::var("MLX_SERVE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mlx-serve").into()))
}

#[test]
fn info_reports_the_pinned_mlx_version_and_a_device() {
    let out = mlx_serve().arg("info").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pinned = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../versions.env"))
        .lines()
        .find_map(|l| l.strip_prefix("MLX_VERSION="))
        .unwrap();
    assert_eq!(v["mlx_version"], pinned);
    assert!(["cpu", "cuda", "metal"].contains(&v["backend"].as_str().unwrap()), "{v}");
    assert!(["cpu", "gpu"].contains(&v["default_device"].as_str().unwrap()), "{v}");
    assert!(v["active_memory_bytes"].is_u64(), "{v}");
}

#[test]
fn unknown_subcommand_is_a_usage_error_not_a_crash() {
    let out = mlx_serve().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand"));
}
