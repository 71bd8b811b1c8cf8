//! Prompt-sized products with affine-quantized weights on NVIDIA GPUs: the
//! weight dequantized to the activations' type, then one matmul, which runs
//! on the tensor cores. MLX 0.32's CUDA quantized_matmul computes a prompt's
//! products at 90-165 TFLOP/s on an H200 however many rows it has;
//! dequantizing the weight (a read of its packed words, a write of the
//! 16-bit matrix) and then multiplying reach 250-500. On Llama-3.1-8B's
//! weight shapes, 4-bit: a layer's products over 512 rows (a prefill chunk)
//! 1.9x faster, over 1144 (eight 143-token chats prefilled together) 3.0x;
//! 8-bit: 1.1x and 1.9x (bench/prefill_matmul_probe.py; BENCHMARKS.md,
//! "A prompt's quantized products on the tensor cores"). Below a few hundred
//! rows the dequantization costs more than it saves: from [`min_rows`] on.
//! Decode batches have their own kernel (quant_kernel).
//!
//! The 16-bit weight is a temporary of one product (the largest, an 8B
//! model's 14336 x 4096 projection, 117 MB), freed once the product has run.
//! The host builds a whole forward pass before the device has run its first
//! layers, so unpaced they pile up: a 4K prompt through Llama-3.1-8B 4-bit
//! in 512-token chunks peaked at 15.2 GB of MLX memory with them, mlx-lm at
//! 7.2 in the same run (H200; BENCHMARKS.md). A [`Pacer`] keeps them under a
//! bound: a quarter of the memory plan's working buffers
//! ([`set_in_flight_limit`]), [`DEFAULT_IN_FLIGHT_BYTES`] without a plan.
//! Rounding: the weight is rounded to the activations' type before the
//! product; the result is within 16-bit rounding of the exact product (the
//! tests) and may differ from quantized_matmul's in its last bits.
//! `MLX_SERVE_PROMPT_MATMUL=0` keeps MLX's quantized_matmul (to compare).
//! Metal and the CPU keep MLX's op: measured on CUDA only.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use mlx_rs_safe::{async_eval, eval, ops, quantized, Array, Dtype};

use super::quant::{QuantMode, QuantSpec};
use super::quant_kernel;
use crate::error::Result;

/// The fewest rows of x a product of `bits`-bit weights dequantizes for, or
/// None for a width not measured. 4-bit: at 143 rows both ways cost the same
/// and at 512 dequantizing is 1.9x faster; 8-bit (twice the words to read
/// either way): 1.1x at 512, 1.9x at 1144.
pub fn min_rows(bits: i32) -> Option<i64> {
    match bits {
        4 => Some(256),
        8 => Some(512),
        _ => None,
    }
}

/// Whether a product of `rows` rows of x in `dtype` with weights quantized by
/// `spec` (scales in `scales`, biases present or not) dequantizes first on a
/// device where it pays.
pub fn applies(rows: i64, dtype: Dtype, spec: QuantSpec, scales: Dtype, has_biases: bool) -> bool {
    let sixteen_bit = matches!(dtype, Dtype::Bfloat16 | Dtype::Float16) && scales == dtype;
    spec.mode == QuantMode::Affine && has_biases && sixteen_bit && min_rows(spec.bits).is_some_and(|m| rows >= m)
}

/// x [..., K] @ Wᵀ for W [N, K] quantized by `spec`, dequantized to x's type
/// and then multiplied; None where it does not apply (the caller runs MLX's
/// quantized_matmul): not CUDA, or a product [`applies`] declines.
pub fn matmul(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Option<Array>> {
    if x.ndim() == 0 || w.ndim() != 2 || !applies(quant_kernel::rows(x), x.dtype(), spec, scales.dtype(), biases.is_some()) || !in_use() {
        return Ok(None);
    }
    thread_local! {
        static PACER: RefCell<Pacer> = RefCell::new(Pacer::default());
    }
    let limit = IN_FLIGHT_LIMIT.load(Ordering::Relaxed);
    PACER.with(|p| p.borrow_mut().product(limit, x, w, scales, biases, spec)).map(Some)
}

/// The bound on the dequantized weights a thread's prompt products keep on
/// the device at once (about: see [`Pacer`]) where no memory plan set one
/// (`mlx-serve generate`). An 8B model's layer dequantizes 436 MB, a 70B's
/// 1.7 GB; a layer's products over a 512-token chunk take 1-2 ms on an H200.
pub const DEFAULT_IN_FLIGHT_BYTES: u64 = 1 << 30;

static IN_FLIGHT_LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_IN_FLIGHT_BYTES);

