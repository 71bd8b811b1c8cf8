//! The rotating cache of sliding-window layers: at most `max_size` positions
//! (more while a multi-token chunk is processed, so every token sees a full
//! window), written round-robin when decoding — mlx-lm's RotatingKVCache, and
//! for several rows its BatchRotatingKVCache idea: one shared write slot, each
//! row left-padded.
//!
//! Positions are counted in "virtual" units shared by all rows: `total` have
//! been written, row b's tokens are those at or after `first[b]`. Which slot
//! holds which position follows from `total`, `idx` and the buffer length, so
//! a mask is needed only while some row's padding is still in the window.

use mlx_rs_safe::{ops, Array};

use super::mask::{padded_causal_mask, slot_mask, MaskKey, StepMemo};
use super::padded::STEP;
use super::sdpa::Attended;
use super::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};
use crate::error::{Error, Result};

pub struct RotatingStore {
    /// [B, kv_heads, len, head_dim]; None before the first write.
    keys: Option<Array>,
    values: Option<Array>,
    max_size: i32,
    /// Virtual positions written (padding included): mlx-lm's `offset` of one row.
    total: i32,
    /// Next slot to write: mlx-lm's `_idx`.
    idx: i32,
    /// Per row: the virtual position of its first token.
    first: Vec<i32>,
    /// Per row: tokens seen (rotary positions), which may exceed what is kept.
    offsets: Vec<i32>,
    /// What the last attention call attended to (for KV-shared layers).
    last: Option<Attended>,
}

fn range(v: &Array, from: i32, to: i32) -> Result<Array> {
    Ok(ops::slice_axis(v, 2, from, to)?)
}

impl RotatingStore {
    pub fn empty(rows: usize, max_size: i32) -> RotatingStore {
        RotatingStore { keys: None, values: None, max_size, total: 0, idx: 0, first: vec![0; rows], offsets: vec![0; rows], last: None }
    }

    /// Rows in temporal order ([1, H, kept, D] keys and values each), right-aligned.
    pub fn from_rows(rows: &[KvRow], max_size: i32) -> Result<RotatingStore> {
        let kept: Vec<i32> = rows.iter().map(|r| r.columns.first().map(|k| k.shape()[2]).unwrap_or(0)).collect();
        let longest = kept.iter().copied().max().unwrap_or(0);
        let mut store = RotatingStore::empty(rows.len(), max_size);
        store.offsets = rows.iter().map(|r| r.offset).collect();
        store.first = kept.iter().map(|k| longest - k).collect();
        let Some(like) = rows.iter().find(|r| r.columns.len() == 2) else { return Ok(store) };
        let b = rows.len() as i32;
        let mut bufs = Vec::with_capacity(2);
        for (i, col) in like.columns.iter().enumerate() {
            let s = col.shape();
            let mut buf = ops::zeros(&[b, s[1], longest, s[3]], col.dtype())?;
            for (r, (row, first)) in rows.iter().zip(&store.first).enumerate() {
                let Some(c) = row.columns.get(i) else { continue };
                let r = r as i32;
                buf = ops::slice_update(&buf, c, &[r, 0, *first, 0], &[r + 1, s[1], longest, s[3]], &[1, 1, 1, 1])?;
            }
            bufs.push(buf);
        }
        store.values = bufs.pop();
        store.keys = bufs.pop();
        store.total = longest;
        store.idx = longest;
        Ok(store)
    }

    /// The buffer in temporal order, unused tail sliced off.
    fn temporal_order(&self, v: &Array) -> Result<Array> {
        let len = v.shape()[2];
        if self.idx == len {
            Ok(v.clone())
        } else if self.idx < self.total {
            Ok(ops::concatenate(&[&range(v, self.idx, len)?, &range(v, 0, self.idx)?], 2)?)
        } else {
            range(v, 0, self.idx)
        }
    }

