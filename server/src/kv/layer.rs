//! One layer's cache for a batch of sequences: the rows, held by one store per
//! cache kind. Rows of different kinds (a sequence whose cache was quantized
//! next to one not yet quantized) decode in the same model call: the layer's
//! projections run over the whole batch, and attention runs once per kind over
//! that kind's rows.

use mlx_rs_safe::{eval, ops, Array};

use super::mask::{MaskKey, StepMemo};
use super::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};
use super::Positions;
use crate::error::{Error, Result};

pub struct LayerCache {
    parts: Vec<Box<dyn KvStore>>,
    /// Batch row b lives in `parts[place[b].0]` as its row `place[b].1`.
    place: Vec<(usize, usize)>,
}

impl LayerCache {
    /// One sequence without tokens, in a store of `kind`.
    pub fn new(kind: &KvKind) -> Result<LayerCache> {
        Ok(LayerCache { parts: vec![kind.empty_store(1)?], place: vec![(0, 0)] })
    }

    /// Sequences without tokens whose prompts arrive left-padded by
    /// `left_pad` (see [`KvKind::padded_store`]); None where `kind` cannot.
    pub fn padded(kind: &KvKind, left_pad: &[i32]) -> Option<LayerCache> {
        let part = kind.padded_store(left_pad)?;
        Some(LayerCache { parts: vec![part], place: (0..left_pad.len()).map(|b| (0, b)).collect() })
    }

    /// Row `b` as a layer cache of its own: for the dense kind a view of this
    /// one's buffers (no copy; they live while the row does), else a copy.
    pub fn row_cache(&self, b: usize) -> Result<LayerCache> {
        let row = self.row(b)?;
        match row.kind {
            KvKind::Dense => Ok(LayerCache { parts: vec![Box::new(super::dense::DenseStore::over_row(row.columns))], place: vec![(0, 0)] }),
            _ => LayerCache::from_rows(std::slice::from_ref(&row)),
        }
    }

    /// Whether the layer keeps every position (full attention, compressed or
    /// not), as against a sliding window or a recurrent state.
    pub fn keeps_every_position(&self) -> bool {
        self.parts.iter().all(|p| p.kind().keeps_every_position())
    }

    /// These rows, in this order, each in the store of its kind.
    pub fn from_rows(rows: &[KvRow]) -> Result<LayerCache> {
        let mut kinds: Vec<KvKind> = Vec::new();
        let mut place = Vec::with_capacity(rows.len());
        let mut members: Vec<Vec<KvRow>> = Vec::new();
        for row in rows {
            let part = match kinds.iter().position(|k| *k == row.kind) {
                Some(p) => p,
                None => {
                    kinds.push(row.kind);
                    members.push(Vec::new());
                    kinds.len() - 1
                }
            };
            place.push((part, members[part].len()));
            members[part].push(row.clone());
        }
        let parts = kinds.iter().zip(&members).map(|(k, m)| k.store(m)).collect::<Result<_>>()?;
        Ok(LayerCache { parts, place })
    }

    pub fn rows(&self) -> usize {
        self.place.len()
    }

    /// Makes room in each store for the positions `room` gives its kind
    /// (see [`KvStore::reserve`]).
    pub fn reserve(&mut self, room: impl Fn(&KvKind) -> i32) {
        self.parts.iter_mut().for_each(|p| {
            let positions = room(&p.kind());
            p.reserve(positions)
        });
    }

    /// Tokens each row has seen, in batch order.
    pub fn offsets(&self) -> Vec<i32> {
        let per_part: Vec<Vec<i32>> = self.parts.iter().map(|p| p.offsets()).collect();
        self.place.iter().map(|&(p, r)| per_part[p][r]).collect()
    }

    /// Where each row's next tokens sit, for rotary embeddings: one scalar when
    /// every row is at the same position (always for one sequence), else one
    /// array per step that every layer shares (`memo`: a host-written array
    /// per layer would be as many uploads for the GPU to fetch).
    pub fn positions(&self, memo: &StepMemo) -> Result<Positions> {
        let offsets = self.offsets();
        match offsets.first() {
            Some(&o) if offsets.iter().all(|&x| x == o) => Ok(Positions::Scalar(o)),
            _ => Ok(Positions::PerRow(step_indices(memo, "rope-positions", &offsets)?)),
        }
    }

