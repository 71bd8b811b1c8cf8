//! Attention over a long compressed history a block of the history at a
//! time (flash attention's online softmax, in MLX ops): a prefill chunk's,
//! or a decode step's.
//!
//! Where MLX attends unfused (the CPU), attending to the whole history at
//! once holds a [query heads, queries, context] scores array and the whole
//! history decoded: working memory that grows with the context, more per
//! token than the compressed cache itself. A block at a time it stays
//! bounded: each block's scores and decoded keys and values are freed once
//! its partial result joins the running one.

use mlx_rs_safe::{eval, ops, Array, Dtype};

use super::codec::Codec;
use super::f32s;
use crate::error::Result;
use crate::kv::mask::{causal_mask, AttentionMask};

/// Bytes one history block holds: its float32 scores (rows x query heads x
/// queries x positions) and its keys and values decoded to float32.
const BLOCK_BYTES: i64 = 8 << 20;
/// The fewest history positions a block holds, so a wide chunk of many heads
/// still reads the history in a few hundred calls per layer, not thousands.
const MIN_BLOCK: i64 = 256;

/// The shape of one attention call over a history, as far as its blocks'
/// memory goes.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Batch rows.
    pub rows: i32,
    pub query_heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Queries per row: a prefill chunk's, or one for a decode step.
    pub queries: i32,
}

impl Shape {
    /// History positions per block. The memory plan sizes attention's
    /// working memory by this too.
    pub fn block(&self) -> i32 {
        #[cfg(test)]
        if let Some(block) = TEST_BLOCK.with(|b| b.get()) {
            return block;
        }
        (BLOCK_BYTES / self.bytes_per_position()).max(MIN_BLOCK).min(i32::MAX as i64) as i32
    }

    /// Bytes one block holds (at least `BLOCK_BYTES` where the fewest
    /// positions take more).
    pub fn block_bytes(&self) -> i64 {
        self.bytes_per_position() * self.block() as i64
    }

    /// A position's float32 scores (rows x query heads x queries) and its
    /// decoded keys and values (rows x 2 x KV heads x head dim).
    fn bytes_per_position(&self) -> i64 {
        let at_least_one = |x: i32| x.max(1) as i64;
        4 * at_least_one(self.rows) * (at_least_one(self.query_heads) * at_least_one(self.queries) + 2 * at_least_one(self.kv_heads) * at_least_one(self.head_dim))
    }
}

