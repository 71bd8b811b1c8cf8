//! MLX's allocator counters and limits.

use mlx_sys as sys;

use crate::error::{check, init, Result};

fn read(f: unsafe extern "C" fn(*mut usize) -> i32) -> Result<usize> {
    init();
    let mut v = 0usize;
    // SAFETY: `f` is one of mlx-c's getters (private helper, called only with
    // them below), writing one size_t into the live local `v`.
    check(unsafe { f(&mut v) })?;
    Ok(v)
}

fn set(f: unsafe extern "C" fn(*mut usize, usize) -> i32, limit: usize) -> Result<usize> {
    init();
    let mut previous = 0usize;
    // SAFETY: `f` is one of mlx-c's setters (private helper, called only with
    // them below), writing the previous limit into the live local `previous`.
    check(unsafe { f(&mut previous, limit) })?;
    Ok(previous)
}

/// Bytes held by live arrays.
pub fn active_memory() -> Result<usize> {
    read(sys::mlx_get_active_memory)
}

/// The most `active_memory` has been since start or the last reset.
pub fn peak_memory() -> Result<usize> {
    read(sys::mlx_get_peak_memory)
}

/// Bytes freed by arrays but kept by the allocator for reuse.
pub fn cache_memory() -> Result<usize> {
    read(sys::mlx_get_cache_memory)
}

/// The allocator's memory limit in bytes (past it, MLX frees its cache and
/// waits for running work before allocating more).
pub fn memory_limit() -> Result<usize> {
    read(sys::mlx_get_memory_limit)
}

/// Zeroes the peak counter. (MLX sets it to 0, not to the active memory: until
/// the next allocation, `peak_memory` may read below `active_memory`.)
pub fn reset_peak_memory() -> Result<()> {
    init();
    // SAFETY: no arguments; touches only MLX's global allocator counters.
    check(unsafe { sys::mlx_reset_peak_memory() })
}

/// Releases the allocator's cache.
pub fn clear_cache() -> Result<()> {
    init();
    // SAFETY: no arguments; frees only cached (unreferenced) buffers.
    check(unsafe { sys::mlx_clear_cache() })
}

/// Sets the memory limit; returns the previous one.
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    set(sys::mlx_set_memory_limit, bytes)
}

/// Sets the allocator cache limit; returns the previous one.
pub fn set_cache_limit(bytes: usize) -> Result<usize> {
    set(sys::mlx_set_cache_limit, bytes)
}

/// Sets the wired (resident) limit on Apple silicon; returns the previous one.
/// Without Metal, MLX accepts and ignores it (the previous value reads 0).
pub fn set_wired_limit(bytes: usize) -> Result<usize> {
    set(sys::mlx_set_wired_limit, bytes)
}
