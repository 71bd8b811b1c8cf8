//! One finished sequence's KV as the prompt cache keeps it: plain rows (what a
//! batch or a dense cache holds) or affine-quantized ones (`--kv-bits`), so a
//! later request can start from a prefix of it in either form.

use mlx_rs_safe::{eval, ops, Array};

use super::{KvCache, KvRows, QuantizedKvCache};
use crate::error::Result;

/// Keys and values of every layer, [1, kv_heads, len, X] each, no padding.
pub enum KvSnapshot {
    Dense(KvRows),
    /// Per layer the (packed, scales, biases) of keys and of values.
    Quantized { layers: Vec<([Array; 3], [Array; 3])>, group_size: i32, bits: i32 },
}

/// `a[:, :, :n, :]`.
fn first_tokens(a: &Array, n: i32) -> Result<Array> {
    let s = a.shape();
    Ok(ops::slice(a, &[0, 0, 0, 0], &[s[0], s[1], n, s[3]], &[1, 1, 1, 1])?)
}

fn map3(parts: &[Array; 3], f: &impl Fn(&Array) -> Result<Array>) -> Result<[Array; 3]> {
    Ok([f(&parts[0])?, f(&parts[1])?, f(&parts[2])?])
}

impl KvSnapshot {
    /// A single sequence's caches, when every layer is plain or every layer is
    /// quantized; None for rotating caches (they hold a window, not a prefix)
    /// and for batches.
    pub fn from_caches(caches: &[Box<dyn KvCache>]) -> Result<Option<KvSnapshot>> {
        if let Some(rows) = KvRows::from_caches(caches)? {
            return Ok(Some(KvSnapshot::Dense(rows)));
        }
        let mut layers = Vec::with_capacity(caches.len());
        let mut form = None;
        for c in caches {
            match c.quantized_rows() {
                Some((k, v, group_size, bits)) if k[0].shape()[0] == 1 && form.unwrap_or((group_size, bits)) == (group_size, bits) => {
                    form = Some((group_size, bits));
                    layers.push((k, v));
                }
                _ => return Ok(None),
            }
        }
        Ok(form.map(|(group_size, bits)| KvSnapshot::Quantized { layers, group_size, bits }))
    }

    /// Tokens held.
    pub fn len(&self) -> i32 {
        match self {
            KvSnapshot::Dense(rows) => rows.len(),
            KvSnapshot::Quantized { layers, .. } => layers.first().map(|(k, _)| k[0].shape()[2]).unwrap_or(0),
        }
    }

    pub fn nbytes(&self) -> usize {
        match self {
            KvSnapshot::Dense(rows) => rows.nbytes(),
            KvSnapshot::Quantized { layers, .. } => layers.iter().flat_map(|(k, v)| k.iter().chain(v)).map(Array::nbytes).sum(),
        }
    }

    /// The same arrays passed through `f`, which keeps the shape [1, H, *, X].
    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<KvSnapshot> {
        Ok(match self {
            KvSnapshot::Dense(rows) => KvSnapshot::Dense(KvRows {
                layers: rows.layers.iter().map(|(k, v)| Ok((f(k)?, f(v)?))).collect::<Result<_>>()?,
            }),
            KvSnapshot::Quantized { layers, group_size, bits } => KvSnapshot::Quantized {
                layers: layers.iter().map(|(k, v)| Ok((map3(k, &f)?, map3(v, &f)?))).collect::<Result<_>>()?,
                group_size: *group_size,
                bits: *bits,
            },
        })
    }

    fn arrays(&self) -> Vec<&Array> {
        match self {
            KvSnapshot::Dense(rows) => rows.layers.iter().flat_map(|(k, v)| [k, v]).collect(),
            KvSnapshot::Quantized { layers, .. } => layers.iter().flat_map(|(k, v)| k.iter().chain(v)).collect(),
        }
    }

    /// The first `n` tokens of every layer. Quantization groups run along the
    /// head dimension, so a prefix of quantized rows is the quantized prefix.
    pub fn prefix(&self, n: i32) -> Result<KvSnapshot> {
        self.map(|a| first_tokens(a, n))
    }

    /// Copies of the arrays, computed now, so they stop sharing (and keeping
    /// alive) the buffer of the batch or cache they were sliced from. Left
    /// lazy, a copy would hold on to its whole source buffer until first used.
    pub fn detached(&self) -> Result<KvSnapshot> {
        let copy = self.map(|a| Ok(ops::contiguous(a, false)?))?;
        eval(&copy.arrays())?;
        Ok(copy)
    }

    /// Single-sequence caches holding these tokens, ready to extend.
    pub fn into_caches(self) -> Vec<Box<dyn KvCache>> {
        match self {
            KvSnapshot::Dense(rows) => rows.into_caches(),
            KvSnapshot::Quantized { layers, group_size, bits } => layers
                .into_iter()
                .map(|(k, v)| Box::new(QuantizedKvCache::from_parts(k, v, group_size, bits)) as Box<dyn KvCache>)
                .collect(),
        }
    }
}
