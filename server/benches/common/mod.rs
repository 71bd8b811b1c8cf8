//! What the benchmarks share: their error type and how they read their flags.
// Each benchmark uses a part of this module.
#![allow(dead_code)]

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The value after flag `name` in `args`, parsed, or `default` when the flag is absent.
pub fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Res<T> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{name} needs a value").into()),
        None => Ok(default),
    }
}

/// A comma-separated list of numbers after flag `name` (e.g. `--rows 1,8`).
pub fn list(args: &[String], name: &str, default: &str) -> Res<Vec<i32>> {
    let text: String = arg(args, name, default.to_string())?;
    text.split(',').map(|v| v.trim().parse().map_err(|_| format!("{name}: {v} is not a number").into())).collect()
}
