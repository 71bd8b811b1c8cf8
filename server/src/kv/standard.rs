//! The growing cache: buffers allocated in steps of 256 positions, written in
//! place with slice updates (mlx-lm's KVCache).

use mlx_rs_safe::{ops, Array};

use super::{KvCache, KvView, QuantizedKvCache};
use crate::error::Result;

const STEP: i32 = 256;

#[derive(Default)]
pub struct StandardKvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl StandardKvCache {
    pub fn new() -> StandardKvCache {
        StandardKvCache::default()
    }

    /// A cache holding `keys`/`values` ([B, kv_heads, L, head_dim]) as its
    /// first L positions; the next update grows the buffers.
    pub fn from_state(keys: Array, values: Array) -> StandardKvCache {
        let offset = keys.shape()[2];
        StandardKvCache { keys: Some(keys), values: Some(values), offset }
    }
}

/// `a[..., :n, :]` of a [B, H, S, D] array.
fn head(a: &Array, n: i32) -> Result<Array> {
    let s = a.shape();
    Ok(ops::slice(a, &[0, 0, 0, 0], &[s[0], s[1], n, s[3]], &[1, 1, 1, 1])?)
}

impl KvCache for StandardKvCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn dense_rows(&self) -> Result<Option<(Array, Array)>> {
        Ok(match (&self.keys, &self.values) {
            (Some(k), Some(v)) if k.shape()[2] == self.offset => Some((k.clone(), v.clone())),
            (Some(k), Some(v)) => Some((head(k, self.offset)?, head(v, self.offset)?)),
            _ => None,
        })
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvView> {
        let prev = self.offset;
        let ks = keys.shape();
        let vs = values.shape();
        let (b, h, l) = (ks[0], ks[1], ks[2]);
        let capacity = self.keys.as_ref().map(|k| k.shape()[2]).unwrap_or(0);
        if self.keys.is_none() || prev + l > capacity {
            let n_steps = (STEP + l - 1) / STEP;
            let new_k = ops::zeros(&[b, h, n_steps * STEP, ks[3]], keys.dtype())?;
            let new_v = ops::zeros(&[b, h, n_steps * STEP, vs[3]], values.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(mut k), Some(mut v)) => {
                    if prev % STEP != 0 {
                        k = head(&k, prev)?;
                        v = head(&v, prev)?;
                    }
                    self.keys = Some(ops::concatenate(&[&k, &new_k], 2)?);
                    self.values = Some(ops::concatenate(&[&v, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        self.offset += l;
        // The buffers were allocated just above when absent.
        let k = self.keys.as_ref().expect("allocated above");
        let v = self.values.as_ref().expect("allocated above");
        let kshape = k.shape();
        let vshape = v.shape();
        let k = ops::slice_update(k, keys, &[0, 0, prev, 0], &[kshape[0], kshape[1], self.offset, kshape[3]], &[1, 1, 1, 1])?;
        let v = ops::slice_update(v, values, &[0, 0, prev, 0], &[vshape[0], vshape[1], self.offset, vshape[3]], &[1, 1, 1, 1])?;
        let (keys, values) = if self.offset < kshape[2] {
            (head(&k, self.offset)?, head(&v, self.offset)?)
        } else {
            (k.clone(), v.clone())
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(KvView::Dense { keys, values })
    }

    fn to_quantized(&self, group_size: i32, bits: i32) -> Result<Option<Box<dyn KvCache>>> {
        Ok(Some(Box::new(QuantizedKvCache::from_dense(
            self.keys.as_ref(),
            self.values.as_ref(),
            self.offset,
            group_size,
            bits,
        )?)))
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.keys.iter().chain(self.values.iter()).map(Array::nbytes).sum()
    }
}
