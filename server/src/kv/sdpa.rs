//! Attention over what a store holds: MLX's fused scaled-dot-product attention
//! for plain keys and values (composed ops for a prefill chunk over a short
//! history on CUDA where `MLX_SERVE_UNFUSED_PREFILL_KEYS` asks), and mlx-lm's
//! quantized attention for affine-quantized ones (dequantized first where the
//! device has no quantized matmuls for attention: CUDA).

use std::sync::OnceLock;

use mlx_rs_safe::fast::{self, SdpaMask};
use mlx_rs_safe::{ops, quantized, Array, Dtype};

use super::mask::{causal_mask, AttentionMask};
use super::store::AttendArgs;
use crate::error::Result;

/// How many keys a prefill chunk may attend to through composed ops rather
/// than MLX's fused kernel on CUDA: `MLX_SERVE_UNFUSED_PREFILL_KEYS`, 0 (never)
/// unless it says. There the fused kernel for several queries is cuDNN's, and
/// MLX builds a cuDNN plan for every new shape and stride of queries and keys
/// (40-80 ms each on an H200) and keeps it by exact shape; a served prompt is
/// often a new shape. Composed ops need no plan and cost 5-20% more per chunk
/// than a plan already built (up to 8K keys, bench/results/prefill/h200-s36),
/// but they round otherwise than cuDNN: bf16 models of four families gave
/// greedy tokens other than mlx-lm's on CUDA through them, and mlx-lm's
/// through the fused kernel (H200, bench/results/qmm/h200-router-s51; float32
/// scores moved them further still). So the fused kernel is the default, as
/// mlx-lm has it, and the variable trades that equality for the time to
/// first token of prompt lengths not seen before.
pub fn unfused_prefill_keys() -> i32 {
    static FROM_ENV: OnceLock<i32> = OnceLock::new();
    *FROM_ENV.get_or_init(|| {
        let Ok(v) = std::env::var("MLX_SERVE_UNFUSED_PREFILL_KEYS") else { return 0 };
        v.trim().parse().unwrap_or_else(|_| {
            log::warn!("MLX_SERVE_UNFUSED_PREFILL_KEYS={v:?} is not a number of keys: ignored, prefill attends through the fused kernel");
            0
        })
    })
}

/// Whether `q` ([B, heads, L, D]) attends to `keys` through composed ops
/// (see [`unfused_prefill_keys`]): several queries, a history within the
/// limit, on CUDA.
fn prefill_unfused_here(q: &Array, keys: &Array) -> Result<bool> {
    let limit = unfused_prefill_keys();
    Ok(limit > 0 && q.dim(2)? > 1 && keys.dim(2)? <= limit && mlx_rs_safe::kernels::current_gpu_backend() == Some("cuda"))
}

/// softmax(Q Kᵀ · scale, masked) V with grouped KV heads, and `sinks` (one
/// logit per query head) in each softmax's denominator where given.
pub fn dense(q: &Array, keys: &Array, values: &Array, scale: f32, mask: &AttentionMask, sinks: Option<&Array>) -> Result<Array> {
    if prefill_unfused_here(q, keys)? {
        return unfused(q, keys, values, scale, mask, sinks);
    }
    let mask = match mask {
        AttentionMask::None => SdpaMask::None,
        AttentionMask::Causal => SdpaMask::Causal,
        AttentionMask::Array(m) => SdpaMask::Array(m),
    };
    Ok(fast::scaled_dot_product_attention(q, keys, values, scale, mask, sinks)?)
}

/// softmax over the last axis of `scores` ([B, heads, L, S], or [B, n_kv,
/// repeats, L, S] with grouped heads) with one more logit per query head, the
/// sink, whose share of the mass attends to nothing.
fn softmax_with_sinks(scores: &Array, sinks: &Array, n_kv: i32, repeats: i32) -> Result<Array> {
    let shape = scores.shape();
    let nd = shape.len();
    let sink_shape: Vec<i32> = if repeats > 1 { vec![1, n_kv, repeats, 1, 1] } else { vec![1, n_kv, 1, 1] };
    let sink = ops::reshape(&ops::astype(sinks, scores.dtype())?, &sink_shape)?;
    let mut column = shape.clone();
    column[nd - 1] = 1;
    let sink = ops::broadcast_to(&sink, &column)?;
    let all = ops::softmax(&ops::concatenate(&[scores, &sink], -1)?, &[-1], true)?;
    let (start, mut stop) = (vec![0; nd], all.shape());
    stop[nd - 1] -= 1;
    Ok(ops::slice(&all, &start, &stop, &vec![1; nd])?)
}