    /// Several new positions: the kept window in temporal order, its oldest
    /// dropped beyond `max_size - 1`, the new ones appended.
    fn update_concat(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(k), Some(v)) => {
                let (k, v) = (self.temporal_order(&k)?, self.temporal_order(&v)?);
                let held = k.shape()[2];
                let drop = (held - self.max_size + 1).max(0);
                (
                    ops::concatenate(&[&range(&k, drop, held)?, keys], 2)?,
                    ops::concatenate(&[&range(&v, drop, held)?, values], 2)?,
                )
            }
            _ => (keys.clone(), values.clone()),
        };
        self.total += keys.shape()[2];
        self.idx = k.shape()[2];
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }

    /// One new position: the buffer grows up to `max_size`, then wraps.
    fn update_in_place(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let ks = keys.shape();
        let s = ks[2];
        let prev = self.total;
        let mut k = self.keys.take();
        let mut v = self.values.take();
        let len = k.as_ref().map(|k| k.shape()[2]).unwrap_or(0);
        if k.is_none() || (prev >= len && len < self.max_size) {
            let grow = STEP.min(self.max_size - prev);
            let new_k = ops::zeros(&[ks[0], ks[1], grow, ks[3]], keys.dtype())?;
            let new_v = ops::zeros(&[ks[0], ks[1], grow, values.dim(-1)?], values.dtype())?;
            k = Some(match k {
                Some(k) => ops::concatenate(&[&k, &new_k], 2)?,
                None => new_k,
            });
            v = Some(match v {
                Some(v) => ops::concatenate(&[&v, &new_v], 2)?,
                None => new_v,
            });
            self.idx = prev;
        }
        let (mut k, mut v) = k.zip(v).ok_or(Error::Internal("rotating cache buffers"))?;
        let len = k.shape()[2];
        if len > self.max_size {
            k = range(&k, len - self.max_size, len)?;
            v = range(&v, len - self.max_size, len)?;
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
        self.total += s;
        self.idx += s;
        let out = if self.total < k.shape()[2] {
            (range(&k, 0, self.total)?, range(&v, 0, self.total)?)
        } else {
            (k.clone(), v.clone())
        };
        self.keys = Some(k);
        self.values = Some(v);
        Ok(out)
    }

    /// The virtual position each slot of a `len`-slot view holds after a write.
    fn slot_positions(&self, len: i32) -> Vec<i32> {
        let buf = self.keys.as_ref().map(|k| k.shape()[2]).unwrap_or(0);
        (0..len).map(|s| self.total - self.idx + s - if s >= self.idx { buf } else { 0 }).collect()
    }
}

/// A rotating store as it was (see [`KvStore::undo_point`]).
struct Saved {
    keys: Option<Array>,
    values: Option<Array>,
    total: i32,
    idx: i32,
    first: Vec<i32>,
    offsets: Vec<i32>,
}

impl KvStore for RotatingStore {
    fn kind(&self) -> KvKind {
        KvKind::Rotating { max_size: self.max_size }
    }

    fn rows(&self) -> usize {
        self.first.len()
    }

    fn offsets(&self) -> Vec<i32> {
        self.offsets.clone()
    }

    fn attend(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        let n = queries.shape()[2];
        for o in self.offsets.iter_mut() {
            *o += n;
        }
        if n > 1 {
            // As mlx-lm: the kept window (at most max_size - 1) plus the new
            // tokens, causal, windowed only where the window is shorter.
            let window = args.window.unwrap_or(self.max_size);
            let offset = (self.max_size - 1).min(self.total);
            let window = (offset + n > window).then_some(window);
            let first_key: Vec<i32> = self.first.iter().map(|f| f - (self.total - offset)).collect();
            let mut layout = vec![offset, n, window.unwrap_or(-1)];
            layout.extend(&first_key);
            let mask = masks.get(MaskKey { kind: "rotating-chunk", layout }, || padded_causal_mask(n, offset, window, &first_key))?;
            let (k, v) = self.update_concat(keys, values)?;
            return Attended { keys: k, values: v, mask }.attend_keeping(queries, args, &mut self.last);
        }
        let (k, v) = self.update_in_place(keys, values)?;
        let len = k.shape()[2];
        let mut layout = vec![self.total, self.idx, len, self.keys.as_ref().map(|k| k.shape()[2]).unwrap_or(0)];
        layout.extend(&self.first);
        let mask = masks.get(MaskKey { kind: "rotating-step", layout }, || slot_mask(&self.slot_positions(len), &self.first))?;
        Attended { keys: k, values: v, mask }.attend_keeping(queries, args, &mut self.last)
    }

    fn last_attended(&self) -> Option<&Attended> {
        self.last.as_ref()
    }

