//! The cache of a decode batch: several sequences of different lengths in one
//! [B, kv_heads, S, head_dim] buffer, each left-padded to the longest (mlx-lm's
//! BatchKVCache). Padded positions hold zeros and are masked out; each row's
//! rotary positions start after its own padding.
//!
//! Sequences join and leave a batch between decode steps; both rebuild the
//! buffer from the rows (one copy of the batch's KV), which keeps the layout
//! simple and the padding minimal.

use mlx_rs_safe::{ops, Array, Dtype};

use super::{AttentionMask, KvCache, KvView, Positions, StandardKvCache};
use crate::error::{Error, Result};

/// One sequence's keys and values for every layer: [(keys, values)] with
/// shapes [1, kv_heads, len, head_dim], no padding.
#[derive(Clone)]
pub struct KvRows {
    pub layers: Vec<(Array, Array)>,
}

impl KvRows {
    /// Tokens held.
    pub fn len(&self) -> i32 {
        self.layers.first().map(|(k, _)| k.shape()[2]).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(|(k, v)| k.nbytes() + v.nbytes()).sum()
    }

    /// The plain caches of one sequence, or None when any layer's cache is not
    /// a plain dense one (rotating or quantized caches cannot be batched).
    pub fn from_caches(caches: &[Box<dyn KvCache>]) -> Result<Option<KvRows>> {
        let mut layers = Vec::with_capacity(caches.len());
        for c in caches {
            match c.dense_rows()? {
                Some((k, v)) if k.shape()[0] == 1 => layers.push((k, v)),
                _ => return Ok(None),
            }
        }
        Ok(Some(KvRows { layers }))
    }

    /// Plain single-sequence caches holding these rows.
    pub fn into_caches(self) -> Vec<Box<dyn KvCache>> {
        self.layers.into_iter().map(|(k, v)| Box::new(StandardKvCache::from_state(k, v)) as Box<dyn KvCache>).collect()
    }
}

pub struct BatchKvCache {
    /// The [B, H, capacity, D] buffers, written at `inner.offset()` by every row.
    inner: StandardKvCache,
    /// Padding positions in front of each row.
    left_pad: Vec<i32>,
}

/// `a` ([1, H, L, D]) with `n` zero positions in front.
fn pad_front(a: &Array, n: i32) -> Result<Array> {
    if n == 0 {
        return Ok(a.clone());
    }
    let s = a.shape();
    let zeros = ops::zeros(&[s[0], s[1], n, s[3]], a.dtype())?;
    Ok(ops::concatenate(&[&zeros, a], 2)?)
}

impl BatchKvCache {
    /// One layer's batch of `rows` (each [1, H, L_i, D] keys and values),
    /// left-padded to the longest.
    pub fn from_rows(rows: &[(Array, Array)]) -> Result<BatchKvCache> {
        let lens: Vec<i32> = rows.iter().map(|(k, _)| k.shape()[2]).collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        if longest == 0 {
            return Err(Error::InvalidRequest("internal: a batch needs at least one non-empty row".into()));
        }
        let mut keys = Vec::with_capacity(rows.len());
        let mut values = Vec::with_capacity(rows.len());
        for ((k, v), &len) in rows.iter().zip(&lens) {
            keys.push(pad_front(k, longest - len)?);
            values.push(pad_front(v, longest - len)?);
        }
        let keys = ops::concatenate(&keys.iter().collect::<Vec<_>>(), 0)?;
        let values = ops::concatenate(&values.iter().collect::<Vec<_>>(), 0)?;
        Ok(BatchKvCache {
            inner: StandardKvCache::from_state(keys, values),
            left_pad: lens.iter().map(|&l| longest - l).collect(),
        })
    }

    /// Row `b`'s keys and values without padding: [1, H, len_b, D].
    pub fn row(&self, b: usize) -> Result<(Array, Array)> {
        let (keys, values) = self
            .inner
            .dense_rows()?
            .ok_or_else(|| Error::InvalidRequest("internal: empty batch cache".into()))?;
        let (start, end) = (self.left_pad[b], self.inner.offset());
        let cut = |a: &Array| -> Result<Array> {
            let s = a.shape();
            let b = b as i32;
            Ok(ops::slice(a, &[b, 0, start, 0], &[b + 1, s[1], end, s[3]], &[1, 1, 1, 1])?)
        };
        Ok((cut(&keys)?, cut(&values)?))
    }
}

impl KvCache for BatchKvCache {
    fn offset(&self) -> i32 {
        self.inner.offset()
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvView> {
        self.inner.update_and_fetch(keys, values)
    }

    fn positions(&self) -> Result<Positions> {
        let idx = self.inner.offset();
        let starts: Vec<i32> = self.left_pad.iter().map(|p| idx - p).collect();
        Ok(Positions::PerRow(Array::from_slice(&starts, &[starts.len() as i32])?))
    }

    /// Causal (and windowed) like a single sequence's mask, and no row sees
    /// its own padding: [B, 1, n, offset + n].
    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        if window.is_none() && self.left_pad.iter().all(|&p| p == 0) {
            return Ok(AttentionMask::for_len(n));
        }
        let idx = self.inner.offset();
        let total = idx + n;
        let queries = ops::reshape(&ops::arange(idx as f64, total as f64, 1.0, Dtype::Int32)?, &[1, 1, n, 1])?;
        let keys = ops::reshape(&ops::arange(0.0, total as f64, 1.0, Dtype::Int32)?, &[1, 1, 1, total])?;
        let mut keep = ops::greater_equal(&queries, &keys)?;
        if let Some(w) = window {
            keep = ops::logical_and(&keep, &ops::less(&queries, &ops::add(&keys, &Array::scalar(w))?)?)?;
        }
        let pad = Array::from_slice(&self.left_pad, &[self.left_pad.len() as i32, 1, 1, 1])?;
        let not_padding = ops::greater_equal(&keys, &pad)?;
        Ok(AttentionMask::Array(ops::logical_and(&keep, &not_padding)?))
    }

    fn to_quantized(&self, _group_size: i32, _bits: i32) -> Result<Option<Box<dyn KvCache>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.inner.state()
    }

    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }
}
