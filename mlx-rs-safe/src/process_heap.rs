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

/// Makes glibc serve every block of `bytes` or more with its own mapping,
/// returned to the operating system when freed. By default glibc raises that
/// threshold (up to 32 MiB) each time such a block is freed, after which
/// MLX's buffers of a few MiB (KV rows, activations) come from its arenas and
/// stay resident once freed: a server whose MLX buffers peaked at 775 MiB
/// held 1171 MiB resident, 825 MiB with a fixed 1 MiB threshold. Returns
/// whether the setting took; a no-op returning false where the C library is
/// not glibc.
pub fn map_blocks_from(bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let Ok(bytes) = i32::try_from(bytes) else { return false };
        // SAFETY: mallopt takes two plain ints and only changes the allocator's
        // own parameters under its lock; a fixed threshold also turns off
        // glibc's dynamic adjustment of it.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = bytes;
        false
    }
}
