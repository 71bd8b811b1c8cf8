//! The C heap of the whole process (glibc's malloc, which Rust's default
//! allocator and MLX's CPU allocations both use).
//!
//! glibc keeps freed memory in its arenas instead of handing it back to the
//! operating system; after one burst of allocations (tokenizing a prompt of
//! megabytes peaks at hundreds of MiB) the resident size stays at the peak.
//! [`trim`] returns the free pages.

/// Hands the heap's free pages back to the operating system (glibc's
/// `malloc_trim(0)`, which walks every arena). Returns whether memory was
/// released. A no-op returning false where the C library is not glibc.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes a plain size (0: keep no padding), touches
        // only the allocator's own free lists under its own locks, and is safe
        // to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
