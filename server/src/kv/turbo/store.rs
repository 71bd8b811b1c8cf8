//! The TurboQuant cache kind. Each row keeps its first [`SINKS`] tokens
//! unquantized (rotated, in the model's dtype) and every later token
//! compressed in the padded body (the same layout as the dense cache, with the
//! sink positions counted as padding); its newest [`RECENT`](recent::RECENT) tokens are also
//! kept unquantized (`recent.rs`), and attention reads those instead of
//! their codes. Attention runs in the rotated basis:
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
use super::recent::{self, Recent};
use super::{blocked, kernels};
use crate::error::{Error, Result};
use crate::kv::mask::{AttentionMask, MaskKey, StepMemo};
use crate::kv::padded::PaddedRows;
use crate::kv::sdpa;
use crate::kv::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};

pub struct TurboStore {
    codec: Codec,
    /// [B, kv_heads, SINKS, D] rotated keys and values, the model's dtype.
    sinks: [Array; 2],
    /// Compressed positions SINKS.. of each row, one row of bytes each (see `codec.rs`).
    body: PaddedRows,
    /// The body's newest columns unquantized, read instead of their codes.
    recent: Recent,
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
            let [rows, _] = kernels::encode(&codec, keys, values)?;
            rows
        } else {
            codec.encode(&codec.rotation.apply(keys)?, &codec.rotation.apply(values)?)?
        };
        let written = rows.written();
        let newest = |x: &Array| ops::slice_axis(x, 2, (written - recent::window()).max(0), written);
        let rotated = |x: &Array| codec.rotation.apply(&newest(x)?);
        let recent = Recent::new(&recent::pair(&rotated(keys)?, &rotated(values)?)?, dtype)?;
        Ok(TurboStore { sinks, body: rows.with_buffers(vec![encoded], SINKS), recent, codec })
    }

    /// Rows of this format ([sink keys, sink values, recent keys, recent
    /// values, body rows] each; see [`TurboStore::row`]).
    pub fn from_rows(rows: &[KvRow], format: TurboFormat) -> Result<TurboStore> {
        let Some(first) = rows.first().and_then(|r| r.columns.first()) else {
            return Err(Error::Internal("a TurboQuant cache built from no rows"));
        };
        let codec = Codec::new(format, first.dim(-1)?, first.dtype())?;
        let parts: Vec<RowParts> = rows.iter().map(row_parts).collect::<Result<_>>()?;
        let sink = |i: usize| -> Result<Array> {
            let cols: Vec<&Array> = parts.iter().map(|p| &p.sinks[i]).collect();
            Ok(ops::concatenate(&cols, 0)?)
        };
        let sinks = [sink(0)?, sink(1)?];
        let windows: Vec<[Array; 2]> = parts.iter().map(|p| [p.window[0].clone(), p.window[1].clone()]).collect();
        let body_rows: Vec<Vec<Array>> = parts.iter().map(|p| p.body.to_vec()).collect();
        let body = PaddedRows::from_rows(&body_rows)?;
        // The window covers the batch's last columns; a row whose own window
        // is shorter (a prefix, or after a rewind) reads the rest from codes.
        let written = body.written();
        let held = recent::window().min(written);
        let (keys, values) = match body.buffers().first() {
            Some(rows) => codec.decode(&ops::slice_axis(rows, 2, written - held, written)?, codec.dtype)?,
            None => {
                let empty = ops::zeros(&[sinks[0].dim(0)?, sinks[0].dim(1)?, 0, codec.dim()], codec.dtype)?;
                (empty.clone(), empty)
            }
        };
        let recent = Recent::from_rows(&windows, [keys, values])?;
        Ok(TurboStore { codec, sinks, body, recent })
    }

    /// The body column where the window starts: attention reads codes
    /// before it and the window from it on.
    fn cut(&self) -> i32 {
        self.body.written() - self.recent.held()
    }
}

