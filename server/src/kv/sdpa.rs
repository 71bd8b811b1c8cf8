//! Attention over what a store holds: MLX's fused scaled-dot-product attention
//! for plain keys and values, and mlx-lm's quantized attention for
//! affine-quantized ones.

use mlx_rs_safe::fast::{self, SdpaMask};
use mlx_rs_safe::{ops, quantized, Array, Dtype};

use super::mask::AttentionMask;
use crate::error::Result;

/// softmax(Q Kᵀ · scale, masked) V with grouped KV heads.
pub fn dense(q: &Array, keys: &Array, values: &Array, scale: f32, mask: &AttentionMask) -> Result<Array> {
    let mask = match mask {
        AttentionMask::None => SdpaMask::None,
        AttentionMask::Causal => SdpaMask::Causal,
        AttentionMask::Array(m) => SdpaMask::Array(m),
    };
    Ok(fast::scaled_dot_product_attention(q, keys, values, scale, mask, None)?)
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

/// A scalar of `dtype`, as MLX treats a Python scalar next to an array.
fn scalar_like(v: f32, dtype: Dtype) -> Result<Array> {
    Ok(ops::astype(&Array::scalar(v), dtype)?)
}

/// Attention over an affine-quantized cache: mlx-lm's
/// `quantized_scaled_dot_product_attention`, op for op (scaled queries, grouped
/// heads folded into a repeat axis, quantized matmuls, precise softmax).
/// `keys`/`values` are (packed, scales, biases).
pub fn quantized(
    q: &Array,
    keys: &[Array],
    values: &[Array],
    scale: f32,
    mask: &AttentionMask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let qs = q.shape();
    let (b, n_q, l, d) = (qs[0], qs[1], qs[2], qs[3]);
    let n_kv = keys[0].dim(-3)?;
    let repeats = n_q / n_kv;
    let mut q = ops::multiply(q, &scalar_like(scale, q.dtype())?)?;
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
    let mut scores = quantized::quantized_matmul(&q, &k[0], &k[1], Some(&k[2]), true, group_size, bits)?;
    let keep = match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => {
            let ss = scores.shape();
            let (ql, kl) = (ss[ss.len() - 2], ss[ss.len() - 1]);
            let qi = ops::arange((kl - ql) as f64, kl as f64, 1.0, Dtype::Int32)?;
            let ki = ops::arange(0.0, kl as f64, 1.0, Dtype::Int32)?;
            Some(ops::greater_equal(&ops::expand_dims(&qi, &[1])?, &ops::expand_dims(&ki, &[0])?)?)
        }
        // A batch mask [B, 1, L, S] lines up with the [B, n_kv, repeats, L, S]
        // scores once it has a repeat axis too.
        AttentionMask::Array(m) if repeats > 1 && m.ndim() == 4 => Some(ops::expand_dims(m, &[2])?),
        AttentionMask::Array(m) => Some(m.clone()),
    };
    if let Some(keep) = keep {
        scores = ops::where_(&keep, &scores, &scalar_like(finfo_min(scores.dtype()), scores.dtype())?)?;
    }
    let scores = ops::softmax(&scores, &[-1], true)?;
    let out = quantized::quantized_matmul(&scores, &v[0], &v[1], Some(&v[2]), false, group_size, bits)?;
    Ok(if repeats > 1 { ops::reshape(&out, &[b, n_q, l, d])? } else { out })
}
