//! The affine-quantized KV cache (`--kv-bits`): keys and values stored as MLX
//! quantized triples (packed uint32, scales, biases), grown in steps of 256
//! positions — mlx-lm's QuantizedKVCache.

use mlx_rs_safe::{ops, quantized, Array, Dtype};

use super::{KvCache, KvView};
use crate::error::Result;

const STEP: i32 = 256;

pub struct QuantizedKvCache {
    keys: Option<[Array; 3]>,
    values: Option<[Array; 3]>,
    offset: i32,
    group_size: i32,
    bits: i32,
}

/// `a[..., :n, :]` of a [B, H, S, X] array.
fn head(a: &Array, n: i32) -> Result<Array> {
    let s = a.shape();
    Ok(ops::slice(a, &[0, 0, 0, 0], &[s[0], s[1], n, s[3]], &[1, 1, 1, 1])?)
}

fn quantize3(a: &Array, group_size: i32, bits: i32) -> Result<[Array; 3]> {
    let (q, s, b) = quantized::quantize(a, group_size, bits)?;
    Ok([q, s, b])
}

impl QuantizedKvCache {
    pub fn new(group_size: i32, bits: i32) -> QuantizedKvCache {
        QuantizedKvCache { keys: None, values: None, offset: 0, group_size, bits }
    }

    /// A cache holding exactly these parts ([B, H, len, X] each), e.g. a
    /// prompt-cache prefix; it grows on the next update.
    pub fn from_parts(keys: [Array; 3], values: [Array; 3], group_size: i32, bits: i32) -> QuantizedKvCache {
        let offset = keys[0].shape()[2];
        QuantizedKvCache { keys: Some(keys), values: Some(values), offset, group_size, bits }
    }

    /// Quantizes a dense cache's buffers (mlx-lm's KVCache.to_quantized).
    pub fn from_dense(keys: Option<&Array>, values: Option<&Array>, offset: i32, group_size: i32, bits: i32) -> Result<QuantizedKvCache> {
        let mut c = QuantizedKvCache::new(group_size, bits);
        c.offset = offset;
        if let (Some(k), Some(v)) = (keys, values) {
            c.keys = Some(quantize3(k, group_size, bits)?);
            c.values = Some(quantize3(v, group_size, bits)?);
        }
        Ok(c)
    }

    fn zeros(&self, b: i32, h: i32, steps: i32, dim: i32, dtype: Dtype) -> Result<[Array; 3]> {
        let el_per_int = 32 / self.bits;
        Ok([
            ops::zeros(&[b, h, steps, dim / el_per_int], Dtype::Uint32)?,
            ops::zeros(&[b, h, steps, dim / self.group_size], dtype)?,
            ops::zeros(&[b, h, steps, dim / self.group_size], dtype)?,
        ])
    }
}

impl KvCache for QuantizedKvCache {
    fn offset(&self) -> i32 {
        self.offset
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<KvView> {
        let ks = keys.shape();
        let (b, h, l, kd) = (ks[0], ks[1], ks[2], ks[3]);
        let vd = values.dim(-1)?;
        let prev = self.offset;
        let capacity = self.keys.as_ref().map(|k| k[0].shape()[2]).unwrap_or(0);
        if self.keys.is_none() || prev + l > capacity {
            let new_steps = (STEP + l - 1) / STEP * STEP;
            match (self.keys.take(), self.values.take()) {
                (Some(k), Some(v)) => {
                    let grow = |parts: [Array; 3]| -> Result<[Array; 3]> {
                        let grown: Vec<Array> = parts
                            .iter()
                            .map(|x| {
                                let x = if prev % STEP != 0 { head(x, prev)? } else { x.clone() };
                                let s = x.shape();
                                let z = ops::zeros(&[s[0], s[1], new_steps, s[3]], x.dtype())?;
                                Ok(ops::concatenate(&[&x, &z], -2)?)
                            })
                            .collect::<Result<_>>()?;
                        let [a, b2, c]: [Array; 3] = grown.try_into().map_err(|_| unreachable_parts())?;
                        Ok([a, b2, c])
                    };
                    self.keys = Some(grow(k)?);
                    self.values = Some(grow(v)?);
                }
                _ => {
                    self.keys = Some(self.zeros(b, h, new_steps, kd, keys.dtype())?);
                    self.values = Some(self.zeros(b, h, new_steps, vd, keys.dtype())?);
                }
            }
        }
        self.offset += l;
        let qk = quantize3(keys, self.group_size, self.bits)?;
        let qv = quantize3(values, self.group_size, self.bits)?;
        let write = |dst: &[Array; 3], src: &[Array; 3]| -> Result<[Array; 3]> {
            let out: Vec<Array> = dst
                .iter()
                .zip(src)
                .map(|(d, s)| {
                    let ds = d.shape();
                    Ok(ops::slice_update(d, s, &[0, 0, prev, 0], &[ds[0], ds[1], self.offset, ds[3]], &[1, 1, 1, 1])?)
                })
                .collect::<Result<_>>()?;
            out.try_into().map_err(|_| unreachable_parts())
        };
        // Both buffers exist: allocated above when absent.
        let k = write(self.keys.as_ref().expect("allocated above"), &qk)?;
        let v = write(self.values.as_ref().expect("allocated above"), &qv)?;
        let full = k[0].shape()[2] == self.offset;
        let view = |parts: &[Array; 3]| -> Result<[Array; 3]> {
            if full {
                return Ok(parts.clone());
            }
            let out: Vec<Array> = parts.iter().map(|x| head(x, self.offset)).collect::<Result<_>>()?;
            out.try_into().map_err(|_| unreachable_parts())
        };
        let (kv, vv) = (view(&k)?, view(&v)?);
        self.keys = Some(k);
        self.values = Some(v);
        Ok(KvView::Quantized { keys: kv, values: vv, group_size: self.group_size, bits: self.bits })
    }

    fn to_quantized(&self, _group_size: i32, _bits: i32) -> Result<Option<Box<dyn KvCache>>> {
        Ok(None)
    }

    fn quantized_rows(&self) -> Option<([Array; 3], [Array; 3], i32, i32)> {
        let (keys, values) = (self.keys.as_ref()?, self.values.as_ref()?);
        let upto = |parts: &[Array; 3]| -> Option<[Array; 3]> {
            Some([head(&parts[0], self.offset).ok()?, head(&parts[1], self.offset).ok()?, head(&parts[2], self.offset).ok()?])
        };
        Some((upto(keys)?, upto(values)?, self.group_size, self.bits))
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).flat_map(|p| p.iter().cloned()).collect()
    }

    fn nbytes(&self) -> usize {
        self.keys.iter().chain(self.values.iter()).flat_map(|p| p.iter()).map(Array::nbytes).sum()
    }
}

/// A Vec of three built from three items always converts back to [_; 3].
fn unreachable_parts() -> crate::error::Error {
    crate::error::Error::InvalidRequest("internal: quantized cache part count".into())
}
