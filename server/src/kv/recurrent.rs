//! The state of a linear-attention layer (Qwen3.5's and Qwen3-Next's Gated
//! DeltaNet) for a batch of sequences: the last `kernel - 1` inputs of its
//! causal convolution ([B, kernel - 1, channels]) and the recurrent matrix
//! ([B, value heads, value dim, key dim], float32) — mlx-lm's ArraysCache of
//! two. Its size does not grow with the sequence, and it holds no positions:
//! it can be restored only at the exact length it was taken at, never cut
//! back to a shorter prefix (hence the prompt cache's checkpoints).

use mlx_rs_safe::{ops, Array};

use super::mask::StepMemo;
use super::store::{AttendArgs, KvKind, KvRow, KvStore, UndoPoint};
use crate::error::{Error, Result};

pub struct RecurrentStore {
    /// [B, kernel - 1, channels], in the layer's input dtype; None before the first token.
    conv: Option<Array>,
    /// [B, value heads, value dim, key dim] float32; None before the first token.
    ssm: Option<Array>,
    /// Tokens each row has seen.
    offsets: Vec<i32>,
    /// The kind's nominal bytes per row.
    state_bytes: u32,
}

impl RecurrentStore {
    pub fn empty(rows: usize, state_bytes: u32) -> RecurrentStore {
        RecurrentStore { conv: None, ssm: None, offsets: vec![0; rows], state_bytes }
    }

    /// These rows stacked; a row without tokens yet starts from zeros (as
    /// mlx-lm's `ArraysCache.merge` fills a missing state).
    pub fn from_rows(rows: &[KvRow], state_bytes: u32) -> Result<RecurrentStore> {
        let mut store = RecurrentStore::empty(rows.len(), state_bytes);
        store.offsets = rows.iter().map(|r| r.offset).collect();
        let Some(like) = rows.iter().find(|r| r.columns.len() == 2) else { return Ok(store) };
        let mut stacked = Vec::with_capacity(2);
        for (i, col) in like.columns.iter().enumerate() {
            let zeros = ops::zeros(&col.shape(), col.dtype())?;
            let parts: Vec<&Array> = rows.iter().map(|r| r.columns.get(i).unwrap_or(&zeros)).collect();
            stacked.push(if parts.len() == 1 { parts[0].clone() } else { ops::concatenate(&parts, 0)? });
        }
        store.ssm = stacked.pop();
        store.conv = stacked.pop();
        Ok(store)
    }

    /// The convolution's kept inputs and the recurrent matrix, if any token was seen.
    pub fn states(&self) -> (Option<&Array>, Option<&Array>) {
        (self.conv.as_ref(), self.ssm.as_ref())
    }

    /// The states after `tokens` more tokens of every row.
    pub fn update(&mut self, conv: Array, ssm: Array, tokens: i32) {
        self.conv = Some(conv);
        self.ssm = Some(ssm);
        for o in self.offsets.iter_mut() {
            *o += tokens;
        }
    }
}

/// A recurrent store as it was (see [`KvStore::undo_point`]).
struct Saved {
    conv: Option<Array>,
    ssm: Option<Array>,
    offsets: Vec<i32>,
}

impl KvStore for RecurrentStore {
    fn kind(&self) -> KvKind {
        KvKind::Recurrent { state_bytes: self.state_bytes }
    }

    fn rows(&self) -> usize {
        self.offsets.len()
    }

    fn offsets(&self) -> Vec<i32> {
        self.offsets.clone()
    }

    fn attend(&mut self, _: &Array, _: &Array, _: &Array, _: &AttendArgs, _: &StepMemo) -> Result<Array> {
        Err(Error::Internal("attention over a linear-attention layer's recurrent state"))
    }

    fn row(&self, b: usize) -> Result<KvRow> {
        let offset = *self.offsets.get(b).ok_or(Error::Internal("a cache row out of range"))?;
        let b = b as i32;
        let columns = match (&self.conv, &self.ssm) {
            (Some(c), Some(s)) => vec![ops::slice_axis(c, 0, b, b + 1)?, ops::slice_axis(s, 0, b, b + 1)?],
            _ => Vec::new(),
        };
        Ok(KvRow { kind: self.kind(), offset, columns })
    }

    fn trim(&mut self, n: i32) -> Result<i32> {
        match n {
            0 => Ok(0),
            _ => Err(Error::Internal("a recurrent state cannot drop positions")),
        }
    }

    /// The state arrays themselves (each step makes new ones): holding them
    /// costs a copy where the update would have written in place.
    fn undo_point(&self, _n: i32) -> Option<UndoPoint> {
        Some(UndoPoint::Restore(Box::new(Saved { conv: self.conv.clone(), ssm: self.ssm.clone(), offsets: self.offsets.clone() })))
    }

    fn undo(&mut self, point: &UndoPoint) -> Result<()> {
        let UndoPoint::Restore(saved) = point else { return Err(Error::Internal("a recurrent state given positions to drop")) };
        let saved = saved.downcast_ref::<Saved>().ok_or(Error::Internal("a recurrent state given another store's undo point"))?;
        self.conv = saved.conv.clone();
        self.ssm = saved.ssm.clone();
        self.offsets = saved.offsets.clone();
        Ok(())
    }

    fn compress(&self, _: &KvKind) -> Result<Option<Box<dyn KvStore>>> {
        Ok(None)
    }

    fn state(&self) -> Vec<Array> {
        self.conv.iter().chain(self.ssm.iter()).cloned().collect()
    }

    fn recurrent(&mut self) -> Option<&mut RecurrentStore> {
        Some(self)
    }

    fn nbytes(&self) -> usize {
        self.conv.iter().chain(self.ssm.iter()).map(Array::nbytes).sum()
    }
}

/// The longest prefix of at most `n` tokens a recurrent row restores: all of
/// it, or nothing.
pub fn servable(row: &KvRow, n: i32) -> i32 {
    if n >= row.offset {
        row.offset
    } else {
        0
    }
}

/// The first `n` tokens of a recurrent row: `n` must be all or none.
pub fn prefix(row: &KvRow, n: i32) -> Result<KvRow> {
    match n {
        0 => Ok(KvRow { kind: row.kind, offset: 0, columns: Vec::new() }),
        n if n == row.offset => Ok(row.clone()),
        _ => Err(Error::Internal("a recurrent state restored at a length other than its own")),
    }
}
