//! The TurboQuant cache kind. Each row keeps its first [`SINKS`] tokens
//! unquantized (rotated, in the model's dtype) and every later token
//! compressed in the padded body (the same layout as the dense cache, with the
//! sink positions counted as padding). Attention runs in the rotated basis:
//! the query is rotated once, scores and the value sum come from the stored
//! form, and the output is rotated back once.
//!
//! This file is the MLX-ops path (every backend; the reference the GPU kernels
//! are tested against): it decodes the history into a temporary per layer and
//! step. A chunk of several tokens (prefill past the compression threshold)
//! attends to its own keys and values unquantized, as native attention would;
//! on the CPU, past one block of history, a block at a time (`blocked.rs`).

use mlx_rs_safe::{ops, Array, Dtype};

use super::codec::{Codec, TurboFormat, SINKS};
use super::{blocked, kernels};
use crate::error::{Error, Result};
use crate::kv::mask::{AttentionMask, StepMemo};
use crate::kv::padded::PaddedRows;
use crate::kv::sdpa;
use crate::kv::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};

pub struct TurboStore {
    codec: Codec,
    /// [B, kv_heads, SINKS, D] rotated keys and values, the model's dtype.
    sinks: [Array; 2],
    /// Compressed positions SINKS.. of each row, one row of bytes each (see `codec.rs`).
    body: PaddedRows,
}

/// `mask` with SINKS always-kept key columns in front (the sinks precede
/// every other position, so causal and unmasked attention stay as they are).
fn with_sinks(mask: AttentionMask) -> Result<AttentionMask> {
    let AttentionMask::Array(m) = mask else { return Ok(mask) };
    let mut shape = m.shape();
    if let Some(last) = shape.last_mut() {
        *last = SINKS;
    }
    let keep = ops::ones(&shape, Dtype::Bool)?;
    Ok(AttentionMask::Array(ops::concatenate(&[&keep, &m], -1)?))
}

impl TurboStore {
    /// Compresses a dense batch (keys and values [B, H, capacity, D] laid out
    /// by `rows`); every row holds at least SINKS tokens.
    pub fn from_dense(rows: &PaddedRows, format: TurboFormat) -> Result<TurboStore> {
        let [keys, values] = rows.buffers() else { return Err(Error::Internal("a dense cache without keys and values")) };
        let s = keys.shape();
        let dtype = keys.dtype();
        let codec = Codec::new(format, s[3], dtype)?;
        // Row b's sinks are its first SINKS positions, after its padding.
        let first: Vec<i32> = rows.left_pad().iter().flat_map(|&p| (0..SINKS).map(move |i| p + i)).collect();
        let idx = Array::from_slice(&first, &[s[0], 1, SINKS, 1])?;
        let idx = ops::broadcast_to(&idx, &[s[0], s[1], SINKS, s[3]])?;
        let sink = |x: &Array| -> Result<Array> {
            Ok(ops::astype(&codec.rotation.apply(&ops::take_along_axis(x, &idx, 2)?)?, dtype)?)
        };
        let sinks = [sink(keys)?, sink(values)?];
        let encoded = if kernels::encode_applies(&codec) {
            kernels::encode(&codec, keys, values)?
        } else {
            codec.encode(&codec.rotation.apply(keys)?, &codec.rotation.apply(values)?)?
        };
        Ok(TurboStore { sinks, body: rows.with_buffers(vec![encoded], SINKS), codec })
    }

    /// Rows of this format ([sink keys, sink values, body rows] each).
    pub fn from_rows(rows: &[KvRow], format: TurboFormat) -> Result<TurboStore> {
        let Some(first) = rows.first().and_then(|r| r.columns.first()) else {
            return Err(Error::Internal("a TurboQuant cache built from no rows"));
        };
        let codec = Codec::new(format, first.dim(-1)?, first.dtype())?;
        let part = |i: usize| -> Result<Array> {
            let cols: Vec<&Array> = rows.iter().map(|r| r.columns.get(i).ok_or(Error::Internal("a TurboQuant row without sinks"))).collect::<Result<_>>()?;
            Ok(ops::concatenate(&cols, 0)?)
        };
        let sinks = [part(0)?, part(1)?];
        let body_rows: Vec<Vec<Array>> = rows.iter().map(|r| r.columns[2..].to_vec()).collect();
        Ok(TurboStore { codec, sinks, body: PaddedRows::from_rows(&body_rows)? })
    }
}

impl TurboStore {
    /// A decode step through the GPU kernels: the new token encoded by one,
    /// attention read from the packed buffers by the others.
    fn attend_on_gpu(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        let encoded = kernels::encode(&self.codec, keys, values)?;
        self.body.append(&[encoded])?;
        let body = &self.body;
        let params = body.step_params(args.scale, masks)?;
        let rows = body.buffers().first().ok_or(Error::Internal("a TurboQuant body without its column"))?;
        kernels::attend(&self.codec, queries, &self.sinks, rows, &params, body.written())
    }
}

impl KvStore for TurboStore {
    fn kind(&self) -> KvKind {
        KvKind::Turbo(self.codec.format)
    }

    fn rows(&self) -> usize {
        self.body.rows()
    }

