//! Keeps a prompt's temporaries waiting on the device under a bound.
//!
//! The host builds a whole forward pass before the device has run its first
//! layers, and MLX's CUDA backend lets a command's buffers go only once the
//! device has run it, so a prefill chunk's temporaries pile up: the 16-bit
//! weights of `prompt_matmul`'s products (a 4K prompt through Llama-3.1-8B
//! 4-bit in 512-token chunks peaked at 15.2 GB of MLX memory with them,
//! mlx-lm at 7.2 in the same run; H200, BENCHMARKS.md), a MoE layer's
//! sorted rows and expert outputs (a 2048-token chunk through the
//! Qwen3-30B-A3B shape: ~280 MB a layer, 48 layers) and attention's scores
//! where a chunk attends through composed ops (`kv::sdpa`). The products that make
//! them report their bytes to the thread's [`Pacer`], which makes the host
//! wait before it builds more than a bound's worth ahead of the device: a
//! quarter of the memory plan's working buffers ([`set_in_flight_limit`]),
//! [`DEFAULT_IN_FLIGHT_BYTES`] without a plan. CUDA only: measured there,
//! not on Metal or the CPU.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use mlx_rs_safe::{async_eval, eval, ops, Array, Dtype};

use crate::error::Result;

/// The bound on the temporaries a thread's prompt products keep waiting on
/// the device at once (about: see [`Pacer`]) where no memory plan set one
/// (`mlx-serve generate`). An 8B model's layer dequantizes 436 MB, a 70B's
/// 1.7 GB; a layer's products over a 512-token chunk take 1-2 ms on an H200.
pub const DEFAULT_IN_FLIGHT_BYTES: u64 = 1 << 30;

static IN_FLIGHT_LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_IN_FLIGHT_BYTES);

/// Sets the bound on the temporaries in flight (the memory plan's share for
/// them, at load).
pub fn set_in_flight_limit(bytes: u64) {
    IN_FLIGHT_LIMIT.store(bytes.max(1), Ordering::Relaxed);
}

/// The bound on the temporaries in flight: a product whose own temporary is
/// larger would break it by itself (`prompt_matmul` keeps MLX's op there).
pub fn in_flight_limit() -> u64 {
    IN_FLIGHT_LIMIT.load(Ordering::Relaxed)
}

/// Reports that computing `y` queued `bytes` of temporaries on the device,
/// to this thread's pacer under the process's bound (a no-op unless the
/// thread's current stream runs on CUDA: a layer placed on the CPU is not paced).
pub fn pace(bytes: u64, y: &Array) -> Result<()> {
    if mlx_rs_safe::kernels::current_gpu_backend() != Some("cuda") {
        return Ok(());
    }
    thread_local! {
        static PACER: RefCell<Pacer> = RefCell::new(Pacer::default());
    }
    PACER.with(|p| p.borrow_mut().pace(in_flight_limit(), bytes, y))
}

/// Paces a thread's prompt products so that no more than about a limit's
/// bytes of their temporaries wait on the device: once half the limit has
/// been queued since the last checkpoint, the product at hand starts (a
/// checkpoint) and the host waits for the checkpoint before it. The device
/// then holds the products queued since that one (half the limit) while the
/// host builds the next half, so it always has work queued.
#[derive(Default)]
pub struct Pacer {
    queued: u64,
    /// One element computed from the last checkpoint's product: waiting for
    /// it waits for the product, and holding it does not hold the product's
    /// buffer past its forward pass (a 2048-row product of an 8B model's MLP
    /// is 59 MB).
    checkpoint: Option<Array>,
}

impl Pacer {
    /// Counts `bytes` queued by computing `y`; past half of `limit` since the
    /// last checkpoint, `y` becomes the next one and the host waits for the last.
    pub fn pace(&mut self, limit: u64, bytes: u64, y: &Array) -> Result<()> {
        self.queued += bytes;
        if self.queued * 2 >= limit {
            self.queued = 0;
            // Taken first: a checkpoint whose evaluation failed is not waited for again
            // (it would hold its forward pass's graph, and fail every later prompt).
            let before = self.checkpoint.take();
            let marker = first_element(y)?;
            async_eval(&[&marker])?;
            if let Some(before) = before {
                eval(&[&before])?;
            }
            self.checkpoint = Some(marker);
        }
        Ok(())
    }
}

/// `y`'s first element in a buffer of its own: a slice is a view holding
/// all of `y`'s buffer, and so is what MLX computes from one in place (a
/// one-element sum, a same-size conversion). A conversion to another size
/// (float32, or float16 from float32) is a new buffer; only its timing matters.
fn first_element(y: &Array) -> Result<Array> {
    let n = y.ndim();
    let first = ops::slice(y, &vec![0; n], &vec![1; n], &vec![1; n])?;
    let other_size = if y.dtype() == Dtype::Float32 { Dtype::Float16 } else { Dtype::Float32 };
    Ok(ops::astype(&first, other_size)?)
}