    /// Appends the new keys and values ([B, kv_heads, L, D]) and attends
    /// `queries` ([B, heads, L, D]) to each row's cache.
    pub fn attend(&mut self, queries: &Array, keys: &Array, values: &Array, args: &AttendArgs, masks: &StepMemo) -> Result<Array> {
        if self.parts.len() == 1 {
            return self.parts[0].attend(queries, keys, values, args, masks);
        }
        let mut outs = Vec::with_capacity(self.parts.len());
        let mut order = Vec::with_capacity(self.rows());
        for (p, store) in self.parts.iter_mut().enumerate() {
            let rows: Vec<i32> = (0..store.rows())
                .map(|r| self.place.iter().position(|&x| x == (p, r)).map(|b| b as i32))
                .collect::<Option<_>>()
                .ok_or(Error::Internal("a cache part row without a batch row"))?;
            let idx = step_indices(masks, "part-rows", &rows)?;
            let take = |a: &Array| -> Result<Array> { Ok(ops::take(a, &idx, 0)?) };
            outs.push(store.attend(&take(queries)?, &take(keys)?, &take(values)?, args, masks)?);
            order.extend(rows);
        }
        // `order[i]` is the batch row of output row i: invert it.
        let mut inverse = vec![0i32; order.len()];
        for (i, &b) in order.iter().enumerate() {
            inverse[b as usize] = i as i32;
        }
        let joined = ops::concatenate(&outs.iter().collect::<Vec<_>>(), 0)?;
        Ok(ops::take(&joined, &step_indices(masks, "part-inverse", &inverse)?, 0)?)
    }

    /// Attention of `queries` ([B, heads, L, D]) to what this layer's last
    /// `attend` attended to, appending nothing: a layer that shares this
    /// layer's keys and values (Gemma 4). One kind of rows only (KV-shared
    /// models take no KV compression, so their layers never mix kinds).
    pub fn attend_shared(&self, queries: &Array, args: &AttendArgs) -> Result<Array> {
        match self.parts.as_slice() {
            [one] => one
                .last_attended()
                .ok_or(Error::Internal("a KV-shared layer ran before the layer it shares, or over a cache kind that keeps nothing"))?
                .attend(queries, args.scale, args.sinks),
            _ => Err(Error::Internal("a KV-shared layer over rows of several cache kinds")),
        }
    }

    /// The recurrent state of a linear-attention layer (its rows are all of
    /// that kind, which no compression converts).
    pub fn recurrent(&mut self) -> Result<&mut super::RecurrentStore> {
        match self.parts.as_mut_slice() {
            [one] => one.recurrent().ok_or(Error::Internal("a linear-attention layer over an attention cache")),
            _ => Err(Error::Internal("a linear-attention layer over rows of several cache kinds")),
        }
    }

    /// Row `b`.
    pub fn row(&self, b: usize) -> Result<KvRow> {
        let &(p, r) = self.place.get(b).ok_or(Error::Internal("a cache row out of range"))?;
        self.parts[p].row(r)
    }

    fn all_rows(&self) -> Result<Vec<KvRow>> {
        (0..self.rows()).map(|b| self.row(b)).collect()
    }

    /// Adds the rows of `others` after these, in order (one copy of the
    /// layer's KV, as mlx-lm's `extend`; none when this layer holds no rows
    /// yet and one other joins).
    pub fn extend(&mut self, others: impl IntoIterator<Item = LayerCache>) -> Result<()> {
        let mut others = others.into_iter();
        if self.rows() == 0 {
            match others.next() {
                Some(first) => *self = first,
                None => return Ok(()),
            }
        }
        let mut rest = others.peekable();
        if rest.peek().is_none() {
            return Ok(());
        }
        let mut rows = self.all_rows()?;
        for other in rest {
            rows.extend(other.all_rows()?);
        }
        *self = LayerCache::from_rows(&rows)?;
        Ok(())
    }