    fn row(&self, b: usize) -> Result<KvRow> {
        let offset = *self.offsets.get(b).ok_or(Error::Internal("a cache row out of range"))?;
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Ok(KvRow { kind: self.kind(), offset, columns: Vec::new() });
        };
        let (k, v) = (self.temporal_order(k)?, self.temporal_order(v)?);
        let held = k.shape()[2];
        let from = (self.first[b] - (self.total - held)).max(0);
        let cut = |a: &Array| -> Result<Array> {
            let s = a.shape();
            let b = b as i32;
            Ok(ops::slice(a, &[b, 0, from, 0], &[b + 1, s[1], held, s[3]], &[1, 1, 1, 1])?)
        };
        Ok(KvRow { kind: self.kind(), offset, columns: vec![cut(&k)?, cut(&v)?] })
    }

    /// Possible only while nothing has left the window (mlx-lm's `is_trimmable`).
    fn trim(&mut self, n: i32) -> Result<i32> {
        if self.idx != self.total {
            return Err(Error::Internal("a sliding-window cache that has dropped positions cannot be trimmed"));
        }
        let shortest = self.first.iter().map(|f| self.total - f).min().unwrap_or(0);
        let n = n.clamp(0, shortest);
        self.total -= n;
        self.idx -= n;
        for o in self.offsets.iter_mut() {
            *o -= n;
        }
        Ok(n)
    }

    /// While the window has not filled, the write takes a new slot: dropping
    /// it undoes it. After, it overwrites a kept position: the buffers as
    /// they were are kept (holding them costs a copy of the window where the
    /// write would have been in place).
    fn undo_point(&self, n: i32) -> Option<UndoPoint> {
        if self.idx == self.total && self.total + n <= self.max_size {
            return Some(UndoPoint::Rewind(self.offsets.clone()));
        }
        Some(UndoPoint::Restore(Box::new(Saved {
            keys: self.keys.clone(),
            values: self.values.clone(),
            total: self.total,
            idx: self.idx,
            first: self.first.clone(),
            offsets: self.offsets.clone(),
        })))
    }

    fn undo(&mut self, point: &UndoPoint) -> Result<()> {
        match point {
            UndoPoint::Rewind(before) => super::store::rewind(self, before),
            UndoPoint::Restore(saved) => {
                let s = saved.downcast_ref::<Saved>().ok_or(Error::Internal("a sliding-window cache given another store's undo point"))?;
                self.keys = s.keys.clone();
                self.values = s.values.clone();
                (self.total, self.idx) = (s.total, s.idx);
                self.first = s.first.clone();
                self.offsets = s.offsets.clone();
                self.last = None;
                Ok(())
            }
        }
    }

    /// Sliding-window layers stay unquantized (mlx-lm cannot quantize them at all).
    fn compress(&self, _target: &KvKind) -> Result<Option<Box<dyn KvStore>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }

    fn nbytes(&self) -> usize {
        self.keys.iter().chain(self.values.iter()).map(Array::nbytes).sum()
    }
}

/// The longest prefix of at most `n` tokens a rotating row can restore: all of
/// it, or a shorter one while the `max_size - 1` positions before it are kept.
pub fn servable(row: &KvRow, n: i32, max_size: i32) -> i32 {
    let kept = row.columns.first().map(|k| k.shape()[2]).unwrap_or(0);
    let start = row.offset - kept;
    if n >= row.offset {
        row.offset
    } else if start == 0 || n >= start + max_size - 1 {
        n.max(0)
    } else {
        0
    }
}

/// The row as it was after `n` tokens (`n` from [`servable`]).
pub fn prefix(row: &KvRow, n: i32, max_size: i32) -> Result<KvRow> {
    if n >= row.offset {
        return Ok(row.clone());
    }
    let kept = row.columns.first().map(|k| k.shape()[2]).unwrap_or(0);
    let start = row.offset - kept;
    let from = if start == 0 { 0 } else { n - (max_size - 1) - start };
    if from < 0 {
        return Err(Error::Internal("a rotating cache prefix beyond its window"));
    }
    let columns = row.columns.iter().map(|c| range(c, from, n - start)).collect::<Result<_>>()?;
    Ok(KvRow { kind: row.kind, offset: n, columns })
}
