//! MLX's fused "fast" kernels: normalisation, rotary embeddings, attention.

use mlx_sys as sys;

use crate::array::Array;
use crate::error::Result;
use crate::optional::{opt_float, raw_or_null};

/// RMS normalisation over the last axis, times `weight` when given.
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles (the weight may be the null handle, which mlx-c accepts).
        unsafe { sys::mlx_fast_rms_norm(res, x.raw, raw_or_null(weight), eps, s) }
    })
}

/// Layer normalisation over the last axis with optional affine weight and bias.
pub fn layer_norm(x: &Array, weight: Option<&Array>, bias: Option<&Array>, eps: f32) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles; weight and bias may be null handles.
        unsafe { sys::mlx_fast_layer_norm(res, x.raw, raw_or_null(weight), raw_or_null(bias), eps, s) }
    })
}

/// Rotary position embedding of the first `dims` features of the last axis, for
/// positions `offset..offset + L` (L = the second-to-last axis). Either `base`
/// or precomputed `freqs` (of length dims/2) gives the frequencies.
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: i32,
    freqs: Option<&Array>,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles; freqs may be the null handle.
        unsafe {
            sys::mlx_fast_rope(res, x.raw, dims, traditional, opt_float(base), scale, offset, raw_or_null(freqs), s)
        }
    })
}

/// [`rope`] with the offset given as an array (one per batch row, or a scalar).
pub fn rope_dynamic(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: &Array,
    freqs: Option<&Array>,
) -> Result<Array> {
    Array::build_s(|res, s| {
        // SAFETY: live handles; freqs may be the null handle.
        unsafe {
            sys::mlx_fast_rope_dynamic(
                res,
                x.raw,
                dims,
                traditional,
                opt_float(base),
                scale,
                offset.raw,
                raw_or_null(freqs),
                s,
            )
        }
    })
}

/// The mask of [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum SdpaMask<'a> {
    /// Every query attends to every key.
    None,
    /// Each query attends to keys at or before its position (aligned to the end).
    Causal,
    /// Additive (float) or keep (bool) mask broadcastable to [B, H, L, S].
    Array(&'a Array),
}

/// softmax(Q Kᵀ · scale + mask) V, with grouped KV heads (queries [B, H, L, D],
/// keys/values [B, H_kv, S, D], H a multiple of H_kv) and optional attention
/// sinks ([H]: one extra logit per head that joins the softmax's denominator
/// but has no value row).
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: SdpaMask<'_>,
    sinks: Option<&Array>,
) -> Result<Array> {
    let (mode, arr) = match mask {
        SdpaMask::None => (c"", None),
        SdpaMask::Causal => (c"causal", None),
        SdpaMask::Array(a) => (c"array", Some(a)),
    };
    Array::build_s(|res, s| {
        // SAFETY: live handles and stream; `mode` is a static NUL-terminated
        // string; mask and sinks may be null handles; `force_fused` false lets
        // MLX fall back to the unfused graph where no fused kernel applies.
        unsafe {
            sys::mlx_fast_scaled_dot_product_attention(
                res,
                q.raw,
                k.raw,
                v.raw,
                scale,
                mode.as_ptr(),
                raw_or_null(arr),
                raw_or_null(sinks),
                false,
                s,
            )
        }
    })
}