    /// Keeps the rows `keep` (batch rows, in the order given).
    pub fn filter(&mut self, keep: &[usize]) -> Result<()> {
        if keep.len() == self.rows() && keep.iter().enumerate().all(|(i, &b)| i == b) {
            return Ok(());
        }
        let rows = keep.iter().map(|&b| self.row(b)).collect::<Result<Vec<_>>>()?;
        *self = LayerCache::from_rows(&rows)?;
        Ok(())
    }

    /// Converts each row for which `target` (given the row's kind and tokens)
    /// names another kind — the compression hook: with `--kv-bits`, dense rows
    /// become affine once they hold `quantized_kv_start` tokens.
    /// Returns how many rows converted.
    pub fn compress(&mut self, target: impl Fn(&KvKind, i32) -> Option<KvKind>) -> Result<usize> {
        let offsets = self.offsets();
        let targets: Vec<Option<KvKind>> =
            self.place.iter().zip(&offsets).map(|(&(p, _), &o)| target(&self.parts[p].kind(), o)).collect();
        let Some(first) = targets.first().copied().flatten() else {
            if targets.iter().all(Option::is_none) {
                return Ok(0);
            }
            return self.compress_rows(&targets);
        };
        if self.parts.len() == 1 && targets.iter().all(|t| *t == Some(first)) {
            // Every row at once (always so for one sequence): the store converts
            // its buffers, as mlx-lm converts a cache.
            return Ok(match self.parts[0].compress(&first)? {
                Some(c) => {
                    // Converted now, layer by layer: left lazy, every layer's
                    // conversion temporaries would coexist in the next step's graph.
                    eval(&c.state().iter().collect::<Vec<_>>())?;
                    self.parts[0] = c;
                    self.rows()
                }
                None => 0,
            });
        }
        self.compress_rows(&targets)
    }

    /// Converts rows one by one (each through a one-row store) and regroups.
    fn compress_rows(&mut self, targets: &[Option<KvKind>]) -> Result<usize> {
        let mut converted = 0;
        let mut rows = Vec::with_capacity(self.rows());
        for (b, to) in targets.iter().enumerate() {
            let row = self.row(b)?;
            let converted_row = match to {
                Some(to) => row.kind.store(std::slice::from_ref(&row))?.compress(to)?,
                None => None,
            };
            rows.push(match converted_row {
                Some(c) => {
                    converted += 1;
                    c.row(0)?
                }
                None => row,
            });
        }
        if converted > 0 {
            *self = LayerCache::from_rows(&rows)?;
            eval(&self.state().iter().collect::<Vec<_>>())?;
        }
        Ok(converted)
    }

    /// Drops the newest `n` positions of every row.
    pub fn trim(&mut self, n: i32) -> Result<i32> {
        let mut dropped = n;
        for p in self.parts.iter_mut() {
            dropped = dropped.min(p.trim(n)?);
        }
        Ok(dropped)
    }

    /// Taken before `n` positions are appended: what [`Self::undo`] needs
    /// to leave every row as it was (see [`KvStore::undo_point`]).
    pub fn undo_point(&self, n: i32) -> Option<Vec<UndoPoint>> {
        self.parts.iter().map(|p| p.undo_point(n)).collect()
    }

    /// Returns every row to `points` (from [`Self::undo_point`]).
    pub fn undo(&mut self, points: &[UndoPoint]) -> Result<()> {
        if points.len() != self.parts.len() {
            return Err(Error::Internal("undo points of another cache layout"));
        }
        self.parts.iter_mut().zip(points).try_for_each(|(p, point)| p.undo(point))
    }

    pub fn state(&self) -> Vec<Array> {
        self.parts.iter().flat_map(|p| p.state()).collect()
    }

    pub fn nbytes(&self) -> usize {
        self.parts.iter().map(|p| p.nbytes()).sum()
    }
}

/// Per-row integers (positions, row indices) as an int32 array made once per
/// step (every layer holds the same rows in the same layout): one
/// host-written array for the step instead of one per layer for the GPU to
/// fetch.
fn step_indices(memo: &StepMemo, kind: &'static str, rows: &[i32]) -> Result<Array> {
    memo.array(MaskKey { kind, layout: rows.to_vec() }, || Ok(Array::from_slice(rows, &[rows.len() as i32])?))
}
