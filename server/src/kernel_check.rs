//! The start-up check a custom GPU kernel passes before it replaces MLX's ops
//! (TurboQuant attention, the Gated DeltaNet recurrence, quantized matmul):
//! its result on a few random inputs against the ops it replaces; the
//! environment switch (`VAR=0`) that keeps one off, to compare with MLX's ops;
//! the environment override of a kernel's tuning constant; and what the CUDA
//! kernel cache did (compile-once: mlx-rs-safe's `KernelCacheStats`).

use crate::error::Result;

/// Runs `check` (None: the kernel agrees with its reference, Some: how it
/// differs) and says in the log what `what` (e.g. "Gated DeltaNet: the cuda
/// kernel") will serve: itself, or `fallback` when it disagrees or fails.
pub fn passes(what: &str, fallback: &str, check: impl FnOnce() -> Result<Option<String>>) -> bool {
    let began = std::time::Instant::now();
    let checked = check();
    // A check compiles its kernels (the first time on a machine: NVRTC), which a
    // request pays for when the first use is inside one.
    log::debug!("{what}: start-up check took {:.0} ms", began.elapsed().as_secs_f64() * 1e3);
    match checked {
        Ok(None) => {
            log::info!("{what} is in use");
            true
        }
        Ok(Some(why)) => {
            log::warn!("{what} disagrees with its reference ({why}); using {fallback}");
            false
        }
        Err(e) => {
            log::warn!("{what} does not run here ({e}); using {fallback}");
            false
        }
    }
}

/// Checks run once per key (a kernel instance, a shape): each key's check
/// runs through [`passes`] the first time it is asked for and its verdict is
/// kept, so a fault particular to one key leaves only that key on the
/// fallback.
pub struct CheckedOnce<K>(std::sync::Mutex<Vec<(K, bool)>>);

impl<K: PartialEq> Default for CheckedOnce<K> {
    fn default() -> CheckedOnce<K> {
        CheckedOnce::new()
    }
}

impl<K: PartialEq> CheckedOnce<K> {
    pub const fn new() -> CheckedOnce<K> {
        CheckedOnce(std::sync::Mutex::new(Vec::new()))
    }

    /// [`passes`] for `key`, run the first time (`what` names it in the log).
    pub fn passes(&self, key: K, what: impl FnOnce() -> String, fallback: &str, check: impl FnOnce() -> Result<Option<String>>) -> bool {
        let mut checked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, ok)) = checked.iter().find(|(k, _)| *k == key) {
            return ok;
        }
        let ok = passes(&what(), fallback, check);
        checked.push((key, ok));
        ok
    }
}

/// Whether a kernel serves: not turned off by `var` ([`turned_off`], naming
/// `instead`) and its start-up check passed ([`passes`]: `what`, `fallback`,
/// `check`).
pub fn serves(var: &str, instead: &str, what: &str, fallback: &str, check: impl FnOnce() -> Result<Option<String>>) -> bool {
    !turned_off(var, instead) && passes(what, fallback, check)
}

/// Whether the environment switch `var` is `0`, which keeps a kernel (or a
/// fused path) off so a benchmark can compare it with what it replaces; says
/// so in the log, naming `instead` (what runs).
pub fn turned_off(var: &str, instead: &str) -> bool {
    let off = std::env::var(var).is_ok_and(|v| v == "0");
    if off {
        log::info!("{var}=0: {instead}");
    }
    off
}

/// The positive integer the environment variable `var` holds, else `default`:
/// a kernel's tuning constant overridden for a comparison on a GPU machine
/// (anything else in `var` leaves the default).
pub fn tuned<T: std::str::FromStr + PartialOrd + From<u8>>(var: &str, default: T) -> T {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).filter(|n| *n > T::from(0)).unwrap_or(default)
}

/// Says in the log how this process got its CUDA custom kernels so far
/// (`when`: e.g. "after warm-up"): loaded from MLX's kernel cache, compiled
/// and written there, or compiled by MLX alone (the cache could not keep
/// them: the last reason at warn). Nothing off CUDA.
pub fn log_cache(when: &str) {
    if !mlx_rs_safe::kernels::kernel_cache_enabled() {
        log::info!("MLX_SERVE_KERNEL_CACHE=0: MLX compiles the CUDA custom kernels in every process");
        return;
    }
    let stats = mlx_rs_safe::kernels::kernel_cache_stats();
    if stats == Default::default() {
        return;
    }
    log::info!(
        "CUDA kernels {when}: {} loaded from MLX's kernel cache, {} compiled and kept there, {} compiled by MLX alone; {} called directly",
        stats.loaded,
        stats.written,
        stats.failed,
        stats.direct
    );
    if let Some(e) = stats.last_error {
        log::warn!("the CUDA kernel cache could not keep {} kernel(s); the last: {e}", stats.failed);
    }
}

#[cfg(test)]
mod tests {
    use super::tuned;

    #[test]
    fn a_tuning_override_takes_only_a_positive_integer() {
        let var = "MLX_SERVE_TEST_TUNED_OVERRIDE";
        for (set, want) in [(None, 7), (Some("3"), 3), (Some("0"), 7), (Some("-2"), 7), (Some("many"), 7)] {
            match set {
                Some(v) => std::env::set_var(var, v),
                None => std::env::remove_var(var),
            }
            assert_eq!(tuned(var, 7i64), want, "{var}={set:?}");
        }
        std::env::remove_var(var);
    }
}
