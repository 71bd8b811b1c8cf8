//! MLX's distributed layer: a group of processes (ranks) and the collectives
//! between them. MLX picks the transport (`ring` over TCP, `nccl` on CUDA,
//! `jaccl` over Thunderbolt RDMA, `mpi`) from its own environment variables,
//! the ones `mlx.launch` sets (`MLX_RANK`, `MLX_HOSTFILE`, `MLX_WORLD_SIZE`,
//! ...); a process started without them is a group of one.
//!
//! Collectives are lazy like every op: they run when their output is
//! evaluated, on the thread's current stream, in the order they are
//! evaluated — so every rank must evaluate the same collectives in the same
//! order.

use std::ffi::CString;
use std::sync::Arc;

use mlx_sys as sys;

use crate::array::Array;
use crate::error::{self, check, Error, Result};

/// Owns one mlx-c group handle.
struct Handle(sys::mlx_distributed_group);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from mlx_distributed_init/split and is freed once.
        unsafe { sys::mlx_distributed_group_free(self.0) };
    }
}

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
        // SAFETY: a fresh handle for mlx_distributed_init to fill.
        let mut raw = unsafe { sys::mlx_distributed_group_new() };
        // SAFETY: `raw` is a live handle; `name` is NUL-terminated or null.
        let status = unsafe { sys::mlx_distributed_init(&mut raw, strict, name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr())) };
        let handle = Handle(raw);
        check(status)?;
        if handle.0.ctx.is_null() {
            return Err(Error::InvalidArgument("MLX's distributed layer started no group".into()));
        }
        // SAFETY: a live, initialised group.
        let (rank, size) = unsafe { (sys::mlx_distributed_group_rank(handle.0), sys::mlx_distributed_group_size(handle.0)) };
        Ok(Group { handle: Arc::new(handle), rank, size })
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
        // SAFETY: live handles and stream.
        Array::build_s(|res, s| unsafe { sys::mlx_distributed_all_sum(res, x.raw, self.handle.0, s) })
    }

    /// Concatenates every rank's `x` along axis 0, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        // SAFETY: live handles and stream.
        Array::build_s(|res, s| unsafe { sys::mlx_distributed_all_gather(res, x.raw, self.handle.0, s) })
    }

    /// Sends `x` to rank `dst`; the result is `x` once sent (depend on it so
    /// the send happens).
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        // SAFETY: live handles and stream.
        Array::build_s(|res, s| unsafe { sys::mlx_distributed_send(res, x.raw, dst as i32, self.handle.0, s) })
    }

    /// Receives from rank `src` an array of `like`'s shape and dtype.
    pub fn recv_like(&self, like: &Array, src: usize) -> Result<Array> {
        // SAFETY: live handles and stream.
        Array::build_s(|res, s| unsafe { sys::mlx_distributed_recv_like(res, like.raw, src as i32, self.handle.0, s) })
    }
}
