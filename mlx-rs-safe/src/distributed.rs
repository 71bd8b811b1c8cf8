//! MLX's distributed layer: a group of processes (ranks) and the collectives
//! between them. MLX picks the transport (`ring` over TCP, `nccl` on CUDA,
//! `jaccl` over Thunderbolt RDMA, `mpi`) from its own environment variables,
//! the ones `mlx.launch` sets (`MLX_RANK`, `MLX_HOSTFILE`, `MLX_WORLD_SIZE`,
//! ...); a process started without them is a group of one.
//!
//! Collectives are lazy like every op: they run when their output is
//! evaluated, in the order they are evaluated — so every rank must evaluate
//! the same collectives in the same order. They run on the stream MLX picks
//! for the backend (the CPU's for ring, MPI and JACCL, the GPU's for NCCL),
//! whatever the thread's current stream, as in MLX's Python API.

use std::ffi::CString;
use std::sync::{Arc, Mutex};

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{self, check, Error, Result};

/// Owns one mlx-c group handle.
struct Handle(sys::mlx_distributed_group);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from mlx_distributed_init and is freed once.
        unsafe { sys::mlx_distributed_group_free(self.0) };
    }
}

/// Owns one mlx-c stream handle: an (index, device) value, which any thread
/// may read.
struct StreamHandle(sys::mlx_stream);

impl Drop for StreamHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from mlx_stream_new and is freed once.
        unsafe { sys::mlx_stream_free(self.0) };
    }
}

// SAFETY: see StreamHandle: a plain value behind mlx-c's pointer.
unsafe impl Send for StreamHandle {}

// SAFETY: a group is an immutable description of the ranks (MLX's own
// `Group` is a shared_ptr to its backend, used from any thread in MLX's
// Python API); the collectives that use it are ordered by the streams.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

/// A group of ranks that take part in collectives together.
#[derive(Clone)]
pub struct Group {
    handle: Arc<Handle>,
    rank: i32,
    size: i32,
    /// The stream the latest collective was queued on (see `take_error`).
    last_stream: Arc<Mutex<Option<StreamHandle>>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group(rank {} of {})", self.rank, self.size)
    }
}

fn backend_name(backend: Option<&str>) -> Result<Option<CString>> {
    backend
        .map(|b| CString::new(b).map_err(|_| Error::InvalidArgument(format!("backend name {b:?} holds a NUL byte"))))
        .transpose()
}

/// Whether MLX was built with `backend` (`None`: with any backend).
pub fn is_available(backend: Option<&str>) -> Result<bool> {
    error::init();
    let name = backend_name(backend)?;
    // SAFETY: a NUL-terminated string alive during the call, or null.
    Ok(unsafe { sys::mlx_distributed_is_available(name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr())) })
}

impl Group {
    /// Joins the group this process was started in. `backend`: "ring",
    /// "nccl", "jaccl", "mpi", or `None` for MLX's choice. With `strict`, a
    /// backend that cannot start is an error; without, the process is a
    /// group of one.
    pub fn init(backend: Option<&str>, strict: bool) -> Result<Group> {
        error::init();
        let name = backend_name(backend)?;
        // SAFETY: a fresh handle, owned by `handle` from here on.
        let mut handle = Handle(unsafe { sys::mlx_distributed_group_new() });
        // SAFETY: a live handle; `name` is NUL-terminated or null.
        check(unsafe { sys::mlx_distributed_init(&mut handle.0, strict, name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr())) })?;
        if handle.0.ctx.is_null() {
            return Err(Error::InvalidArgument("MLX's distributed layer started no group".into()));
        }
        // SAFETY: a live, initialised group.
        let (rank, size) = unsafe { (sys::mlx_distributed_group_rank(handle.0), sys::mlx_distributed_group_size(handle.0)) };
        Ok(Group { handle: Arc::new(handle), rank, size, last_stream: Arc::default() })
    }

    /// This process's place in the group, 0-based.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// How many ranks the group has.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// Sums `x` element-wise over the ranks; every rank gets the sum.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        // SAFETY: live handles (see `collective`).
        self.collective(|res, group, stream| unsafe { sys::mlx_distributed_all_sum(res, x.raw, group, stream) })
    }

    /// Concatenates every rank's `x` along axis 0, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        // SAFETY: live handles (see `collective`).
        self.collective(|res, group, stream| unsafe { sys::mlx_distributed_all_gather(res, x.raw, group, stream) })
    }

    /// Sends `x` to rank `dst`; the result is `x` once sent (depend on it so
    /// the send happens).
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        // SAFETY: live handles (see `collective`).
        self.collective(|res, group, stream| unsafe { sys::mlx_distributed_send(res, x.raw, dst as i32, group, stream) })
    }

    /// Receives from rank `src` an array of `like`'s shape and dtype.
    pub fn recv_like(&self, like: &Array, src: usize) -> Result<Array> {
        // SAFETY: live handles (see `collective`).
        self.collective(|res, group, stream| unsafe { sys::mlx_distributed_recv_like(res, like.raw, src as i32, group, stream) })
    }

    /// Builds a collective with `f` on the stream MLX picks for this group on
    /// this thread, and remembers that stream for `take_error`.
    fn collective(&self, f: impl FnOnce(&mut sys::mlx_array, sys::mlx_distributed_group, sys::mlx_stream) -> std::ffi::c_int) -> Result<Array> {
        // SAFETY: a fresh handle, filled for this thread by mlxs_distributed_stream.
        let mut stream = StreamHandle(unsafe { sys::mlx_stream_new() });
        // SAFETY: a live group and stream handle.
        check(unsafe { sys::mlxs_distributed_stream(&mut stream.0, self.handle.0) })?;
        let out = Array::build(|res| f(res, self.handle.0, stream.0));
        *self.last_stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
        out
    }

    /// Takes the error a failed collective left on the stream of this group's
    /// latest collective (a rank died mid-collective), if any. The ring
    /// backend then blocks the collectives queued after it for ever, so the
    /// thread blocked on them cannot report it; another thread can, with
    /// this. Taking it clears it.
    pub fn take_error(&self) -> Option<String> {
        let last = self.last_stream.lock().unwrap_or_else(|e| e.into_inner());
        let stream = last.as_ref()?;
        let mut buf = [0u8; 512];
        // SAFETY: a live stream handle; `buf` is writable for its length.
        let found = unsafe { sys::mlxs_stream_take_error(stream.0, buf.as_mut_ptr().cast(), buf.len()) };
        (found == 1).then(|| {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            String::from_utf8_lossy(&buf[..end]).into_owned()
        })
    }
}

/// Makes the calling thread MLX's main thread, if no thread has used MLX's
/// scheduler yet: call it first thing from the process's own main thread
/// when other threads run the collectives. (On MLX's main thread, queueing
/// work first throws and clears an error a stream stored, then waits for the
/// stream; after a rank died mid-collective that wait never ends, and the
/// error is gone for [`Group::take_error`]. Other threads meet the error when
/// they wait, and it stays for `take_error`.)
pub fn claim_main_thread() -> Result<()> {
    error::init();
    // SAFETY: no arguments; reports failure through mlx-c's error handler.
    check(unsafe { sys::mlxs_claim_main_thread() })
}

/// Ends the process with `code` at once, without running exit handlers or
/// static destructors: after a rank died, MLX's stream threads can be blocked
/// for ever in the collectives queued behind the failed one, and MLX's
/// destructors would wait for them (`std::process::exit` would hang). Flush
/// what must be written first.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let _ = std::io::stdout().flush();
    // SAFETY: _exit takes any status and never returns.
    unsafe { libc::_exit(code) }
}