    fn offsets(&self) -> Vec<i32> {
        self.body.offsets().into_iter().map(|o| o + SINKS).collect()
    }

    fn attend(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        if args.sinks.is_some() {
            // Refused at start-up (KvCompression::for_model); a guard, not a path.
            return Err(Error::Internal("TurboQuant attention has no learned attention sinks"));
        }
        let n = queries.shape()[2];
        let rep = queries.dim(1)? / keys.dim(1)?;
        if n == 1 && args.window.is_none() && kernels::applies(&self.codec, rep) {
            return self.attend_on_gpu(queries, keys, values, args, masks);
        }
        let [sink_k, sink_v] = self.sinks.clone();
        let dtype = keys.dtype();
        let rot = &self.codec.rotation;
        let body = &self.body;
        // Rows padded alike (one row, or rows of one length) lose their
        // common padding: the keys are then one unpadded sequence and
        // attention takes the causal mode instead of a [B, 1, n, keys] mask
        // (which a GPU attends to without its fused kernel).
        let pads = body.left_pad();
        let common_pad = pads.iter().all(|&p| p == pads[0]).then_some(pads[0]).filter(|_| args.window.is_none());
        let mask = match common_pad {
            Some(_) => AttentionMask::for_len(n),
            None => masks.get(body.mask_key("turbo", n, args.window), || with_sinks(body.mask(n, args.window)?))?,
        };
        let (kr, vr) = (rot.apply(keys)?, rot.apply(values)?);
        let mut views = self.body.append(&[self.codec.encode(&kr, &vr)?])?;
        if let Some(pad) = common_pad.filter(|&p| p > 0) {
            views = views.iter().map(|c| Ok(ops::slice_axis(c, 2, pad, c.dim(2)?)?)).collect::<Result<_>>()?;
        }
        let qr = ops::astype(&rot.apply(queries)?, queries.dtype())?;
        let rows = views.first().ok_or(Error::Internal("a TurboQuant body without its column"))?;
        // A chunk's history, then its own positions as computed; a decode
        // step's whole history, its new token read back from the cache.
        let before = rows.dim(2)? - if n > 1 { n } else { 0 };
        let history = ops::slice_axis(rows, 2, 0, before)?;
        let chunk = (n > 1).then_some([&kr, &vr]);
        let block = blocked::Shape { rows: queries.dim(0)?, query_heads: queries.dim(1)?, kv_heads: keys.dim(1)?, head_dim: keys.dim(3)?, queries: n }.block();
        let out = if before > block && blocked::applies_here() {
            blocked::attend(&self.codec, &qr, [&sink_k, &sink_v], &history, chunk, &mask, args.scale, block)?
        } else {
            let (hk, hv) = self.codec.decode(&history, dtype)?;
            let (mut k, mut v) = (vec![&sink_k, &hk], vec![&sink_v, &hv]);
            let own = chunk.map(|[ck, cv]| Ok::<_, Error>([ops::astype(ck, dtype)?, ops::astype(cv, dtype)?])).transpose()?;
            if let Some([ck, cv]) = &own {
                k.push(ck);
                v.push(cv);
            }
            sdpa::dense(&qr, &ops::concatenate(&k, 2)?, &ops::concatenate(&v, 2)?, args.scale, &mask, None)?
        };
        Ok(ops::astype(&rot.invert(&out)?, queries.dtype())?)
    }

    fn row(&self, b: usize) -> Result<KvRow> {
        let [sk, sv] = &self.sinks;
        let b32 = b as i32;
        let mut columns = vec![ops::slice_axis(sk, 0, b32, b32 + 1)?, ops::slice_axis(sv, 0, b32, b32 + 1)?];
        columns.extend(self.body.row(b)?);
        Ok(KvRow { kind: self.kind(), offset: self.body.offset(b)? + SINKS, columns })
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        Ok(self.body.trim(n))
    }

    fn undo_point(&self, _n: i32) -> Option<UndoPoint> {
        Some(UndoPoint::Rewind(self.offsets()))
    }

    fn compress(&self, _target: &KvKind) -> Result<Option<Box<dyn KvStore>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.sinks.iter().cloned().chain(self.body.arrays()).collect()
    }

    fn nbytes(&self) -> usize {
        self.sinks.iter().map(Array::nbytes).sum::<usize>() + self.body.nbytes()
    }

    fn reserve(&mut self, positions: i32) {
        // The first SINKS positions are kept apart from the body.
        self.body.reserve(positions - SINKS);
    }
}

/// The longest prefix of at most `n` tokens a TurboQuant row restores: any
/// that keeps its sinks.
pub fn servable(row: &KvRow, n: i32) -> i32 {
    if n >= SINKS {
        n.min(row.offset)
    } else {
        0
    }
}

/// The row as it was after `n` tokens (`n` from [`servable`]).
pub fn prefix(row: &KvRow, n: i32) -> Result<KvRow> {
    if n < SINKS {
        return Err(Error::Internal("a TurboQuant prefix shorter than its sinks"));
    }
    let mut columns = row.columns[..2].to_vec();
    for c in &row.columns[2..] {
        columns.push(ops::slice_axis(c, 2, 0, n - SINKS)?);
    }
    Ok(KvRow { kind: row.kind, offset: n, columns })
}