/// What one attention call attended to: its keys, values and mask, kept for a
/// layer that shares this layer's KV (Gemma 4) to attend to as well.
#[derive(Clone)]
pub struct Attended {
    pub keys: Array,
    pub values: Array,
    pub mask: AttentionMask,
}

impl Attended {
    /// `queries` attending to what was attended to.
    pub fn attend(&self, queries: &Array, scale: f32, sinks: Option<&Array>) -> Result<Array> {
        dense(queries, &self.keys, &self.values, scale, &self.mask, sinks)
    }

    /// `queries` attending to this, which `kept` then holds where `args` ask
    /// for it (and nothing otherwise): a store's attention call.
    pub fn attend_keeping(self, queries: &Array, args: &AttendArgs, kept: &mut Option<Attended>) -> Result<Array> {
        let out = self.attend(queries, args.scale, args.sinks);
        *kept = args.keep.then_some(self);
        out
    }
}

/// The most negative finite value of a float dtype (numpy's finfo.min).
fn finfo_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::Float16 => -65504.0,
        // bf16's largest finite value, 0x7F7F, exactly representable in f32.
        Dtype::Bfloat16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

/// Whether the device this layer runs on has quantized matmuls for
/// attention's shapes. MLX 0.32.4's CUDA backend has none it runs reliably:
/// on an H100 a prefill chunk's product (511 queries × 1023 keys) and a decode
/// step's over a long history (1 query × 59,195 keys) both fail with "No
/// implementation for problem shape", and so do the small shapes of this
/// module's test; the CPU and Metal run every shape. The memory plan counts
/// the dequantized history where they don't (`PrefillAttention::quantized_matmuls`).
pub fn quantized_matmuls_run() -> bool {
    mlx_rs_safe::kernels::current_gpu_backend() != Some("cuda")
}

/// Attention over an affine-quantized cache by dequantizing it first (one
/// layer's history at the model's precision for the call), then MLX's fused
/// attention: for shapes [`quantized_matmuls_run`] refuses.
#[allow(clippy::too_many_arguments)]
pub fn dequantized(
    q: &Array,
    keys: &[Array],
    values: &[Array],
    scale: f32,
    mask: &AttentionMask,
    sinks: Option<&Array>,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let k = quantized::dequantize(&keys[0], &keys[1], Some(&keys[2]), group_size, bits)?;
    let v = quantized::dequantize(&values[0], &values[1], Some(&values[2]), group_size, bits)?;
    dense(q, &k, &v, scale, mask, sinks)
}

