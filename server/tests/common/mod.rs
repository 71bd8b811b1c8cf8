//! Shared by the integration tests: tiny models built by mlx-lm itself.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("MLX_SERVE_PYTHON") {
        return PathBuf::from(p);
    }
    let p = repo().join("vendor/pyref/bin/python");
    assert!(p.exists(), "no Python reference at {}: run scripts/reference-env.sh", p.display());
    p
}

/// A fresh copy of model folder `dir` (to damage, or to give other files),
/// named `name` under the test binary's own folder.
pub fn copy_of(dir: &Path, test: &str, name: &str) -> PathBuf {
    let to = Path::new(env!("CARGO_TARGET_TMPDIR")).join(test).join(name);
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to
}

/// Builds (once per spec and generator version) the fixture folder for `name`.
/// Tests run as threads and several share a fixture: one builds it while the
/// others wait, so none reads a folder that is being rewritten.
pub fn fixture(name: &str, spec: &Value) -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parity");
    let dir = root.join(name);
    let spec_text = serde_json::to_string_pretty(spec).unwrap();
    // The cache key: the spec and the generator scripts, so editing either rebuilds.
    let mut key = spec_text.clone();
    for script in ["make_fixture.py", "make_tokenizer.py"] {
        key.push_str(&std::fs::read_to_string(repo().join("parity").join(script)).unwrap());
    }
    let key_path = root.join(format!("{name}.key"));
    if dir.join("reference.json").exists() && std::fs::read_to_string(&key_path).ok().as_deref() == Some(&key) {
        return dir;
    }
    std::fs::create_dir_all(&root).unwrap();
    let spec_path = root.join(format!("{name}.json"));
    std::fs::write(&spec_path, &spec_text).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(python())
        .arg(repo().join("parity/make_fixture.py"))
        .arg(&spec_path)
        .arg(&dir)
        .current_dir(repo().join("parity"))
        .output()
        .unwrap();
    assert!(out.status.success(), "make_fixture.py failed:\n{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&key_path, &key).unwrap();
    dir
}

pub mod configs;
pub mod engine;
pub mod models;
pub mod server;