#[cfg(test)]
thread_local! {
    /// A block size for this thread's tests, so short histories cross blocks.
    pub static TEST_BLOCK: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Whether attention reads the history block by block where this layer
/// runs: on the CPU, whose attention is unfused. A GPU attends decode steps
/// with its kernels and prefill chunks fused, over the history decoded once.
pub fn applies_here() -> bool {
    mlx_rs_safe::kernels::current_gpu_backend().is_none()
}

/// Attention over a part of the keys: the row maxima of the scores, the
/// softmax's denominators and the value sums, unnormalized.
pub(super) struct Partial {
    pub max: Array,
    pub sum: Array,
    pub out: Array,
}

/// f32's most negative finite value: a masked score. Finite, so a query
/// row masked in a whole block gives weights that vanish in the merge
/// instead of NaN.
const MASKED: f32 = f32::MIN;

/// `q` ([B, kv heads, repeats, n, D], float32, already scaled) against keys
/// and values [B, kv heads, S, D]; `keep`: which of the S keys each query
/// sees ([B, 1, n, S] or [n, S]), all where None.
pub(super) fn partial(q: &Array, keys: &Array, values: &Array, keep: Option<&Array>) -> Result<Partial> {
    let k = ops::expand_dims(&f32s(keys)?, &[2])?;
    let v = ops::expand_dims(&f32s(values)?, &[2])?;
    let mut scores = ops::matmul(q, &ops::swapaxes(&k, -1, -2)?)?;
    if let Some(keep) = keep {
        // A batch mask lines up with the scores once it has a repeat axis.
        let keep = if keep.ndim() == 4 { ops::expand_dims(keep, &[2])? } else { keep.clone() };
        scores = ops::where_(&keep, &scores, &Array::scalar(MASKED))?;
    }
    let max = ops::max(&scores, &[-1], true)?;
    let weights = ops::exp(&ops::subtract(&scores, &max)?)?;
    Ok(Partial { sum: ops::sum(&weights, &[-1], true)?, out: ops::matmul(&weights, &v)?, max })
}

/// Two partials over disjoint keys as one.
fn merge(a: Partial, b: Partial) -> Result<Partial> {
    let max = ops::maximum(&a.max, &b.max)?;
    let (wa, wb) = (ops::exp(&ops::subtract(&a.max, &max)?)?, ops::exp(&ops::subtract(&b.max, &max)?)?);
    Ok(Partial {
        sum: ops::add(&ops::multiply(&a.sum, &wa)?, &ops::multiply(&b.sum, &wb)?)?,
        out: ops::add(&ops::multiply(&a.out, &wa)?, &ops::multiply(&b.out, &wb)?)?,
        max,
    })
}

/// Rotated queries `qr` ([B, query heads, n, D]) attending to the sinks
/// (`sinks`: keys and values [B, kv heads, SINKS, D]), the compressed
/// `history` rows ([B, kv heads, positions, row bytes]) `block` positions at
/// a time, the history's newest positions held unquantized (`exact`, rotated
/// keys and values [B, kv heads, m, D]: the recent window), then `chunk` — a
/// prefill chunk's own rotated keys and values, the last n positions — if
/// given. `mask` is the attention's over all of them
/// in that order: causal (the chunk's queries see the chunk causally), none,
/// or an array ([B, 1, n, keys]: rows of other lengths). Returns
/// [B, query heads, n, D] in float32, in the rotated basis.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    codec: &Codec,
    qr: &Array,
    sinks: [&Array; 2],
    history: &Array,
    exact: [&Array; 2],
    chunk: Option<[&Array; 2]>,
    mask: &AttentionMask,
    scale: f32,
    block: i32,
) -> Result<Array> {
    let qs = qr.shape();
    let (b, heads, n, d) = (qs[0], qs[1], qs[2], qs[3]);
    let kv_heads = sinks[0].dim(1)?;
    let q = ops::reshape(&ops::multiply(&f32s(qr)?, &Array::scalar(scale))?, &[b, kv_heads, heads / kv_heads, n, d])?;
    // The mask's columns for keys from..to (of sinks, history, chunk).
    let columns = |from: i32, to: i32| -> Result<Option<Array>> {
        match mask {
            AttentionMask::Array(m) => Ok(Some(ops::slice_axis(m, -1, from, to)?)),
            _ => Ok(None),
        }
    };
    let sink_len = sinks[0].dim(2)?;
    let mut acc = partial(&q, sinks[0], sinks[1], columns(0, sink_len)?.as_ref())?;
    let positions = history.dim(2)?;
    let mut start = 0;
    while start < positions {
        let end = (start + block.max(1)).min(positions);
        let (k, v) = codec.decode(&ops::slice_axis(history, 2, start, end)?, Dtype::Float32)?;
        acc = merge(acc, partial(&q, &k, &v, columns(sink_len + start, sink_len + end)?.as_ref())?)?;
        // Computed now: left lazy, MLX computes every block's scores before
        // merging any (measured: the working memory grew with the context).
        eval(&[&acc.max, &acc.sum, &acc.out])?;
        start = end;
    }
    let held = exact[0].dim(2)?;
    if held > 0 {
        let from = sink_len + positions;
        acc = merge(acc, partial(&q, exact[0], exact[1], columns(from, from + held)?.as_ref())?)?;
    }
    if let Some([k, v]) = chunk {
        let keys = sink_len + positions + held;
        let keep = match mask {
            AttentionMask::Causal => Some(causal_mask(n, 0, None)?),
            _ => columns(keys, keys + n)?,
        };
        acc = merge(acc, partial(&q, k, v, keep.as_ref())?)?;
    }
    Ok(ops::reshape(&ops::divide(&acc.out, &acc.sum)?, &[b, heads, n, d])?)
}