/// Attention over an affine-quantized cache: mlx-lm's
/// `quantized_scaled_dot_product_attention`, op for op (scaled queries, grouped
/// heads folded into a repeat axis, quantized matmuls, precise softmax).
/// `keys`/`values` are (packed, scales, biases). `sinks` (which mlx-lm refuses
/// here) join the softmax as one more column, as MLX's fused attention has them.
#[allow(clippy::too_many_arguments)]
pub fn quantized(
    q: &Array,
    keys: &[Array],
    values: &[Array],
    scale: f32,
    mask: &AttentionMask,
    sinks: Option<&Array>,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let qs = q.shape();
    let (b, n_q, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let n_kv = keys[0].dim(-3)?;
    let repeats = n_q / n_kv;
    let mut q = ops::multiply(q, &ops::scalar_as(scale, q.dtype())?)?;
    let expand = |parts: &[Array]| -> Result<Vec<Array>> {
        parts
            .iter()
            .map(|x| if repeats > 1 { Ok(ops::expand_dims(x, &[-3])?) } else { Ok(x.clone()) })
            .collect()
    };
    let (k, v) = (expand(keys)?, expand(values)?);
    if repeats > 1 {
        q = ops::reshape(&q, &[b, n_kv, repeats, l, d])?;
    }
    let scores = quantized::quantized_matmul(&q, &k[0], &k[1], Some(&k[2]), true, group_size, bits)?;
    let weights = masked_softmax(scores, mask, sinks, n_kv, repeats)?;
    let out = quantized::quantized_matmul(&weights, &v[0], &v[1], Some(&v[2]), false, group_size, bits)?;
    Ok(if repeats > 1 { ops::reshape(&out, &[b, n_q, l, d])? } else { out })
}

/// The attention weights from `scores` ([B, heads, L, S], or [B, n_kv,
/// repeats, L, S] with grouped heads): masked positions set to the dtype's
/// lowest value, then a precise softmax (with the sinks where given), as
/// MLX's own unfused attention does.
fn masked_softmax(mut scores: Array, mask: &AttentionMask, sinks: Option<&Array>, n_kv: i32, repeats: i32) -> Result<Array> {
    let keep = match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => {
            let ss = scores.shape();
            let (ql, kl) = (ss[ss.len() - 2], ss[ss.len() - 1]);
            Some(causal_mask(ql, kl - ql, None)?)
        }
        // A batch mask [B, 1, L, S] lines up with the [B, n_kv, repeats, L, S]
        // scores once it has a repeat axis too.
        AttentionMask::Array(m) if repeats > 1 && m.ndim() == 4 => Some(ops::expand_dims(m, &[2])?),
        AttentionMask::Array(m) => Some(m.clone()),
    };
    if let Some(keep) = keep {
        scores = ops::where_(&keep, &scores, &ops::scalar_as(finfo_min(scores.dtype()), scores.dtype())?)?;
    }
    Ok(match sinks {
        None => ops::softmax(&scores, &[-1], true)?,
        Some(sinks) => softmax_with_sinks(&scores, sinks, n_kv, repeats)?,
    })
}