impl TurboStore {
    /// A decode step through the GPU kernels: the new token encoded (and the
    /// recent window updated) by one, attention read from the packed buffers
    /// by the other (which on CUDA also merges its splits).
    fn attend_on_gpu(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        // The new position's codes, and the window with it (one launch).
        let moves = self.recent.step_moves()?;
        let moves_arr = masks.array(MaskKey { kind: "turbo-window-moves", layout: vec![moves.0, moves.1] }, || kernels::window_moves(moves.0, moves.1))?;
        let [encoded, window] = kernels::encode_step(&self.codec, keys, values, self.recent.buffer(), &moves_arr)?;
        self.body.append(&[encoded])?;
        self.recent.stepped(window, moves);
        let counts = self.body.split_counts()?;
        let (body, cut, recent) = (&self.body, self.cut(), &self.recent);
        let params = body.step_params_to(cut, args.scale, masks)?;
        // Each row's first slot the window reads: the window's start, or
        // later where the row's tokens start later (its sinks count as padding).
        let (start, end) = (recent.start(), recent.filled());
        let firsts: Vec<i32> = body.left_pad().iter().map(|p| start + (p - cut).clamp(0, recent.held())).collect();
        let mut layout = vec![end, args.scale.to_bits() as i32];
        layout.extend(&firsts);
        let window_params = masks.array(MaskKey { kind: "turbo-window-params", layout }, || kernels::step_params(end, args.scale, &firsts))?;
        let rows = body.buffers().first().ok_or(Error::Internal("a TurboQuant body without its column"))?;
        let window = kernels::Window { buffer: recent.buffer(), params: &window_params };
        kernels::attend(&self.codec, queries, &self.sinks, rows, &params, cut, &window, &counts)
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
        self.recent.push(&recent::pair(&kr, &vr)?)?;
        // The window's start in the views' columns.
        let mut cut = self.cut();
        if let Some(pad) = common_pad.filter(|&p| p > 0) {
            views = views.iter().map(|c| Ok(ops::slice_axis(c, 2, pad, c.dim(2)?)?)).collect::<Result<_>>()?;
            cut -= pad;
        }
        let qr = ops::astype(&rot.apply(queries)?, queries.dtype())?;
        let rows = views.first().ok_or(Error::Internal("a TurboQuant body without its column"))?;
        // A chunk's history, then its own positions as computed; a decode
        // step's whole history, its new token read back from the cache.
        let before = rows.dim(2)? - if n > 1 { n } else { 0 };
        // The history's columns up to the window from codes, the rest from
        // the window (whose slot s is column cut + s).
        let coded = cut.clamp(0, before);
        let history = ops::slice_axis(rows, 2, 0, coded)?;
        let (lo, hi) = if before > coded { (coded - cut, before - cut) } else { (0, 0) };
        let [wk, wv] = self.recent.views()?;
        let exact = [ops::slice_axis(&wk, 2, lo, hi)?, ops::slice_axis(&wv, 2, lo, hi)?];
        let chunk = (n > 1).then_some([&kr, &vr]);
        let block = blocked::Shape { rows: queries.dim(0)?, query_heads: queries.dim(1)?, kv_heads: keys.dim(1)?, head_dim: keys.dim(3)?, queries: n }.block();
        let out = if before > block && blocked::applies_here() {
            blocked::attend(&self.codec, &qr, [&sink_k, &sink_v], &history, [&exact[0], &exact[1]], chunk, &mask, args.scale, block)?
        } else {
            let (hk, hv) = self.codec.decode(&history, dtype)?;
            let (mut k, mut v) = (vec![&sink_k, &hk, &exact[0]], vec![&sink_v, &hv, &exact[1]]);
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
        let tokens = self.body.offset(b)?;
        let mut columns = vec![ops::slice_axis(sk, 0, b32, b32 + 1)?, ops::slice_axis(sv, 0, b32, b32 + 1)?];
        columns.extend(self.recent.row(b, tokens)?);
        columns.extend(self.body.row(b)?);
        Ok(KvRow { kind: self.kind(), offset: tokens + SINKS, columns })
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        let dropped = self.body.trim(n);
        self.recent.trim(dropped);
        Ok(dropped)
    }

    fn undo_point(&self, _n: i32) -> Option<UndoPoint> {
        Some(UndoPoint::Rewind(self.offsets()))
    }

    fn compress(&self, _target: &KvKind) -> Result<Option<Box<dyn KvStore>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.sinks.iter().cloned().chain(self.recent.arrays()).chain(self.body.arrays()).collect()
    }

    fn nbytes(&self) -> usize {
        self.sinks.iter().map(Array::nbytes).sum::<usize>() + self.recent.nbytes() + self.body.nbytes()
    }

    fn reserve(&mut self, positions: i32) {
        // The first SINKS positions are kept apart from the body.
        self.body.reserve(positions - SINKS);
    }
}

/// A TurboQuant row's columns (see [`TurboStore::row`]): sink keys and
/// values, the recent window's keys and values, the body's rows.
struct RowParts<'a> {
    sinks: &'a [Array],
    window: &'a [Array],
    body: &'a [Array],
}

fn row_parts(row: &KvRow) -> Result<RowParts<'_>> {
    if row.columns.len() < 5 {
        return Err(Error::Internal("a TurboQuant row without its sinks, recent window and body"));
    }
    let (sinks, rest) = row.columns.split_at(2);
    let (window, body) = rest.split_at(2);
    Ok(RowParts { sinks, window, body })
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
    let parts = row_parts(row)?;
    let mut columns = parts.sinks.to_vec();
    // The window holds the row's last positions; the prefix keeps those before its end.
    for c in parts.window {
        let held = c.dim(2)?;
        columns.push(ops::slice_axis(c, 2, 0, recent::prefix_len(held, row.offset, n))?);
    }
    for c in parts.body {
        columns.push(ops::slice_axis(c, 2, 0, n - SINKS)?);
    }
    Ok(KvRow { kind: row.kind, offset: n, columns })
}
