//! Reading files around the page cache, for streamed MoE experts: a read that
//! the kernel's page cache answers is not a disk read, and would make the
//! server's byte counters (and its memory footprint) lie.
//!
//! - [`open_direct`]: Linux `O_DIRECT` (reads go to the device; buffer, file
//!   offset and length must be multiples of [`DIRECT_IO_ALIGN`]); macOS
//!   `F_NOCACHE` (no alignment rule; pages cached before are still used).
//! - [`drop_cached`]: after a buffered read, `POSIX_FADV_DONTNEED` on the range,
//!   so the next read of it goes to the disk again and the cache does not grow.
//! - [`advise_random`]: `POSIX_FADV_RANDOM`, so a buffered read fetches what it
//!   asks for and no read-ahead beyond it.

use std::fs::File;
use std::io;
use std::path::Path;

/// The alignment `O_DIRECT` reads use: 4096 is a multiple of every logical
/// block size Linux file systems report (512 or 4096), so it is always valid.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// Opens `path` for reading that bypasses the page cache. An `Err` (e.g.
/// `EINVAL` on tmpfs, some overlay file systems) means the caller must fall back
/// to buffered reads.
#[cfg(target_os = "linux")]
pub fn open_direct(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT | libc::O_CLOEXEC).open(path)
}

#[cfg(target_os = "macos")]
pub fn open_direct(path: &Path) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let file = File::open(path)?;
    // SAFETY: fcntl on a descriptor `file` owns, with an int argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn open_direct(_path: &Path) -> io::Result<File> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "no page-cache bypass on this platform"))
}

/// Whether [`open_direct`] needs aligned buffers, offsets and lengths here.
pub const fn direct_needs_alignment() -> bool {
    cfg!(target_os = "linux")
}

/// Drops the page-cache pages of `file` in `[offset, offset + len)`.
#[cfg(target_os = "linux")]
pub fn drop_cached(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED)
}

#[cfg(not(target_os = "linux"))]
pub fn drop_cached(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

/// Turns off read-ahead for `file`: buffered reads fetch what they ask for.
#[cfg(target_os = "linux")]
pub fn advise_random(file: &File) -> io::Result<()> {
    fadvise(file, 0, 0, libc::POSIX_FADV_RANDOM)
}

#[cfg(not(target_os = "linux"))]
pub fn advise_random(_file: &File) -> io::Result<()> {
    Ok(())
}

#[cfg(target_os = "linux")]
fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: posix_fadvise only reads its integer arguments; `file` owns the descriptor.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, advice) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}