/// [`dense`]'s attention through composed ops (MLX's unfused attention:
/// scaled queries, grouped heads folded into a repeat axis, scores, masked
/// precise softmax, weighted sum), which need no per-shape plan.
pub fn unfused(q: &Array, keys: &Array, values: &Array, scale: f32, mask: &AttentionMask, sinks: Option<&Array>) -> Result<Array> {
    let qs = q.shape();
    let (b, n_q, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let n_kv = keys.dim(1)?;
    let repeats = n_q / n_kv;
    let mut q = ops::multiply(q, &ops::scalar_as(scale, q.dtype())?)?;
    let (mut k, mut v) = (keys.clone(), values.clone());
    if repeats > 1 {
        q = ops::reshape(&q, &[b, n_kv, repeats, l, d])?;
        k = ops::expand_dims(&k, &[2])?;
        v = ops::expand_dims(&v, &[2])?;
    }
    let scores = ops::matmul(&q, &ops::swapaxes(&k, -1, -2)?)?;
    // The scores, their masked copy and the weights: a prompt chunk's
    // largest temporaries (a 2048-token chunk's over 4K keys, 32 heads: 0.5 GB each).
    let temporaries = 3 * scores.nbytes() as u64;
    let weights = masked_softmax(scores, mask, sinks, n_kv, repeats)?;
    let out = ops::matmul(&weights, &v)?;
    crate::pacer::pace(temporaries, &out)?;
    Ok(if repeats > 1 { ops::reshape(&out, &[b, n_q, l, values.dim(-1)?])? } else { out })
}

#[cfg(test)]
mod tests {
    use mlx_rs_safe::{quantized, random, Array, Dtype};

    use super::*;

    fn normal(shape: &[i32], seed: u64) -> Array {
        random::normal(shape, Dtype::Float32, 0.0, 1.0, &random::key(seed).unwrap()).unwrap()
    }

    fn max_diff(a: &Array, b: &Array) -> f32 {
        let d = ops::max_all(&ops::abs(&ops::subtract(a, b).unwrap()).unwrap(), false).unwrap();
        d.item::<f32>().unwrap()
    }

    // The composed attention a CUDA prefill chunk takes over a short history
    // equals MLX's fused attention: grouped heads or not, causal, a padding
    // mask, sinks, more keys than queries.
    #[test]
    fn unfused_attention_equals_the_fused_kernel() {
        let (d, b) = (32, 2);
        let padding = ops::greater_equal(&ops::arange(0.0, 12.0, 1.0, Dtype::Int32).unwrap(), &Array::from_slice(&[0i32, 3], &[2, 1, 1, 1]).unwrap()).unwrap();
        let cases = [
            (4, 2, 7, 12, AttentionMask::Causal, false),
            (4, 4, 5, 5, AttentionMask::Causal, true),
            (8, 2, 6, 12, AttentionMask::Array(padding), false),
            (4, 1, 3, 9, AttentionMask::None, true),
        ];
        for (q_heads, kv_heads, len, keys_len, mask, with_sinks) in cases {
            let q = normal(&[b, q_heads, len, d], 1);
            let k = normal(&[b, kv_heads, keys_len, d], 2);
            let v = normal(&[b, kv_heads, keys_len, d], 3);
            let sinks = with_sinks.then(|| ops::multiply(&normal(&[q_heads], 4), &Array::scalar(3.0f32)).unwrap());
            let scale = (d as f32).powf(-0.5);
            let mlx = match &mask {
                AttentionMask::None => SdpaMask::None,
                AttentionMask::Causal => SdpaMask::Causal,
                AttentionMask::Array(m) => SdpaMask::Array(m),
            };
            let fused = fast::scaled_dot_product_attention(&q, &k, &v, scale, mlx, sinks.as_ref()).unwrap();
            let ours = unfused(&q, &k, &v, scale, &mask, sinks.as_ref()).unwrap();
            assert_eq!(ours.shape(), fused.shape());
            let diff = max_diff(&ours, &fused);
            assert!(diff < 1e-5, "{q_heads}/{kv_heads} heads, {len} queries over {keys_len} keys, {mask:?}: differs by {diff}");
        }
    }

    // Sinks in the quantized path (which mlx-lm refuses) attend as MLX's fused
    // attention attends with them, over the same dequantized keys and values:
    // grouped heads or not, a causal prefill chunk or one new token.
    #[test]
    fn quantized_attention_takes_sinks_as_fused_attention_does() {
        for (q_heads, kv_heads, len, mask) in [(4, 2, 5, AttentionMask::Causal), (4, 4, 1, AttentionMask::None), (8, 2, 1, AttentionMask::None)] {
            let (d, keys_len, (g, bits)) = (32, 40, (32, 8));
            let q = normal(&[2, q_heads, len, d], 1);
            let k = normal(&[2, kv_heads, keys_len, d], 2);
            let v = normal(&[2, kv_heads, keys_len, d], 3);
            let sinks = ops::multiply(&normal(&[q_heads], 4), &Array::scalar(3.0f32)).unwrap();
            let (kq, ks, kb) = quantized::quantize(&k, g, bits).unwrap();
            let (vq, vs, vb) = quantized::quantize(&v, g, bits).unwrap();
            let (kp, vp) = ([kq, ks, kb], [vq, vs, vb]);
            let scale = (d as f32).powf(-0.5);
            let want = dequantized(&q, &kp, &vp, scale, &mask, Some(&sinks), g, bits).unwrap();
            let without = dequantized(&q, &kp, &vp, scale, &mask, None, g, bits).unwrap();
            assert!(max_diff(&without, &want) > 1e-2, "the sinks changed nothing: the test cannot tell");
            if !quantized_matmuls_run() {
                continue; // CUDA: the dequantized path is the one that runs.
            }
            let ours = quantized(&q, &kp, &vp, scale, &mask, Some(&sinks), g, bits).unwrap();
            assert!(max_diff(&ours, &want) < 1e-4, "{q_heads}/{kv_heads} heads, {len} queries: differs by {}", max_diff(&ours, &want));
        }
    }
}
