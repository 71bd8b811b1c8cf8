//! What the benchmarks share: their error type, how they read their flags, and
//! their median.
// Each benchmark uses a part of this module.
#![allow(dead_code)]

pub mod host_profile;

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

/// The median of `v`; of an even count, the mean of the middle two (a
/// median of two passes is then their mean, not the larger).
pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "the median of no values");
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
