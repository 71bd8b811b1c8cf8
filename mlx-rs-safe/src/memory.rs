//! MLX's allocator counters and limits.

use mlx_sys as sys;

use crate::error::{check, init, Result};

fn read(f: unsafe extern "C" fn(*mut usize) -> i32) -> Result<usize> {
    init();
    let mut v = 0usize;
    // SAFETY: `f` is one of mlx-c's getters, writing one size_t into `v`.
    check(unsafe { f(&mut v) })?;
    Ok(v)
}

fn set(f: unsafe extern "C" fn(*mut usize, usize) -> i32, limit: usize) -> Result<usize> {
    init();
    let mut previous = 0usize;
    // SAFETY: `f` is one of mlx-c's setters, writing the previous limit into `previous`.
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

pub fn memory_limit() -> Result<usize> {
    read(sys::mlx_get_memory_limit)
}

pub fn reset_peak_memory() -> Result<()> {
    init();
    // SAFETY: no arguments.
    check(unsafe { sys::mlx_reset_peak_memory() })
}

/// Releases the allocator's cache.
pub fn clear_cache() -> Result<()> {
    init();
    // SAFETY: no arguments.
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
pub fn set_wired_limit(bytes: usize) -> Result<usize> {
    set(sys::mlx_set_wired_limit, bytes)
}
