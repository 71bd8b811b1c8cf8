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
//! A MoE layer's prompt products, the chunk's (row, expert) pairs sorted by
//! expert, take the same road: the layer's expert stack dequantized whole,
//! then MLX's gather_mm over the sorted pairs, which MLX's CUDA backend runs
//! as one grouped GEMM on the tensor cores. MLX's gather_qmm computes each
//! pair as a one-row product: on the Qwen3-30B-A3B expert shapes (128
//! experts, 4-bit) a 2048-token chunk's 16384 pairs take it 10.4 ms a
//! projection against 1.2 (8.4x), 512 tokens 2.7 against 1.1, 128 tokens 0.7
//! against 1.0; 8-bit 5.7x at 2048 tokens (bench/moe_prefill_probe.py, H200):
//! from [`min_sorted_pairs`] on.
//!
//! The 16-bit weight is a temporary of one product (the largest, an 8B
//! model's 14336 x 4096 projection, 117 MB), freed once the product has run;
//! the products report it to the [`pacer`](crate::pacer), which keeps those
//! a prompt's forward pass has waiting on the device under a bound.
//! Rounding: the weight is rounded to the activations' type before the
//! product; the result is within 16-bit rounding of the exact product (the
//! tests) and may differ from quantized_matmul's in its last bits.
//! `MLX_SERVE_PROMPT_MATMUL=0` keeps MLX's quantized_matmul (to compare).
//! Metal and the CPU keep MLX's op: measured on CUDA only.

use std::sync::OnceLock;

use mlx_rs_safe::{ops, quantized, Array, Dtype};

use super::quant::{QuantMode, QuantSpec};
use super::quant_kernel;
use crate::error::Result;
use crate::pacer;

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

/// The fewest sorted (row, expert) pairs a gathered product of `bits`-bit
/// expert stacks dequantizes for, or None for a width not measured. On the
/// A3B shapes the dequantization costs about the same at any pair count
/// (0.4 ms a 4-bit projection, 0.75 an 8-bit one) and gather_qmm grows with
/// the pairs: 4-bit 1024 pairs 0.7x, 4096 2.4x; 8-bit 1024 0.45x, 4096 1.55x.
pub fn min_sorted_pairs(bits: i32) -> Option<i64> {
    match bits {
        4 => Some(2048),
        8 => Some(4096),
        _ => None,
    }
}

/// Whether a product of `rows` rows of x in `dtype` with weights quantized by
/// `spec` (scales in `scales`, biases present or not) dequantizes first on a
/// device where it pays.
pub fn applies(rows: i64, dtype: Dtype, spec: QuantSpec, scales: Dtype, has_biases: bool) -> bool {
    dequantizes_to(dtype, spec, scales, has_biases) && min_rows(spec.bits).is_some_and(|m| rows >= m)
}

/// [`applies`] for a gathered product of `pairs` sorted (row, expert) pairs.
pub fn gather_applies(pairs: i64, dtype: Dtype, spec: QuantSpec, scales: Dtype, has_biases: bool) -> bool {
    dequantizes_to(dtype, spec, scales, has_biases) && min_sorted_pairs(spec.bits).is_some_and(|m| pairs >= m)
}

/// Whether the weight dequantizes to x's type as MLX's quantized products
/// would compute it: affine with biases, 16-bit activations and scales.
fn dequantizes_to(dtype: Dtype, spec: QuantSpec, scales: Dtype, has_biases: bool) -> bool {
    let sixteen_bit = matches!(dtype, Dtype::Bfloat16 | Dtype::Float16) && scales == dtype;
    spec.mode == QuantMode::Affine && has_biases && sixteen_bit
}

/// x [..., K] @ Wᵀ for W [N, K] quantized by `spec`, dequantized to x's type
/// and then multiplied; None where it does not apply (the caller runs MLX's
/// quantized_matmul): not CUDA, a product [`applies`] declines, or a 16-bit
/// weight over the pacer's bound.
pub fn matmul(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, spec: QuantSpec) -> Result<Option<Array>> {
    if x.ndim() == 0 || w.ndim() != 2 || !applies(quant_kernel::rows(x), x.dtype(), spec, scales.dtype(), biases.is_some()) || !in_use() {
        return Ok(None);
    }
    paced(x, w, || dequantized_product(x, w, scales, biases, spec))
}

/// The bytes of the 16-bit weight [`dequantized_product`] (or stack,
/// [`dequantized_gather`]) makes for x and the packed W [..., N, K]: the
/// product's temporary, what it reports to the pacer.
pub fn dequantized_bytes(x: &Array, w: &Array) -> Result<u64> {
    let rows = (w.size() / w.dim(-1)? as usize) as u64;
    Ok(rows * x.dim(-1)? as u64 * x.dtype().size_of() as u64)
}

/// MLX's gather_qmm(x, W, rhs_indices = indices, transpose, sorted) for a
/// prompt chunk's pairs sorted by expert: x [P, 1, K], W stacked [E, N, K]
/// quantized by `spec`, indices [P] → [P, 1, N], the stack dequantized to
/// x's type and then gathered and multiplied; None where it does not apply
/// (not CUDA, a product [`gather_applies`] declines, or a 16-bit stack over
/// the pacer's bound).
pub fn gather(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, indices: &Array, spec: QuantSpec) -> Result<Option<Array>> {
    if w.ndim() != 3 || !gather_applies(indices.size() as i64, x.dtype(), spec, scales.dtype(), biases.is_some()) || !in_use() {
        return Ok(None);
    }
    paced(x, w, || dequantized_gather(x, w, scales, biases, indices, spec))
}

/// `product`, its 16-bit weight reported to the pacer; None where that weight
/// alone is over the pacer's bound (a large MoE's stack, a plan's small share
/// for working buffers): the bound the memory plan counts would not hold.
fn paced(x: &Array, w: &Array, product: impl FnOnce() -> Result<Array>) -> Result<Option<Array>> {
    let bytes = dequantized_bytes(x, w)?;
    if bytes > pacer::in_flight_limit() {
        return Ok(None);
    }
    let y = product()?;
    pacer::pace(bytes, &y)?;
    Ok(Some(y))
}

/// [`gather`]'s product on any device (the tests compare it with the exact one).
pub fn dequantized_gather(x: &Array, w: &Array, scales: &Array, biases: Option<&Array>, indices: &Array, spec: QuantSpec) -> Result<Array> {
    let dense = quantized::dequantize_with(w, scales, biases, spec, Some(x.dtype()))?;
    Ok(quantized::gather_mm(x, &ops::swapaxes(&dense, -1, -2)?, None, Some(indices), true)?)
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