/// Sets the bound on the dequantized weights in flight (the memory plan's
/// share for them, at load).
pub fn set_in_flight_limit(bytes: u64) {
    IN_FLIGHT_LIMIT.store(bytes.max(1), Ordering::Relaxed);
}

/// Paces a thread's dequantized products so that no more than about a limit's
/// bytes of their 16-bit weights wait on the device: once half the limit has
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
    /// [`dequantized_product`], paced to `limit` bytes.
    pub fn product(&mut self, limit: u64, x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Array> {
        let y = dequantized_product(x, w, scales, biases, spec)?;
        self.queued += (w.dim(0)? as u64) * (x.dim(-1)? as u64) * x.dtype().size_of() as u64;
        if self.queued * 2 >= limit {
            self.queued = 0;
            // Taken first: a checkpoint whose evaluation failed is not waited for again
            // (it would hold its forward pass's graph, and fail every later prompt).
            let before = self.checkpoint.take();
            let marker = first_element(&y)?;
            async_eval(&[&marker])?;
            if let Some(before) = before {
                eval(&[&before])?;
            }
            self.checkpoint = Some(marker);
        }
        Ok(y)
    }
}

/// `y`'s first element in a buffer of its own: a slice is a view holding
/// all of `y`'s buffer, and so is what MLX computes from one in place (a
/// one-element sum, a same-size conversion). `y` is 16-bit (see [`applies`]),
/// so its float32 copy is a new buffer.
fn first_element(y: &Array) -> Result<Array> {
    let n = y.ndim();
    let first = ops::slice(y, &vec![0; n], &vec![1; n], &vec![1; n])?;
    Ok(ops::astype(&first, Dtype::Float32)?)
}

/// x @ dequantize(W)ᵀ with the weight in x's type: the product [`matmul`]
/// runs, on any device (the tests compare it with the exact product).
pub fn dequantized_product(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Array> {
    let dense = quantized::dequantize_with(w, scales, biases, spec, Some(x.dtype()))?;
    Ok(ops::matmul(x, &ops::transpose(&dense)?)?)
}

/// Whether prompt products dequantize here: CUDA the current device, and not
/// turned off (`MLX_SERVE_PROMPT_MATMUL=0`).
pub fn in_use() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    mlx_rs_safe::kernels::current_gpu_backend() == Some("cuda")
        && *ON.get_or_init(|| !crate::kernel_check::turned_off("MLX_SERVE_PROMPT_MATMUL", "prompts' quantized products use MLX's quantized_matmul"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_sized_affine_products_of_16_bit_activations_apply() {
        let q4 = QuantSpec::affine(64, 4);
        let q8 = QuantSpec::affine(32, 8);
        let bf = Dtype::Bfloat16;
        assert!(applies(256, bf, q4, bf, true));
        assert!(!applies(255, bf, q4, bf, true), "fewer rows than pay");
        assert!(applies(512, Dtype::Float16, q8, Dtype::Float16, true));
        assert!(!applies(511, bf, q8, bf, true));
        assert!(!applies(4096, bf, QuantSpec::affine(64, 3), bf, true), "a width not measured");
        assert!(!applies(4096, bf, q4, bf, false), "no biases");
        assert!(!applies(4096, Dtype::Float32, q4, Dtype::Float32, true), "32-bit activations");
        assert!(!applies(4096, bf, q4, Dtype::Float16, true), "scales in another type");
        let mxfp4 = QuantSpec { mode: QuantMode::Mxfp4, ..QuantSpec::affine(32, 4) };
        assert!(!applies(4096, bf, mxfp4, bf, true), "not affine");
    }
}
