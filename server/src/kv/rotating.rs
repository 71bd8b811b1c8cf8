//! The rotating cache of sliding-window layers: at most `max_size` positions
//! (more while a multi-token chunk is processed, so every token sees a full
//! window), written round-robin during decoding — mlx-lm's RotatingKVCache.

use mlx_rs_safe::{ops, Array};

use super::{causal_mask, AttentionMask, KvCache, KvView};
use crate::error::Result;

const STEP: i32 = 256;

pub struct RotatingKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    max_size: i32,
    /// Write position in the buffers.
    idx: i32,
}

/// `v[..., from:to, :]` of a [B, H, S, D] array.
fn range(v: &Array, from: i32, to: i32) -> Result<Array> {
    let s = v.shape();
    Ok(ops::slice(v, &[0, 0, from, 0], &[s[0], s[1], to, s[3]], &[1, 1, 1, 1])?)
}

impl RotatingKvCache {
    pub fn new(max_size: i32) -> RotatingKvCache {
        RotatingKvCache { keys: None, values: None, offset: 0, max_size, idx: 0 }
    }

    /// Drops the oldest `trim` positions (keep = 0), appending `append`.
    fn trim(trim: i32, v: &Array, append: Option<&Array>) -> Result<Array> {
        let len = v.shape()[2];
        let mut parts = Vec::new();
        let kept;
        if trim > 0 {
            kept = range(v, trim, len)?;
            parts.push(&kept);
        } else {
            parts.push(v);
        }
        if let Some(a) = append {
            parts.push(a);
        }
        Ok(ops::concatenate(&parts, 2)?)
    }

    /// The buffer in temporal order, unused tail sliced off.
    fn temporal_order(&self, v: &Array) -> Result<Array> {
        let len = v.shape()[2];
        if self.idx == len {
            Ok(v.clone())
        } else if self.idx < self.offset {
            Ok(ops::concatenate(&[&range(v, self.idx, len)?, &range(v, 0, self.idx)?], 2)?)
        } else {
            range(v, 0, self.idx)
        }
    }

    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let k = self.temporal_order(&k)?;
                let v = self.temporal_order(&v)?;
                self.idx = k.shape()[2];
                let trim = self.idx - self.max_size + 1;
                self.keys = Some(Self::trim(trim, &k, Some(keys))?);
                self.values = Some(Self::trim(trim, &v, Some(values))?);
            }
            _ => {
                self.keys = Some(keys.clone());
                self.values = Some(values.clone());
            }
        }
        self.offset += keys.shape()[2];
        // Set just above.
        let k = self.keys.clone().expect("set above");
        let v = self.values.clone().expect("set above");
        self.idx = k.shape()[2];
        Ok((k, v))
    }

    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let ks = keys.shape();
        let (b, h, s, kd) = (ks[0], ks[1], ks[2], ks[3]);
        let prev = self.offset;
        let len = self.keys.as_ref().map(|k| k.shape()[2]).unwrap_or(0);
        if self.keys.is_none() || (prev >= len && len < self.max_size) {
            let new_size = STEP.min(self.max_size - prev);
            let new_k = ops::zeros(&[b, h, new_size, kd], keys.dtype())?;
            let new_v = ops::zeros(&[b, h, new_size, values.dim(-1)?], values.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => {
                    self.keys = Some(ops::concatenate(&[&k, &new_k], 2)?);
                    self.values = Some(ops::concatenate(&[&v, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
            self.idx = prev;
        }
        // Allocated above when absent.
        let mut k = self.keys.take().expect("allocated above");
        let mut v = self.values.take().expect("allocated above");
        let trim = k.shape()[2] - self.max_size;
        if trim > 0 {
            k = Self::trim(trim, &k, None)?;
            v = Self::trim(trim, &v, None)?;
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = 0;
        }
        let at = |buf: &Array, new: &Array, idx: i32| -> Result<Array> {
            let bs = buf.shape();
            Ok(ops::slice_update(buf, new, &[0, 0, idx, 0], &[bs[0], bs[1], idx + s, bs[3]], &[1, 1, 1, 1])?)
        };
        k = at(&k, keys, self.idx)?;
        v = at(&v, values, self.idx)?;
        self.offset += s;
        self.idx += s;
        let out = if self.offset < k.shape()[2] {
            (range(&k, 0, self.offset)?, range(&v, 0, self.offset)?)
        } else {
            (k.clone(), v.clone())
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(out)
    }
}

impl KvCache for RotatingKvCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvView> {
        let (keys, values) = if keys.shape()[2] == 1 {
            self.update_in_place(keys, values)?
        } else {
            self.update_concat(keys, values)?
        };
        Ok(KvView::Dense { keys, values })
    }

    fn make_mask(&self, n: i32, window: Option<i32>) -> Result<AttentionMask> {
        let window = window.unwrap_or(self.max_size);
        if n > 1 {
            let offset = (self.max_size - 1).min(self.offset);
            return Ok(if offset + n > window {
                AttentionMask::Array(causal_mask(n, offset, Some(window))?)
            } else {
                AttentionMask::Causal
            });
        }
        // One token: the window equals the cache size here, so nothing is masked.
        Ok(AttentionMask::None)
    }

    /// Sliding-window layers stay unquantized (mlx-lm cannot quantize them at all).
    fn to_quantized(&self, _group_size: i32, _bits: i32) -> Result<Option<Box<dyn KvCache>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.keys.iter().chain(self.values.iter()).map(Array::nbytes).sum()
    }
}
